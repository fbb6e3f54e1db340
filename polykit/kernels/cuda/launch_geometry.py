"""Launch geometry shared by the elementwise-style families: the block size, the grid for n
elements, and iteration spaces with size-1 dims dropped and contiguous neighbours merged
(a set of broadcast tensors, or a copy's source and destination strides)."""

from __future__ import annotations

from typing import Sequence

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
