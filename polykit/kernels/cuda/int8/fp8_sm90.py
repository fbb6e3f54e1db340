"""FP8 convolutions on Hopper tensor cores: conv_sm90.cu's `conv_sm90` with F8 1 (docs/INT8.md "FP8").

Tactics `cuda.fp8.sm90_<BM>x<BN>` (kind QConvNHWC, compute capability 9.0) run FP8 layers
(float8_e4m3fn X and W, zero points 0, precision "fp8"): the INT8 sm90 implicit GEMM (TMA weights,
cp.async im2col rows, warp-specialized, persistent; int8_sm90.py) on `wgmma.mma_async
m64nNk32.f32.e4m3.e4m3` (both operands K-major bytes, 128 K a stage), each stage's products added to
fp32 accumulators on the CUDA cores (gemm_sm90_core.cuh F8: the tensor cores' own FP8 accumulation
keeps fewer bits), then int8_out.cuh's output on the float sums: `fl(fl(acc * scale[n]) + B[n])`,
the epilogue, and a float32 store or a saturating round-to-nearest-even e4m3 store of
`v / Y_scale` (QuantizeLinear's, by cvt.rn.satfinite.e4m3x2.f32), or a float16 store when the epilogue
ends in a Cast to float16 (passes/absorb_quantized_casts.py: an --fp16 build's Cast after the layer).
Taken: group 1, C % 16, per-tensor or per-channel scale / bias, an epilogue epilogue.py compiles whose
extra inputs are float32, e4m3 (an identity block's residual read as the 8-bit tensor its producer
wrote, dequantized in the epilogue by fold_qdq.dequantizing_steps: lowp.cuh's exact e4m3 decode, then
the scale) or float16 (a half residual the epilogue casts to float32 itself).
Results differ from the cpu reference (the exact sum rounded once) by the float32 summation order
and the tensor cores' accumulation inside a stage; tests/kernels/cuda/test_fp8_sm90.py states the
tolerance. An FP8 QMatMul with a constant [K, N] weight (K % 16) reaches them as a 1x1 QConvNHWC
over its rows (to_channels_last packs W K-major at build time); other FP8 QMatMuls and NCHW QConvs
have no cuda tactic: the builder unfolds them (their Q/DQ run as layers and the op in float).
fp8_gemm_sm90.py runs the same layers where the conv is a GEMM over rows (1x1, stride 1, unpadded) on
gemm_sm90.cu, both operands by TMA, with wider tiles (priority below these); fp8_conv_sm90.py runs every layer
these take on the same kernel with a stage promoted in pieces and wider tiles (priority below both).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.int8 import QUANT_ARITY, SCALE, BIAS, W_ZERO_POINT
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, TensorMapSpec, cuda_tactic, defines
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, supports_epilogue
from polykit.kernels.cuda.gemm.gemm_sm90 import ARCHS, ROW_BYTES, Sm90Tile, kernel_for
from polykit.kernels.cuda.conv.conv_sm90 import CONV_TILES
from polykit.kernels.cuda.int8.int8 import NHWC_CHANNELS, RESIDUALS, out_defines
from polykit.kernels.cuda.int8.int8_sm90 import Int8Launch, _estimate, _geometry, int8_launch

KIND = "QConvNHWC"
E4M3 = "float8_e4m3fn"
#: no overflow to guard against (float sums); the im2col index math is int32 in K
MAX_FP8_K = 1 << 30
#: the output types (int8_out.cuh's Y_OUT 0, 1 and 3) and the epilogue's extra input types (epilogue.extra_types)
OUTPUTS = ("float32", E4M3, "float16")
EPILOGUE_INPUTS = ("float32", E4M3, "float16")
#: the tiles: one stage's products need a second block of BN / 2 registers beside the accumulators
#: (mainloop_f8), so the 256-column and the two-blocks-an-SM 128-column tiles are left out (fp8_conv_sm90.py: wider
#: tiles with the stage promoted in pieces)
TILES = tuple(t for t in CONV_TILES if t.label in ("128x128", "128x64", "64x64x2"))


def _supports(tile: Sm90Tile):
    def supported(layer: Any) -> bool:
        if layer.kind != KIND or layer.precision != "fp8" or not layer.in_dtypes or not supports_epilogue(layer):
            return False
        ins, shapes = layer.in_dtypes, layer.in_shapes
        if ins[0] != E4M3 or ins[2] != E4M3 or layer.out_dtypes[0] not in OUTPUTS:
            return False
        if any(len(shapes[s]) > 1 for s in (W_ZERO_POINT, SCALE, BIAS)) or int(layer.attrs.get("group", 1)) != 1:
            return False
        if any(d not in EPILOGUE_INPUTS for d in ins[QUANT_ARITY:]):
            return False
        geo = _geometry(layer)
        return geo is not None and geo.C % NHWC_CHANNELS == 0 and tile.fits("int8", False, False)

    return supported


def kernel(layer: Any, tile: Sm90Tile, y_dtype: str | None = None, steps: tuple[int, int] | None = None,
           pieces: int = 1, bufs: int = 1, fast: bool = False) -> KernelSource:
    """conv_sm90 with the tile's defines, F8 1 (the epilogue's float is float) and the output compiled
    in (int8.out_defines: its type, the scale's and bias's steps); `pieces` > 1 (fp8_conv_sm90.py's tiles):
    F8_PIECES / F8_BUFS, a stage promoted in pieces (gemm_sm90_core.cuh mainloop_f8_pieces); `fast`: F8_FAST 1
    (fp8_conv_sm90.py's fast tiles: no promotion)."""
    source = kernel_for(layer, tile, "float", False, "conv_sm90")
    extra = defines(F8=1) + (defines(F8_PIECES=pieces, F8_BUFS=bufs) if pieces > 1 else ())
    extra += defines(F8_FAST=1) if fast else ()
    return replace(source, defines=tuple(sorted(source.defines + extra + out_defines(layer, y_dtype, steps))))


def fp8_launch(layer: Any, tensors: Mapping[str, DeviceTensor]) -> Int8Launch | None:
    """The layer's kernel arguments (int8_sm90.int8_launch with e4m3 operands, FP8's largest K, float32 / float16
    outputs), or None when its output is empty (nothing to launch)."""
    return int8_launch(layer, tensors, (E4M3,), MAX_FP8_K, ("float32", "float16"))


def enqueue_conv(tile: Sm90Tile, pieces: int = 1, bufs: int = 1, fast: bool = False):
    """The enqueue of a conv_sm90 F8 tactic on `tile` (`pieces`, `bufs`, `fast`: kernel's)."""

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        run = fp8_launch(layer, tensors)
        if run is None:
            return
        x, w, y, geo = run.x, run.w, run.y, run.geo
        if geo is None:
            raise DeviceError(f"X {x.shape} * W {w.shape} does not fit the sm90 FP8 kernel (e4m3 NHWC X, KRSC W, "
                              "group 1)", where=f"layer {layer.name!r}", hint="run this layer on --target cpu")
        tm_w = TensorMapSpec(w.ptr, w.dtype, (geo.K, geo.N, 1), (geo.K, geo.N * geo.K), (ROW_BYTES, tile.bn, 1))
        tiles = -(-geo.M // tile.bm) * -(-geo.N // tile.bn)
        launcher.launch(kernel(layer, tile, y.dtype.name, run.steps, pieces, bufs, fast),
                        (tile.grid(tiles, launcher.sm_count),),
                        (tile.threads,),
                        [tm_w, x, 0, y, *geo.args(), *run.out] + epilogue_args(layer, tensors, np.dtype(np.float32)),
                        shared_mem=tile.smem_for("int8", False, False))

    return enqueue


#: an --fp16 build's FP8 layer after absorb_quantized_casts: a float16 residual cast to float32 in the epilogue, Add,
#: Relu, the result cast to float16 (stored as float16)
HALF_RESIDUAL = [{"op": "Cast", "inputs": ["skip"], "outputs": ["f"], "attrs": {"to": 1}},
                 {"op": "Add", "inputs": ["raw", "f"], "outputs": ["s"], "attrs": {}},
                 {"op": "Relu", "inputs": ["s"], "outputs": ["r"], "attrs": {}},
                 {"op": "Cast", "inputs": ["r"], "outputs": ["y"], "attrs": {"to": 10}}]


def fp8_layer(y_dtype: str = "float32", residual: str | None = None, shapes: bool = True) -> Any:
    """A stamped FP8 QConvNHWC (a 1x1 conv of 16 channels) writing `y_dtype` (e4m3: requantized), with a
    residual + Relu epilogue when `residual` names the residual's dtype (float32; e4m3 dequantized by a scale:
    an identity block's; float16: HALF_RESIDUAL, whose output is float16), read 8 at a time when `shapes`,
    else through the general broadcast (compile variants, tests)."""
    from polykit.compiler.plan.records import LayerDesc

    requant = y_dtype == E4M3
    extra = () if residual is None else ("skip", "skip_scale") if residual == E4M3 else ("skip",)
    names = ("x", "xz", "w", "wz", "s", "", "ys" if requant else "", "yz" if requant else "")
    dtypes = (E4M3, E4M3, E4M3, E4M3, "float32", "", "float32" if requant else "", E4M3 if requant else "",
              *(residual, "float32")[:len(extra)])
    known = {"x": (1, 8, 8, 16), "w": (16, 1, 1, 16), "s": (16,), "skip": (1, 8, 8, 16), "ys": (), "yz": (),
             "skip_scale": ()}
    attrs: dict = {"kernel_shape": [1, 1]}
    if residual is not None:
        body = {"float32": RESIDUALS["float32"], E4M3: RESIDUALS["int8"], "float16": HALF_RESIDUAL}[residual]
        attrs["epilogue"] = {"input": "raw", "body": body}
    inputs = (*names, *extra)
    return LayerDesc("fp8", KIND, inputs, ("y",), attrs, domain=POLYKIT_DOMAIN, precision="fp8", in_dtypes=dtypes,
                     out_dtypes=(y_dtype,), in_shapes=tuple(known.get(n, ()) for n in inputs) if shapes else (),
                     out_shapes=((1, 8, 8, 16),) if shapes else ())


def compile_variants() -> list[KernelSource]:
    """conv_sm90 F8 for every tile (float32 and e4m3 outputs compiled in); the first tile with a float32 and an
    e4m3 residual epilogue (e4m3 out) and a float16 one (float16 out), each read 8 at a time and through the
    general broadcast (CI: sm_90a)."""
    out = [kernel(fp8_layer(y), t) for t in TILES for y in ("float32", E4M3)]
    return out + [kernel(fp8_layer(y, residual=r, shapes=s), TILES[0])
                  for y, r in ((E4M3, "float32"), (E4M3, E4M3), ("float16", "float16")) for s in (True, False)]


for _tile in TILES:
    cuda_tactic(KIND, f"cuda.fp8.sm90_{_tile.label}", kernels=lambda layer, t=_tile: [kernel(layer, t)],
                supports=_supports(_tile), priority=5, archs=ARCHS, estimate=_estimate(_tile), domain=POLYKIT_DOMAIN,
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": ROW_BYTES, "msub": _tile.msub,
                        "consumers": _tile.consumers, "stages": _tile.stages})(enqueue_conv(_tile))
