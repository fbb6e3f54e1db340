"""2:4 sparse tensor-core GEMM (sparse24.cu): the sparse variants of Gemm, MatMul and 1x1
Conv / ConvNHWC layers (polykit.compiler.builder.sparsity), their weight compressed at build
time (polykit.compiler.plan.sparse24: values [N, K/2] + the PTX metadata of mma.sp m16n8k32).

Tactic (kinds Gemm, MatMul, Conv, ConvNHWC; params sparse24 = 1, so it serves only sparse
variants and they only it):
  cuda.gemm.sparse24   mma.sp.sync m16n8k32, fp16 operands, fp32 accumulation, fp16 storage;
                       layers built with precision "fp16"; bias (Gemm C / Conv B, a vector
                       along the output features) and the layer's epilogue in the kernel.
                       64 x 64 output tiles, 32 K a step, no split-K (correctness first).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.plan.sparse24 import ATTR, KINDS, K_STEP, is_pointwise_conv
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, kernel_source, supports_epilogue

FILE = "sparse24.cu"
KERNEL = "gemm_sparse24"
#: output features x tokens a block computes, and its threads
TILE_F, TILE_T, THREADS = 64, 64, 128
MAX_GRID = 65535


def compile_variants() -> list[KernelSource]:
    return [KernelSource(KERNEL, file=FILE, defines=defines(ELEM="half_t"))]


def kernels(layer: Any) -> list[KernelSource]:
    return [kernel_source(layer, KERNEL, FILE, "half_t")]


#: the kinds whose input 2 is their own bias (Gemm's C, a Conv's B); a MatMul's input 2 is an epilogue operand
BIAS_KINDS = ("Gemm", "Conv", "ConvNHWC")


def has_bias(layer: Any) -> bool:
    return layer.kind in BIAS_KINDS and len(layer.inputs) > 2 and bool(layer.inputs[2])


def _bias_ok(layer: Any, n: int) -> bool:
    """No bias, or one vector along the output features (Gemm's C [N] / [1, N], a Conv's B)."""
    if not has_bias(layer):
        return True
    shape = tuple(layer.in_shapes[2]) if layer.in_shapes else ()
    return shape in ((n,), (1, n)) and (not layer.in_dtypes or layer.in_dtypes[2] == "float16")


def supports(layer: Any) -> bool:
    record = layer.attrs.get(ATTR)
    if record is None or record.get("dtype") != "float16" or layer.precision != "fp16" or record["k"] % K_STEP:
        return False
    if layer.in_dtypes and (layer.in_dtypes[0] != "float16" or layer.out_dtypes[0] != "float16"):
        return False
    if layer.kind == "Gemm" and (int(layer.attrs.get("transA", 0)) or layer.in_shapes and len(layer.in_shapes[0]) != 2):
        return False
    if layer.kind == "MatMul" and layer.in_shapes and len(layer.in_shapes[0]) < 2:
        return False
    if layer.kind in ("Conv", "ConvNHWC") and not is_pointwise_conv(layer.kind, layer.attrs, tuple(record["shape"])):
        return False
    return _bias_ok(layer, record["n"]) and supports_epilogue(layer)


def geometry(layer: Any, x_shape: tuple[int, ...]) -> dict[str, int]:
    """Tokens T, items and the element strides of X and Y (sparse24.cu's header) for the layer."""
    k, n = layer.attrs[ATTR]["k"], layer.attrs[ATTR]["n"]
    if layer.kind == "Conv":  # NCHW 1x1: a GEMM per image, tokens the pixels
        pixels = int(np.prod(x_shape[2:]))
        return {"T": pixels, "items": x_shape[0], "sxb": k * pixels, "sxt": 1, "sxk": pixels,
                "syb": n * pixels, "syt": 1, "syf": pixels}
    tokens = int(np.prod(x_shape[:-1]))  # MatMul / Gemm rows, ConvNHWC pixels: the K axis is last
    return {"T": tokens, "items": 1, "sxb": 0, "sxt": k, "sxk": 1, "syb": 0, "syt": n, "syf": 1}


def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    record = layer.attrs[ATTR]
    k, n = record["k"], record["n"]
    x, wc, y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    bias = tensors[layer.inputs[2]] if has_bias(layer) else None  # a fused MatMul's input 2 is its epilogue's
    axis = 1 if layer.kind == "Conv" else -1
    if x.dtype != np.float16 or y.dtype != np.float16 or len(x.shape) < 2 or x.shape[axis] != k:
        raise DeviceError(f"the sparse GEMM takes float16 X [..., {k}] and Y, not X {x.dtype} {list(x.shape)}, "
                          f"Y {y.dtype}", where=where, hint="build without --sparsity, or run on --target cpu")
    if wc.dtype != np.uint8 or wc.ptr % 16 or int(np.prod(wc.shape)) != n * k + n * (k // 16) * 2:
        raise DeviceError(f"the compressed weight ({wc.dtype} {list(wc.shape)}, 16-byte aligned: {wc.ptr % 16 == 0}) "
                          f"is not the uint8 form of a [{n}, {k}] float16 weight", where=where, hint="rebuild the plan")
    geo = geometry(layer, tuple(x.shape))
    if geo["T"] == 0 or n == 0:
        return
    if geo["items"] > MAX_GRID or -(-n // TILE_F) > MAX_GRID:
        raise DeviceError(f"{geo['items']} images or {n} features are past the grid", where=where,
                          hint="run this layer on --target cpu")
    vec = int(geo["sxk"] == 1 and geo["sxt"] % 8 == 0 and x.ptr % 16 == 0)
    alpha = float(layer.attrs.get("alpha", 1.0)) if layer.kind == "Gemm" else 1.0
    beta = float(layer.attrs.get("beta", 1.0)) if layer.kind == "Gemm" else 1.0
    ylast = y.shape[-1] if y.shape else 1
    args = [x, wc, bias if bias is not None else 0, y, np.int64(geo["T"]), np.int64(n), np.int64(k),
            *(np.int64(geo[key]) for key in ("sxb", "sxt", "sxk", "syb", "syt", "syf")),
            np.float32(alpha), np.float32(beta), np.int64(ylast), np.int64(vec)]
    grid = (-(-geo["T"] // TILE_T), -(-n // TILE_F), geo["items"])
    launcher.launch(kernels(layer)[0], grid, (THREADS,), args + epilogue_args(layer, tensors, np.dtype(np.float16)))


for _kind in KINDS:
    cuda_tactic(_kind, "cuda.gemm.sparse24", kernels=kernels, supports=supports, priority=-5,
                params={"sparse24": 1, "tile_f": TILE_F, "tile_t": TILE_T, "tile_k": K_STEP})(enqueue)
