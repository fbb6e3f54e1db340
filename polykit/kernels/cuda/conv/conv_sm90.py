"""Channels-last convolution on Hopper tensor cores: `conv_sm90` (conv_sm90.cu).

Tactics `cuda.conv_nhwc.sm90_<BM>x<BN>` (kind ConvNHWC, compute capability 9.0) run a
group-1 2-D ai.polykit ConvNHWC with float16/bfloat16 storage, or float32 storage in a layer of
precision "tf32" (--tf32: tf32 wgmma on the same tiles, half the K elements per stage) or, as
`cuda.conv_nhwc.sm90x3_<BM>x<BN>`, of precision "fp32" (3xTF32: fp32 accuracy, gemm_sm90.py), and
C % 8 == 0 (the
to_channels_last pass pads the 3-channel stem to 8) as an implicit GEMM on the same
warp-specialized wgmma consumers as the GEMM tactics: GEMM M = NB * OH * OW output pixels,
N = output channels, K = KH * KW * C. The KRSC weight is B, read by TMA; the producer
warpgroup gathers A (im2col rows, 16 bytes = 8 (tf32: 4) channels of one tap at a time) with cp.async.
Tiles are gemm_sm90's with BM <= 128 (a 256-row tile would make each producer thread track 16
rows, more registers than a producer has). Y's rows lie LDY elements apart (a runtime argument: N,
or a channels-last Concat's channel total where the output is placed in its slice, places_last_axis);
the pair and 16-byte stores check their alignment at run time and fall back to narrower ones. X's
pixels lie LDX elements apart (C, or a Concat's channel total where X is a skip placed in its slice
that this conv reads too: reads_placed where LDX and the slice's offset keep the cp.async chunks
16-byte aligned). A ConvNHWC with depth_to_space whose Y has C % 8 == 0 runs too (D2S_H / D2S_W
variants: the epilogue's row and column terms of the store address change, nothing else).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ops.nn.channels_last import DEPTH_TO_SPACE, conv_output_shape
from polykit.compiler.ops.nn.conv import window_geometry
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import (DeviceTensor, KernelSource, TensorMapSpec, cuda_tactic, defines, places_last_axis,
                                       reads_last_axis)
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, supports_epilogue
from polykit.kernels.cuda.gemm.gemm_sm90 import (ARCHS, BK, ELEMS, FILES, TILES, X3_TILES, Sm90Tile, bk_of, kernel_for,
                                            predicted_us, storage_of)

#: 32 output channels a tile (wgmma m64n32k16): a conv with N <= 32 (UNet's and the stems' full-resolution
#: layers) leaves half of a 64-column tile's products unused; 16-bit storage and N <= 32 only
NARROW_TILES = (Sm90Tile(1, 2, 32, 8, tflops=250), Sm90Tile(1, 1, 32, 8, blocks=2, tflops=230))
CONV_TILES = tuple(t for t in TILES if t.bm <= 128 and t.bn != 192) + NARROW_TILES  # 128x192 serves GEMMs whose N/192 tiles fill the chip
X3_CONV_TILES = tuple(t for t in X3_TILES if t.bm <= 128)


@dataclass(frozen=True)
class ConvGemm:
    """A ConvNHWC as the implicit GEMM sees it (sizes in elements)."""

    M: int
    N: int
    K: int
    H: int
    W: int
    C: int
    OH: int
    OW: int
    KW: int
    strides: tuple[int, int]
    pads: tuple[int, int]
    dilations: tuple[int, int]
    #: elements between output pixels' rows of Y (conv_sm90.cu's LDY); 0: dense (N)
    ldy: int = 0
    #: elements between input pixels of X (conv_sm90.cu's LDX); 0: dense (C)
    ldx: int = 0

    def args(self) -> list[Any]:
        i32 = np.int32
        return [self.M, self.N, self.K, i32(self.H), i32(self.W), i32(self.C), i32(self.OH), i32(self.OW),
                i32(self.KW), i32(self.strides[0]), i32(self.strides[1]), i32(self.pads[0]), i32(self.pads[1]),
                i32(self.dilations[0]), i32(self.dilations[1]), self.ldy or self.N, self.ldx or self.C]


def plan_conv(attrs: Mapping[str, Any], x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...]) -> ConvGemm | None:
    """The implicit-GEMM geometry of a ConvNHWC (X [NB, H, W, C], W [M, KH, KW, C], Y [NB, OH,
    OW, M]; with depth_to_space [bH, bW] Y [NB, OH * bH, OW * bW, M / (bH * bW)], its channels a
    multiple of 8 so no pair or 16-byte store leaves a block), or None when conv_sm90 cannot run it."""
    if len(x) != 4 or len(w) != 4 or len(y) != 4 or int(attrs.get("group", 1)) != 1:
        return None
    NB, H, W, C = x
    M, KH, KW, Cw = w
    if Cw != C or C % 8 or min(NB, H, W, C, M, KH, KW) <= 0:
        return None
    try:
        geo = window_geometry(attrs, (H, W), (KH, KW), where="conv_sm90")
    except Exception:  # the shape rules already reject these: not this tactic's to report
        return None
    if DEPTH_TO_SPACE in attrs:  # Y stored depth-to-space: blocks of C % 8 == 0 channels
        if y[3] % 8:
            return None
        y = conv_output_shape(attrs, y)
    out = ConvGemm(NB * y[1] * y[2], M, KH * KW * C, H, W, C, y[1], y[2], KW, tuple(geo.strides),
                   tuple(geo.pads_begin), tuple(geo.dilations))
    if max(out.M, out.K, NB * H * W * C) >= 2**31 or y[3] != M:
        return None
    return out


def _geometry(layer: Any) -> ConvGemm | None:
    shapes = getattr(layer, "in_shapes", ())
    outs = getattr(layer, "out_shapes", ())
    if len(shapes) < 2 or not outs:
        return None
    return plan_conv(layer.attrs, tuple(shapes[0]), tuple(shapes[1]), tuple(outs[0]))


def _storage(layer: Any, split3: bool = False) -> str | None:
    return storage_of(layer, 3, split3)


def _supports(tile: Sm90Tile, split3: bool):
    def supports(layer: Any) -> bool:
        storage = _storage(layer, split3)
        geo = _geometry(layer)
        if tile in NARROW_TILES and (storage not in ("float16", "bfloat16") or geo is None or geo.N > tile.bn):
            return False  # past 32 channels a 64-column tile wastes no more and runs at a higher rate
        return (storage is not None and tile.fits(storage, False, split3) and geo is not None
                and supports_epilogue(layer))

    return supports


def _kernels(tile: Sm90Tile, split3: bool):
    return lambda layer: [kernel_for(layer, tile, ELEMS[_storage(layer, split3)], False, "conv_sm90", split3)]


def _estimate(tile: Sm90Tile, split3: bool):
    def estimate(layer: Any, sm_count: int) -> float | None:
        geo = _geometry(layer)
        if geo is None or not sm_count:
            return None
        return predicted_us(tile, geo.M, geo.N, geo.K, 1, sm_count, _storage(layer, split3) == "float32", split3)

    return estimate


def conv_operands(layer: Any, tensors: Mapping[str, DeviceTensor], plan: Any = plan_conv,
                  what: str = "the sm90 convolution kernel") -> tuple[Any, ...]:
    """X, W, the bias (or None), Y of a ConvNHWC layer and its geometry by `plan` (ValueError when
    the shapes do not fit `what`)."""
    X, Wt, Y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    B = tensors.get(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] else None
    geo = plan(layer.attrs, X.shape, Wt.shape, Y.shape)
    if geo is None:
        raise ValueError(f"shapes {X.shape} * {Wt.shape} do not fit {what}")
    return X, Wt, B, Y, geo


def _enqueue(tile: Sm90Tile, split3: bool):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        X, Wt, B, Y, geo = conv_operands(layer, tensors)
        es = np.dtype(Wt.dtype).itemsize
        ldx = X.rows_apart(geo.C)  # a skip placed in a Concat's output: its pixels that far apart
        if X.row_stride and ((ldx * es) % 16 or X.ptr % 16):
            raise DeviceError(f"X's pixels {ldx} elements apart at {X.ptr:#x} break the 16-byte A loads",
                              where=f"layer {layer.name!r}", hint="rebuild the plan (reads_placed refuses these)")
        geo = replace(geo, ldy=Y.rows_apart(Y.shape[-1]), ldx=ldx)  # rows in a Concat's output where placed there
        tm_w = TensorMapSpec(Wt.ptr, Wt.dtype, (geo.K, geo.N, 1), (geo.K * es, geo.N * geo.K * es),
                             (bk_of(Wt.dtype), tile.bn, 1))
        tiles = -(-geo.M // tile.bm) * -(-geo.N // tile.bn)
        storage = np.dtype(Y.dtype).name
        kernel = kernel_for(layer, tile, ELEMS[storage], False, "conv_sm90", split3)
        args = [tm_w, X, B if B is not None else 0, Y, *geo.args()] + epilogue_args(layer, tensors, Y.dtype)
        launcher.launch(kernel, (tile.grid(tiles, launcher.sm_count),), (tile.threads,), args,
                        shared_mem=tile.smem_for(storage, False, split3))

    return enqueue


def reads_aligned(split3: bool):
    def reads(layer: Any, index: int, row: int, stride: int, offset: int) -> bool:
        """Tactic.reads_placed: X's pixels read by 16-byte cp.async, so the rows (whole pixels) must
        keep each chunk 16-byte aligned: stride and offset (into a 256-byte aligned root) too."""
        es = {"float16": 2, "bfloat16": 2, "float32": 4}.get(_storage(layer, split3) or "", 0)
        return bool(es) and reads_last_axis(layer, index, row, stride, offset) and not (stride * es) % 16 \
            and not (offset * es) % 16

    return reads


def compile_variants() -> list[KernelSource]:
    """conv_sm90 for every tile (fp16), the first tile (bf16, float/tf32) and every 3xTF32 tile."""
    file = FILES["conv_sm90"]
    out = [KernelSource("conv_sm90", file=file, defines=defines(ELEM="half_t") + t.defines(False), arch="sm_90a")
           for t in CONV_TILES]
    out += [KernelSource("conv_sm90", file=file, defines=defines(ELEM=e) + CONV_TILES[0].defines(False),
                         arch="sm_90a") for e in ("bf16_t", "float")]
    out += [KernelSource("conv_sm90", file=file, defines=defines(ELEM="float") + t.defines(False, True),
                         arch="sm_90a") for t in X3_CONV_TILES]
    # depth-to-space stores: a two-consumer (16-byte path) and a one-consumer tile, fp16; bf16
    d2s = defines(D2S_H=2, D2S_W=2)
    out += [KernelSource("conv_sm90", file=file, defines=defines(ELEM="half_t") + t.defines(False) + d2s, arch="sm_90a")
            for t in (CONV_TILES[0], CONV_TILES[2])]
    return out + [KernelSource("conv_sm90", file=file, defines=defines(ELEM="bf16_t") + CONV_TILES[0].defines(False)
                               + defines(D2S_H=2, D2S_W=3), arch="sm_90a")]


for _tiles, _prefix, _split3 in ((CONV_TILES, "sm90", False), (X3_CONV_TILES, "sm90x3", True)):
    for _tile in _tiles:
        cuda_tactic("ConvNHWC", f"cuda.conv_nhwc.{_prefix}_{_tile.label}", kernels=_kernels(_tile, _split3),
                    supports=_supports(_tile, _split3), priority=30, archs=ARCHS, estimate=_estimate(_tile, _split3),
                    places=places_last_axis, reads_placed=reads_aligned(_split3), depth_to_space=True,
                    params={"bm": _tile.bm, "bn": _tile.bn, "bk": BK, "msub": _tile.msub,
                            "consumers": _tile.consumers, "stages": _tile.stages})(_enqueue(_tile, _split3))
