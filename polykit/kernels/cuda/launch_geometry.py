"""Launch geometry shared by the elementwise-style families: the block size, the grid for n
elements, and iteration spaces with size-1 dims dropped and contiguous neighbours merged
(a set of broadcast tensors, or a copy's source and destination strides)."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

BLOCK = 256


def merge_dims(dims: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous in every stride list."""
    keep = [k for k, d in enumerate(dims) if d != 1]
    dims = [dims[k] for k in keep]
    strides = [[s[k] for k in keep] for s in strides]
    k = len(dims) - 1
    while k > 0:
        if all(s[k - 1] == s[k] * dims[k] for s in strides):
            dims[k - 1] *= dims[k]
            for s in strides:
                s[k - 1] = s[k]
                del s[k]
            del dims[k]
        k -= 1
    if not dims:
        return [1], [[0] for _ in strides]
    return dims, strides


def broadcast_geometry(shapes: Sequence[tuple[int, ...]], n_out: int):
    """Collapse the broadcast iteration space of `shapes` (inputs then outputs).

    Returns (n, dims, strides per tensor, zero-masks per output): dims innermost last;
    adjacent dims merge when every tensor is contiguous (or broadcast) across them."""
    rank = max((len(s) for s in shapes), default=0)
    full = [1] * rank
    for s in shapes:
        for k, d in enumerate(s):
            full[rank - len(s) + k] = max(full[rank - len(s) + k], d)
    n = int(np.prod(full, dtype=np.int64)) if full else 1
    per = []
    for s in shapes:
        padded = (1,) * (rank - len(s)) + tuple(s)
        st, acc = [0] * rank, 1
        for k in range(rank - 1, -1, -1):
            st[k] = 0 if padded[k] == 1 else acc
            acc *= padded[k]
        per.append(st)
    dims, strides = merge_dims(full, per)
    zm = [sum(1 << d for d in range(len(dims)) if strides[len(shapes) - n_out + j][d] == 0 and dims[d] > 1)
          for j in range(n_out)]
    return n, dims, strides, zm


def grid_for(n: int, per_thread: int = 1) -> tuple[int, int, int]:
    return (max(1, min(-(-n // (BLOCK * per_thread)), 65535 * 16)), 1, 1)


def _dense(padded: Sequence[int]) -> list[int]:
    st, acc = [0] * len(padded), 1
    for k in range(len(padded) - 1, -1, -1):
        st[k] = 0 if padded[k] == 1 else acc
        acc *= padded[k]
    return st


def _factors(extent: int, sizes: list[list[int]]) -> list[int]:
    """The common refinement (outer first) of one dim's piece splits (each a list of sizes,
    outer first); ValueError when they do not nest."""
    cuts = sorted({math.prod(s[k:]) for s in sizes for k in range(1, len(s))} | {1, extent})
    if any(b % a for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"the view operands split a dim of {extent} at {cuts}, which do not nest")
    return [b // a for a, b in reversed(list(zip(cuts, cuts[1:])))]


def _piece_stride(pieces: list[list[int]], inner: int) -> int:
    """The element stride of a factor whose inner factors multiply to `inner`, inside `pieces`."""
    below = 1
    for size, stride in reversed(pieces):
        if inner < below * size:
            return stride * (inner // below)
        below *= size
    return 0


def view_geometry(shapes: Sequence[tuple[int, ...]], n_out: int, views: Mapping[int, Sequence[tuple[int, list]]]):
    """broadcast_geometry where the tensors in `views` (index -> per logical dim (shift, pieces),
    polykit.compiler.ops.nn.view_operands) read through a view of their source.

    An unshifted dim is split into the common refinement of the views' pieces (dims of the
    iteration space of their own: plain strides for every tensor); a shifted dim stays one, and a
    view reads it with (shift, inner piece size or 0, outer piece stride), its ordinary stride the
    inner one. Returns (n, dims, strides per tensor, zero-masks per output, {view index: (shifts,
    inner sizes, outer strides)}), dims merged where every list allows; ValueError when the views
    need what the kernel does not do (a shifted dim of over two pieces, splits that do not nest)."""
    rank = max((len(s) for s in shapes), default=0)
    full = [1] * rank
    for s in shapes:
        for k, d in enumerate(s):
            full[rank - len(s) + k] = max(full[rank - len(s) + k], d)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    vdims = {i: [(0, [[1, 0]])] * (rank - len(v)) + [(sh, [list(p) for p in ps]) for sh, ps in v]
             for i, v in views.items()}
    dims: list[int] = []
    lists: list[list[int]] = [[] for _ in range(len(shapes) + 3 * len(views) + 1)]
    dense = [_dense(p) for p in padded]
    for k in range(rank):
        live = {i: vdims[i][k] for i in views if padded[i][k] > 1}
        shifted = any(sh for sh, _ in live.values())
        factors = [full[k]] if shifted or full[k] == 1 else _factors(full[k], [[p[0] for p in ps]
                                                                               for _, ps in live.values()])
        for f_at, f in enumerate(factors):
            inner = math.prod(factors[f_at + 1:])
            dims.append(f)
            for t in range(len(shapes)):
                if t in live:
                    pieces = live[t][1]
                    lists[t].append(pieces[-1][1] if shifted else _piece_stride(pieces, inner))
                else:
                    lists[t].append(dense[t][k] * inner)
            for v, i in enumerate(sorted(views)):
                sh, pieces = live.get(i, (0, [[1, 0]]))
                if shifted and len(pieces) > 2:
                    raise ValueError(f"a shifted dim read by a view of {len(pieces)} pieces (at most 2)")
                two = shifted and len(pieces) == 2
                for m, value in enumerate((sh, pieces[1][0] if two else 0, pieces[0][1] if two else 0)):
                    lists[len(shapes) + 3 * v + m].append(value)
            lists[-1].append(int(shifted))  # a shifted dim merges with no neighbour
    n = int(np.prod(full, dtype=np.int64)) if full else 1
    dims, merged = merge_dims(dims, lists)
    strides = merged[:len(shapes)]
    zm = [sum(1 << d for d in range(len(dims)) if strides[len(shapes) - n_out + j][d] == 0 and dims[d] > 1)
          for j in range(n_out)]
    extra = {i: tuple(merged[len(shapes) + 3 * v + m] for m in range(3)) for v, i in enumerate(sorted(views))}
    return n, dims, strides, zm, extra
