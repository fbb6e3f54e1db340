"""Pointwise (1x1, stride 1, unpadded, group 1) channels-last convolutions as skinny GEMMs
(gemm_skinny.cu through gemm_skinny.py): Y [NB*H*W, N] = X [NB*H*W, C] x W[N, C]^T + bias.

Tactics `cuda.conv_nhwc.skinny_<BM>x<BN>` (kind ConvNHWC, compute capability 8.0+) for float16 /
bfloat16 layers with C % 8 == 0 and C <= gemm_skinny.MAX_K: the mobile nets' expand and project
convolutions (M up to 401,408 pixels at batch 32, C and N of 16..320), which are memory-bound.
The KRSC weight [N, 1, 1, C] is the kernel's K-contiguous W; the bias its C (scn 1). Y's rows
may lie further apart than N (gemm_skinny.cu's LDY): a Concat's slice (places_last_axis).
"""

from __future__ import annotations

from typing import Any, Mapping

from polykit.kernels.cuda.base import KernelSource, cuda_tactic, places_last_axis
from polykit.kernels.cuda.conv.conv_sm90 import ConvGemm, conv_operands, plan_conv
from polykit.kernels.cuda.gemm.epilogue import supports_epilogue
from polykit.kernels.cuda.gemm.gemm_skinny import ARCHS, ELEMS, TILES, SkinnyTile, kernel_for, launch, skinny_us
from polykit.kernels.cuda.gemm.gemm_sm90 import storage_of


def plan_pointwise(attrs: Mapping[str, Any], x: tuple[int, ...], w: tuple[int, ...],
                   y: tuple[int, ...]) -> ConvGemm | None:
    """The GEMM of a ConvNHWC that is a pointwise convolution (1x1 kernel, stride 1, no padding,
    group 1, C % 8 == 0: every output pixel is its input pixel's row times W), else None."""
    geo = plan_conv(attrs, x, w, y)
    if geo is None or w[1:3] != (1, 1) or geo.strides != (1, 1) or geo.pads != (0, 0):
        return None
    return geo if (geo.OH, geo.OW) == (geo.H, geo.W) else None


def _geometry(layer: Any) -> ConvGemm | None:
    shapes, outs = getattr(layer, "in_shapes", ()), getattr(layer, "out_shapes", ())
    if len(shapes) < 2 or not outs:
        return None
    return plan_pointwise(layer.attrs, tuple(shapes[0]), tuple(shapes[1]), tuple(outs[0]))


def _storage(layer: Any) -> str | None:
    return storage_of(layer, 3)


def _supports(tile: SkinnyTile):
    def supports(layer: Any) -> bool:
        geo = _geometry(layer)
        return (_storage(layer) in ELEMS and geo is not None and tile.fits(geo.K, False)
                and supports_epilogue(layer))

    return supports


def _kernels(tile: SkinnyTile):
    return lambda layer: [kernel_for(layer, tile, ELEMS[_storage(layer)], False)]


def _estimate(tile: SkinnyTile):
    def estimate(layer: Any, sm_count: int) -> float | None:
        geo = _geometry(layer)
        return None if geo is None or not sm_count else skinny_us(tile, geo.M, geo.N, geo.K, sm_count)

    return estimate


def _enqueue(tile: SkinnyTile):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, Any]) -> None:
        X, Wt, B, Y, geo = conv_operands(layer, tensors, plan_pointwise, "the pointwise convolution kernel")
        launch(layer, tile, launcher, tensors, X, Wt, B, Y, geo.M, geo.N, geo.K, False, (0, 1), 1.0, 1.0)

    return enqueue


def compile_variants() -> list[KernelSource]:
    """None of its own: the kernels are gemm_skinny.py's (B_KN 0 for every tile)."""
    return []


for _tile in TILES:
    cuda_tactic("ConvNHWC", f"cuda.conv_nhwc.skinny_{_tile.label}", kernels=_kernels(_tile), supports=_supports(_tile),
                priority=30, archs=ARCHS, estimate=_estimate(_tile), places=places_last_axis,
                params={"bm": _tile.bm, "bn": _tile.bn})(_enqueue(_tile))
