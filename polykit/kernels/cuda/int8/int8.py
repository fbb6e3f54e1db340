"""INT8 layers on tensor cores (int8.cu on int8_mma.cuh): ai.polykit QMatMul, QConv and QConvNHWC
(docs/INT8.md, "The contract of a cuda INT8 tactic").

Tactics (one per kind, mma.sync m16n8k32 s8 with int32 accumulation, sm_80+):
  cuda.int8.mma_matmul     QMatMul: X [..., M, K] (rows folded into M), W [K, N] (2-D, constant or not)
  cuda.int8.mma_conv_nhwc  QConvNHWC: X NHWC with C % 16 == 0, W KRSC (to_channels_last makes both)
  cuda.int8.mma_conv_nchw  QConv: 2-D, group 1, X NCHW gathered byte by byte (a layout the
                           channels-last pass did not convert; slower than the NHWC kernel)
(int8_sm90.py adds `cuda.int8.sm90_*` for symmetric int8 QConvNHWC on sm_90a: s8 wgmma;
int8_splitk.py `cuda.int8.mma_matmul_sk*`, QMatMul split along K.)
int8 and uint8 activations and weights, zero points per tensor or per channel, scale and bias per
tensor or per channel, float32 output or fused requantization to int8/uint8, an epilogue compiled
in (epilogue.py); a float16 output where the epilogue ends in a Cast to float16 (an --fp16 build's Cast
after the layer, passes/absorb_quantized_casts.py), compiled in (int8_out.cuh Y_OUT 3, `half_out`). Results
equal the cpu reference (`cpu.reference`) bit for bit: the centered sum is exact and the dequantization runs in float32 with the reference's roundings (int8_out.cuh).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.conv import window_geometry
from polykit.compiler.ops.quant.int8 import (BIAS, SCALE, W, W_ZERO_POINT, X, X_ZERO_POINT, Y_SCALE, Y_SYMMETRIC,
                                             Y_ZERO_POINT)
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, kernel_source, supports_epilogue

FILE = "int8.cu"
#: kind -> its kernel
KERNELS = {"QMatMul": "int8_matmul", "QConvNHWC": "int8_conv_nhwc", "QConv": "int8_conv_nchw"}
#: int8.cu's INT8_ENTRIES bit of each entry point: a layer's unit compiles its own kernel (the split-K pair together)
ENTRIES = {"int8_matmul": 1, "int8_matmul_splitk": 2, "int8_splitk_reduce": 2, "int8_conv_nhwc": 4, "int8_conv_nchw": 8}


def entries(source: KernelSource) -> KernelSource:
    """An int8.cu unit that compiles `source`'s entry point alone (INT8_ENTRIES: its bit of ENTRIES), where the module
    otherwise compiles all five (NVRTC 13.5, 2026-12-08: an int8_matmul unit 7.2 s with every entry, 1.5 s alone)."""
    return replace(source, defines=source.defines + defines(INT8_ENTRIES=ENTRIES[source.name]))
TILE = {"tile_m": 128, "tile_n": 128, "tile_k": 64}
#: longest reduction whose centered int32 sum cannot overflow (|(x - zx)(w - zw)| <= 255 ** 2)
MAX_INT8_K = 1 << 15
#: the channel multiple QConvNHWC's 16-byte activation loads need (to_channels_last pads to it)
NHWC_CHANNELS = 16
INT8 = ("int8", "uint8")
#: the float output types every cuda INT8 kernel takes: float32, and float16 (int8_out.cuh's Y_OUT 3: the value an
#: epilogue ending in a Cast to float16 computed, stored as float16)
FLOATS = ("float32", "float16")
MAX_GRID_Y = 65535
FLAG_X_U8, FLAG_W_U8, FLAG_Y_INT, FLAG_Y_U8, FLAG_VEC_X, FLAG_VEC_W = 1, 2, 4, 8, 16, 32

#: int8_out.cuh's Y_OUT: the output type a kernel compiles in (e4m3 and float16 in the F8 variant)
Y_OUT = {"float32": 0, "int8": 1, "uint8": 2, "float8_e4m3fn": 1, "float16": 3}


def output_type(layer: Any, y: DeviceTensor | None = None) -> str:
    """The output dtype an sm90 kernel compiles in (Y_OUT): the output tensor's when given (enqueue),
    else the stamped record's, else float32 (a record without dtypes: enqueue compiles its own)."""
    if y is not None:
        return y.dtype.name
    outs = getattr(layer, "out_dtypes", ())
    return outs[0] if outs and outs[0] in Y_OUT else "float32"


def out_defines(layer: Any, y_dtype: str | None = None, steps: tuple[int, int] | None = None
                ) -> tuple[tuple[str, str], ...]:
    """int8_out.cuh's compiled-in output: Y_OUT (`y_dtype`, else output_type's), and SCALE_STEP /
    BIAS_STEP (`steps`: int8_args' scale and bias steps, bias 2 when there is none; else from the
    record's shapes, none when it has no shapes: the kernel then reads its arguments); Y_ZERO 0 for an int8 / uint8
    output whose zero point is a constant 0 (the layer's Y_SYMMETRIC, stamped by to_channels_last)."""
    y_dtype = y_dtype or output_type(layer)
    out = defines(Y_OUT=Y_OUT[y_dtype])
    if y_dtype in ("int8", "uint8") and getattr(layer, "attrs", {}).get(Y_SYMMETRIC):
        out += defines(Y_ZERO=0)
    if steps is None:
        shapes = getattr(layer, "in_shapes", ())
        if len(shapes) <= BIAS:
            return out
        bias = layer.inputs[BIAS] if BIAS < len(layer.inputs) else ""
        steps = (int(np.prod(shapes[SCALE]) != 1), int(np.prod(shapes[BIAS]) != 1) if bias else 2)
    return out + defines(SCALE_STEP=steps[0], BIAS_STEP=steps[1])


#: the epilogues compile_variants builds in: a float32 residual, and an int8 one dequantized in the
#: epilogue (fold_qdq.dequantizing_steps) with a requantized output
RESIDUALS = {
    "float32": [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
                {"op": "Relu", "inputs": ["s"], "outputs": ["y"], "attrs": {}}],
    "int8": [{"op": "Cast", "inputs": ["skip"], "outputs": ["f"], "attrs": {"to": 1}},
             {"op": "Mul", "inputs": ["f", "skip_scale"], "outputs": ["d"], "attrs": {}},
             {"op": "Add", "inputs": ["raw", "d"], "outputs": ["s"], "attrs": {}},
             {"op": "Relu", "inputs": ["s"], "outputs": ["y"], "attrs": {}}],
}


#: an --fp16 build's INT8 layer after absorb_quantized_casts: Relu, then the Cast to float16 its output was (stored as
#: float16: Y_OUT 3)
HALF_OUT = [{"op": "Relu", "inputs": ["raw"], "outputs": ["r"], "attrs": {}},
            {"op": "Cast", "inputs": ["r"], "outputs": ["y"], "attrs": {"to": 10}}]


def half_layer(kind: str) -> Any:
    """A stamped INT8 layer of `kind` (per-channel scale) whose epilogue is HALF_OUT: a float16 output (compile
    variants, tests)."""
    from polykit.compiler.plan.records import LayerDesc

    dtypes = ("int8", "int8", "int8", "int8", "float32", "", "", "")
    return LayerDesc("half", kind, ("x", "xz", "w", "wz", "s", "", "", ""), ("y",),
                     {"epilogue": {"input": "raw", "body": HALF_OUT}}, domain=POLYKIT_DOMAIN, precision="int8",
                     in_dtypes=dtypes, out_dtypes=("float16",))


def residual_layer(kind: str, residual: str) -> Any:
    """A stamped-enough INT8 layer of `kind` with one of RESIDUALS' epilogues (compile variants)."""
    from polykit.compiler.plan.records import LayerDesc

    extra = ("skip",) if residual == "float32" else ("skip", "skip_scale")
    dtypes = ("int8", "int8", "int8", "int8", "float32", "", "", "", residual, "float32")[:8 + len(extra)]
    return LayerDesc("epi", kind, ("x", "xz", "w", "wz", "s", "", "", "", *extra), ("y",),
                     {"epilogue": {"input": "raw", "body": RESIDUALS[residual]}}, domain=POLYKIT_DOMAIN,
                     in_dtypes=dtypes)


def compile_variants() -> list[KernelSource]:
    """Every entry point plain, with each residual epilogue (RESIDUALS), and with a float16 output (HALF_OUT)."""
    out = [KernelSource(k, file=FILE, defines=defines(ELEM="float")) for k in KERNELS.values()]
    for kind, kernel in KERNELS.items():
        out += [kernel_source(residual_layer(kind, r), kernel, FILE, "float") for r in RESIDUALS]
        out += _kernels(half_layer(kind))
    return out


def _per_channel(shape: tuple[int, ...]) -> bool:
    return len(shape) <= 1


def supports(layer: Any) -> bool:
    """What the stamped record says the kernels take (layers built by hand: judged at enqueue)."""
    if layer.precision != "int8" or not supports_epilogue(layer) or int(layer.attrs.get("group", 1)) != 1:
        return False
    if not layer.in_dtypes:
        return True
    ins, shapes = layer.in_dtypes, layer.in_shapes
    if ins[X] not in INT8 or ins[W] not in INT8 or layer.out_dtypes[0] not in (*FLOATS, *INT8):
        return False
    if not all(_per_channel(shapes[s]) for s in (W_ZERO_POINT, SCALE, BIAS)):
        return False
    w = shapes[W]
    if layer.kind == "QMatMul":
        return len(w) == 2 and w[0] <= MAX_INT8_K
    if len(w) != 4 or int(np.prod(w[1:])) > MAX_INT8_K:
        return False
    return layer.kind == "QConv" or w[-1] % NHWC_CHANNELS == 0


def _geometry(layer: Any, x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], where: str) -> dict[str, int]:
    nhwc = layer.kind == "QConvNHWC"
    if len(x) != 4 or len(w) != 4:
        raise DeviceError(f"the cuda INT8 convolution is 2-D; X {x}, W {w}", where=where,
                          hint="run this layer on --target cpu")
    (nb, h, wd, c), (n, kh, kw, _), (oh, ow) = (x, w, y[1:3]) if nhwc else (
        (x[0], x[2], x[3], x[1]), (w[0], w[2], w[3], w[1]), y[2:4])
    geo = window_geometry(layer.attrs, (h, wd), (kh, kw), where=where)
    return {"M": nb * oh * ow, "N": n, "K": c * kh * kw, "C": c, "H": h, "W": wd, "OH": oh, "OW": ow,
            "KH": kh, "KW": kw, "SH": geo.strides[0], "SW": geo.strides[1], "PH": geo.pads_begin[0],
            "PW": geo.pads_begin[1], "DH": geo.dilations[0], "DW": geo.dilations[1]}


def int8_args(layer: Any, tensors: Mapping[str, DeviceTensor], operands: tuple[str, ...] = INT8,
              max_k: int = MAX_INT8_K, floats: tuple[str, ...] = FLOATS) -> tuple[dict[str, int], list[Any]]:
    """(GEMM sizes, kernel arguments) of an INT8 layer: int8.cu's INT8_PARAMS, epilogue excluded.
    `operands`: the X / W (and requantized Y) types taken (fp8_sm90.py: float8_e4m3fn); `max_k`: the
    longest reduction; `floats`: the float output types taken."""
    where = f"layer {layer.name!r}"

    def get(slot: int) -> DeviceTensor | None:
        name = layer.inputs[slot] if slot < len(layer.inputs) else ""
        return tensors[name] if name else None

    x, w, y = get(X), get(W), tensors[layer.outputs[0]]
    if get(X_ZERO_POINT) is None or get(W_ZERO_POINT) is None or get(SCALE) is None:
        raise DeviceError("INT8 layer without its X_zero_point, W_zero_point or scale input", where=where,
                          hint="docs/INT8.md lists the INT8 layers' inputs")
    if x.dtype.name not in operands or w.dtype.name not in operands or y.dtype.name not in (*floats, *operands):
        raise DeviceError(f"INT8 layer with X {x.dtype}, W {w.dtype}, Y {y.dtype} (the kernels take "
                          f"{'/'.join(operands)} operands and a {'/'.join(floats + operands)} output)", where=where,
                          hint="run on --target cpu")
    if layer.kind == "QMatMul":
        if len(w.shape) != 2 or len(x.shape) < 2 or x.shape[-1] != w.shape[0]:
            raise DeviceError(f"QMatMul of X {x.shape} and W {w.shape} (the kernel takes a 2-D W [K, N])",
                              where=where, hint="run this layer on --target cpu")
        g = dict.fromkeys(("C", "H", "W", "OH", "OW", "KH", "KW", "SH", "SW", "PH", "PW", "DH", "DW"), 1)
        g.update(M=int(np.prod(x.shape[:-1])), N=w.shape[1], K=w.shape[0])
    else:
        g = _geometry(layer, x.shape, w.shape, y.shape, where)
    if g["K"] > max_k or -(-g["M"] // TILE["tile_m"]) > MAX_GRID_Y:
        raise DeviceError(f"INT8 product of M={g['M']}, K={g['K']}: past the kernel's limits (K <= {max_k}, "
                          f"M <= {MAX_GRID_Y * TILE['tile_m']})", where=where, hint="run this layer on --target cpu")
    steps = []
    for slot in (W_ZERO_POINT, SCALE, BIAS):
        t = get(slot)
        steps.append(0 if t is None or t.size == 1 else 1)
        if t is not None and t.size not in (1, g["N"]):
            raise DeviceError(f"input {layer.inputs[slot]!r} has {t.size} values for {g['N']} output channels",
                              where=where)
    yscale = get(Y_SCALE)
    flags = ((FLAG_X_U8 if x.dtype.name == "uint8" else 0) | (FLAG_W_U8 if w.dtype.name == "uint8" else 0)
             | (FLAG_Y_INT if yscale is not None else 0) | (FLAG_Y_U8 if y.dtype.name == "uint8" else 0)
             | (FLAG_VEC_X if g["K"] % 16 == 0 and x.ptr % 16 == 0 else 0)
             | (FLAG_VEC_W if g["K"] % 16 == 0 and w.ptr % 16 == 0 else 0))
    if layer.kind == "QConvNHWC" and (g["C"] % NHWC_CHANNELS or x.ptr % 16):
        raise DeviceError(f"QConvNHWC with {g['C']} channels (the kernel loads 16 at a time: C % 16 == 0, "
                          "X 16-byte aligned)", where=where, hint="to_channels_last pads the channels; rebuild")
    args = [x, w, get(X_ZERO_POINT), get(W_ZERO_POINT), get(SCALE), get(BIAS) or 0, yscale or 0,
            get(Y_ZERO_POINT) or 0, y]
    args += [g[k] for k in ("M", "N", "K", "C", "H", "W", "OH", "OW", "KH", "KW", "SH", "SW", "PH", "PW", "DH", "DW")]
    args += [np.int32(flags), *(np.int32(s) for s in steps)]
    return g, args


def half_out(source: KernelSource, y_dtype: str) -> KernelSource:
    """An int8.cu kernel (whose flags give its output type at run time) with a float16 output compiled in
    (Y_OUT 3: int8_out.cuh's float16 store) where `y_dtype` is float16; else `source` as it is."""
    if y_dtype != "float16":
        return source
    return replace(source, defines=source.defines + defines(Y_OUT=Y_OUT["float16"]))


def _kernels(layer: Any, y_dtype: str | None = None) -> list[KernelSource]:
    """The layer's int8.cu kernel (its entry point alone: `entries`); `y_dtype` (enqueue: the output tensor's) or the
    record's output type."""
    return [entries(half_out(kernel_source(layer, KERNELS[layer.kind], FILE, "float"), y_dtype or output_type(layer)))]


def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    g, args = int8_args(layer, tensors)
    if g["M"] == 0 or g["N"] == 0:
        return
    grid = (-(-g["N"] // TILE["tile_n"]), -(-g["M"] // TILE["tile_m"]), 1)
    kernel = _kernels(layer, tensors[layer.outputs[0]].dtype.name)[0]
    launcher.launch(kernel, grid, (256,), args + epilogue_args(layer, tensors, np.dtype(np.float32)))


for _kind, _kernel in KERNELS.items():
    cuda_tactic(_kind, f"cuda.int8.mma_{_kernel.split('_', 1)[1]}", kernels=_kernels, supports=supports,
                priority=10, params=dict(TILE), conservative=True, domain=POLYKIT_DOMAIN)(enqueue)
