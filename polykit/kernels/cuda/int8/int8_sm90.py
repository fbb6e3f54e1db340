"""INT8 convolutions on Hopper tensor cores: conv_sm90.cu's `conv_sm90` with I8 1 (docs/INT8.md).

Tactics `cuda.int8.sm90_<BM>x<BN>` (kind QConvNHWC, compute capability 9.0): the fp16 sm90
implicit GEMM (warp-specialized, TMA weights, cp.async im2col rows, persistent) on
`wgmma.mma_async m64nNk32.s32.s8.s8` (twice fp16's rate), 128 K a stage (16 channels a 16-byte
chunk: QConvNHWC's C % 16), int32 accumulators, and int8.cu's output (int8_out.cuh): the float64
dequantization rounded once, the epilogue, requantization; results equal `cpu.reference` bit for bit.
Taken: int8 X and W with zero points 0 (the layer's `symmetric` attribute, stamped by
to_channels_last from the constant zero points: what `--int8` builds make), group 1, per-tensor or
per-channel scale / bias, float32 / int8 / uint8 output, an epilogue epilogue.py compiles.
The rest (uint8, asymmetric, QMatMul's [K, N] weights) stays with `cuda.int8.mma_*`. Priority 5,
below the mma tactic's 10: level 0 keeps mma.sync, the tuner times it against the best sm90 tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.int8 import SYMMETRIC, Y_SYMMETRIC
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, TensorMapSpec, cuda_tactic
from polykit.kernels.cuda.conv.conv_sm90 import CONV_TILES, ConvGemm, plan_conv
from polykit.kernels.cuda.gemm.epilogue import epilogue_args
from polykit.kernels.cuda.gemm.gemm_sm90 import ARCHS, ROW_BYTES, Sm90Tile, kernel_for, predicted_us
from polykit.kernels.cuda.int8.int8 import (MAX_INT8_K, NHWC_CHANNELS, half_layer, int8_args, out_defines, residual_layer,
                                          supports)

KIND = "QConvNHWC"
#: the tiles (gemm_sm90's: 128x128, 128x256, 128x64, 64x128 and 64x64 two blocks an SM; 64x64x2 for
#: the 64-channel convolutions, where fp16 takes it too), and INT8's own 128x64 two blocks an SM: for
#: the short-K 1x1 layers, whose time is the epilogue (one K stage a tile), four consumer warpgroups
#: an SM where 128x128 has two (conv_sm90.cu moves the registers: no spill at 80 a thread)
TILES = tuple(t for t in CONV_TILES if t.label in ("128x128", "128x256", "128x64", "64x128x2", "64x64x2")) + (
    Sm90Tile(1, 2, 64, 4, blocks=2, tflops=340),)
#: s8 wgmma runs twice fp16's rate: the cost model sees half the K
RATE = 2
#: outputs a microsecond one SM's 8-bit epilogue finishes (dequantize, residual, requantize: issue-bound), by
#: consumer warpgroups an SM w, as EPI_RATE * sqrt(w), counted in whole tiles a wave: H100, 2026-12-07, the FP8
#: fast GEMM 128x256 (w 2; F8_NATIVE, TILE_INPUTS) on ResNet-50 bs32's 1x1 64 -> 256 with an e4m3 residual and
#: output in 56.6 us, 25.7 M outputs on 132 SMs in whole tiles: 3440 a microsecond an SM / sqrt(2). INT8 takes the
#: same rate, an ESTIMATE not fitted to INT8 timings: its output rounds by one conversion (Y_ZERO 0: 21.6
#: instructions an output with an int8 residual on conv 128x256, where FP8's e4m3 one issues 24.3; cuda_sass.py)
EPI_RATE = 2430.0


def _geometry(layer: Any):
    shapes, outs = getattr(layer, "in_shapes", ()), getattr(layer, "out_shapes", ())
    if len(shapes) < 3 or not outs:
        return None
    return plan_conv(layer.attrs, tuple(shapes[0]), tuple(shapes[2]), tuple(outs[0]))


def _supports(tile: Sm90Tile):
    def supported(layer: Any) -> bool:
        if layer.kind != KIND or not layer.in_dtypes or not supports(layer) or not layer.attrs.get(SYMMETRIC):
            return False
        geo = _geometry(layer)
        return (layer.in_dtypes[0] == "int8" and layer.in_dtypes[2] == "int8" and geo is not None
                and geo.C % NHWC_CHANNELS == 0 and geo.K <= MAX_INT8_K and tile.fits("int8", False, False))

    return supported


def kernel(layer: Any, tile: Sm90Tile, y_dtype: str | None = None, steps: tuple[int, int] | None = None
           ) -> KernelSource:
    """conv_sm90 with the tile's defines, I8 1 and the output compiled in (int8.out_defines: its type,
    the scale's and bias's steps, from `y_dtype` / `steps` or the record): the epilogue tests no flag
    for them (one path, fewer registers)."""
    source = kernel_for(layer, tile, "float", False, "conv_sm90", int8=True)
    return replace(source, defines=tuple(sorted(source.defines + out_defines(layer, y_dtype, steps))))


def _kernels(tile: Sm90Tile):
    return lambda layer: [kernel(layer, tile)]


def _estimate(tile: Sm90Tile):
    """predicted_us on half the K (RATE), plus the epilogue at EPI_RATE * sqrt(w) outputs a microsecond an SM, the
    outputs one SM finishes counted as whole tiles a wave (`blocks` an SM): a last wave that leaves SMs idle costs
    the busy ones a whole tile's epilogue all the same (ResNet-50 bs32's layer3 1x1 256 -> 1024, M 6272: 128x256
    makes 1.48 waves, 128x128 2.97; alone on an H100 the fast FP8 tiles took 22.8 and 18.8 us, 2026-12-07, and in
    the INT8 plan of the same day 128x256, which outputs / SMs ranked first, took 38.3 us on layer3's first 1x1
    512 -> 256 where FP8's 128x128 took 19.2). The INT8 and FP8 tiles (fp8_sm90.py, fp8_conv_sm90.py,
    fp8_gemm_sm90.py, int8_gemm_sm90.py) all take it."""
    def estimate(layer: Any, sm_count: int) -> float | None:
        geo = _geometry(layer)
        if geo is None or not sm_count:
            return None
        width = math.sqrt(tile.consumers * tile.blocks)
        units = -(-geo.M // tile.bm) * -(-geo.N // tile.bn)
        per_sm = -(-units // max(1, tile.blocks * sm_count)) * tile.blocks * tile.bm * tile.bn
        return predicted_us(tile, geo.M, geo.N, max(1, geo.K // RATE), 1, sm_count) + per_sm / (EPI_RATE * width)

    return estimate


@dataclass(frozen=True)
class Int8Launch:
    """An INT8 or FP8 layer's device tensors as the sm90 kernels take them (this module's, int8_gemm_sm90.py's, and
    through fp8_sm90.fp8_launch the FP8 ones)."""

    x: DeviceTensor
    w: DeviceTensor
    y: DeviceTensor
    geo: ConvGemm | None  # plan_conv's geometry (None: conv_sm90 cannot run it)
    out: list[Any]  # the kernels' I8_PARAMS: scale, bias, Y scale, Y zero point, flags, scale step, bias step
    steps: tuple[int, int]  # the scale's and bias's steps compiled in (int8.out_defines; bias 2: none)


def int8_launch(layer: Any, tensors: Mapping[str, DeviceTensor], *checks: Any) -> Int8Launch | None:
    """The layer's kernel arguments (int8_args checks dtypes, shapes, per-channel sizes; `checks`: its operand types,
    largest K and float outputs, INT8's by default), or None when its output is empty (nothing to launch)."""
    g, args = int8_args(layer, tensors, *checks)
    x, w, _xz, _wz, scale, bias, y_scale, y_zero, y = args[:9]
    flags, _wz_step, scale_step, bias_step = args[-4:]
    if g["M"] == 0 or g["N"] == 0:
        return None
    steps = (int(scale_step), int(bias_step) if isinstance(bias, DeviceTensor) else 2)
    return Int8Launch(x, w, y, plan_conv(layer.attrs, x.shape, w.shape, y.shape),
                      [scale, bias, y_scale, y_zero, flags, scale_step, bias_step], steps)


def _enqueue(tile: Sm90Tile):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        run = int8_launch(layer, tensors)
        if run is None:
            return
        x, w, y, geo = run.x, run.w, run.y, run.geo
        if geo is None or x.dtype != np.int8 or w.dtype != np.int8:
            raise DeviceError(f"X {x.shape} {x.dtype} * W {w.shape} {w.dtype} does not fit the sm90 INT8 kernel "
                              "(int8 NHWC X, KRSC W, group 1)", where=f"layer {layer.name!r}",
                              hint="the cuda.int8.mma_* tactics take it")
        tm_w = TensorMapSpec(w.ptr, w.dtype, (geo.K, geo.N, 1), (geo.K, geo.N * geo.K), (ROW_BYTES, tile.bn, 1))
        tiles = -(-geo.M // tile.bm) * -(-geo.N // tile.bn)
        launcher.launch(kernel(layer, tile, y.dtype.name, run.steps), (tile.grid(tiles, launcher.sm_count),),
                        (tile.threads,),
                        [tm_w, x, 0, y, *geo.args(), *run.out] + epilogue_args(layer, tensors, np.dtype(np.float32)),
                        shared_mem=tile.smem_for("int8", False, False))

    return enqueue


#: the shapes a build stamps on compile_variants' layers: a 1x1 conv of 16 channels on 1 x 8 x 8 pixels
_STAMPED = {"x": (1, 8, 8, 16), "w": (16, 1, 1, 16), "s": (16,), "skip": (1, 8, 8, 16)}


def _stamp(layer: Any) -> Any:
    """`layer` (residual_layer's or half_layer's names) with _STAMPED's shapes."""
    return replace(layer, in_shapes=tuple(_STAMPED.get(n, ()) for n in layer.inputs), out_shapes=(_STAMPED["x"],))


def _shaped_residual_layer(residual: str) -> Any:
    """residual_layer with the shapes a build stamps (a 1x1 conv of 16 channels): its residual is
    read at the output index, so the kernel gets the 16-byte epilogue (apply_epilogue8)."""
    return _stamp(residual_layer(KIND, residual))


def compile_variants() -> list[KernelSource]:
    """conv_sm90 I8 for every tile; the first tile with each residual epilogue int8.py builds in,
    read 8 at a time (shapes stamped), and with its int8 residual read through a general broadcast
    (shapes unknown: the per-element path only); int8 out (Y_OUT), the int8 residual also uint8 and
    float32 out, the float32 one float32; every tile's int8 output with a constant 0 zero point (Y_ZERO 0, what
    --int8 builds stamp), the first tile's also read at run time and with the int8 residual; the first tile's
    float16 output (CI: sm_90a)."""
    plain = replace(residual_layer(KIND, "int8"), attrs={})
    out = [kernel(zero_y(plain), t, "int8") for t in TILES] + [kernel(plain, TILES[0], "int8")]
    outputs = {"float32": ("int8", "float32"), "int8": ("int8", "uint8", "float32")}  # (per-channel scale, no bias)
    out += [kernel(_shaped_residual_layer(r), TILES[0], y) for r, ys in outputs.items() for y in ys]
    out += [kernel(zero_y(_shaped_residual_layer("int8")), TILES[0], "int8")]
    out += [kernel(shaped_half_layer(), TILES[0], "float16")]  # Relu, float16 out (Y_OUT 3)
    return out + [kernel(residual_layer(KIND, "int8"), TILES[0], "int8")]


def shaped_half_layer() -> Any:
    """int8.half_layer (Relu, a float16 output) with the shapes a build stamps (a 1x1 conv of 16 channels)."""
    layer = _stamp(half_layer(KIND))
    return replace(layer, attrs={**layer.attrs, SYMMETRIC: 1, "kernel_shape": [1, 1]})


def zero_y(layer: Any) -> Any:
    """`layer` stamped as to_channels_last stamps a requantized output whose zero point is a constant 0."""
    return replace(layer, attrs={**layer.attrs, Y_SYMMETRIC: 1})


for _tile in TILES:
    cuda_tactic(KIND, f"cuda.int8.sm90_{_tile.label}", kernels=_kernels(_tile), supports=_supports(_tile),
                priority=5, archs=ARCHS, estimate=_estimate(_tile), domain=POLYKIT_DOMAIN,
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": ROW_BYTES, "msub": _tile.msub,
                        "consumers": _tile.consumers, "stages": _tile.stages})(_enqueue(_tile))
