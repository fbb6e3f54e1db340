"""ai.polykit PermutedCopy on the cuda target (permuted_copy.cu): one strided pass for a roll, a
window, a transpose across reshapes and an output roll (polykit.compiler.ops.tensor.permuted_copy).

The host turns the layer's attributes into the kernel's three index phases (`copy_phases`: output
roll, permutation, window), each reduced to the fewest dims (neighbours that move together merge)
and skipped when it does nothing; a contiguous innermost run moves up to 16 bytes per thread when
every phase keeps it whole and the pointers are aligned (`widened`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.tensor.permuted_copy import PERMUTED_COPY, CopySpec, copy_spec
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for, merge_dims
from polykit.kernels.cuda.movement.movement import contiguous_strides
from polykit.kernels.cuda.reduce.reduce import unit

FILE = "permuted_copy.cu"
MAXR = 8
SIZES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class CopyPhases:
    """The kernel's index tables, innermost dim last; an empty phase is skipped by the kernel."""

    out_dims: tuple[int, ...]   # phase 1: output dims and their roll offsets ((-shift) mod dim)
    out_offsets: tuple[int, ...]
    fine_dims: tuple[int, ...]  # phase 2: permuted view dims and their strides in the window
    fine_strides: tuple[int, ...]
    win_dims: tuple[int, ...]   # phase 3: window dims, starts, input dims, input strides
    win_starts: tuple[int, ...]
    in_dims: tuple[int, ...]
    in_strides: tuple[int, ...]


def _out_phase(spec: CopySpec) -> tuple[list[int], list[int]]:
    dims, offs = [], []
    for d, s in zip(spec.shape, spec.out_shifts):
        o = (-s) % d if d else 0
        if d == 1:
            continue
        if dims and o == 0 and offs[-1] == 0:
            dims[-1] *= d
        else:
            dims.append(d)
            offs.append(o)
    return ([], []) if not any(offs) else (dims, offs)


def _fine_phase(spec: CopySpec) -> tuple[list[int], list[int]]:
    vs = contiguous_strides(spec.view)
    dims, (fs,) = merge_dims([spec.view[p] for p in spec.perm], [[vs[p] for p in spec.perm]])
    return ([], []) if len(dims) == 1 and fs[0] == 1 else (dims, fs)


def _window_phase(spec: CopySpec) -> tuple[list[int], ...]:
    ss = contiguous_strides(spec.in_shape)
    axes = [[w, s, d, t] for w, s, d, t in zip(spec.window, spec.starts, spec.in_shape, ss) if d != 1]
    merged: list[list[int]] = []
    for w, s, d, t in reversed(axes):  # innermost first: an axis read whole from 0 folds into its outer neighbour
        if merged and merged[-1][0] == merged[-1][2] and merged[-1][1] == 0 and t == merged[-1][3] * merged[-1][2]:
            inner = merged[-1]
            merged[-1] = [w * inner[2], s * inner[2], d * inner[2], inner[3]]
        else:
            merged.append([w, s, d, t])
    merged.reverse()
    if not merged or (len(merged) == 1 and merged[0][0] == merged[0][2] and merged[0][1] == 0 and merged[0][3] == 1):
        return [], [], [], []
    return [list(col) for col in zip(*merged)]


def copy_phases(spec: CopySpec) -> CopyPhases:
    """The three index phases of `spec` (host logic, testable without a GPU)."""
    od, oo = _out_phase(spec)
    fd, fs = _fine_phase(spec)
    wd, st, sd, ss = _window_phase(spec)
    return CopyPhases(*(tuple(v) for v in (od, oo, fd, fs, wd, st, sd, ss)))


def widened(spec: CopySpec, itemsize: int, ptrs: Sequence[int]) -> tuple[CopySpec, int]:
    """`spec` over elements of up to 16 bytes when the input's innermost axis is read whole, stays the
    innermost dim of the view and of the output, is not rolled, and every pointer is aligned."""
    if not spec.in_shape or not spec.view or not spec.shape:
        return spec, itemsize
    inner = spec.in_shape[-1]
    whole = spec.starts[-1] == 0 and spec.window[-1] == inner and spec.perm[-1] == len(spec.view) - 1 \
        and spec.out_shifts[-1] == 0
    for size in (16, 8, 4, 2):
        f = size // itemsize
        if size <= itemsize or not whole:
            break
        if all(d % f == 0 for d in (inner, spec.view[-1], spec.shape[-1])) and all(p % size == 0 for p in ptrs):
            last = lambda dims: (*dims[:-1], dims[-1] // f)
            return replace(spec, in_shape=last(spec.in_shape), window=last(spec.window), view=last(spec.view),
                           shape=last(spec.shape)), size
    return spec, itemsize


def _pad8(v: Sequence[int]) -> list[int]:
    return list(v) + [1] * (MAXR - len(v))


def kernel(es: int) -> KernelSource:
    return KernelSource(f"permuted_copy_{es}", FILE, defines=unit(str(es)))


def enqueue_permuted_copy(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    where = f"layer {layer.name!r}"
    if y.size == 0:
        return
    if x.dtype.itemsize not in SIZES[:-1]:
        raise DeviceError(f"no PermutedCopy kernel for {x.dtype.itemsize}-byte elements", where=where,
                          hint="use --target cpu")
    try:
        spec = copy_spec(layer.attrs, x.shape)
    except ValueError as exc:
        raise DeviceError(f"PermutedCopy attributes do not fit the input {tuple(x.shape)}: {exc}", where=where,
                          hint="rebuild the plan") from None
    spec, es = widened(spec, x.dtype.itemsize, (x.ptr, y.ptr))
    ph = copy_phases(spec)
    if max(len(ph.out_dims), len(ph.fine_dims), len(ph.win_dims)) > MAXR:
        raise DeviceError(f"a PermutedCopy over more than {MAXR} non-mergeable dims", where=where,
                          hint="use --target cpu")
    n = math.prod(spec.shape)
    args = [x, y, n, len(ph.out_dims), *_pad8(ph.out_dims), *_pad8(ph.out_offsets), len(ph.fine_dims),
            *_pad8(ph.fine_dims), *_pad8(ph.fine_strides), len(ph.win_dims), *_pad8(ph.win_dims),
            *_pad8(ph.win_starts), *_pad8(ph.in_dims), *_pad8(ph.in_strides)]
    launcher.launch(kernel(es), grid_for(n), (BLOCK, 1, 1), args)


def _kernels(layer) -> list[KernelSource]:
    return [kernel(es) for es in SIZES]


cuda_tactic(PERMUTED_COPY, "cuda.movement.permuted_copy", kernels=_kernels, domain=POLYKIT_DOMAIN)(
    enqueue_permuted_copy)


def compile_variants() -> list[KernelSource]:
    """Every element size of permuted_copy.cu (16 bytes: a widened contiguous run)."""
    return _kernels(None)
