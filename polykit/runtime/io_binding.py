"""The caller's buffers bound to an execution context's I/O tensors, and when inputs are consumed.

`set_tensor_address(name, ptr)` binds an I/O tensor to caller memory (an int address, or an
object with the target's array interface: `__cuda_array_interface__` / DLPack on cuda,
`__array_interface__` on cpu); the next enqueues read that input or write that output in
place, with no copy. `IoAddresses` keeps the bindings and checks each against the tensor's
shape of the run (size, dtype where the object tells it, alignment) before the launches.

`input_consumed_at(plan)` is the index of the last layer that reads an engine input (or a
view of one): once it has run the caller may overwrite its input buffers
(`set_input_consumed_event`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.errors import RuntimeInputError, UsageError


def root_of(name: str, aliases: Mapping[str, str]) -> str:
    """The tensor whose memory view `name` shares (itself when it is no view)."""
    seen = set()
    while name in aliases and name not in seen:
        seen.add(name)
        name = aliases[name]
    return name


def input_consumed_at(plan: Any) -> int:
    """Index of the last plan layer reading an input or a view of one (-1: none reads one);
    len(layers) when an input is itself an output or the root of one (read by the copy out)."""
    aliases = plan.memory.aliases

    def root(name: str) -> str:
        return root_of(name, aliases)

    inputs = set(plan.inputs)
    if any(root(name) in inputs for name in plan.outputs):
        return len(plan.layers)
    last = -1
    for index, layer in enumerate(plan.layers):
        if any(name and root(name) in inputs for name in layer.inputs):
            last = index
    return last


class IoAddresses:
    """The caller addresses bound to an engine's I/O tensors (module docstring)."""

    def __init__(self, plan: Any):
        self._plan = plan
        self._bound: dict[str, Any] = {}

    def set(self, name: str, binding: Any) -> None:
        """Bind I/O tensor `name` to `binding` (None unbinds it: the context copies it again)."""
        if name not in self._plan.inputs and name not in self._plan.outputs:
            raise UsageError(f"the engine has no input or output {name!r}",
                             hint=f"I/O tensors are: {', '.join(dict.fromkeys([*self._plan.inputs, *self._plan.outputs]))}")
        if binding is None:
            self._bound.pop(name, None)
        else:
            self._bound[name] = binding

    def get(self, name: str) -> Any:
        return self._bound.get(name)

    def __bool__(self) -> bool:
        return bool(self._bound)

    def __contains__(self, name: str) -> bool:
        return name in self._bound

    def resolve(self, ctx: Any, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """{name: address} of every binding, checked for the run's shapes on target context `ctx`."""
        out = {}
        for name, binding in self._bound.items():
            desc = self._plan.tensors[name]
            shape = tuple(shapes.get(name, desc.shape))
            if desc.dims and name not in shapes:
                raise RuntimeInputError(f"output {name!r} has a data-dependent size and cannot be bound in place",
                                        where=f"tensor {name!r}",
                                        hint="unbind it (set_tensor_address(name, None)) and pass it to enqueue")
            ptr = ctx.io_pointer(binding, name, shape, desc.np_dtype)
            align = max(ctx.io_alignment, desc.np_dtype.itemsize)
            nbytes = int(np.prod(shape, dtype=np.int64)) * desc.np_dtype.itemsize
            if nbytes and ptr == 0:
                raise RuntimeInputError(f"tensor {name!r} is bound to a null address", where=f"tensor {name!r}",
                                        hint="bind a buffer of the tensor's size")
            if ptr % align:
                raise RuntimeInputError(f"the buffer bound to {name!r} at {ptr:#x} is not aligned to {align} bytes",
                                        where=f"tensor {name!r}",
                                        hint=f"bind an address that is a multiple of {align} (fresh allocations are)")
            out[name] = ptr
        return out
