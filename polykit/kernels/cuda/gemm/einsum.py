"""Einsum tactic (einsum.cu): any 1- or 2-operand equation as one batched strided contraction.

`plan_contraction` turns an equation and the operand shapes into four groups of strided
dims -- batch, M, N, K -- so transposed operands, diagonals (repeated letters), broadcast
dims and ellipses run with no copy and no transpose kernel. supports() is false for
equations of three or more operands (rare in exported models) and for unparsable ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from polykit.compiler.ops.math.math_misc import parse_einsum
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.storage_types import CODE

FILE = "einsum.cu"
DTYPES = ("f32", "f16", "bf16", "f64", "i32", "i64")
MAXD = 4
TILE = 64
MAX_GRID_Z = 65535
GROUPS = ("batch", "m", "n", "k")

#: one strided dim: (size, stride in A, stride in B, stride in Y)
Dim = tuple[int, int, int, int]


@dataclass(frozen=True)
class Contraction:
    """Y[b, m, n] = sum_k A[b, m, k] * B[b, k, n] over groups of strided dims (innermost first)."""

    batch: tuple[Dim, ...]
    m: tuple[Dim, ...]
    n: tuple[Dim, ...]
    k: tuple[Dim, ...]

    def size(self, group: str) -> int:
        return int(np.prod([d[0] for d in getattr(self, group)], dtype=np.int64))


def _labels(term: str, rank: int, n_ell: int) -> list[str]:
    """Per-dim labels of one term; ellipsis dims get labels '.0', '.1', ... right-aligned."""
    head, ell, tail = term.partition("...")
    if not ell:
        return list(term)
    own = rank - len(head) - len(tail)
    return list(head) + [f".{n_ell - own + i}" for i in range(own)] + list(tail)


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def _collapse(dims: list[Dim]) -> tuple[Dim, ...]:
    """Drop size-1 dims and merge neighbours (innermost first) that nest in every tensor."""
    out: list[Dim] = []
    for d in dims:
        if d[0] == 1:
            continue
        if out and all(d[t] == out[-1][t] * out[-1][0] for t in (1, 2, 3)):
            n, a, b, y = out[-1]
            out[-1] = (n * d[0], a, b, y)
        else:
            out.append(d)
    return tuple(out)


def plan_contraction(equation: str, shapes: Sequence[Sequence[int]], out_shape: Sequence[int]) -> Contraction:
    """The batched contraction that computes `equation` over operands of `shapes` (1 or 2)."""
    terms, rhs = parse_einsum(equation, len(shapes))
    n_ell = max([len(s) - len(t.replace("...", "")) for t, s in zip(terms, shapes) if "..." in t], default=0)
    labels = [_labels(t, len(s), n_ell) for t, s in zip(terms, shapes)]
    out_labels = _labels(rhs, len(out_shape), n_ell)
    size: dict[str, int] = {}
    for ls, shape in zip(labels, shapes):
        for c, d in zip(ls, shape):
            size[c] = max(size.get(c, 1), int(d))
    stride: list[dict[str, int]] = []
    for ls, shape in zip(labels, shapes):
        st: dict[str, int] = {}
        for c, d, s in zip(ls, shape, _contiguous_strides(shape)):
            st[c] = st.get(c, 0) + (s if int(d) == size[c] else 0)  # size 1 against n: broadcast
        stride.append(st)
    y_stride = dict(zip(out_labels, _contiguous_strides(out_shape)))
    a, b = stride[0], (stride[1] if len(stride) > 1 else {})
    groups: dict[str, list[Dim]] = {g: [] for g in GROUPS}
    for c in dict.fromkeys(c for ls in labels for c in ls):
        in_b = c in b
        group = ("batch" if c in a and in_b else "m" if c in a else "n") if c in y_stride else "k"
        groups[group].append((size[c], a.get(c, 0), b.get(c, 0), y_stride.get(c, 0)))
    for g, key in (("batch", 3), ("m", 3), ("n", 3), ("k", 1 if a else 2)):
        groups[g].sort(key=lambda d: (d[key], d[1], d[2]))
    return Contraction(*(_collapse(groups[g]) for g in GROUPS))


def _supports(layer) -> bool:
    if not 1 <= len(layer.inputs) <= 2:
        return False
    try:
        parse_einsum(str(layer.attrs.get("equation", "")), len(layer.inputs))
    except ValueError:
        return False
    return True


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"einsum_{c}", FILE) for c in DTYPES]


def _group_args(dims: tuple[Dim, ...]) -> list[int]:
    padded = list(dims) + [(1, 0, 0, 0)] * (MAXD - len(dims))
    return [int(v) for d in padded for v in d]


def enqueue_einsum(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    ops = [tensors[n] for n in layer.inputs]
    y = tensors[layer.outputs[0]]
    code = CODE.get(ops[0].dtype.name)
    if code not in DTYPES or any(t.dtype != ops[0].dtype for t in ops):
        raise DeviceError(f"Einsum has no CUDA kernel for operands of {[str(t.dtype) for t in ops]}", where=where,
                          hint="use --target cpu")
    plan = plan_contraction(str(layer.attrs["equation"]), [t.shape for t in ops], y.shape)
    wide = [g for g in GROUPS if len(getattr(plan, g)) > MAXD]
    if wide:
        raise DeviceError(f"Einsum {layer.attrs['equation']!r} needs more than {MAXD} strided dims in group(s) "
                          f"{wide}", where=where, hint="use --target cpu")
    if y.size == 0:
        return
    m, n, nb = plan.size("m"), plan.size("n"), plan.size("batch")
    grid_y = -(-m // TILE)
    if grid_y > 65535:
        raise DeviceError(f"Einsum with {m} output rows (at most {65535 * TILE})", where=where, hint="use --target cpu")
    a_k_inner = int(bool(plan.k) and plan.k[0][1] == 1 and not (plan.m and plan.m[0][1] == 1))
    b_n_inner = int(bool(plan.n) and plan.n[0][2] == 1)
    args = [ops[0], ops[1] if len(ops) > 1 else 0, y, a_k_inner, b_n_inner]
    for g in GROUPS:
        args += _group_args(getattr(plan, g))
    launcher.launch(KernelSource(f"einsum_{code}", FILE), (-(-n // TILE), grid_y, min(nb, MAX_GRID_Z)), (256, 1, 1),
                    args)


cuda_tactic("Einsum", "cuda.einsum.contraction", kernels=_kernels, supports=_supports)(enqueue_einsum)


def compile_variants() -> list[KernelSource]:
    """The one einsum.cu module (every dtype is an entry point in it)."""
    return _kernels(None)
