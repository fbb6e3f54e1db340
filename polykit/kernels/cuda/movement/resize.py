"""Resize tactic (resize.cu): nearest / linear / cubic, every coordinate mode (tf_crop_and_resize
with roi and extrapolation_value), antialias, exclude_outside and keep_aspect_ratio_policy.

The host only packs metadata (shapes, which axes are resized, where each axis's scale comes
from); the scales / sizes / roi values stay on the device and the kernel reads them, so
enqueue neither allocates nor synchronizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, defines, places_last_axis
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for
from polykit.kernels.cuda.storage_types import CODE

FILE = "resize.cu"
#: dtype code -> CUDA storage type (dtypes.cuh)
DTYPES = {"f32": "float", "f16": "half_t", "bf16": "bf16_t", "f64": "double", "u8": "u8", "i8": "i8"}
MODES = {"nearest": "NEAREST", "linear": "LINEAR", "cubic": "CUBIC"}
MAXR = 8
COORD = {"half_pixel": 0, "half_pixel_symmetric": 1, "pytorch_half_pixel": 2, "align_corners": 3, "asymmetric": 4,
         "tf_half_pixel_for_nn": 5, "tf_crop_and_resize": 6}
NEAREST = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}
ROI = {"float32": 1, "float64": 2, "float16": 3}
#: where an axis's scale comes from (the kernel's `src`)
SCALE_SRC = {"host": 0, "scales": 1, "not_larger": 2, "not_smaller": 3}


def supports(layer) -> bool:
    a = layer.attrs
    if (a.get("mode", "nearest") not in MODES or a.get("coordinate_transformation_mode", "half_pixel") not in COORD
            or a.get("nearest_mode", "round_prefer_floor") not in NEAREST
            or a.get("keep_aspect_ratio_policy", "stretch") not in ("stretch", "not_larger", "not_smaller")):
        return False
    dtypes = getattr(layer, "in_dtypes", ())
    return not dtypes or CODE.get(dtypes[0]) in DTYPES


#: at most this many blocks in a fast launch (about four waves of 256-thread blocks on 132 SMs): each block
#: walks many rows, so a thread's set-up (its W taps, a double division) is paid once per column, not per row
FAST_BLOCKS = 4096

#: rows a fast block takes at a time (compiled in as resize.cu's RESIZE_FAST_ROWS: their H taps computed at once,
#: one a thread: at most BLOCK)
FAST_ROWS = 32

#: modes with a fast kernel (resize.cu's RESIZE_FAST: two adjacent axes, no antialias / exclude / crop)
FAST_MODES = ("nearest", "linear")


def kernel_source(mode: str, code: str, fast: bool = False) -> KernelSource:
    """The one-kernel compile unit of `mode` for dtype `code` (`fast`: the two-axis kernel)."""
    name = f"resize_{'fast_' if fast else ''}{mode}_{code}"
    extra = {"RESIZE_FAST_ROWS": FAST_ROWS} if fast else {}
    return KernelSource(name, FILE, defines=defines(RESIZE_KERNEL=name, RESIZE_T=DTYPES[code], RESIZE_MODE=MODES[mode],
                                                    RESIZE_FAST=int(fast), **extra))


def _kernels(layer) -> list[KernelSource]:
    modes = tuple(MODES) if layer is None else (layer.attrs.get("mode", "nearest"),)
    dtypes = getattr(layer, "in_dtypes", ()) if layer is not None else ()
    codes = (CODE[dtypes[0]],) if dtypes and CODE.get(dtypes[0]) in DTYPES else tuple(DTYPES)
    return [kernel_source(m, c, fast) for m in modes for c in codes for fast in (False, True)
            if not fast or m in FAST_MODES]


@dataclass(frozen=True)
class ResizeGeometry:
    """What the host tells the kernel about one Resize launch (everything but the pointers)."""

    mode: str
    code: str                     # dtype code (DTYPES)
    rank: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    slot: tuple[int, ...]         # per axis: index into scales/sizes/roi, -1 for an axis left alone
    host_scale: tuple[float, ...]  # per axis: out/in (used where src is "host" or the axis is left alone)
    n_axes: int                   # len(axes): roi holds n_axes starts then n_axes ends
    src: int                      # SCALE_SRC value
    roi_code: int                 # ROI value, 0 without roi
    coord: int
    rule: int
    cubic_a: float
    exclude: int
    antialias: int
    extrapolation: float
    empty: int                    # x has no element but y has some: y is zeros

    def fast_axes(self) -> tuple[int, int] | None:
        """(dh, dw) for resize.cu's fast kernel: the one (dh -1) or two adjacent axes whose length
        changes, every other axis keeping its length (one with a device scale is checked on the
        device); None where the general kernel must run (cubic, antialias or exclude_outside on a
        linear resize, tf_crop_and_resize, an aspect policy, an empty input, other axes)."""
        if (self.mode not in FAST_MODES or self.empty or self.coord == COORD["tf_crop_and_resize"]
                or self.src not in (SCALE_SRC["host"], SCALE_SRC["scales"])
                or (self.mode == "linear" and (self.antialias or self.exclude))):
            return None
        changed = [d for d in range(self.rank) if self.in_shape[d] != self.out_shape[d]]
        if len(changed) == 1:
            return -1, changed[0]
        if len(changed) == 2 and changed[1] == changed[0] + 1:
            return changed[0], changed[1]
        return None

    def args(self, x, y, scales, sizes, roi) -> list:
        """Kernel arguments; x/y/scales/sizes/roi are DeviceTensors or 0 (absent); y's rows of its last
        dim lie y.rows_apart(last) elements apart (a Concat's slice where y is placed there). With
        fast_axes, the fast kernel's (dh, dw, outer, inner) come before `empty`."""
        pad = lambda v, fill: list(v) + [fill] * (MAXR - len(v))  # noqa: E731
        fast = self.fast_axes()
        extra = []
        if fast is not None:
            dh, dw = fast
            first = dw if dh < 0 else dh
            extra = [dh, dw, int(np.prod(self.in_shape[:first], dtype=np.int64)),
                     int(np.prod(self.in_shape[dw + 1:], dtype=np.int64))]
        return [x, y, scales, sizes, roi, self.roi_code, self.n_axes, int(np.prod(self.out_shape, dtype=np.int64)),
                self.rank, *pad(self.in_shape, 1), *pad(self.out_shape, 1), *pad(self.slot, -1),
                *[np.float64(h) for h in pad(self.host_scale, 1.0)], self.src, self.coord, self.rule,
                np.float64(self.cubic_a), self.exclude, self.antialias, np.float64(self.extrapolation), *extra,
                self.empty, y.rows_apart(self.out_shape[-1] if self.out_shape else 1)]

    def launch_shape(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(grid, block) of the launch: the fast kernel's columns x rows (block BX x BY, BX * BY = BLOCK,
        BX the columns rounded up to a warp, at most BLOCK; FAST_ROWS rows a block at a time, at most
        FAST_BLOCKS blocks, the rows strided),
        else grid_for's one dimension."""
        fast = self.fast_axes()
        if fast is None:
            return grid_for(int(np.prod(self.out_shape, dtype=np.int64))), (BLOCK, 1, 1)
        dh, dw = fast
        cols = self.out_shape[dw] * int(np.prod(self.out_shape[dw + 1:], dtype=np.int64))
        rows = int(np.prod(self.out_shape[:dw], dtype=np.int64))
        bx = min(BLOCK, -(-cols // 32) * 32)
        by = BLOCK // bx
        gx = -(-cols // bx)
        return (gx, max(1, min(-(-rows // FAST_ROWS), FAST_BLOCKS // gx)), 1), (bx, by, 1)


def _optional(layer, tensors: Mapping[str, DeviceTensor], i: int) -> DeviceTensor | None:
    t = tensors.get(layer.inputs[i]) if len(layer.inputs) > i and layer.inputs[i] else None
    return None if t is None or t.size == 0 else t


def resize_geometry(layer, x: DeviceTensor, y: DeviceTensor, scales: DeviceTensor | None,
                    sizes: DeviceTensor | None, roi: DeviceTensor | None) -> ResizeGeometry:
    """Check a Resize launch and pack its metadata (no device access)."""
    where = f"layer {layer.name!r}"
    a = layer.attrs
    if not supports(layer):
        raise DeviceError("this Resize mode has no CUDA kernel", where=where, hint="use --target cpu")
    code = CODE.get(x.dtype.name)
    if code not in DTYPES:
        raise DeviceError(f"Resize has no CUDA kernel for {x.dtype}", where=where, hint="use --target cpu")
    rank = len(x.shape)
    if rank > MAXR or len(y.shape) != rank:
        raise DeviceError(f"input rank {rank} / output rank {len(y.shape)} (at most {MAXR}, equal)", where=where,
                          hint="use --target cpu")
    axes = [int(v) % rank for v in a.get("axes", [])] or list(range(rank))
    if (scales is None) == (sizes is None):
        raise DeviceError("Resize needs exactly one of 'scales' and 'sizes'", where=where,
                          hint="leave the other input empty (\"\")")
    given = scales if scales is not None else sizes
    if given.size != len(axes):
        raise DeviceError(f"{'scales' if scales is not None else 'sizes'} has {given.size} values for "
                          f"{len(axes)} resized axes", where=where)
    if scales is not None and scales.dtype != np.float32:
        raise DeviceError(f"scales of dtype {scales.dtype} (float32 expected)", where=where)
    if sizes is not None and sizes.dtype != np.int64:
        raise DeviceError(f"sizes of dtype {sizes.dtype} (int64 expected)", where=where)
    if roi is not None and (roi.size != 2 * len(axes) or roi.dtype.name not in ROI):
        raise DeviceError(f"roi of {roi.size} {roi.dtype} values (expected {2 * len(axes)} floats)", where=where)
    slot = [-1] * rank
    for k, d in enumerate(axes):
        slot[d] = k
    policy = a.get("keep_aspect_ratio_policy", "stretch")
    src = "scales" if scales is not None else ("host" if policy == "stretch" else policy)
    return ResizeGeometry(
        mode=a.get("mode", "nearest"), code=code, rank=rank, in_shape=tuple(x.shape),
        out_shape=tuple(y.shape), slot=tuple(slot),
        host_scale=tuple(y.shape[d] / x.shape[d] if x.shape[d] else 1.0 for d in range(rank)),
        n_axes=len(axes), src=SCALE_SRC[src], roi_code=ROI[roi.dtype.name] if roi is not None else 0,
        coord=COORD[a.get("coordinate_transformation_mode", "half_pixel")],
        rule=NEAREST[a.get("nearest_mode", "round_prefer_floor")], cubic_a=float(a.get("cubic_coeff_a", -0.75)),
        exclude=int(bool(a.get("exclude_outside", 0))), antialias=int(bool(a.get("antialias", 0))),
        extrapolation=float(a.get("extrapolation_value", 0.0)), empty=int(x.size == 0))


def enqueue_resize(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    roi, scales, sizes = (_optional(layer, tensors, i) for i in (1, 2, 3))
    geo = resize_geometry(layer, x, y, scales, sizes, roi)
    if y.size == 0:
        return
    grid, block = geo.launch_shape()
    launcher.launch(kernel_source(geo.mode, geo.code, geo.fast_axes() is not None), grid, block,
                    geo.args(x, y, scales or 0, sizes or 0, roi or 0))


cuda_tactic("Resize", "cuda.resize", kernels=_kernels, supports=supports, places=places_last_axis)(enqueue_resize)


def compile_variants() -> list[KernelSource]:
    return _kernels(None)
