"""Sequence and optional engine I/O: a plan runs tensors only (polykit.compiler.passes.
resolve_sequences flattens them at build time); the engine flattens such feeds into the
plan's element inputs and packs the element outputs back, by the layouts the plan records
in metadata["sequence_io"] (a tensor name per element; lists for sequences, None for an
empty optional; `{"length": tensor, "items": [...]}` for an output sequence whose length the
run decides: the first `length` of the items; `{"present": tensor, "item": ...}` for an output
optional whose presence the run decides: the item, or None when the flag is false; `{"ragged": tensor,
"shapes": tensor, "prefix": [...]}` for an output sequence a Loop grew by run-time iterations: the prefix's
elements, then the ragged tensor's values cut by the rows of `shapes`, one element per row). The flattened
names, `s/0`, `s/1`, ..., are also how `.npz` files name a sequence's elements."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import OPTIONAL
from polykit.compiler.passes.control.sequence_walk import PRESENT, RAGGED, RAGGED_PREFIX, RAGGED_SHAPES, RUN_LENGTH
from polykit.errors import PlanError, RuntimeInputError

Layout = Any


def layouts(plan: Any) -> dict[str, dict[str, Layout]]:
    """The plan's sequence I/O layouts, checked against its inputs and outputs (PlanError)."""
    io = plan.metadata.get("sequence_io") or {}
    for side, names in (("inputs", plan.inputs), ("outputs", plan.outputs)):
        for name, layout in (io.get(side) or {}).items():
            bad = [n for n in flat_names(layout) if n not in names]
            if bad or not isinstance(name, str):
                raise PlanError(f"metadata.sequence_io.{side}[{name!r}] names {bad[:1]}, which is not a plan "
                                f"{side[:-1]}", where="plan", hint="rebuild the plan with `polykit convert`")
    return {"inputs": dict(io.get("inputs") or {}), "outputs": dict(io.get("outputs") or {})}


def flat_names(layout: Layout) -> list[str]:
    if layout is None:
        return []
    if isinstance(layout, list):
        return [n for item in layout for n in flat_names(item)]
    if isinstance(layout, dict) and set(layout) == {PRESENT, "item"} and isinstance(layout[PRESENT], str):
        return [layout[PRESENT]] + flat_names(layout["item"])
    if isinstance(layout, dict) and set(layout) == {RUN_LENGTH, "items"} and isinstance(layout[RUN_LENGTH], str) \
            and isinstance(layout["items"], list):
        return flat_names(layout["items"]) + [layout[RUN_LENGTH]]
    if isinstance(layout, dict) and set(layout) == {RAGGED, RAGGED_SHAPES, RAGGED_PREFIX} and \
            isinstance(layout[RAGGED], str) and isinstance(layout[RAGGED_SHAPES], str) and \
            isinstance(layout[RAGGED_PREFIX], list):
        return flat_names(layout[RAGGED_PREFIX]) + [layout[RAGGED], layout[RAGGED_SHAPES]]
    if not isinstance(layout, str):
        raise PlanError(f"a sequence layout holds {type(layout).__name__}", where="plan metadata.sequence_io",
                        hint="rebuild the plan with `polykit convert`")
    return [layout]


def flatten_value(name: str, wrap: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A fed value of type `wrap` (ir.Value.wrap) as element arrays named as the build names
    them: `name/i` for a sequence's elements, `name/0` for an optional's element."""
    if not wrap:
        return {name: value}
    if wrap[0] == OPTIONAL:
        return {} if value is None else flatten_value(f"{name}/0", wrap[1:], value)
    if not isinstance(value, (list, tuple)):
        raise RuntimeInputError(f"input {name!r} is a sequence, the feed is a {type(value).__name__}",
                                where=f"tensor {name!r}", hint="feed a sequence as a list of arrays")
    out: dict[str, Any] = {}
    for i, item in enumerate(value):
        out.update(flatten_value(f"{name}/{i}", wrap[1:], item))
    return out


def _by_layout(name: str, layout: Layout, value: Any, out: dict[str, Any]) -> None:
    if layout is None or value is None:
        if layout is not None or value is not None:
            raise RuntimeInputError(f"input {name!r} has {_count(value)}, the plan was built for {_count(layout)}",
                                    where=f"tensor {name!r}", hint="rebuild the plan for this input")
        return
    if isinstance(layout, list):
        if not isinstance(value, (list, tuple)) or len(value) != len(layout):
            raise RuntimeInputError(f"input {name!r} has {_count(value)}, the plan was built for {_count(layout)}",
                                    where=f"tensor {name!r}",
                                    hint="a plan is built for one sequence length: rebuild it for this input")
        for item_layout, item in zip(layout, value):
            _by_layout(name, item_layout, item, out)
        return
    out[layout] = value


def flatten_feeds(io: Mapping[str, Mapping[str, Layout]], feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Feeds with each sequence/optional input replaced by its elements (RuntimeInputError when
    its length or presence differs from what the plan was built for)."""
    if not io["inputs"] or not isinstance(feeds, Mapping):
        return feeds  # type: ignore[return-value]
    out = {k: v for k, v in feeds.items() if k not in io["inputs"]}
    for name, layout in io["inputs"].items():
        if name not in feeds:
            raise RuntimeInputError(f"input {name!r} is missing from the feeds", where=f"tensor {name!r}",
                                    hint="feed a sequence as a list of arrays")
        _by_layout(name, layout, feeds[name], out)
    return out


def pack_outputs(io: Mapping[str, Mapping[str, Layout]], outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Outputs with each sequence/optional output's elements packed back into a list (or None)."""
    if not io["outputs"]:
        return dict(outputs)
    used = {n for layout in io["outputs"].values() for n in flat_names(layout)}
    out: dict[str, Any] = {k: v for k, v in outputs.items() if k not in used}
    for name, layout in io["outputs"].items():
        out[name] = _pack(layout, outputs)
    return out


def _pack(layout: Layout, outputs: Mapping[str, np.ndarray]) -> Any:
    if layout is None:
        return None
    if isinstance(layout, list):
        return [_pack(item, outputs) for item in layout]
    if isinstance(layout, dict) and PRESENT in layout:
        return _pack(layout["item"], outputs) if bool(np.asarray(outputs[layout[PRESENT]]).reshape(-1)[0]) else None
    if isinstance(layout, dict) and RAGGED in layout:
        return [_pack(item, outputs) for item in layout[RAGGED_PREFIX]] + _cut(layout, outputs)
    if isinstance(layout, dict):
        items = layout["items"]
        length = int(np.asarray(outputs[layout[RUN_LENGTH]]).reshape(-1)[0])
        if not 0 <= length <= len(items):
            raise PlanError(f"a sequence output's length is {length}; the plan holds {len(items)} elements for it",
                            where=f"tensor {layout[RUN_LENGTH]!r}", hint="rebuild the plan with this polykit version")
        return [_pack(item, outputs) for item in items[:length]]
    return outputs[layout]


def _cut(layout: Mapping[str, Any], outputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """A loop-grown sequence's elements: its ragged values cut by its rows of shapes."""
    data, shapes = np.asarray(outputs[layout[RAGGED]]), np.asarray(outputs[layout[RAGGED_SHAPES]])
    sizes = np.prod(shapes, axis=1, dtype=np.int64) if shapes.ndim == 2 else None
    if data.ndim != 1 or sizes is None or shapes.dtype.kind not in "iu" or (shapes < 0).any() \
            or int(sizes.sum()) != data.size:
        raise PlanError(f"a loop-grown sequence's values {data.shape} do not match its shapes {shapes.shape}: "
                        f"{[] if sizes is None else sizes.tolist()[:4]} elements", where=f"tensor {layout[RAGGED]!r}",
                        hint="rebuild the plan with this polykit version")
    ends = np.cumsum(sizes)
    return [data[end - size:end].reshape(tuple(int(d) for d in shape)) for end, size, shape in zip(ends, sizes, shapes)]


def _count(value: Any) -> str:
    if value is None:
        return "no element (an empty optional)"
    if isinstance(value, (list, tuple)):
        return f"{len(value)} element(s)"
    return "one element"
