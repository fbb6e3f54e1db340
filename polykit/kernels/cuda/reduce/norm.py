"""Normalization tactics: Layer/Group/Instance/RMS normalization as per-row block reductions
(cuda.norm.rows, norm.cu), Layer/RMS normalization of rows that fit a warp's registers
(cuda.norm.warp, norm_warp.cu: one read of x, 16-byte vectors where aligned; ai.polykit LayerNormQuantize
with its e4m3 output stage, NW_Q8), inference
BatchNormalization as one pass over the tensor (cuda.norm.batch). A Layer/RMS normalization with a
row map (ai.polykit, ops/nn/norm_row_map.py) writes its rows permuted, and one with an input map
(`in_map`: the row read in segments gathered from X) reads so: both Layer/RMS tactics take the maps as
arguments (norm_row_map.cuh, `row_map_args`, `in_map_args`) of kernels compiled for mapped layers only
(norm_rows_map_<code>, norm_warp.cu with NW_MAPS 1): an unmapped layer's kernel has no map code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.layernorm_quantize import KIND as QUANTIZED
from polykit.compiler.ops.nn.norm_row_map import IN_MAP, MAX_ROW_DIMS, NORM_KINDS, ROW_MAP, logical_input, row_dims
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, defines, stored_as
from polykit.kernels.cuda.launch_geometry import grid_for
from polykit.kernels.cuda.storage_types import CODE, dtype_names
from polykit.kernels.cuda.reduce.reduce import block_for

FILE = "norm.cu"
DTYPES = ("f32", "f16", "f64")
STORED = dtype_names(DTYPES)


def _kernels(layer) -> list[KernelSource]:
    prefix = "batchnorm" if layer is not None and layer.kind == "BatchNormalization" else \
        "norm_rows_map" if layer is not None and mapped(layer) else "norm_rows"
    return [KernelSource(f"{prefix}_{c}", FILE) for c in DTYPES]


def _code(layer, t: DeviceTensor) -> str:
    code = CODE.get(t.dtype.name)
    if code not in DTYPES:
        raise DeviceError(f"{layer.kind} has no CUDA kernel for {t.dtype}", where=f"layer {layer.name!r}",
                          hint="use --target cpu")
    return code


def _opt(layer, tensors, names, i):
    return tensors[names[i]] if len(names) > i and names[i] else None


def _check_params(layer, scale: DeviceTensor, bias: DeviceTensor | None, per_row: int) -> None:
    for p, what in ((scale, "scale"), (bias, "bias")):
        if p is not None and p.size not in (1, per_row):
            raise DeviceError(f"{what} of {p.size} elements does not match the normalized size",
                              where=f"layer {layer.name!r}", hint="use --target cpu")


def _check_stats(layer, mean: DeviceTensor | None, rstd: DeviceTensor | None) -> None:
    if mean is not None and mean.dtype != np.float32 or rstd is not None and rstd.dtype != np.float32:
        raise DeviceError("mean / inv_std outputs must be float32 (stash_type 1)", where=f"layer {layer.name!r}")


def _last_axes(layer, shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, L) of a Layer/RMS normalization's input of `shape`: the normalized axes flattened."""
    axis = int(layer.attrs.get("axis", -1)) % len(shape)
    length = int(np.prod(shape[axis:], dtype=np.int64))
    return (int(np.prod(shape, dtype=np.int64)) // length if length else 0), length


#: a row map's kernel arguments: dims, then per dim (inner first) n, shift, q, a, b
ROW_MAP_ARGS = 1 + 5 * MAX_ROW_DIMS


def row_map_args(layer, rows: int) -> list[np.int32]:
    """norm_row_map.cuh's arguments for `layer`'s row map (dims 0, the identity, without one): per
    dim, inner first, its size n, shift, inner piece size q (n for one piece) and the inner and outer
    piece strides a, b."""
    return _map_args(layer, ROW_MAP, rows)


def in_map_args(layer, rows: int, length: int) -> list[np.int32]:
    """norm_row_map.cuh's IM_PARAMS for `layer`'s input map: segment, offset, then its dims as
    row_map_args gives a row map's (zeros without a map)."""
    raw = layer.attrs.get(IN_MAP)
    if raw is None:
        return [np.int32(0)] * (ROW_MAP_ARGS + 2)
    seg = int(raw.get("segment", 0))
    if seg < 1 or length % seg:
        raise DeviceError(f"input map segment {seg} does not divide rows of {length}", where=f"layer {layer.name!r}",
                          hint="rebuild the plan")
    args = _map_args(layer, IN_MAP, rows * (length // seg))
    return [np.int32(seg), np.int32(raw.get("offset", 0)), *args]


def _map_args(layer, key: str, count: int) -> list[np.int32]:
    raw = layer.attrs.get(key)
    if raw is None:
        return [np.int32(0)] * ROW_MAP_ARGS
    where = f"layer {layer.name!r}"
    try:
        dims = row_dims(raw)
    except ValueError as exc:
        raise DeviceError(f"bad {key}: {exc}", where=where, hint="rebuild the plan") from None
    held = int(np.prod([n for n, _, _ in dims]))
    if layer.kind not in NORM_KINDS or held != count or count >= 2 ** 31:
        raise DeviceError(f"the {key} holds {held} rows or segments, the layer has {count}", where=where,
                          hint="rebuild the plan for these shapes")
    args = [len(dims)]
    for n, shift, pieces in reversed(dims):
        (q, a), b = pieces[-1], (pieces[0][1] if len(pieces) == 2 else 0)
        args += [n, shift, q, a, b]
    args += [0] * (ROW_MAP_ARGS - len(args))
    return [np.int32(v) for v in args]


def mapped(layer) -> bool:
    """Whether `layer` has a row map or an input map (its kernels are the NW_MAPS / norm_rows_map ones)."""
    return ROW_MAP in layer.attrs or IN_MAP in layer.attrs


def map_args(layer, rows: int, length: int, x: DeviceTensor, y: DeviceTensor) -> list[np.int32]:
    """A mapped layer's map arguments: its row map's, then its input map's (zeros for the one it lacks),
    each checked to address only rows of Y / segments of X (a plan is untrusted input: an edited map
    must not make the kernel write or read outside its tensors)."""
    rows_args, in_args = row_map_args(layer, rows), in_map_args(layer, rows, length)
    where = f"layer {layer.name!r}"
    if _map_reach(rows_args) >= y.size // max(length, 1):
        raise DeviceError(f"the row map writes past the output's {y.size // max(length, 1)} rows", where=where,
                          hint="rebuild the plan (pass norm_row_maps makes the map)")
    seg, offset = int(in_args[0]), int(in_args[1])
    if seg and (offset < 0 or offset + _map_reach(in_args[2:]) >= x.size // seg):
        raise DeviceError(f"the input map reads past the input's {x.size // seg} segments of {seg}", where=where,
                          hint="rebuild the plan (pass norm_row_maps makes the map)")
    return [*rows_args, *in_args]


def _map_reach(args: list[np.int32]) -> int:
    """The largest row (segment) norm_row_map.cuh's rm_dest gives over a map's arguments (-1 for none):
    per dim, the largest (j mod q) * a + (j / q) * b with j < n, strides >= 0 (row_dims checks them)."""
    dims = int(args[0])
    if dims == 0:
        return -1
    reach = 0
    for d in range(dims):
        n, _, q, a, b = (int(v) for v in args[1 + 5 * d:6 + 5 * d])
        reach += (q - 1) * a + (n // q - 1) * b
    return reach


def _maps_rows_or_plain(layer) -> bool:
    """A layer without maps, or a Layer/RMS normalization with them (its mean / inv_std absent)."""
    return ROW_MAP not in layer.attrs and IN_MAP not in layer.attrs \
        or layer.kind in NORM_KINDS and len(layer.outputs) == 1


def enqueue_rows(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x = tensors[layer.inputs[0]]
    scale, bias = _opt(layer, tensors, layer.inputs, 1), _opt(layer, tensors, layer.inputs, 2)
    y = tensors[layer.outputs[0]]
    mean, rstd = _opt(layer, tensors, layer.outputs, 1), _opt(layer, tensors, layer.outputs, 2)
    eps = np.float64(layer.attrs.get("epsilon", 1e-5))
    if x.size == 0:
        return
    rms = 0
    if layer.kind in ("LayerNormalization", "RMSNormalization"):
        length = _last_axes(layer, logical_input(layer.attrs, x.shape))[1]
        groups, d = 1, 1
        rms = int(layer.kind == "RMSNormalization")
    else:  # Group / Instance: statistics per (n, group), parameters per channel
        c = x.shape[1]
        groups = int(layer.attrs.get("num_groups", c)) if layer.kind == "GroupNormalization" else c
        d = int(np.prod(x.shape[2:], dtype=np.int64))
        length = (c // groups) * d
    _check_params(layer, scale, bias, length if d == 1 else length * groups // d)
    rows = x.size // length if IN_MAP not in layer.attrs else int(np.prod(layer.attrs[IN_MAP]["shape"])) // length
    _check_stats(layer, mean, rstd)
    args = [x, scale, bias if bias is not None else 0, y, mean if mean is not None else 0,
            rstd if rstd is not None else 0, rows, length, groups, d, scale.size,
            bias.size if bias is not None else 1, eps, rms] \
        + (map_args(layer, rows, length, x, y) if mapped(layer) else [])
    kernel = "norm_rows_map" if mapped(layer) else "norm_rows"
    launcher.launch(KernelSource(f"{kernel}_{_code(layer, x)}", FILE), (min(rows, 1 << 20), 1, 1),
                    (block_for(length), 1, 1), args)


def enqueue_batchnorm(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    if layer.attrs.get("training_mode", 0):
        raise DeviceError("BatchNormalization in training mode has no CUDA kernel", where=f"layer {layer.name!r}",
                          hint="export the model in eval mode, or use --target cpu")
    x, scale, bias, mean, var = (tensors[n] for n in layer.inputs[:5])
    y = tensors[layer.outputs[0]]
    if x.size == 0:
        return
    c = x.shape[1] if len(x.shape) > 1 else 1
    inner = int(np.prod(x.shape[2:], dtype=np.int64))
    args = [x, scale, bias, mean, var, y, x.size, c, inner, np.float64(layer.attrs.get("epsilon", 1e-5))]
    launcher.launch(KernelSource(f"batchnorm_{_code(layer, x)}", FILE), grid_for(x.size), (256, 1, 1), args)


# ---- cuda.norm.warp: a row in the registers of 4..32 lanes (norm_warp.cu) -------------------------
WARP_FILE = "norm_warp.cu"
#: storage dtype (numpy name) -> (ELEM, bytes an element)
WARP_ELEMS = {"float32": ("float", 4), "float16": ("half_t", 2), "bfloat16": ("bf16_t", 2)}
WARP_LANES = (4, 8, 16, 32)
#: 16-byte vectors a lane holds at most, by element size: 4096 elements a row either way (fp16 rows
#: of 8192 spilled: ptxas -v on sm_90 gave 255 registers and 228 bytes of spill stores, the
#: halves being kept converted; 4096 fp16 take 168 registers, 4096 fp32 164, neither spills)
WARP_MAX_CHUNKS = {2: 16, 4: 32}
WARP_THREADS = 128
MAX_GRID = 1 << 20


@dataclass(frozen=True)
class WarpGeometry:
    """How norm_warp.cu holds a row of L elements: `lanes` lanes, `chunks` 16-byte vectors a lane."""

    lanes: int
    chunks: int

    @property
    def rows_per_block(self) -> int:
        return WARP_THREADS // self.lanes


def warp_geometry(length: int, itemsize: int) -> WarpGeometry | None:
    """The lanes a row of `length` elements of `itemsize` bytes takes (the power of two in 4..32 that
    leaves the fewest vector slots idle, ties to more lanes) and the vectors a lane holds; None when
    the row does not fit WARP_MAX_CHUNKS vectors a lane."""
    if length <= 0 or itemsize not in (2, 4):
        return None
    nvec = -(-length // (16 // itemsize))
    best: WarpGeometry | None = None
    for lanes in WARP_LANES:
        chunks = -(-nvec // lanes)
        if chunks <= WARP_MAX_CHUNKS[itemsize] and (best is None or lanes * chunks <= best.lanes * best.chunks):
            best = WarpGeometry(lanes, chunks)
    return best


def warp_kernel(dtype: str, geometry: WarpGeometry, q8: bool = False, maps: bool = False) -> KernelSource:
    """norm_warp.cu for this storage type and geometry; `q8`: LayerNormQuantize's e4m3 output stage (NW_Q8);
    `maps`: a row map / input map (NW_MAPS: their arguments and index code, compiled for mapped layers only)."""
    extra = {"NW_Q8": 1} if q8 else {}
    if maps:
        extra["NW_MAPS"] = 1
    return KernelSource("norm_warp", WARP_FILE, defines=defines(ELEM=WARP_ELEMS[dtype][0], NW_LANES=geometry.lanes,
                                                                NW_CHUNKS=geometry.chunks, **extra))


def _warp_layout(layer) -> tuple[str, WarpGeometry] | None:
    """(storage dtype, geometry) of a stamped Layer/RMS normalization layer cuda.norm.warp runs:
    one storage type of X, scale, bias and Y, parameters of L elements or one, float32 statistics,
    a row that fits; None otherwise (and for layers without stamped shapes)."""
    shapes, dtypes = tuple(getattr(layer, "in_shapes", ()) or ()), tuple(getattr(layer, "in_dtypes", ()) or ())
    outs = tuple(getattr(layer, "out_dtypes", ()) or ())
    if not shapes or not dtypes or not shapes[0] or not all(isinstance(d, int) for d in shapes[0]):
        return None
    dtype = dtypes[0]
    _, length = _last_axes(layer, logical_input(layer.attrs, tuple(shapes[0])))
    if layer.kind == QUANTIZED:  # Yq e4m3, then Y (optional) of X's type; no statistics
        values, stats = outs[1:2], ()
        if outs[:1] != ("float8_e4m3fn",) or dtypes[3:5] != ("float32", "float8_e4m3fn"):
            return None
    else:
        values, stats = outs[:1], outs[1:3]
    if dtype not in WARP_ELEMS or any(d and d != dtype for d in dtypes[1:3] + values) \
            or any(d and d != "float32" for d in stats):
        return None
    for shape in shapes[1:3]:
        if shape and (not all(isinstance(d, int) for d in shape) or int(np.prod(shape)) not in (1, length)):
            return None
    geometry = warp_geometry(length, WARP_ELEMS[dtype][1])
    return None if geometry is None else (dtype, geometry)


def _warp_kernels(layer) -> list[KernelSource]:
    layout = _warp_layout(layer) if layer is not None else None
    return [warp_kernel(*layout, q8=layer.kind == QUANTIZED, maps=mapped(layer))] if layout is not None else []


def _aligned(*tensors: DeviceTensor | None) -> bool:
    return all(t is None or t.ptr % 16 == 0 for t in tensors)


def warp_launch(layer, tensors: Mapping[str, DeviceTensor]) -> tuple[KernelSource, tuple, tuple, list[Any]] | None:
    """(kernel, grid, block, arguments) of cuda.norm.warp for these tensors; None when empty.
    16-byte vectors (vec 1) where L is a whole number of them and X, Y and the L-element scale and
    bias start 16-byte aligned; element by element otherwise."""
    q8 = layer.kind == QUANTIZED
    x, scale, bias = tensors[layer.inputs[0]], _opt(layer, tensors, layer.inputs, 1), _opt(layer, tensors, layer.inputs, 2)
    if q8:  # LayerNormQuantize: Yq, then Y only where the float output has other readers
        yq, y, mean, rstd = tensors[layer.outputs[0]], _opt(layer, tensors, layer.outputs, 1), None, None
    else:
        y, mean, rstd = tensors[layer.outputs[0]], _opt(layer, tensors, layer.outputs, 1), _opt(layer, tensors, layer.outputs, 2)
    where = f"layer {layer.name!r}"
    if q8 and (yq.dtype.name != "float8_e4m3fn" or tensors[layer.inputs[3]].dtype != np.float32):
        raise DeviceError(f"{layer.kind} writes float8_e4m3fn with a float32 scale here, not {yq.dtype}", where=where,
                          hint="rebuild the plan (fuse_output_quantize makes only that form) or use --target cpu")
    if x.dtype.name not in WARP_ELEMS or y is not None and y.dtype != x.dtype or scale.dtype != x.dtype \
            or bias is not None and bias.dtype != x.dtype:
        raise DeviceError(f"{layer.kind} has no cuda.norm.warp kernel for {x.dtype}", where=where,
                          hint="rebuild the plan (cuda.norm.rows runs other storage types)")
    if x.size == 0:
        return None
    rows, length = _last_axes(layer, logical_input(layer.attrs, x.shape))
    _check_params(layer, scale, bias, length)
    _check_stats(layer, mean, rstd)
    geometry = warp_geometry(length, x.dtype.itemsize)
    if geometry is None:
        raise DeviceError(f"rows of {length} elements do not fit cuda.norm.warp's registers", where=where,
                          hint="rebuild the plan for these shapes (cuda.norm.rows runs long rows)")
    per_vector = 16 // x.dtype.itemsize  # elements a 16-byte vector holds: the e4m3 bytes of one store
    segment = int(layer.attrs[IN_MAP]["segment"]) if IN_MAP in layer.attrs else length
    vec = length % per_vector == 0 and segment % per_vector == 0 \
        and _aligned(x, y, scale if scale.size > 1 else None, bias if bias is not None and bias.size > 1 else None) \
        and (not q8 or yq.ptr % per_vector == 0)
    i32, f32 = np.int32, np.float32
    args = [x, scale, bias if bias is not None else 0, y if y is not None else 0, mean if mean is not None else 0,
            rstd if rstd is not None else 0, rows, i32(length), i32(scale.size),
            i32(bias.size if bias is not None else 1), f32(layer.attrs.get("epsilon", 1e-5)),
            i32(layer.kind == "RMSNormalization"), i32(vec)] + ([yq, tensors[layer.inputs[3]]] if q8 else []) \
        + (map_args(layer, rows, length, x, y if y is not None else yq) if mapped(layer) else [])
    grid = (min(-(-rows // geometry.rows_per_block), MAX_GRID), 1, 1)
    return warp_kernel(x.dtype.name, geometry, q8, mapped(layer)), grid, (WARP_THREADS, 1, 1), args


def enqueue_warp(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    launch = warp_launch(layer, tensors)
    if launch is not None:
        launcher.launch(*launch)


for _kind in ("LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization"):
    cuda_tactic(_kind, "cuda.norm.rows", kernels=_kernels,
                supports=stored_as(*STORED, then=_maps_rows_or_plain))(enqueue_rows)
for _kind in ("LayerNormalization", "RMSNormalization"):  # ahead of cuda.norm.rows at level 0; timed against it
    cuda_tactic(_kind, "cuda.norm.warp", kernels=_warp_kernels, priority=1,
                supports=lambda layer: _maps_rows_or_plain(layer) and _warp_layout(layer) is not None)(enqueue_warp)
cuda_tactic(QUANTIZED, "cuda.norm.warp", kernels=_warp_kernels, domain=POLYKIT_DOMAIN,
            supports=lambda layer: _maps_rows_or_plain(layer) and _warp_layout(layer) is not None)(enqueue_warp)
cuda_tactic("BatchNormalization", "cuda.norm.batch", kernels=_kernels,
            supports=stored_as(*STORED, then=lambda layer: not layer.attrs.get("training_mode", 0)))(enqueue_batchnorm)


def compile_variants() -> list[KernelSource]:
    """norm.cu's entry points, and norm_warp.cu for every storage type with the fewest lanes and
    vectors and with the most (the register-heaviest variant), and every lane count in fp16; its NW_Q8
    form (LayerNormQuantize) and its NW_MAPS form (row / input maps) for every storage type at the fewest
    and the most."""
    shapes = {(dtype, WarpGeometry(4, 1)) for dtype in WARP_ELEMS} | {
        (dtype, WarpGeometry(32, WARP_MAX_CHUNKS[size])) for dtype, (_, size) in WARP_ELEMS.items()} | {
        ("float16", WarpGeometry(lanes, 3)) for lanes in WARP_LANES}
    warp = [warp_kernel(dtype, geometry) for dtype, geometry in sorted(shapes, key=repr)]
    extremes = [(dtype, g) for dtype, g in sorted(shapes, key=repr) if g.lanes in (4, 32) and g.chunks != 3]
    warp += [warp_kernel(dtype, geometry, q8=True) for dtype, geometry in extremes]
    warp += [warp_kernel(dtype, geometry, maps=True) for dtype, geometry in extremes]
    return [KernelSource(f"{p}_{c}", FILE) for p in ("norm_rows", "norm_rows_map", "batchnorm") for c in DTYPES] + warp
