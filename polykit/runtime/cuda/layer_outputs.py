"""Outputs a layer sizes while it runs, on cuda: the scan outputs of a Loop whose iteration count
the run decides, the outputs of an If whose branches give other shapes (their dims are *sized*
data symbols, polykit.compiler.ops.data_dims.sized_dim: nothing bounds them, the plan reserves no
bytes for them).

The layer's host-driven tactic (polykit.kernels.cuda.models.control_flow) asks for device memory once it
knows a size (the Loop after reading its trip count back, or growing by doubling while its body's
condition decides; the If after reading its condition: the branch plan's output shapes) through
`LayerOutputs.allocate`, and records the size it wrote with `LayerOutputs.done`. The context then
reports those sizes as the layer's data sizes (`sizes`), and its `bind_shapes` points the output
and its views at the buffer (`pointers`). A buffer is kept across runs and reused while it is large
enough; a larger one replaces it (the old one freed after the device drained: a run on any stream
may still read it). The tensors computed from such an output live in a region per size set
(polykit.runtime.cuda.sized).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from polykit.errors import PolykitError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.memory import DeviceBuffer, copy_device
from polykit.runtime.cuda.sized import view_roots
from polykit.runtime.output_alloc import DataOutput, data_outputs


def layer_sized(plan: Any) -> dict[str, dict[int, str]]:
    """{tensor: {axis: sized symbol}} of the outputs their deciding layer sizes."""
    sized = plan.profiles.sized if plan.profiles is not None else frozenset()
    found: dict[str, dict[int, str]] = {}
    for o in data_outputs(plan) if sized else ():
        if o.symbol in sized:
            found.setdefault(o.tensor, {})[o.axis] = o.symbol
    return found


class LayerOutputs:
    """The buffers of one context's layer-sized outputs (module docstring)."""

    def __init__(self, plan: Any, alloc: Callable[[int], Any] | None = None,
                 drain: Callable[[], None] | None = None, copy: Callable[..., None] = copy_device):
        """`alloc(nbytes)`: a buffer with `ptr`, `nbytes` and `free()`; `drain()`: wait for the device;
        `copy(dst, src, nbytes, stream)`: a device-to-device copy (the defaults are the driver's)."""
        self.axes = layer_sized(plan)
        self.members = view_roots(plan, self.axes)
        self._alloc = alloc or (lambda n: DeviceBuffer(n, what="outputs a layer sizes"))
        self._drain = drain or (lambda: driver.call("cuCtxSynchronize", what="drain outputs a layer sizes"))
        self._copy = copy
        self._buffers: dict[str, Any] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}

    def __bool__(self) -> bool:
        return bool(self.axes)

    def sizes(self, name: str) -> bool:
        """Whether the layer writing `name` sizes it (allocate, then done)."""
        return name in self.axes

    def allocate(self, name: str, shape: Sequence[int], dtype: Any, stream: Any = None, keep: int = 0) -> DeviceTensor:
        """Room for `name` of `shape`: its buffer when large enough, else a new one holding the old
        one's first `keep` bytes (copied on `stream`)."""
        nbytes = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
        self._shapes.pop(name, None)
        old = self._buffers.get(name)
        if old is None or old.nbytes < nbytes:
            new = self._alloc(max(nbytes, 2 * old.nbytes if old is not None else 0))
            if old is not None:
                self._copy(new.ptr, old.ptr, min(keep, old.nbytes), stream)
                self._drain()  # the copy, and any run still reading the old buffer
                old.free()
            self._buffers[name] = old = new
        return DeviceTensor(old.ptr, tuple(int(d) for d in shape), np.dtype(dtype))

    def done(self, name: str, shape: Sequence[int]) -> None:
        """The shape the layer wrote into `name`'s buffer this run."""
        self._shapes[name] = tuple(int(d) for d in shape)

    def read(self, outputs: Sequence[DataOutput]) -> dict[str, int]:
        """{symbol: size} of `outputs` that the layer sized this run."""
        found = {}
        for o in outputs:
            if o.tensor not in self._shapes:
                raise PolykitError(f"the layer that writes {o.tensor!r} did not size it",
                                   where=f"tensor {o.tensor!r}", hint="a control-flow tactic missed its "
                                   "output allocation; please report this")
            found[o.symbol] = self._shapes[o.tensor][o.axis]
        return found

    def pointers(self) -> Mapping[str, int]:
        """{tensor: device pointer} of the outputs allocated so far and their views."""
        return {n: self._buffers[r].ptr for n, r in self.members.items() if r in self._buffers}

    def free(self) -> None:
        if self._buffers:
            self._drain()
        for buffer in self._buffers.values():
            buffer.free()
        self._buffers.clear()
        self._shapes.clear()
