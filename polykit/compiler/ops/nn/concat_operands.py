"""Concatenated operands of a fused Pointwise node (pass absorb_concat, docs/FUSION.md).

A Pointwise node may read a Concat's result without the Concat running: attribute `concat` is
a list of `{"name", "axis", "first", "count", "extents"}`, one per absorbed Concat. The node's
inputs `first .. first + count - 1` are the Concat's sources in order; `name` is the value the
body reads (the Concat's output, no input of the node), their concatenation along `axis`
(non-negative); `extents` are the sources' sizes along `axis` when the pass knew them (null
where a dim was symbolic): a record for readers, checked against the shapes where both are known.

The *logical* inputs of such a node are its inputs with each source run replaced by one item,
the operand: what the body sees. `group_inputs` maps any per-input list (names, shapes, dtypes,
tensors) to it; the shape rule, the reference and the kernels go through it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, TypeVar

from polykit.errors import NodeAttributeError

T = TypeVar("T")

#: most sources one concatenated operand may have (a kernel argument table per source)
MAX_SOURCES = 64


def concat_operands(attrs: Mapping[str, Any], n_inputs: int, where: str = "") -> list[dict[str, Any]]:
    """The node's `concat` entries, validated against its input count and sorted by `first`
    ([] without the attribute); NodeAttributeError when malformed."""
    entries = attrs.get("concat") or []
    if not isinstance(entries, list):
        raise _bad(where, "attribute 'concat' is not a list")
    out, end = [], 0
    for e in sorted(entries, key=lambda e: e.get("first", -1) if isinstance(e, dict) else -1):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"]:
            raise _bad(where, f"concat entry {e!r} has no name")
        first, count, axis = e.get("first"), e.get("count"), e.get("axis")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (first, count, axis)):
            raise _bad(where, f"concat entry {e['name']!r}: first, count and axis must be integers")
        if axis < 0 or not 1 <= count <= MAX_SOURCES or first < end or first + count > n_inputs:
            raise _bad(where, f"concat entry {e['name']!r} (first {first}, count {count}, axis {axis}) does not fit "
                       f"the node's {n_inputs} inputs (or overlaps another, or has over {MAX_SOURCES} sources)")
        extents = e.get("extents")
        if not isinstance(extents, list) or len(extents) != count or \
                not all(x is None or (isinstance(x, int) and x >= 0) for x in extents):
            raise _bad(where, f"concat entry {e['name']!r}: extents must list {count} sizes (or nulls)")
        out.append(e)
        end = first + count
    return out


def _bad(where: str, what: str) -> NodeAttributeError:
    return NodeAttributeError(what, where=where or None,
                              hint="the attribute is written by pass absorb_concat; rebuild the plan from the model")


def group_inputs(items: Sequence[T], entries: Sequence[Mapping[str, Any]],
                 combine: Callable[[Mapping[str, Any], list[T]], Any]) -> list:
    """`items` (one per node input) as the logical inputs: each entry's source run becomes
    `combine(entry, sources)`, the other items stay."""
    out: list = []
    k = 0
    for e in entries:
        out.extend(items[k:e["first"]])
        out.append(combine(e, list(items[e["first"]:e["first"] + e["count"]])))
        k = e["first"] + e["count"]
    out.extend(items[k:])
    return out


def logical_names(inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    """The names a Pointwise body reads from its node's inputs (each operand by its name)."""
    return group_inputs(inputs, concat_operands(attrs, len(inputs)), lambda e, _: e["name"])


def operand_positions(inputs: Sequence[str], attrs: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """Logical input index -> its concat entry, for the concatenated operands."""
    grouped = group_inputs(list(range(len(inputs))), concat_operands(attrs, len(inputs)), lambda e, _: e)
    return {i: g for i, g in enumerate(grouped) if isinstance(g, dict)}


def concat_shape(shapes: Sequence[Sequence | None], axis: int) -> tuple | None:
    """The shape of the sources' concatenation along `axis` (None if one is unknown)."""
    if any(s is None for s in shapes) or not shapes:
        return None
    total = shapes[0][axis]
    for s in shapes[1:]:
        total = total + s[axis]
    return tuple(total if d == axis else shapes[0][d] for d in range(len(shapes[0])))
