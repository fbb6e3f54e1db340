"""Shape ops: Reshape, Flatten, Squeeze, Unsqueeze, Expand, Shape, Size, Dropout.

Also the small dim arithmetic the tensor-op rules share (`const_ints`, `dim_product`,
`fresh_dim`): dims are ints, symbolic strs or None, and these keep a symbol where the
result is exactly that symbol and fall back to None where it is not known.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import Dim, Node
from polykit.compiler.ir.symbolic import SymInt
from polykit.compiler.ops.registry import InferContext, ImportContext, broadcast_shapes, importer, shape_rule

INT64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)


# ---- dim arithmetic shared by the tensor-op rules ----------------------------------------
def const_ints(ctx: InferContext, i: int) -> list[int] | None:
    """Input i's known value as a flat list of Python ints (None when not known)."""
    value = ctx.const(i)
    if value is None:
        return None
    return [v if isinstance(v, SymInt) else int(v) for v in np.asarray(value).reshape(-1)]


def dim_product(dims: Sequence[Dim]) -> Dim:
    """Product of dims: an int when all are ints, the symbol when it is exactly one symbol."""
    total, symbols = 1, []
    for d in dims:
        if d is None:
            return None
        if isinstance(d, int):
            total *= d
        else:
            symbols.append(d)
    if not symbols:
        return total
    if total == 0:
        return 0
    return symbols[0] if len(symbols) == 1 and total == 1 else None


def dim_quotient(numerator: Sequence[Dim], denominator: Sequence[Dim]) -> Dim:
    """prod(numerator) / prod(denominator), cancelling equal symbols; None if not exact."""
    if any(d is None for d in numerator) or any(d is None for d in denominator):
        return None
    num_syms = Counter(d for d in numerator if isinstance(d, str))
    den_syms = Counter(d for d in denominator if isinstance(d, str))
    common = num_syms & den_syms
    num_syms, den_syms = num_syms - common, den_syms - common
    num = math.prod(d for d in numerator if isinstance(d, int))
    den = math.prod(d for d in denominator if isinstance(d, int))
    if den_syms or den == 0:
        return None
    if not num_syms:
        return num // den if num % den == 0 else -1  # -1: not divisible (the caller reports it)
    if sum(num_syms.values()) == 1 and num == den:
        return next(iter(num_syms))
    return None


def fresh_dim(ctx: InferContext, tag: str, output: int = 0) -> str:
    """A symbolic dim for a data-dependent size, named after the node's output (stable)."""
    name = ctx.node.outputs[output] if output < len(ctx.node.outputs) else ctx.node.name
    return f"{tag}({name})"


def merge_dims(a: Dim, b: Dim) -> Dim:
    """Two dims that must be equal: the more precise one (an int beats a symbol beats None)."""
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return a if a is not None else b


def unknown_dims(rank: int | None):
    return None if rank is None else (None,) * rank


def canonical(node: Node, ctx: ImportContext) -> None:
    """Importer for opset ranges whose form is already the canonical one."""
    return None


def attr_to_input(node: Node, ctx: ImportContext, attr: str, index: int, dtype=np.int64) -> None:
    """Move list attribute `attr` into input slot `index` as an int64 constant (if present)."""
    if attr not in node.attrs:
        return
    name = ctx.add_constant(np.asarray(node.attrs.pop(attr), dtype=dtype), prefix=f"{node.name}_{attr}")
    while len(node.inputs) < index:
        node.inputs.append("")
    if len(node.inputs) == index:
        node.inputs.append(name)
    else:
        node.inputs[index] = name


# ---- Reshape ------------------------------------------------------------------------------
@importer("Reshape", since=1)
def _reshape_v1(node: Node, ctx: ImportContext):
    node.attrs.pop("consumed_inputs", None)
    attr_to_input(node, ctx, "shape", 1)


importer("Reshape", since=5)(canonical)


@shape_rule("Reshape")
def _reshape(ctx: InferContext):
    dt, data = ctx.dtype(0), ctx.shape(0)
    target = const_ints(ctx, 1)
    if target is None:
        spec = ctx.shape(1)
        return [(dt, unknown_dims(spec[0] if spec and len(spec) == 1 and isinstance(spec[0], int) else None))]
    allowzero = ctx.attr("allowzero", 0)
    if target.count(-1) > 1:
        raise ctx.fail(f"shape {target} has more than one -1", hint="at most one output dim may be inferred")
    if allowzero and 0 in target and -1 in target:
        raise ctx.fail(f"shape {target} has both 0 and -1 with allowzero=1", hint="the -1 dim cannot be inferred")
    out: list[Dim] = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if data is not None and i >= len(data):
                raise ctx.fail(f"shape {target} copies dim {i} (0) but the input has rank {len(data)}")
            out.append(None if data is None else data[i])
        elif d < -1:
            raise ctx.fail(f"shape {target} has an invalid dim {d}", hint="dims are >= 0 or -1")
        else:
            out.append(d)
    if -1 in target:
        k = target.index(-1)
        inferred = None if data is None else dim_quotient(data, out[:k] + out[k + 1:])
        if inferred == -1:
            raise ctx.fail(f"cannot reshape {tuple(data)} to {target}", hint="the element counts differ")
        out[k] = inferred
    elif data is not None and all(isinstance(d, int) for d in list(data) + out):
        if dim_product(data) != dim_product(out):
            raise ctx.fail(f"cannot reshape {tuple(data)} to {tuple(out)}", hint="the element counts differ")
    return [(dt, tuple(out))]


# ---- Flatten ------------------------------------------------------------------------------
@shape_rule("Flatten")
def _flatten(ctx: InferContext):
    data = ctx.shape(0)
    if data is None:
        return [(ctx.dtype(0), (None, None))]
    rank = len(data)
    axis = ctx.attr("axis", 1)
    if not -rank <= axis <= rank:
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return [(ctx.dtype(0), (dim_product(data[:axis]), dim_product(data[axis:])))]


# ---- Squeeze / Unsqueeze ------------------------------------------------------------------
@importer("Squeeze", since=1)
@importer("Unsqueeze", since=1)
def _axes_attr_to_input(node: Node, ctx: ImportContext):
    attr_to_input(node, ctx, "axes", 1)


importer("Squeeze", since=13)(canonical)
importer("Unsqueeze", since=13)(canonical)


@shape_rule("Squeeze")
def _squeeze(ctx: InferContext):
    data, axes = ctx.shape(0), const_ints(ctx, 1)
    if data is None:
        return [(ctx.dtype(0), None)]
    rank = len(data)
    if axes is None and ctx.has(1):
        n = ctx.shape(1)
        return [(ctx.dtype(0), unknown_dims(rank - n[0] if n and isinstance(n[0], int) else None))]
    if axes is None:
        if any(not isinstance(d, int) for d in data):
            return [(ctx.dtype(0), None)]
        return [(ctx.dtype(0), tuple(d for d in data if d != 1))]
    picked = {ctx.normalize_axis(a, rank) for a in axes}
    for a in picked:
        if isinstance(data[a], int) and data[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of size {data[a]}", hint="only size-1 axes can be squeezed")
    return [(ctx.dtype(0), tuple(d for i, d in enumerate(data) if i not in picked))]


@shape_rule("Unsqueeze")
def _unsqueeze(ctx: InferContext):
    data, axes = ctx.shape(0), const_ints(ctx, 1)
    if data is None:
        return [(ctx.dtype(0), None)]
    if axes is None:
        n = ctx.shape(1)
        return [(ctx.dtype(0), unknown_dims(len(data) + n[0] if n and isinstance(n[0], int) else None))]
    rank = len(data) + len(axes)
    picked = {ctx.normalize_axis(a, rank) for a in axes}
    if len(picked) != len(axes):
        raise ctx.fail(f"axes {axes} repeat an axis", hint="each axis may appear once")
    rest = iter(data)
    return [(ctx.dtype(0), tuple(1 if i in picked else next(rest) for i in range(rank)))]


# ---- Expand -------------------------------------------------------------------------------
@shape_rule("Expand")
def _expand(ctx: InferContext):
    data, target = ctx.shape(0), const_ints(ctx, 1)
    if target is None:
        spec = ctx.shape(1)
        n = spec[0] if spec and isinstance(spec[0], int) else None
        return [(ctx.dtype(0), None if data is None or n is None else (None,) * max(len(data), n))]
    if any(d < 0 for d in target):
        raise ctx.fail(f"shape {target} has a negative dim")
    return [(ctx.dtype(0), broadcast_shapes(ctx, data, tuple(target)))]


# ---- Shape / Size ------------------------------------------------------------------------
@shape_rule("Shape")
def _shape(ctx: InferContext):
    data = ctx.shape(0)
    if data is None:
        return [(INT64, (None,))]
    rank = len(data)
    start, end = ctx.attr("start", 0), ctx.attr("end", rank)
    return [(INT64, (len(range(rank)[start:end]),))]


@shape_rule("Size")
def _size(ctx: InferContext):
    return [(INT64, ())]


# ---- Dropout ------------------------------------------------------------------------------
@importer("Dropout", since=1)
def _dropout_old(node: Node, ctx: ImportContext):
    """Before opset 12: ratio was an attribute (is_test too); before 10 the mask had the
    data's dtype. Canonical: ratio as an input, inference mode, a bool mask."""
    for key in ("is_test", "consumed_inputs"):
        node.attrs.pop(key, None)
    ratio = node.attrs.pop("ratio", None)
    if ratio is not None:
        node.inputs[1:] = [ctx.add_constant(np.float32(ratio), prefix=f"{node.name}_ratio")]
    if ctx.opset < 10 and len(node.outputs) > 1 and node.outputs[1]:
        mask = node.outputs[1]
        node.outputs[1] = ctx.graph.fresh_name(f"{mask}_bool")
        cast = Node("CastLike", [node.outputs[1], node.inputs[0]], [mask], name=f"{node.name}_mask_cast")
        return [node, cast]
    return None


importer("Dropout", since=12)(canonical)


@shape_rule("Dropout")
def _dropout(ctx: InferContext):
    results = [(ctx.dtype(0), ctx.shape(0))]
    if ctx.n_outputs > 1:
        results.append((BOOL, ctx.shape(0)))
    return results
