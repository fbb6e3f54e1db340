"""The caller's buffers bound to an execution context's I/O tensors, and when inputs are consumed.

`set_tensor_address(name, ptr)` binds an I/O tensor to caller memory (an int address, or an
object with the target's array interface: `__cuda_array_interface__` / DLPack on cuda,
`__array_interface__` on cpu); the next enqueues read that input or write that output in
place, with no copy. `IoAddresses` keeps the bindings and checks each against the tensor's
shape of the run (size, dtype where the object tells it, alignment) before the launches, once per
binding and shape: an object's address is read then, as if its pointer had been bound.

Where a context replays captured launches (CUDA graphs), the graph holds the addresses it was
captured with. A set of addresses therefore runs in place from its second run on (captured
then), for a few sets per context (engine.MAX_IN_PLACE_SETS); its first run, and runs of addresses
past that cap, are copied through the graph of the context's own memory. Addresses that change
on every run cost what copies cost, stable buffers run in place, and nothing is re-captured or
run eagerly again and again.

`check_feeds` checks the host arrays `execute` takes, `scratch_of` the memory
`set_device_memory` is given. `input_consumed_at(plan)` is the index of the last layer that reads an engine input (or a
view of one): once it has run the caller may overwrite its input buffers
(`set_input_consumed_event`).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

from polykit.compiler.plan.file import Plan
from polykit.errors import RuntimeInputError, UsageError

#: (tensor, shape) pairs whose bound address a context remembers as checked
MAX_CHECKED = 256


def root_of(name: str, aliases: Mapping[str, str]) -> str:
    """The tensor whose memory view `name` shares (itself when it is no view)."""
    seen = set()
    while name in aliases and name not in seen:
        seen.add(name)
        name = aliases[name]
    return name


def view_groups(aliases: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """{root: every view sharing its memory} of a plan's `memory.aliases` (roots without views absent)."""
    groups: dict[str, list[str]] = {}
    for view in aliases:
        groups.setdefault(root_of(view, aliases), []).append(view)
    return {root: tuple(views) for root, views in groups.items()}


def place_in_caller_memory(plan: Any, names: Iterable[str], elsewhere: Iterable[str] = (),
                           groups: Mapping[str, tuple[str, ...]] | None = None) -> tuple[dict, set]:
    """Which tensors move to the caller's memory when I/O tensors `names` are bound there: ({bound
    name: (the tensor whose slot it shares, and every view of that slot)}, names to copy instead).
    A bound tensor's whole view group moves, so the layers writing or reading any view of it use
    the caller's bytes. Copied instead: an output that is an input or a view of one, a second
    name bound to a slot already bound, a weight, and a group with a member `elsewhere` (memory
    outside the arena: staged values, run-time-sized regions). `groups`: the plan's
    view_groups, when the caller keeps them (a context binding on every run does)."""
    aliases, outside = plan.memory.aliases, set(elsewhere)
    if groups is None:
        groups = view_groups(aliases)
    placed, copies, taken = {}, set(), set()
    for name in sorted(names, key=lambda n: n not in plan.inputs):  # inputs claim their slots first
        root = root_of(name, aliases)
        group = (root, *groups.get(root, ()))
        if (root in taken or outside.intersection(group) or plan.tensors[root].kind == "weight"
                or (name in plan.outputs and (name in plan.inputs or root in plan.inputs))):
            copies.add(name)
            continue
        taken.add(root)
        placed[name] = group
    return placed, copies


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
        self._checked: dict[tuple, int] = {}  # (name, shape) -> the bound buffer's address, checked

    def set(self, name: str, binding: Any) -> None:
        """Bind I/O tensor `name` to `binding` (None unbinds it: the context copies it again)."""
        if name not in self._plan.inputs and name not in self._plan.outputs:
            raise UsageError(f"the engine has no input or output {name!r}",
                             hint=f"I/O tensors are: {', '.join(dict.fromkeys([*self._plan.inputs, *self._plan.outputs]))}")
        if binding is None:
            self._bound.pop(name, None)
        else:
            self._bound[name] = binding
        self._checked = {key: ptr for key, ptr in self._checked.items() if key[0] != name}

    def get(self, name: str) -> Any:
        return self._bound.get(name)

    def __bool__(self) -> bool:
        return bool(self._bound)

    def __contains__(self, name: str) -> bool:
        return name in self._bound

    def resolve(self, ctx: Any, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """{name: address} of every binding, checked for the run's shapes on target context `ctx`.
        A binding is checked (and an object asked for its address) the first time it serves a
        shape, not on every run: serving binds the same buffers run after run, and this is on
        the host's path to every launch. An object's address is the one it had then, as if its
        pointer had been bound (TensorRT binds pointers): bind it again after it gets new memory."""
        out = {}
        for name, binding in self._bound.items():
            shape = shapes.get(name)
            shape = self._static_shape(name) if shape is None else tuple(shape)
            key = (name, shape)
            ptr = self._checked.get(key)
            if ptr is None:
                ptr = self._check(ctx, name, binding, shape)
                if len(self._checked) >= MAX_CHECKED:  # many shapes: start over
                    self._checked.clear()
                self._checked[key] = ptr
            out[name] = ptr
        return out

    def _check(self, ctx: Any, name: str, binding: Any, shape: tuple[int, ...]) -> int:
        dtype = self._plan.tensors[name].np_dtype
        ptr = ctx.io_pointer(binding, name, shape, dtype)
        align = max(ctx.io_alignment, dtype.itemsize)
        if math.prod(shape) * dtype.itemsize and ptr == 0:
            raise RuntimeInputError(f"tensor {name!r} is bound to a null address", where=f"tensor {name!r}",
                                    hint="bind a buffer of the tensor's size")
        if ptr % align:
            raise RuntimeInputError(f"the buffer bound to {name!r} at {ptr:#x} is not aligned to {align} bytes",
                                    where=f"tensor {name!r}",
                                    hint=f"bind an address that is a multiple of {align} (fresh allocations are)")
        return ptr

    def _static_shape(self, name: str) -> tuple[int, ...]:
        """The plan's shape of a tensor the run's shapes do not list; a data-dependent one cannot be bound."""
        desc = self._plan.tensors[name]
        if desc.dims:
            raise RuntimeInputError(f"output {name!r} has a data-dependent size and cannot be bound in place",
                                    where=f"tensor {name!r}",
                                    hint="unbind it (set_tensor_address(name, None)) and pass it to enqueue")
        return tuple(desc.shape)


def scratch_of(memory: Any, size: int | None) -> tuple[int, int]:
    """(address, bytes) of scratch given as an address and its size, or as a contiguous buffer
    object with __array_interface__ (cpu) or __cuda_array_interface__ (cuda)."""
    if isinstance(memory, (int, np.integer)) and not isinstance(memory, bool):
        if size is None:
            raise UsageError("set_device_memory(address) needs the size of the memory in bytes",
                             hint="call set_device_memory(address, size)")
        return int(memory), int(size)
    iface = getattr(memory, "__cuda_array_interface__", None) or getattr(memory, "__array_interface__", None)
    if iface is None:
        raise UsageError(f"device memory must be an address and size or a buffer, not {type(memory).__name__}")
    itemsize = np.dtype(iface["typestr"]).itemsize
    shape = tuple(iface["shape"])
    strides = iface.get("strides")
    if strides is not None and tuple(strides) != tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * itemsize
                                                       for i in range(len(shape))):
        raise UsageError("the device memory buffer is not contiguous", hint="give a contiguous buffer")
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    return int(iface["data"][0]), nbytes if size is None else min(int(size), nbytes)


def check_feeds(plan: Plan, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Feeds as contiguous arrays, after checking names, shapes and exact dtypes."""
    if not isinstance(feeds, Mapping):
        raise RuntimeInputError(f"feeds must be a dict name -> array, got {type(feeds).__name__}")
    unknown = [n for n in feeds if n not in plan.inputs]
    if unknown:
        raise RuntimeInputError(f"feed {unknown[0]!r} is not an input of the engine",
                                where=f"tensor {unknown[0]!r}", hint=f"inputs are: {', '.join(plan.inputs)}")
    out: dict[str, np.ndarray] = {}
    for name in plan.inputs:
        desc = plan.tensors[name]
        if name not in feeds:
            raise RuntimeInputError(f"input {name!r} is missing from the feeds", where=f"tensor {name!r}",
                                    hint=f"feed a {desc.dtype} array of shape {tuple(desc.shape)}")
        value = feeds[name]
        if not isinstance(value, np.ndarray):
            if isinstance(value, (np.generic, int, float, bool, list, tuple)):
                value = np.asarray(value)
            else:
                raise RuntimeInputError(f"input {name!r} must be a numpy array, got {type(value).__name__}",
                                        where=f"tensor {name!r}")
        if value.dtype.name != desc.dtype:
            raise RuntimeInputError(f"input {name!r} has dtype {value.dtype.name}, the engine expects {desc.dtype}",
                                    where=f"tensor {name!r}", hint=f"convert it with .astype(np.{desc.dtype})")
        if not desc.dims and tuple(value.shape) != tuple(desc.shape):  # dynamic: ShapeBinder checks
            raise RuntimeInputError(
                f"input {name!r} has shape {tuple(value.shape)}, the engine expects {tuple(desc.shape)}",
                where=f"tensor {name!r}", hint="rebuild the plan with --input-shapes for other shapes")
        out[name] = np.asarray(value, order="C")
    for name, bound in (plan.metadata.get("input_values") or {}).items():
        value = out.get(name)
        if value is not None and not np.array_equal(value.ravel(), np.asarray(bound["values"], dtype=value.dtype),
                                                    equal_nan=value.dtype.kind == "f"):
            raise RuntimeInputError(
                f"input {name!r} differs from the value the plan was built for (BuilderConfig.input_values)",
                where=f"tensor {name!r}", hint="rebuild the plan with this input's value")
    return out
