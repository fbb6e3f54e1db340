"""Small tensor tactics (tensor_misc.cu): Constant, ConstantOfShape, Shape, Size, Dropout
(inference), EyeLike, OneHot, Range, ReverseSequence, CastLike, BitCast (a byte copy).

Shapes are static in a plan, so Shape and Size write values known at build time, and
Constant / ConstantOfShape write their attribute: the bytes travel as kernel arguments
(`write_constant`: one fill launch for a repeated element, else 512-byte chunks), never as
a host-to-device copy. Everything else reads its operands on the device.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ir.dtypes import EXTENDED_TYPES
from polykit.compiler.ops.tensor.constants import constant_of_shape_fill, constant_value
from polykit.compiler.ir.graph import Node
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.movement.movement import launch_copy
from polykit.kernels.tactics import find_tactic
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for

FILE = "tensor_misc.cu"
SIZES = (1, 2, 4, 8)
CHUNK_WORDS = 64
#: dtype -> code of cast_any (tensor_misc.cu)
CAST_CODES = {np.dtype(d): k for k, d in enumerate(
    ("float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "bool"))}
if 16 in EXTENDED_TYPES:
    CAST_CODES[EXTENDED_TYPES[16]] = 12  # bfloat16 (ml_dtypes)
    # the lowp.cuh storage types (ml_dtypes), codes 13..22 in cast_any's order
    for _k, _onnx in enumerate((17, 18, 19, 20, 24, 23, 22, 21, 26, 25)):
        if _onnx in EXTENDED_TYPES:
            CAST_CODES[EXTENDED_TYPES[_onnx]] = 13 + _k
#: CastLike round_mode (float8e8m0 targets) -> cast_any's rmode
ROUND_MODES = {"up": 0, "down": 1, "nearest": 2}
#: dtype -> code of load_any_index (OneHot indices)
INDEX_CODES = {np.dtype(d): k for k, d in enumerate(
    ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "float32", "float64", "float16"))}
RANGE_CODES = {np.dtype("float32"): "f32", np.dtype("float64"): "f64", np.dtype("int16"): "i16",
               np.dtype("int32"): "i32", np.dtype("int64"): "i64", np.dtype("float16"): "f16"}
if 16 in EXTENDED_TYPES:
    RANGE_CODES[EXTENDED_TYPES[16]] = "bf16"


def copy_kernels(layer) -> list[KernelSource]:
    """The kernels movement's launch_copy may launch (those of its contiguous-copy tactic)."""
    return find_tactic("cuda", "Reshape", "cuda.movement.copy").kernels(layer)


def _src(name: str) -> KernelSource:
    return KernelSource(name, FILE)


def _sized(prefix: str) -> list[KernelSource]:
    return [_src(f"{prefix}_{es}") for es in SIZES]


def _where(layer) -> str:
    return f"layer {layer.name!r}"


def _es(t: DeviceTensor, where: str) -> int:
    if t.dtype.itemsize not in SIZES or t.dtype == object:
        raise DeviceError(f"no kernel for {t.dtype} elements", where=where, hint="use --target cpu")
    return t.dtype.itemsize


def _bits(value: np.ndarray) -> int:
    """The element's raw bytes as a signed int64 kernel argument (low bytes first)."""
    raw = np.zeros(8, np.uint8)
    raw[:value.dtype.itemsize] = np.frombuffer(np.ascontiguousarray(value).tobytes(), np.uint8)
    return int(raw.view(np.int64)[0])


def fill_constant(launcher: Launcher, out: DeviceTensor, scalar: np.ndarray, where: str) -> None:
    """out[:] = scalar (cast to the output's dtype) with one fill launch."""
    if out.size:
        value = np.asarray(scalar, dtype=out.dtype).reshape(1)
        launcher.launch(_src(f"fill_{_es(out, where)}"), grid_for(out.size), (BLOCK, 1, 1), [out, out.size, _bits(value)])


def write_constant(launcher: Launcher, out: DeviceTensor, value: np.ndarray, where: str) -> None:
    """Write `value` (the output's dtype and size) into `out` from kernel arguments."""
    value = np.ascontiguousarray(value, dtype=out.dtype).reshape(-1)
    if value.size != out.size:
        raise DeviceError(f"a constant of {value.size} elements for an output of {out.size}", where=where)
    if value.size == 0:
        return
    flat_bits = value.view(f"u{value.dtype.itemsize}")
    if np.all(flat_bits == flat_bits[0]):
        fill_constant(launcher, out, value[:1], where)
        return
    raw = value.tobytes()
    chunk = CHUNK_WORDS * 8
    for start in range(0, len(raw), chunk):
        part = raw[start:start + chunk]
        words = np.zeros(CHUNK_WORDS * 8, np.uint8)
        words[:len(part)] = np.frombuffer(part, np.uint8)
        dst = DeviceTensor(out.ptr + start, (len(part),), np.dtype(np.uint8))
        launcher.launch(_src("write_words"), grid_for(len(part)), (BLOCK, 1, 1),
                        [dst, len(part), *words.view(np.int64).tolist()])


def _constant_kernels(layer) -> list[KernelSource]:
    return [_src("write_words"), *_sized("fill")]


def _as_node(layer) -> Node:
    return Node(layer.kind, list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name, layer.domain)


def enqueue_constant(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    write_constant(launcher, tensors[layer.outputs[0]], constant_value(_as_node(layer)), _where(layer))


def enqueue_constant_of_shape(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    out = tensors[layer.outputs[0]]
    fill = constant_of_shape_fill(_as_node(layer))
    fill_constant(launcher, out, fill[0], _where(layer))


def enqueue_shape(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    dims = tensors[layer.inputs[0]].shape
    start, end = layer.attrs.get("start", 0), layer.attrs.get("end", len(dims))
    write_constant(launcher, tensors[layer.outputs[0]], np.array(dims[start:end], np.int64), _where(layer))


def enqueue_size(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    write_constant(launcher, tensors[layer.outputs[0]], np.array(tensors[layer.inputs[0]].size, np.int64),
                   _where(layer))


def _dropout_inference(layer) -> bool:
    """Inference Dropout only: no training_mode input (the mask would need numpy's generator)."""
    return len(layer.inputs) < 3 or not layer.inputs[2]


def enqueue_dropout(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    if x.ptr != y.ptr:
        launch_copy(launcher, x, y, [x.size], [1], [1], where=_where(layer))
    if len(layer.outputs) > 1 and layer.outputs[1]:
        mask = tensors[layer.outputs[1]]
        fill_constant(launcher, mask, np.True_, _where(layer))


def _dropout_kernels(layer) -> list[KernelSource]:
    return copy_kernels(layer) + _constant_kernels(layer)


def enqueue_eye_like(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    out = tensors[layer.outputs[0]]
    rows, cols = out.shape
    one = _bits(np.ones(1, out.dtype))
    launcher.launch(_src(f"eye_{_es(out, _where(layer))}"), grid_for(out.size), (BLOCK, 1, 1),
                    [out, rows, cols, int(layer.attrs.get("k", 0)), one])


def enqueue_one_hot(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    idx, values, out = tensors[layer.inputs[0]], tensors[layer.inputs[2]], tensors[layer.outputs[0]]
    where = _where(layer)
    if idx.dtype not in INDEX_CODES:
        raise DeviceError(f"OneHot indices of dtype {idx.dtype} have no kernel", where=where, hint="use --target cpu")
    axis = int(layer.attrs.get("axis", -1)) % len(out.shape)
    outer = int(np.prod(out.shape[:axis], dtype=np.int64))
    inner = int(np.prod(out.shape[axis + 1:], dtype=np.int64))
    args = [idx, np.int32(INDEX_CODES[idx.dtype]), values, out, outer, out.shape[axis], inner]
    launcher.launch(_src(f"onehot_{_es(out, where)}"), grid_for(out.size), (BLOCK, 1, 1), args)


def enqueue_range(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    start, delta, out = tensors[layer.inputs[0]], tensors[layer.inputs[2]], tensors[layer.outputs[0]]
    code = RANGE_CODES.get(out.dtype)
    if code is None:
        raise DeviceError(f"Range of {out.dtype} has no kernel", where=_where(layer), hint="use --target cpu")
    launcher.launch(_src(f"range_{code}"), grid_for(out.size), (BLOCK, 1, 1), [start, delta, out, out.size])


def enqueue_reverse_sequence(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, lengths, out = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    where = _where(layer)
    if lengths.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise DeviceError(f"sequence_lens of dtype {lengths.dtype} (int32/int64 expected)", where=where)
    rank = len(x.shape)
    t_axis, b_axis = int(layer.attrs.get("time_axis", 0)) % rank, int(layer.attrs.get("batch_axis", 1)) % rank
    stride = lambda a: int(np.prod(x.shape[a + 1:], dtype=np.int64))  # noqa: E731
    args = [x, lengths, out, int(lengths.dtype.itemsize == 8), x.size, stride(t_axis), x.shape[t_axis],
            stride(b_axis), x.shape[b_axis]]
    launcher.launch(_src(f"reverse_sequence_{_es(x, where)}"), grid_for(x.size), (BLOCK, 1, 1), args)


def enqueue_cast_like(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    where = _where(layer)
    for t in (x, y):
        if t.dtype not in CAST_CODES:
            raise DeviceError(f"CastLike of {t.dtype} has no kernel", where=where, hint="use --target cpu")
    if x.dtype == y.dtype and x.ptr == y.ptr:
        return
    mode = ROUND_MODES.get(str(layer.attrs.get("round_mode", "up")))
    if mode is None:
        raise DeviceError(f"CastLike round_mode {layer.attrs.get('round_mode')!r} is not one of {sorted(ROUND_MODES)}",
                          where=where)
    args = [x, np.int32(CAST_CODES[x.dtype]), y, np.int32(CAST_CODES[y.dtype]), x.size,
            np.int32(bool(layer.attrs.get("saturate", 1))), np.int32(mode)]
    launcher.launch(_src("cast_any"), grid_for(x.size), (BLOCK, 1, 1), args)


def enqueue_bit_cast(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    """The input's bytes copied as they are (the output's dtype has the same width)."""
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    if x.ptr != y.ptr:
        launch_copy(launcher, x, y, [x.size], [1], [1], where=_where(layer))


def _plain(layer) -> bool:
    return layer.domain in ("", "ai.onnx")


def _constant_supported(layer) -> bool:
    try:
        return _plain(layer) and constant_value(_as_node(layer)).dtype != object
    except Exception:  # a malformed Constant: no tactic, the builder reports the layer
        return False


cuda_tactic("Constant", "cuda.misc.constant", kernels=_constant_kernels, supports=_constant_supported)(enqueue_constant)
for _kind, _fn in (("ConstantOfShape", enqueue_constant_of_shape), ("Shape", enqueue_shape), ("Size", enqueue_size)):
    cuda_tactic(_kind, "cuda.misc.constant", kernels=_constant_kernels, supports=_plain)(_fn)
cuda_tactic("Dropout", "cuda.misc.dropout", kernels=_dropout_kernels,
            supports=lambda layer: _plain(layer) and _dropout_inference(layer))(enqueue_dropout)
cuda_tactic("EyeLike", "cuda.misc.eye_like", kernels=lambda layer: _sized("eye"), supports=_plain)(enqueue_eye_like)
cuda_tactic("OneHot", "cuda.misc.one_hot", kernels=lambda layer: _sized("onehot"), supports=_plain)(enqueue_one_hot)
cuda_tactic("Range", "cuda.misc.range", kernels=lambda layer: [_src(f"range_{c}") for c in RANGE_CODES.values()],
            supports=_plain)(enqueue_range)
cuda_tactic("ReverseSequence", "cuda.misc.reverse_sequence", kernels=lambda layer: _sized("reverse_sequence"),
            supports=_plain)(enqueue_reverse_sequence)
cuda_tactic("BitCast", "cuda.misc.bit_cast", kernels=copy_kernels, supports=_plain)(enqueue_bit_cast)
cuda_tactic("CastLike", "cuda.misc.cast_like", kernels=lambda layer: [_src("cast_any")],
            supports=_plain)(enqueue_cast_like)


def compile_variants() -> list[KernelSource]:
    """The one tensor_misc.cu module (every kernel is an entry point in it)."""
    return [_src("cast_any")]
