"""ai.polykit PermutedCopy: one copy that does a roll, a window, a reshape-transpose-reshape and a roll.

PermutedCopy(x) -> y, x of static shape S (rank R). Attributes (ints; all but `shape` optional):

- `starts` (R, default 0): per axis of x, the first element read, cyclically (in [0, S_a));
- `window` (R, default S): per axis, how many elements are read (1 <= window_a <= S_a);
  so the window W = x[(starts_a + i) mod S_a for i < window_a, on every axis a];
- `view` (default `window`): W reshaped to these dims (same element count);
- `perm` (default identity): a permutation of the view's dims;
- `shape`: the output shape, the permuted view reshaped (same element count);
- `out_shifts` (len(shape), default 0): y is then rolled as torch.roll rolls: y[i] = y'[(i - s) mod n].

    y = roll(reshape(transpose(reshape(W, view), perm), shape), out_shifts)

torch.roll(x, s) is `starts` = -s mod S; x[k] of a Gather with a scalar constant index k on axis a
is starts_a = k, window_a = 1; a window partition (Swin: roll, reshape, transpose, reshape) or a
window merge (reshape, transpose, reshape, roll back) is one PermutedCopy: one pass over the bytes.
polykit.compiler.passes.fuse_movement makes them; the formats are in docs/FUSION.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.registry import InferContext, shape_rule

PERMUTED_COPY = "PermutedCopy"
_HINT = "fuse_movement makes this node; rebuild the plan (or fix the edited attributes)"


@dataclass(frozen=True)
class CopySpec:
    """A PermutedCopy's attributes with their defaults filled in, checked against its input shape."""

    in_shape: tuple[int, ...]
    starts: tuple[int, ...]
    window: tuple[int, ...]
    view: tuple[int, ...]
    perm: tuple[int, ...]
    shape: tuple[int, ...]
    out_shifts: tuple[int, ...]


def _ints(attrs: Mapping[str, Any], key: str, default: Sequence[int] | None) -> tuple[int, ...]:
    value = attrs.get(key, default)
    if value is None:
        raise ValueError(f"attribute {key!r} is missing")
    if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ValueError(f"attribute {key!r} is {value!r}, not a list of integers")
    return tuple(int(v) for v in value)


def copy_spec(attrs: Mapping[str, Any], in_shape: Sequence[int]) -> CopySpec:
    """The filled-in, validated attributes of a PermutedCopy reading a tensor of `in_shape`
    (ValueError naming what is wrong)."""
    in_shape = tuple(int(d) for d in in_shape)
    rank = len(in_shape)
    starts = _ints(attrs, "starts", (0,) * rank)
    window = _ints(attrs, "window", in_shape)
    if len(starts) != rank or len(window) != rank:
        raise ValueError(f"starts {starts} and window {window} need one entry per input axis ({rank})")
    if any(not 0 <= s < max(d, 1) for s, d in zip(starts, in_shape)):
        raise ValueError(f"starts {starts} must lie in [0, dim) of the input shape {in_shape}")
    if any(not 0 <= w <= d for w, d in zip(window, in_shape)):
        raise ValueError(f"window {window} must lie in [0, dim] of the input shape {in_shape}")
    view = _ints(attrs, "view", window)
    perm = _ints(attrs, "perm", tuple(range(len(view))))
    if sorted(perm) != list(range(len(view))):
        raise ValueError(f"perm {perm} is not a permutation of the view's {len(view)} dims")
    shape = _ints(attrs, "shape", tuple(view[p] for p in perm))
    out_shifts = _ints(attrs, "out_shifts", (0,) * len(shape))
    if len(out_shifts) != len(shape):
        raise ValueError(f"out_shifts {out_shifts} need one entry per output axis ({len(shape)})")
    if any(d < 0 for d in (*view, *shape)) or not math.prod(window) == math.prod(view) == math.prod(shape):
        raise ValueError(f"window {window}, view {view} and shape {shape} must hold the same number of elements")
    return CopySpec(in_shape, starts, window, view, perm, shape, out_shifts)


@shape_rule(PERMUTED_COPY, domain=POLYKIT_DOMAIN)
def _permuted_copy(ctx: InferContext):
    if ctx.n_inputs != 1 or not ctx.has(0) or ctx.n_outputs != 1:
        raise ctx.fail("PermutedCopy takes one tensor and gives one", hint=_HINT)
    shape = ctx.shape(0)
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise ctx.fail(f"PermutedCopy needs a static input shape, has {shape}", hint=_HINT)
    try:
        spec = copy_spec(ctx.node.attrs, shape)
    except ValueError as exc:
        raise ctx.fail(str(exc), hint=_HINT) from None
    return [(ctx.dtype(0), spec.shape)]
