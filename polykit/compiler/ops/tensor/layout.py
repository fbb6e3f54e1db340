"""Layout ops: Transpose, Concat, Split, Slice, Tile, Pad, ReverseSequence."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Dim, Node
from polykit.compiler.ops.data_dims import dim_extreme
from polykit.compiler.ops.tensor.shape_ops import attr_to_input, canonical, const_ints, merge_dims, unknown_dims
from polykit.compiler.ops.registry import InferContext, ImportContext, importer, shape_rule
from polykit.compiler.ir.symbolic import ceil_div
from polykit.errors import NodeAttributeError


# ---- Transpose ----------------------------------------------------------------------------
@shape_rule("Transpose")
def _transpose(ctx: InferContext):
    data = ctx.shape(0)
    if data is None:
        perm = ctx.attr("perm", None)
        return [(ctx.dtype(0), unknown_dims(None if perm is None else len(perm)))]
    perm = ctx.attr("perm", list(range(len(data)))[::-1])
    if sorted(perm) != list(range(len(data))):
        raise ctx.fail(f"perm {perm} is not a permutation of the {len(data)} axes")
    return [(ctx.dtype(0), tuple(data[p] for p in perm))]


# ---- Concat -------------------------------------------------------------------------------
@importer("Concat", since=1)
def _concat_v1(node: Node, ctx: ImportContext):
    node.attrs.setdefault("axis", 1)  # Concat-1 defaulted to axis 1


importer("Concat", since=4)(canonical)


@shape_rule("Concat")
def _concat(ctx: InferContext):
    shapes = [ctx.shape(i) for i in range(ctx.n_inputs) if ctx.has(i)]
    dtype = next((ctx.dtype(i) for i in range(ctx.n_inputs) if ctx.dtype(i) is not None), None)
    known = [s for s in shapes if s is not None]
    if not known:
        return [(dtype, None)]
    rank = len(known[0])
    if any(len(s) != rank for s in known):
        raise ctx.fail(f"inputs have different ranks: {[tuple(s) for s in known]}", hint="Concat needs equal ranks")
    axis = ctx.normalize_axis(ctx.attr("axis"), rank)
    out: list[Dim] = []
    for k in range(rank):
        if k == axis:
            dims = [None if s is None else s[k] for s in shapes]
            out.append(sum(dims) if all(isinstance(d, int) for d in dims) else None)
            continue
        dim: Dim = None
        for s in known:
            if isinstance(dim, int) and isinstance(s[k], int) and dim != s[k]:
                raise ctx.fail(f"dim {k} differs between inputs ({dim} vs {s[k]})",
                               hint="all dims but the concat axis must match")
            dim = merge_dims(dim, s[k])
        out.append(dim)
    return [(dtype, tuple(out))]


# ---- Split --------------------------------------------------------------------------------
@importer("Split", since=1)
def _split_v1(node: Node, ctx: ImportContext):
    attr_to_input(node, ctx, "split", 1)


importer("Split", since=13)(canonical)


def split_sizes(dim: int, n: int, split: list[int] | None) -> list[int] | None:
    """Output sizes along the axis: the explicit `split`, or n near-equal chunks (the last smaller)."""
    if split is not None:
        return split if sum(split) == dim else None
    chunk = -(-dim // n)
    sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    return sizes if sizes[-1] >= 0 else None


@shape_rule("Split")
def _split(ctx: InferContext):
    data, n = ctx.shape(0), ctx.n_outputs
    if data is None:
        return [(ctx.dtype(0), None)] * n
    axis = ctx.normalize_axis(ctx.attr("axis", 0), len(data))
    split = const_ints(ctx, 1)
    if split is not None and len(split) != n:
        raise ctx.fail(f"split {split} has {len(split)} entries for {n} outputs")
    if split is not None and any(s < 0 for s in split):
        raise ctx.fail(f"split {split} has a negative size", hint="split sizes are lengths: 0 or more each")
    num = ctx.attr("num_outputs", None)
    if num is not None and num != n:
        raise ctx.fail(f"num_outputs={num} but the node has {n} outputs")
    dim = data[axis]
    sizes: list[Dim] = [None] * n
    if isinstance(dim, int) and (split is not None or not ctx.has(1)):
        sizes = split_sizes(dim, n, split)
        if sizes is None:
            raise ctx.fail(f"cannot split dim {dim} into {split or n} parts",
                           hint="the split sizes must add up to the axis length")
    elif split is not None:
        sizes = list(split)
    return [(ctx.dtype(0), data[:axis] + (s,) + data[axis + 1:]) for s in sizes]


# ---- Slice --------------------------------------------------------------------------------
@importer("Slice", since=1)
def _slice_v1(node: Node, ctx: ImportContext):
    for index, key in ((1, "starts"), (2, "ends"), (3, "axes")):
        attr_to_input(node, ctx, key, index)


importer("Slice", since=10)(canonical)


def slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice's clamped (start, end) on an axis of length `dim`: negatives count from the
    end; start clamps to [0, dim] ([0, dim-1] stepping back), end to [0, dim] ([-1, dim-1])."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    # min/max of a data-dependent dim (x[:300] of a filtered count) stay expressions: the run decides them
    low, high = (0, dim) if step > 0 else (-1, dim - 1)
    return dim_extreme("min", dim_extreme("max", start, 0), high), dim_extreme("min", dim_extreme("max", end, low), high)


def slice_length(dim: int, start: int, end: int, step: int) -> int:
    """How many elements ONNX Slice keeps along an axis of length `dim`."""
    start, end = slice_bounds(dim, start, end, step)
    # len(range(start, end, step)) in arithmetic that keeps a dim expression (SymInt)
    return dim_extreme("max", ceil_div(end - start, step) if step > 0 else ceil_div(start - end, -step), 0)


_HUGE = 2**31 - 1


def _takes_whole_axis(start: int, end: int, step: int) -> bool:
    """Whether a slice keeps every element whatever the axis length (x[0:INT_MAX])."""
    return step == 1 and (start == 0 or start <= -_HUGE) and end >= _HUGE


@shape_rule("Slice")
def _slice(ctx: InferContext):
    data = ctx.shape(0)
    if data is None:
        return [(ctx.dtype(0), None)]
    rank = len(data)
    starts, ends = const_ints(ctx, 1), const_ints(ctx, 2)
    axes = const_ints(ctx, 3) if ctx.has(3) else None
    steps = const_ints(ctx, 4) if ctx.has(4) else None
    n = len(starts) if starts is not None else len(ends) if ends is not None else None
    if axes is None and not ctx.has(3) and n is not None:
        axes = list(range(n))
    if axes is None:
        return [(ctx.dtype(0), unknown_dims(rank))]
    axes = [ctx.normalize_axis(a, rank) for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"axes {axes} repeat an axis")
    out = list(data)
    exact = starts is not None and ends is not None and (steps is not None or not ctx.has(4))
    for k, a in enumerate(axes):
        step = steps[k] if exact and steps is not None else 1
        if step == 0:
            raise ctx.fail("a slice step is 0", hint="steps must be non-zero")
        if not exact:
            out[a] = None
        elif isinstance(data[a], int):
            out[a] = slice_length(data[a], starts[k], ends[k], step)
        elif not _takes_whole_axis(starts[k], ends[k], step):
            out[a] = None
    return [(ctx.dtype(0), tuple(out))]


# ---- Tile ---------------------------------------------------------------------------------
@importer("Tile", since=1)
def _tile_v1(node: Node, ctx: ImportContext):
    """Tile-1 took (input, tiles, axis); opset 6 takes per-axis repeats. Needs known rank."""
    tiles, axis = ctx.const(node.input(1)), ctx.const(node.input(2))
    rank_shape = ctx.graph.value(node.inputs[0]).shape
    if tiles is None or axis is None or rank_shape is None:
        raise NodeAttributeError(
            "Tile-1 needs constant `tiles` and `axis` inputs and an input of known rank",
            where=node.describe(), hint="re-export the model with opset >= 6",
        )
    repeats = np.ones(len(rank_shape), dtype=np.int64)
    repeats[int(axis)] = int(tiles)
    node.inputs = [node.inputs[0], ctx.add_constant(repeats, prefix=f"{node.name}_repeats")]


importer("Tile", since=6)(canonical)


@shape_rule("Tile")
def _tile(ctx: InferContext):
    data, reps = ctx.shape(0), const_ints(ctx, 1)
    if data is None or reps is None:
        return [(ctx.dtype(0), unknown_dims(None if data is None else len(data)))]
    if len(reps) != len(data):
        raise ctx.fail(f"repeats {reps} do not match the input rank {len(data)}")
    if any(r < 0 for r in reps):
        raise ctx.fail(f"repeats {reps} has a negative entry")
    return [(ctx.dtype(0), tuple(d if r == 1 else d * r if isinstance(d, int) else None for d, r in zip(data, reps)))]


# ---- Pad ----------------------------------------------------------------------------------
@importer("Pad", since=1)
def _pad_v1(node: Node, ctx: ImportContext):
    """Pad-1/2 carried pads (`paddings` in v1) and `value` as attributes; v11 takes inputs."""
    pads = node.attrs.pop("pads", node.attrs.pop("paddings", None))
    if pads is None:
        raise NodeAttributeError("Pad needs a `pads` attribute before opset 11", where=node.describe())
    value = float(node.attrs.pop("value", 0.0))
    node.inputs = [node.inputs[0], ctx.add_constant(np.asarray(pads, np.int64), prefix=f"{node.name}_pads")]
    if value == 0.0:
        return None
    dtype = ctx.graph.value(node.inputs[0]).dtype
    if dtype is not None:
        node.inputs.append(ctx.add_constant(np.asarray(value, dtype), prefix=f"{node.name}_value"))
        return None
    raw = ctx.add_constant(np.float32(value), prefix=f"{node.name}_value")
    cast = ctx.graph.fresh_name(f"{node.name}_value_cast")
    node.inputs.append(cast)
    return [Node("CastLike", [raw, node.inputs[0]], [cast], name=cast), node]


importer("Pad", since=11)(canonical)


@shape_rule("Pad")
def _pad(ctx: InferContext):
    data, pads = ctx.shape(0), const_ints(ctx, 1)
    if data is None:
        return [(ctx.dtype(0), None)]
    rank = len(data)
    axes = const_ints(ctx, 3) if ctx.has(3) else list(range(rank))
    if pads is None or axes is None:
        return [(ctx.dtype(0), unknown_dims(rank))]
    if len(pads) != 2 * len(axes):
        raise ctx.fail(f"pads {pads} should have {2 * len(axes)} entries (begin and end per axis)")
    mode = ctx.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.fail(f"unknown pad mode {mode!r}", hint="use constant, reflect, edge or wrap")
    out = list(data)
    for k, a in enumerate(ctx.normalize_axis(a, rank) for a in axes):
        extra = pads[k] + pads[k + len(axes)]
        d = data[a]
        out[a] = d + extra if isinstance(d, int) else d if extra == 0 else None
        if isinstance(out[a], int) and out[a] < 0:
            raise ctx.fail(f"pads {pads} remove more than the {d} elements of axis {a}")
    return [(ctx.dtype(0), tuple(out))]


# ---- ReverseSequence ----------------------------------------------------------------------
@shape_rule("ReverseSequence")
def _reverse_sequence(ctx: InferContext):
    return [(ctx.dtype(0), ctx.shape(0))]
