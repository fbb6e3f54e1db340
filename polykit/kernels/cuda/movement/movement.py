"""Data-movement tactics (movement.cu): Transpose, Expand, Concat, Split, Slice, Pad, Tile,
DepthToSpace/SpaceToDepth and the Reshape family (a contiguous copy).

Every op is dtype-agnostic (kernels by element size). Shapes are collapsed on the host
(adjacent dims that stay contiguous in every tensor merge), contiguous copies move 16
bytes per thread when aligned. Constant operands (Slice starts/axes/steps, Pad pads) are
read by the kernels on the device, so enqueue never copies them to the host.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, places_last_axis
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for, merge_dims
from polykit.kernels.cuda.reduce.reduce import unit

FILE = "movement.cu"
MAXR = 8
SIZES = (1, 2, 4, 8)


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    st, acc = [0] * len(shape), 1
    for k in range(len(shape) - 1, -1, -1):
        st[k] = acc
        acc *= shape[k]
    return st


def _es(t: DeviceTensor, where: str) -> int:
    es = t.dtype.itemsize
    if es not in SIZES:
        raise DeviceError(f"no data-movement kernel for {es}-byte elements", where=where, hint="use --target cpu")
    return es


def _pad8(v: Sequence[int], fill: int = 1) -> list[int]:
    return list(v) + [fill] * (MAXR - len(v))


def widen(es: int, dims: list[int], ss: list[int], ds: list[int], bases: tuple[int, int], ptrs: tuple[int, int]):
    """Move the contiguous innermost run in wider elements (up to 16 bytes) when every stride,
    base and pointer stays aligned: fewer threads and index divisions, 16-byte accesses."""
    for w in (16, 8, 4, 2):
        if w <= es:
            break
        f = w // es
        if ss[-1] == 1 and ds[-1] == 1 and dims[-1] % f == 0 and all(s % f == 0 for s in ss[:-1] + ds[:-1]) \
                and all(b % f == 0 for b in bases) and all(p % w == 0 for p in ptrs):
            return w, dims[:-1] + [dims[-1] // f], [s // f for s in ss[:-1]] + [1], \
                [s // f for s in ds[:-1]] + [1], (bases[0] // f, bases[1] // f)
    return es, dims, ss, ds, bases


def launch_tiled_transpose(launcher: Launcher, src: DeviceTensor, dst: DeviceTensor, es: int, dims: list[int],
                           ss: list[int], ds: list[int]) -> None:
    """32x32 shared-memory tiles over (a = the source-contiguous dim, b = the last dim)."""
    a = ss.index(1)
    rest = [k for k in range(len(dims) - 1) if k != a]
    bd = [dims[k] for k in rest]
    nbatch = int(np.prod(bd, dtype=np.int64))
    tiles = -(-dims[a] // 32) * -(-dims[-1] // 32)
    args = [src, dst, nbatch, len(rest), *_pad8(bd), *_pad8([ss[k] for k in rest], 0), *_pad8([ds[k] for k in rest], 0),
            dims[a], dims[-1], ss[-1], ds[a]]
    launcher.launch(KernelSource(f"transpose_tiled_{es}", FILE, defines=unit(str(es))),
                    (tiles, min(nbatch, 65535), 1), (32, 8, 1), args)


def launch_copy(launcher: Launcher, src: DeviceTensor, dst: DeviceTensor, dims: Sequence[int],
                src_strides: Sequence[int], dst_strides: Sequence[int], src_base: int = 0, dst_base: int = 0,
                where: str = "") -> None:
    """dst[dst_base + c.dst_strides] = src[src_base + c.src_strides] for every c in `dims`."""
    if int(np.prod(dims, dtype=np.int64)) == 0:
        return
    es = _es(src, where)
    dims, (ss, ds) = merge_dims(list(dims), [list(src_strides), list(dst_strides)])
    if len(dims) > MAXR:
        raise DeviceError(f"a copy over {len(dims)} non-mergeable dims (at most {MAXR})", where=where,
                          hint="use --target cpu")
    es, dims, ss, ds, (src_base, dst_base) = widen(es, dims, ss, ds, (src_base, dst_base), (src.ptr, dst.ptr))
    n = int(np.prod(dims, dtype=np.int64))
    if len(dims) >= 2 and ds[-1] == 1 and ss[-1] != 1 and 1 in ss and src_base == 0 and dst_base == 0:
        launch_tiled_transpose(launcher, src, dst, es, dims, ss, ds)
        return
    args = [src, dst, n, len(dims), *_pad8(dims), *_pad8(ss, 0), *_pad8(ds, 0), src_base, dst_base]
    launcher.launch(KernelSource(f"copy_strided_{es}", FILE, defines=unit(str(es))), grid_for(n), (BLOCK, 1, 1), args)


def _src(prefix: str, es: int) -> KernelSource:
    return KernelSource(f"{prefix}_{es}", FILE, defines=unit(str(es)))


def copy_kernels(layer) -> list[KernelSource]:
    """The strided-copy and tiled-transpose kernels launch_copy may launch (every element size)."""
    return [KernelSource(f"{k}_{es}", FILE, defines=unit(str(es))) for es in (*SIZES, 16)
            for k in ("copy_strided", "transpose_tiled")]


def _shaped_kernels(prefix):
    return lambda layer: [_src(prefix, es) for es in SIZES]


def _io(layer, tensors):
    return tensors[layer.inputs[0]], tensors[layer.outputs[0]], f"layer {layer.name!r}"


def shares_bytes(layer, tensors: Mapping[str, DeviceTensor]) -> bool:
    """Whether a Reshape-family layer's output is its input's bytes (a view in the memory plan,
    or both bound at one caller address): it copies nothing."""
    return tensors[layer.inputs[0]].ptr == tensors[layer.outputs[0]].ptr


def enqueue_copy(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, where = _io(layer, tensors)
    if not shares_bytes(layer, tensors):
        launch_copy(launcher, x, y, [x.size], [1], [1], where=where)


def enqueue_transpose(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, where = _io(layer, tensors)
    rank = len(x.shape)
    perm = [int(p) % max(rank, 1) for p in layer.attrs.get("perm", list(range(rank))[::-1])]
    xs = contiguous_strides(x.shape)
    # placed in a Concat's output (concat by placement): rows of its last dim y.row_stride apart
    ys = contiguous_strides((*y.shape[:-1], y.rows_apart(y.shape[-1]))) if y.shape else []
    launch_copy(launcher, x, y, y.shape, [xs[p] for p in perm], ys, where=where)


def enqueue_expand(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, where = _io(layer, tensors)
    rank = len(y.shape)
    xshape = (1,) * (rank - len(x.shape)) + tuple(x.shape)
    xs = contiguous_strides(xshape)
    src = [0 if xshape[k] == 1 else xs[k] for k in range(rank)]
    launch_copy(launcher, x, y, y.shape, src, contiguous_strides(y.shape), where=where)


def enqueue_concat(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    """Each input copied into its slice of the output, but for those placed there (their producer
    wrote them at their rows: polykit.compiler.builder.concat_placement)."""
    y = tensors[layer.outputs[0]]
    axis = int(layer.attrs.get("axis", 0)) % len(y.shape)
    ys, offset = contiguous_strides(y.shape), 0
    for name in layer.inputs:
        if not name:
            continue
        x = tensors[name]
        if x.row_stride and x.ptr == y.ptr + offset * ys[axis] * np.dtype(y.dtype).itemsize:
            offset += x.shape[axis]
            continue
        launch_copy(launcher, x, y, x.shape, contiguous_strides(x.shape), ys, 0, offset * ys[axis],
                    where=f"layer {layer.name!r}")
        offset += x.shape[axis]


def enqueue_split(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x = tensors[layer.inputs[0]]
    axis = int(layer.attrs.get("axis", 0)) % len(x.shape)
    xs, offset = contiguous_strides(x.shape), 0
    for name in layer.outputs:
        if not name:
            continue
        y = tensors[name]
        launch_copy(launcher, x, y, y.shape, xs, contiguous_strides(y.shape), offset * xs[axis], 0,
                    where=f"layer {layer.name!r}")
        offset += y.shape[axis]


def depth_space_view(kind: str, attrs: Mapping, shape: Sequence[int]) -> tuple[list[int], list[int]]:
    """The strided view (dims, source element strides) whose contiguous copy is the op's output, for a
    contiguous (N, C, H, W) input; host logic, testable without a GPU."""
    b = int(attrs["blocksize"])
    n, c, h, w = (int(d) for d in shape)
    hw = h * w
    if kind == "DepthToSpace":
        c2 = c // (b * b)
        if attrs.get("mode", "DCR") == "DCR":  # view [n, b1, b2, c2, h, w]
            s_b1, s_b2, s_c = b * c2 * hw, c2 * hw, hw
        else:  # CRD: view [n, c2, b1, b2, h, w]
            s_c, s_b1, s_b2 = b * b * hw, b * hw, hw
        return [n, c2, h, b, w, b], [c * hw, s_c, w, s_b1, 1, s_b2]
    hb, wb = h // b, w // b  # SpaceToDepth: input viewed as [n, c, h/b, b1, w/b, b2]
    if attrs.get("mode", "DCR") == "DCR":  # -> [n, b1, b2, c, h/b, w/b]
        return [n, b, b, c, hb, wb], [c * hw, w, 1, hw, b * w, b]
    return [n, c, b, b, hb, wb], [c * hw, hw, w, 1, b * w, b]  # CRD: -> [n, c, b1, b2, h/b, w/b]


def enqueue_depth_space(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, where = _io(layer, tensors)
    dims, src = depth_space_view(layer.kind, layer.attrs, x.shape)
    launch_copy(launcher, x, y, dims, src, contiguous_strides(dims), where=where)


def _shape_args(x: DeviceTensor, y: DeviceTensor, where: str) -> list[int]:
    if len(x.shape) > MAXR:
        raise DeviceError(f"rank {len(x.shape)} exceeds {MAXR}", where=where, hint="use --target cpu")
    return [y.size, len(x.shape), *_pad8(x.shape), *_pad8(y.shape)]


def _opt(layer, tensors, i):
    return tensors[layer.inputs[i]] if len(layer.inputs) > i and layer.inputs[i] else None


def enqueue_slice(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, where = _io(layer, tensors)
    if y.size == 0:
        return
    starts, axes, steps = _opt(layer, tensors, 1), _opt(layer, tensors, 3), _opt(layer, tensors, 4)
    args = [x, y, *_shape_args(x, y, where), starts, starts.size, axes if axes is not None else 0,
            steps if steps is not None else 0, int(starts.dtype.itemsize == 8)]
    launcher.launch(_src("slice", _es(x, where)), grid_for(y.size), (BLOCK, 1, 1), args)


PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}


def enqueue_pad(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, where = _io(layer, tensors)
    if y.size == 0:
        return
    pads, cval, axes = _opt(layer, tensors, 1), _opt(layer, tensors, 2), _opt(layer, tensors, 3)
    mode = layer.attrs.get("mode", "constant")
    if mode not in PAD_MODES:
        raise DeviceError(f"Pad mode {mode!r} has no CUDA kernel", where=where, hint="use --target cpu")
    if x.size == 0 and mode != "constant":
        raise DeviceError(f"Pad mode {mode!r} of an empty tensor", where=where)
    if cval is not None and cval.size == 0:
        cval = None
    n_axes = axes.size if axes is not None else len(x.shape)
    args = [x, y, cval if cval is not None else 0, *_shape_args(x, y, where), pads, n_axes,
            axes if axes is not None else 0, int(axes is None or axes.dtype.itemsize == 8), PAD_MODES[mode]]
    launcher.launch(_src("pad", _es(x, where)), grid_for(y.size), (BLOCK, 1, 1), args)


def enqueue_tile(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, where = _io(layer, tensors)
    if y.size == 0:
        return
    launcher.launch(_src("tile", _es(x, where)), grid_for(y.size), (BLOCK, 1, 1),
                    [x, y, *_shape_args(x, y, where)])


for _kind in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
    cuda_tactic(_kind, "cuda.movement.copy", kernels=copy_kernels, idle=shares_bytes)(enqueue_copy)
for _kind, _fn in (("Transpose", enqueue_transpose), ("Expand", enqueue_expand), ("Concat", enqueue_concat),
                   ("Split", enqueue_split), ("DepthToSpace", enqueue_depth_space),
                   ("SpaceToDepth", enqueue_depth_space)):
    cuda_tactic(_kind, "cuda.movement.strided", kernels=copy_kernels,
                places=places_last_axis if _kind == "Transpose" else None)(_fn)
cuda_tactic("Slice", "cuda.movement.slice", kernels=_shaped_kernels("slice"))(enqueue_slice)
pad_kernels = _shaped_kernels("pad")
cuda_tactic("Pad", "cuda.movement.pad", kernels=pad_kernels,
            supports=lambda layer: layer.attrs.get("mode", "constant") in PAD_MODES)(enqueue_pad)
cuda_tactic("Tile", "cuda.movement.tile", kernels=_shaped_kernels("tile"))(enqueue_tile)


def compile_variants() -> list[KernelSource]:
    """The one movement.cu module (every op and element size is an entry point in it)."""
    return copy_kernels(None) + [k for p in ("slice", "pad", "tile") for k in _shaped_kernels(p)(None)]
