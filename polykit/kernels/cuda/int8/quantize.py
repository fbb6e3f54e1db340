"""QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear and ai.polykit QuantizeNHWC tactics (quantize.cu).

Element types are runtime codes, so one kernel per op covers every type combination the
shape rules allow; the scale / zero point granularity (per tensor, per axis, blocked) is a
runtime mode. Scale and zero point stay on the device (DynamicQuantizeLinear computes its
own there), so a plan needs no host copy of them.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.quantize_nhwc import KIND, block_and_pads
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic

FILE = "quantize.cu"
ENTRIES = ("quantize_linear", "quantize_f32_8bit", "quantize_nhwc", "quantize_nhwc_image", "quantize_nhwc_s2d",
           "dequantize_linear", "dq_minmax", "dq_params")
#: numpy dtype name -> the kernels' QK_* type code
TYPE_CODE = {"float32": 0, "float16": 1, "float64": 2, "int8": 3, "uint8": 4, "int16": 5, "uint16": 6,
             "int32": 7, "int64": 8, "float8_e4m3fn": 9, "float8_e4m3fnuz": 10, "float8_e5m2": 11,
             "float8_e5m2fnuz": 12, "float4_e2m1fn": 13, "int4": 14, "uint4": 15, "int2": 16, "uint2": 17}
FLOAT_CODES = (0, 1, 2)
#: quantized element types: 8/16-bit integers, then the lowp.cuh float8 / float4 / 4- and 2-bit types
QUANT_CODES = (3, 4, 5, 6) + tuple(range(9, 18))
#: ONNX element type of QuantizeLinear's `precision` attribute -> precision code (0 f32, 1 f16, 2 f64)
PRECISION = {1: 0, 10: 1, 11: 2}
BLOCK = 256
MAX_GRID = 1 << 16
MINMAX_BLOCKS = 1024
#: QuantizeNHWC's output type -> quantize.cu's Q8 mode
NHWC_MODES = {"int8": 0, "uint8": 1, "float8_e4m3fn": 2}
#: pixels a quantize_nhwc(_image) thread owns (quantize.cu NHWC_PIX), and the image kernel's most channels
NHWC_PIX = 8
IMAGE_CHANNELS = 3


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(name, FILE) for name in ENTRIES]


def _grid(n: int) -> tuple[int, int, int]:
    return (max(1, min(-(-n // BLOCK), MAX_GRID)), 1, 1)


def _code(t: DeviceTensor, allowed, what: str, where: str) -> int:
    code = TYPE_CODE.get(t.dtype.name)
    if code not in allowed:
        raise DeviceError(f"{what} of type {t.dtype} has no CUDA kernel", where=where, hint="use --target cpu")
    return code


def param_geometry(attrs: Mapping, x_shape: tuple[int, ...], p_shape: tuple[int, ...]) -> list[int]:
    """(mode, inner, D, block, Dp) locating a scale / zero point entry for each element of x."""
    size = int(np.prod(p_shape, dtype=np.int64))
    block = int(attrs.get("block_size", 0))
    if not x_shape or (size == 1 and block <= 0):
        return [0, 1, 1, 1, 1]
    axis = int(attrs.get("axis", 1)) % len(x_shape)
    inner = int(np.prod(x_shape[axis + 1:], dtype=np.int64))
    if block > 0:
        return [2, inner, x_shape[axis], block, p_shape[axis]]
    return [1, inner, x_shape[axis], 1, 1]


def _params(layer, tensors) -> tuple[DeviceTensor, DeviceTensor | None]:
    """The scale and the optional zero point of a (De)QuantizeLinear layer."""
    s = tensors[layer.inputs[1]]
    z = tensors.get(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] else None
    return s, z


def _four_at_a_time(layer, x: DeviceTensor, s: DeviceTensor, z: DeviceTensor | None, y: DeviceTensor,
                    precision: int) -> bool:
    """Whether quantize_f32_8bit serves: float32 x and scale (per tensor, float32 precision), an int8 /
    uint8 output, a per-tensor zero point or none, x.size % 4 == 0, x 16- and y 4-byte aligned."""
    return (x.dtype == np.float32 and s.dtype == np.float32 and s.size == 1 and precision == PRECISION[1]
            and int(layer.attrs.get("block_size", 0)) <= 0 and y.dtype.name in ("int8", "uint8")
            and (z is None or (z.size == 1 and z.dtype == y.dtype)) and x.size % 4 == 0
            and x.ptr % 16 == 0 and y.ptr % 4 == 0)


def enqueue_quantize(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    s, z = _params(layer, tensors)
    xc, sc = _code(x, FLOAT_CODES, "QuantizeLinear input", where), _code(s, FLOAT_CODES, "scale", where)
    yc = _code(y, QUANT_CODES, "QuantizeLinear output", where)
    zc = _code(z, QUANT_CODES, "zero point", where) if z is not None else 0
    code = int(layer.attrs.get("precision", 0))
    precision = PRECISION.get(code) if code else sc
    if precision is None:
        raise DeviceError(f"QuantizeLinear precision type {code} has no CUDA kernel", where=where,
                          hint="use --target cpu")
    if x.size == 0:
        return
    if _four_at_a_time(layer, x, s, z, y, precision):
        launcher.launch(KernelSource("quantize_f32_8bit", FILE), _grid(x.size // 4), (BLOCK, 1, 1),
                        [x, s, z if z is not None else 0, y, x.size // 4, int(y.dtype == np.uint8)])
        return
    geo_z = param_geometry(layer.attrs, x.shape, z.shape) if z is not None else [0, 1, 1, 1, 1]
    launcher.launch(KernelSource("quantize_linear", FILE), _grid(x.size), (BLOCK, 1, 1),
                    [x, xc, s, sc, z if z is not None else 0, zc, y, yc, x.size, precision,
                     *param_geometry(layer.attrs, x.shape, s.shape), *geo_z, int(bool(layer.attrs.get("saturate", 1)))])


def enqueue_dequantize(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    s, z = _params(layer, tensors)
    xc = _code(x, QUANT_CODES + (7,), "DequantizeLinear input", where)
    sc, yc = _code(s, FLOAT_CODES, "scale", where), _code(y, FLOAT_CODES, "DequantizeLinear output", where)
    zc = _code(z, QUANT_CODES + (7,), "zero point", where) if z is not None else 0
    if x.size == 0:
        return
    geo_z = param_geometry(layer.attrs, x.shape, z.shape) if z is not None else [0, 1, 1, 1, 1]
    launcher.launch(KernelSource("dequantize_linear", FILE), _grid(x.size), (BLOCK, 1, 1),
                    [x, xc, s, sc, z if z is not None else 0, zc, y, yc, x.size,
                     *param_geometry(layer.attrs, x.shape, s.shape), *geo_z])


def enqueue_dynamic_quantize(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x = tensors[layer.inputs[0]]
    y, scale, zp = (tensors.get(n) if n else None for n in (list(layer.outputs) + ["", ""])[:3])
    xc = _code(x, FLOAT_CODES, "DynamicQuantizeLinear input", where)
    scale = scale or DeviceTensor(launcher.workspace(4), (), np.dtype(np.float32))
    zp = zp or DeviceTensor(launcher.workspace(1), (), np.dtype(np.uint8))
    blocks = max(1, min(-(-x.size // (BLOCK * 8)), MINMAX_BLOCKS))
    partial = launcher.workspace(blocks * 8)
    launcher.launch(KernelSource("dq_minmax", FILE), (blocks, 1, 1), (BLOCK, 1, 1), [x, xc, x.size, partial])
    launcher.launch(KernelSource("dq_params", FILE), (1, 1, 1), (BLOCK, 1, 1), [partial, blocks, scale, zp])
    if y is None or x.size == 0:
        return
    none = [0, 1, 1, 1, 1]
    launcher.launch(KernelSource("quantize_linear", FILE), _grid(x.size), (BLOCK, 1, 1),
                    [x, xc, scale, TYPE_CODE["float32"], zp, TYPE_CODE["uint8"], y, TYPE_CODE["uint8"], x.size,
                     0, *none, *none, 1])


def enqueue_quantize_nhwc(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    """ai.polykit QuantizeNHWC (ops/quantize_nhwc.py): one pass from float32 NCHW to int8 / uint8 / e4m3 NHWC,
    padded (an e4m3 zero point is +0: the kernel pads with 0 bytes); with `block` > 1 or `pads`
    (a space-to-depth stem's image), quantize_nhwc_s2d: zero-padded and space-to-depth'd in the same pass."""
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    s, z = _params(layer, tensors)
    if (x.dtype != np.float32 or s.dtype != np.float32 or s.size != 1 or z is None or z.size != 1
            or y.dtype.name not in NHWC_MODES or z.dtype != y.dtype or len(x.shape) != 4):
        raise DeviceError(f"QuantizeNHWC of X {x.dtype} {x.shape}, scale {s.dtype} {s.shape}, zero point "
                          f"{None if z is None else (z.dtype, z.shape)} -> {y.dtype}: the kernel takes float32 X "
                          "[N, C, H, W], one float32 scale, one int8 / uint8 / float8_e4m3fn zero point",
                          where=f"layer {layer.name!r}", hint="fuse_quantize_nhwc makes only that form; use --target cpu")
    geometry = block_and_pads(layer.attrs)
    if isinstance(geometry, str):
        raise DeviceError(geometry, where=f"layer {layer.name!r}", hint="fuse_quantize_nhwc builds it")
    nb, c, h, w = x.shape
    cp = int(y.shape[-1])
    vec = cp % 16 == 0 and y.ptr % 16 == 0
    i32 = np.int32
    block, (top, left, bottom, right) = geometry
    if block > 1 or any((top, left, bottom, right)):
        oh, ow = (h + top + bottom) // block, (w + left + right) // block
        if tuple(y.shape) != (nb, oh, ow, cp) or cp < c * block * block:
            raise DeviceError(f"QuantizeNHWC output {tuple(y.shape)} for X {tuple(x.shape)}, block {block}, pads "
                              f"{[top, left, bottom, right]}: expected {(nb, oh, ow, cp)} with {cp} >= "
                              f"{c * block * block} channels", where=f"layer {layer.name!r}",
                              hint="the shape rule gives the output's shape; rebuild the plan")
        if nb * oh * ow == 0:
            return
        launcher.launch(KernelSource("quantize_nhwc_s2d", FILE), (_grid(oh * ow)[0], min(nb, MAX_GRID - 1), 1),
                        (BLOCK, 1, 1), [x, s, z, y, i32(nb), i32(c), i32(h), i32(w), i32(oh), i32(ow), i32(block),
                                        i32(top), i32(left), i32(cp), i32(vec), NHWC_MODES[y.dtype.name]])
        return
    if nb * h * w == 0:
        return
    grid = (_grid(-(-h * w // NHWC_PIX))[0], min(nb, MAX_GRID - 1), 1)
    head, mode = [x, s, z, y, i32(nb), i32(h * w), i32(c), i32(cp)], NHWC_MODES[y.dtype.name]
    if vec and c <= IMAGE_CHANNELS:
        launcher.launch(KernelSource("quantize_nhwc_image", FILE), grid, (BLOCK, 1, 1), head + [mode])
        return
    launcher.launch(KernelSource("quantize_nhwc", FILE), grid, (BLOCK, 1, 1), head + [i32(vec), mode])


cuda_tactic("QuantizeLinear", "cuda.quantize", kernels=_kernels)(enqueue_quantize)
cuda_tactic(KIND, "cuda.quantize", kernels=_kernels, domain=POLYKIT_DOMAIN)(enqueue_quantize_nhwc)
cuda_tactic("DequantizeLinear", "cuda.quantize", kernels=_kernels)(enqueue_dequantize)
cuda_tactic("DynamicQuantizeLinear", "cuda.quantize", kernels=_kernels)(enqueue_dynamic_quantize)


def compile_variants() -> list[KernelSource]:
    """The one quantize.cu module (every op is an entry point in it)."""
    return _kernels(None)
