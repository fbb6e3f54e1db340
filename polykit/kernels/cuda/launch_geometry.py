"""Launch geometry shared by the elementwise-style families: the block size, the grid for n
elements, and the collapsed broadcast iteration space of a set of tensors."""

from __future__ import annotations

from typing import Sequence

import numpy as np

BLOCK = 256


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
    keep = [k for k in range(rank) if full[k] != 1]
    dims = [full[k] for k in keep]
    strides = [[st[k] for k in keep] for st in per]
    k = len(dims) - 1
    while k > 0:
        if all(st[k - 1] == st[k] * dims[k] for st in strides):
            dims[k - 1] *= dims[k]
            for st in strides:
                st[k - 1] = st[k]
                del st[k]
            del dims[k]
        k -= 1
    if not dims:
        dims, strides = [1], [[0] for _ in shapes]
    zm = [sum(1 << d for d in range(len(dims)) if strides[len(shapes) - n_out + j][d] == 0 and dims[d] > 1)
          for j in range(n_out)]
    return n, dims, strides, zm


def grid_for(n: int, per_thread: int = 1) -> tuple[int, int, int]:
    return (max(1, min(-(-n // (BLOCK * per_thread)), 65535 * 16)), 1, 1)
