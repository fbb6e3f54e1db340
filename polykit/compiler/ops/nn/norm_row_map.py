"""ai.polykit LayerNormalization / RMSNormalization writing their rows to permuted positions.

The ONNX op with its attributes (axis, epsilon, stash_type) plus `row_map` (pass
polykit.compiler.passes.norm_row_maps: a row-permuting Transpose / PermutedCopy of the norm's output
folded into it). X is viewed as [R, L] (L = the normalized axes' elements, R rows); the output has
`row_map["shape"]` (R * L elements, its trailing dims L elements) viewed as [R, L], and input row r
is written to output row dest(r):

- `row_map["dims"]`: per row dim, outer first, `{"shift", "pieces"}` (the Pointwise view format of
  docs/FUSION.md, in rows): r splits mixed-radix into digits r_d over the dims' sizes n_d (the
  product of the dim's piece sizes, prod n_d == R); each digit shifts cyclically, j = (r_d + shift)
  mod n_d (a roll), then splits into digits over `pieces` = [[size, stride], ...] (outer first, at
  most 2 a dim), each digit times its stride; dest(r) is the sum over the dims.

dest must be a permutation of [0, R) (checked here, and by the pass that builds the map).

`in_map` (a row-gathering PermutedCopy before the norm folded into it: Swin's patch merging) reads the
norm's logical input `in_map["shape"]` (its trailing dims the normalized ones) from the stored X in
segments of `in_map["segment"]` = S contiguous elements (S divides L): logical segment t (the flat
index of the logical input divided by S, split over the map's dims like a row above, each dim's
digit shifted and split into pieces with strides in segments) is X's elements
(offset + sum of the dims' terms) * S + [0, S). Either map may come alone; only the normalized output
exists (no Mean / InvStdDev outputs).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.view_operands import view_index
from polykit.compiler.ops.nn.fused import decode_json_attrs
from polykit.compiler.ops.registry import InferContext, importer, shape_rule

ROW_MAP = "row_map"
IN_MAP = "in_map"
NORM_KINDS = ("LayerNormalization", "RMSNormalization")
#: row dims a map holds at most (the cuda kernels take that many as arguments)
MAX_ROW_DIMS = 6
_HINT = "pass norm_row_maps makes this attribute; rebuild the plan (or fix the edited attribute)"


def row_dims(row_map: Mapping[str, Any]) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """(n, shift, [(size, stride), ...] outer first) per dim of `row_map`, outer first, checked
    (ValueError naming what is wrong)."""
    dims = row_map.get("dims") if isinstance(row_map, Mapping) else None
    if not isinstance(dims, list) or not 1 <= len(dims) <= MAX_ROW_DIMS:
        raise ValueError(f"row_map needs 1..{MAX_ROW_DIMS} dims, has {dims!r}")
    out = []
    for d in dims:
        pieces = d.get("pieces") if isinstance(d, Mapping) else None
        shift = d.get("shift", 0) if isinstance(d, Mapping) else None
        if not isinstance(pieces, list) or not 1 <= len(pieces) <= 2 or not isinstance(shift, int) \
                or any(not isinstance(p, list) or len(p) != 2 or not all(isinstance(v, int) for v in p)
                       or p[0] < 1 or p[1] < 0 for p in pieces):
            raise ValueError(f"row_map dim {d!r} needs an int shift and 1..2 pieces [size >= 1, stride >= 0]")
        n = math.prod(p[0] for p in pieces)
        if not 0 <= shift < n:
            raise ValueError(f"row_map dim {d!r}: shift must lie in [0, {n})")
        out.append((n, shift, [(int(a), int(b)) for a, b in pieces]))
    return out


def row_destinations(row_map: Mapping[str, Any]) -> np.ndarray:
    """dest(r) for every input row r (int64), from the map's dims."""
    row_dims(row_map)
    return view_index({"offset": 0, "dims": row_map["dims"]}).reshape(-1)


def check_row_map(row_map: Mapping[str, Any], x_shape: Sequence[int], axis: int) -> tuple[int, ...]:
    """The output shape of a norm of X `x_shape` (normalized from `axis`) writing rows by `row_map`;
    ValueError when the map is no permutation of X's rows or the shape does not hold them."""
    shape = row_map.get("shape") if isinstance(row_map, Mapping) else None
    if not isinstance(shape, list) or any(not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError(f"row_map needs the output 'shape' as a list of dims, has {shape!r}")
    length = math.prod(x_shape[axis:])
    rows = math.prod(x_shape[:axis])
    tail = 1
    for k in range(len(shape), 0, -1):
        if tail == length:
            break
        tail *= shape[k - 1]
    if math.prod(shape) != rows * length or tail != length:
        raise ValueError(f"output shape {shape} does not hold {rows} rows of {length} elements as trailing dims")
    dest = row_destinations(row_map)
    if dest.size != rows or not np.array_equal(np.sort(dest), np.arange(rows)):
        raise ValueError(f"row_map's destinations are no permutation of the {rows} rows")
    return tuple(int(d) for d in shape)


for _op in NORM_KINDS:  # an exported graph stores the map as JSON
    importer(_op, since=1, domain=POLYKIT_DOMAIN)(decode_json_attrs)


def input_index(in_map: Mapping[str, Any], x_shape: Sequence[int]) -> np.ndarray:
    """The element of X (flat) each element of the logical input reads (its shape), checked
    (ValueError naming what is wrong)."""
    shape, seg = in_map.get("shape"), in_map.get("segment")
    if not isinstance(shape, list) or any(not isinstance(d, int) or d < 1 for d in shape) \
            or not isinstance(seg, int) or seg < 1 or math.prod(shape) % seg:
        raise ValueError(f"in_map needs a logical 'shape' and a 'segment' dividing it, has {shape!r}, {seg!r}")
    offset = in_map.get("offset", 0)
    row_dims(in_map)
    first = view_index({"offset": offset, "dims": in_map["dims"]}).reshape(-1)
    if first.size * seg != math.prod(shape) or first.min() < 0 or (first.max() + 1) * seg > math.prod(x_shape):
        raise ValueError(f"in_map's {first.size} segments of {seg} do not read the logical {shape} inside X {list(x_shape)}")
    return (first[:, None] * seg + np.arange(seg)).reshape(shape)


def logical_input(attrs: Mapping[str, Any], x_shape: Sequence[int]) -> tuple[int, ...]:
    """The shape the norm normalizes: in_map's logical shape, else X's."""
    return tuple(attrs[IN_MAP]["shape"]) if IN_MAP in attrs else tuple(x_shape)


@shape_rule(*NORM_KINDS, domain=POLYKIT_DOMAIN)
def _mapped_norm(ctx: InferContext):
    x = ctx.shape(0)
    if ctx.n_outputs != 1 or x is None or not all(isinstance(d, int) for d in x):
        raise ctx.fail(f"{ctx.node.op_type} with a row map needs a static X and one output", hint=_HINT)
    try:
        if IN_MAP in ctx.node.attrs:
            x = input_index(ctx.attr(IN_MAP), x).shape
        axis = ctx.normalize_axis(int(ctx.attr("axis", -1)), len(x))
        shape = check_row_map(ctx.attr(ROW_MAP), x, axis) if ROW_MAP in ctx.node.attrs else tuple(x)
    except ValueError as exc:
        raise ctx.fail(str(exc), hint=_HINT) from None
    dtype = ctx.dtype(1) if ctx.node.op_type == "RMSNormalization" and ctx.has(1) else ctx.dtype(0)
    return [(dtype or ctx.dtype(0), shape)]
