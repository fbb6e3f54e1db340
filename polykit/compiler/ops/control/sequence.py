"""Sequence and optional ops: shape rules (values: polykit.compiler.ir.sequences).

A sequence's Value carries its elements' shapes while the build knows its length (a sequence
built from tensors, split from a tensor of known shape, or fed with known element shapes),
so SequenceAt at a constant position and ConcatFromSequence give exact shapes; otherwise
the element shape is the one every element fits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.compiler.ir.graph import OPTIONAL, SEQUENCE, Graph, Node, Shape, Value
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule
from polykit.compiler.ir.sequences import merge_all, sequence_value, value_of_type
from polykit.compiler.ir.subgraphs import captured
from polykit.compiler.ops.control.bodies import annotate, import_bodies

INT64 = np.dtype(np.int64)


def _sequence(ctx: InferContext, i: int) -> Value:
    v = ctx.value(i)
    if v.wrap[:1] != (SEQUENCE,):
        raise ctx.fail(f"input {i} ({ctx.node.input(i)!r}) is not a sequence",
                       hint="pass a sequence (SequenceConstruct, SequenceEmpty, SplitToSequence, a sequence input)")
    return v


def _position(ctx: InferContext, i: int, length: int, default: int, insert: bool = False) -> int | None:
    """A constant position input, made non-negative; None when it is not known."""
    if not ctx.has(i):
        return default
    pos = ctx.const(i)
    if pos is None:
        return None
    p = int(np.asarray(pos).reshape(-1)[0])
    top = length if insert else length - 1
    if not -length <= p <= top:
        raise ctx.fail(f"position {p} is out of range for a sequence of {length} element(s)",
                       hint=f"positions lie in [-{length}, {top}]")
    return p + length if p < 0 else p


@shape_rule("SequenceEmpty")
def _empty(ctx: InferContext) -> list[Value]:
    from polykit.compiler.ir import dtypes

    return [sequence_value(dtypes.to_numpy(ctx.attr("dtype", 1), where=ctx.node.describe()), ())]


@shape_rule("SequenceConstruct")
def _construct(ctx: InferContext) -> list[Value]:
    if ctx.n_inputs == 0:
        raise ctx.fail("SequenceConstruct needs at least one input", hint="use SequenceEmpty for an empty sequence")
    kinds = {ctx.dtype(i) for i in range(ctx.n_inputs)} - {None}
    if len(kinds) > 1:
        raise ctx.fail(f"the inputs have different dtypes {sorted(str(k) for k in kinds)}",
                       hint="every element of a sequence has one element type")
    return [sequence_value(ctx.dtype(0), [ctx.shape(i) for i in range(ctx.n_inputs)])]


@shape_rule("SequenceInsert")
def _insert(ctx: InferContext) -> list[Value]:
    seq = _sequence(ctx, 0)
    if seq.dtype is not None and ctx.dtype(1) is not None and seq.dtype != ctx.dtype(1):
        raise ctx.fail(f"the tensor is {ctx.dtype(1)}, the sequence holds {seq.dtype}",
                       hint="insert a tensor of the sequence's element type")
    dtype = seq.dtype or ctx.dtype(1)
    if seq.elements is not None:
        pos = _position(ctx, 2, len(seq.elements), len(seq.elements), insert=True)
        if pos is not None:
            return [sequence_value(dtype, (*seq.elements[:pos], ctx.shape(1), *seq.elements[pos:]))]
    shape = ctx.shape(1) if seq.elements == () else merge_all([seq.shape, ctx.shape(1)])
    return [sequence_value(dtype, None, shape)]


@shape_rule("SequenceErase")
def _erase(ctx: InferContext) -> list[Value]:
    seq = _sequence(ctx, 0)
    if seq.elements is not None:
        if not seq.elements:
            raise ctx.fail("SequenceErase of an empty sequence")
        pos = _position(ctx, 1, len(seq.elements), len(seq.elements) - 1)
        if pos is not None:
            return [sequence_value(seq.dtype, (*seq.elements[:pos], *seq.elements[pos + 1:]), seq.shape)]
    return [sequence_value(seq.dtype, None, seq.shape)]


@shape_rule("SequenceAt")
def _at(ctx: InferContext) -> list[tuple[Any, Shape]]:
    seq = _sequence(ctx, 0)
    if seq.elements is not None:
        if not seq.elements:
            raise ctx.fail("SequenceAt of an empty sequence")
        pos = _position(ctx, 1, len(seq.elements), 0)
        if pos is not None:
            return [(seq.dtype, seq.elements[pos])]
    return [(seq.dtype, seq.shape)]


@shape_rule("SequenceLength")
def _length(ctx: InferContext) -> list[tuple[Any, Shape]]:
    _sequence(ctx, 0)
    return [(INT64, ())]


def split_to_sequence_sizes(dim: int, split: np.ndarray | None) -> list[int] | None:
    """SplitToSequence's piece sizes along its axis: one per index without `split`, chunks of a
    scalar `split` (the last one smaller), or the 1-D `split`'s entries; None if they do not fit."""
    if split is None:
        return [1] * dim
    split = np.asarray(split)
    if split.ndim == 0:
        step = int(split)
        if step <= 0:
            return None
        return [min(step, dim - lo) for lo in range(0, dim, step)]
    sizes = [int(s) for s in split.reshape(-1)]
    return sizes if sum(sizes) == dim and all(s >= 0 for s in sizes) else None


@shape_rule("SplitToSequence")
def _split_to_sequence(ctx: InferContext) -> list[Value]:
    data = ctx.shape(0)
    if data is None:
        return [sequence_value(ctx.dtype(0), None, None)]
    axis = ctx.normalize_axis(ctx.attr("axis", 0), len(data))
    squeeze = not ctx.has(1) and not ctx.attr("keepdims", 1)
    dim = data[axis]
    split = ctx.const(1) if ctx.has(1) else None
    if isinstance(dim, int) and (split is not None or not ctx.has(1)):
        sizes = split_to_sequence_sizes(dim, split)
        if sizes is None:
            raise ctx.fail(f"cannot split dim {dim} by {split.tolist()}", hint="the split sizes must add up to the "
                                                                              "axis length")
        parts = [data[:axis] + (() if squeeze else (s,)) + data[axis + 1:] for s in sizes]
        return [sequence_value(ctx.dtype(0), parts)]
    piece = None if split is None or np.asarray(split).ndim else int(np.asarray(split))
    return [sequence_value(ctx.dtype(0), None, data[:axis] + (() if squeeze else (piece,)) + data[axis + 1:])]


@shape_rule("ConcatFromSequence")
def _concat_from_sequence(ctx: InferContext) -> list[tuple[Any, Shape]]:
    seq = _sequence(ctx, 0)
    new_axis = bool(ctx.attr("new_axis", 0))
    shapes = list(seq.elements) if seq.elements is not None else [seq.shape]
    if any(s is None for s in shapes) or (seq.elements == () and seq.shape is None):
        return [(seq.dtype, None)]
    if seq.elements == ():
        raise ctx.fail("ConcatFromSequence of an empty sequence", hint="the sequence needs at least one element")
    rank = len(shapes[0]) + new_axis
    axis = ctx.normalize_axis(ctx.attr("axis"), rank)
    if new_axis:
        shapes = [s[:axis] + (1,) + s[axis:] for s in shapes]
    if any(len(s) != rank for s in shapes):
        raise ctx.fail(f"the elements have different ranks {sorted({len(s) for s in shapes})}",
                       hint="the elements must have one rank and agree on every dim but the axis")
    dims = [s[axis] for s in shapes]
    total = sum(dims) if seq.elements is not None and all(isinstance(d, int) for d in dims) else None
    return [(seq.dtype, tuple(total if k == axis else merge_all([s[k:k + 1] for s in shapes])[0]
                              for k in range(rank)))]


# ---- SequenceMap: a body applied to each element -------------------------------------------
@importer("SequenceMap")
def _import_map(node: Node, ctx: ImportContext) -> None:
    import_bodies(node, ("body",), ctx)


@shape_rule("SequenceMap")
def _map(ctx: InferContext) -> list[Value]:
    body: Graph = ctx.attr("body")
    n = ctx.n_inputs - captured(ctx.node)
    values = [ctx.value(i) for i in range(ctx.n_inputs)]
    _sequence(ctx, 0)
    lengths = {len(v.elements) for v in values[:n] if v.wrap and v.elements is not None}
    if len(lengths) > 1:
        raise ctx.fail(f"the input sequences have different lengths {sorted(lengths)}",
                       hint="SequenceMap's sequences must have one length")
    rest = [(v.dtype, v.shape) for v in values[n:]]

    def element(v: Value, k: int | None) -> tuple[Any, Shape]:
        if not v.wrap:
            return (v.dtype, v.shape)
        return (v.dtype, v.shape if k is None else v.elements[k])

    per_element: list[list[Value]] = []
    for k in (range(lengths.pop()) if lengths else [None]):
        per_element.append(annotate(body, [element(v, k) for v in values[:n]] + rest,
                                    [None] * n + [ctx.const(i) for i in range(n, ctx.n_inputs)]))
    if len(per_element[0]) != ctx.n_outputs:
        raise ctx.fail(f"the body gives {len(per_element[0])} outputs for the node's {ctx.n_outputs}",
                       hint="the body has one output per output sequence")
    known = all(v.elements is not None for v in values[:n] if v.wrap)
    out = []
    for j in range(ctx.n_outputs):
        shapes = [outs[j].shape for outs in per_element]
        dtype = per_element[0][j].dtype
        out.append(sequence_value(dtype, shapes) if known else sequence_value(dtype, None, shapes[0]))
    return out


# ---- optionals -------------------------------------------------------------------------------
@shape_rule("Optional")
def _optional(ctx: InferContext) -> list[Value]:
    if ctx.has(0):
        v = ctx.value(0)
        return [v.with_(wrap=(OPTIONAL, *v.wrap))]
    tp = ctx.attr("type", None)
    if tp is None:
        raise ctx.fail("an Optional without input needs its 'type' attribute",
                       hint="give the type of the empty optional (see the ONNX spec)")
    v = value_of_type("", tp)
    return [v.with_(wrap=(OPTIONAL, *v.wrap))]


@shape_rule("OptionalHasElement")
def _has_element(ctx: InferContext) -> list[tuple[Any, Shape]]:
    return [(np.dtype(np.bool_), ())]


@shape_rule("OptionalGetElement")
def _get_element(ctx: InferContext) -> list[Value | tuple[Any, Shape]]:
    v = ctx.value(0)
    if v.wrap[:1] == (OPTIONAL,):
        v = v.with_(wrap=v.wrap[1:])
    return [v if v.wrap else (v.dtype, v.shape)]
