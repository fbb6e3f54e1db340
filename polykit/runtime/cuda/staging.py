"""Shape-tensor values: one device region, filled from pinned blocks staged once per shape set.

A plan built with profiles computes some small tensors on the host (shape-tensor values: Range
limits, Reshape targets, masks of the bound sizes; TensorDesc.value) and writes them to the
device before the launches of every run. BERT-base's dynamic plan has 55 of them. Two costs
came with copying each into its arena slot from numpy memory:
- a copy from pageable memory first waits for the stream (the driver stages it synchronously),
  so the host waited for the previous run;
- 55 small copies a run cost the stream ~0.6 ms, 11 % of BERT-base at 8x128.
So the value tensors live in a region of their own, each at a fixed offset (sized for its
largest shape, TensorDesc.nbytes), and a run makes ONE asynchronous copy into it from a pinned
block packed the same way for its shape set. Offsets do not move between shape sets, so CUDA
graphs captured for one set stay valid. Blocks stay while their shape set is cached (bounded,
like the replays); one leaves only after the device finished every copy from it.
Nothing but these copies writes the region, so a run whose shape set is the one the region
already holds (the same key as the last copy: every run at one shape) copies nothing: the
runs of one context are ordered on the device (they share its arena), so the earlier copy
lands before this run's kernels read it.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.memory import DeviceBuffer, align_up

#: pinned blocks a context keeps, one per shape set (polykit.runtime.engine.MAX_REPLAYS alike)
MAX_STAGED = 16


class PinnedBlock:
    """`nbytes` of page-locked host memory, freed by `free()`."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        err, ptr = driver.drv().cuMemHostAlloc(self.nbytes, 0)
        if int(err) != 0:
            raise DeviceError(f"cannot allocate {self.nbytes} bytes of pinned host memory for shape values: "
                              f"{driver.error_name(err)}", hint="free host memory, or use fewer contexts")
        self.ptr = int(ptr)

    def write(self, offset: int, array: np.ndarray) -> None:
        if offset + array.nbytes > self.nbytes:
            raise DeviceError(f"{array.nbytes} bytes at {offset} do not fit a pinned block of {self.nbytes}",
                              hint="please report this")
        ctypes.memmove(self.ptr + offset, array.ctypes.data, array.nbytes)

    def free(self) -> None:
        if self.ptr:
            driver.call("cuMemFreeHost", self.ptr, what="free pinned shape values")
            self.ptr = 0


def value_layout(tensors: Mapping[str, Any], aliases: Mapping[str, str]) -> tuple[dict[str, int], int]:
    """({value tensor: offset in the region}, region bytes): each value tensor of the plan
    (`tensors`: name -> TensorDesc) at a 16-byte aligned offset sized for its largest shape. A
    value tensor that is a view (`aliases`) of another value tensor is not placed (it shares its
    source's bytes: polykit.runtime.cuda.target places it there)."""
    layout, offset = {}, 0
    for name, desc in tensors.items():
        source = aliases.get(name)
        if desc.value and not (source in tensors and tensors[source].value):
            layout[name] = offset
            offset += align_up(max(int(desc.nbytes), 1), 16)
    return layout, offset


def placed_root(name: str, aliases: Mapping[str, str], layout: Mapping[str, int]) -> str | None:
    """The placed value tensor whose bytes `name` reads (itself, or the source its views lead
    to), or None for a tensor outside the region."""
    seen = set()
    while name not in layout:
        if name in seen or name not in aliases:
            return None
        seen.add(name)
        name = aliases[name]
    return name


class StagedValues:
    """The value region of one context and the pinned blocks that fill it, per shape set."""

    def __init__(self, layout: Mapping[str, int], nbytes: int, allocator: Any = None):
        self.layout = dict(layout)
        self.region = DeviceBuffer(nbytes, what="shape-tensor values", allocator=allocator)
        self._blocks: OrderedDict[tuple, tuple[PinnedBlock, int]] = OrderedDict()
        #: the shape set whose values the region holds (its last copy's key)
        self.holds: tuple | None = None

    def pointer(self, name: str) -> int:
        return self.region.ptr + self.layout[name]

    def copy(self, key: tuple, values: Mapping[str, np.ndarray], stream: Any) -> None:
        """Write `values` (a shape set's: name -> array) into the region on `stream`, unless
        the region holds them already (`key` was the last set copied)."""
        if key == self.holds:
            return
        entry = self._blocks.get(key)
        if entry is None:
            entry = self._stage(values)
            self._blocks[key] = entry
            if len(self._blocks) > MAX_STAGED:
                _, (old, _) = self._blocks.popitem(last=False)
                driver.call("cuCtxSynchronize", what="drain copies of evicted shape values")  # any stream may read it
                old.free()
        else:
            self._blocks.move_to_end(key)
        block, used = entry
        if used:
            driver.call("cuMemcpyHtoDAsync", self.region.ptr, block.ptr, used, stream, what="copy of shape values")
        self.holds = key

    def _stage(self, values: Mapping[str, np.ndarray]) -> tuple[PinnedBlock, int]:
        block, used = PinnedBlock(self.region.nbytes), 0
        for name, value in values.items():
            if name not in self.layout:
                continue  # a view of a placed value tensor: its source's bytes are written
            a = np.ascontiguousarray(value)
            block.write(self.layout[name], a)
            used = max(used, self.layout[name] + a.nbytes)
        return block, used

    def free(self) -> None:
        self.holds = None
        for block, _ in self._blocks.values():
            block.free()
        self._blocks.clear()
        self.region.free()
