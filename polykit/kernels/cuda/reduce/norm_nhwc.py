"""ai.polykit GroupNormNHWC on cuda (norm_nhwc.cu): group / instance normalization of a channels-last
tensor in three launches, split over the pixels so that a batch-1 layer fills the GPU.

  cuda.norm_nhwc   fp16 / fp32 / bf16 X with scale and bias of X's dtype, fp32 statistics; 16-byte
                   vectors along C where C is a multiple of them and X / Y are 16-byte aligned,
                   element by element otherwise (any C, any C / G)

geometry() cuts a sample's pixels into S chunks of about SPLIT_BYTES of X each (at most MAX_SPLITS,
and about MAX_BLOCKS partial blocks in all) and its channels into CT tiles of tx threads x NG_VEC
channels: gn_nhwc_partials' grid (S, CT, N) writes per-channel Welford partials, gn_nhwc_stats' grid
(G, N) combines those of each (n, group) in a fixed order (deterministic), gn_nhwc_apply normalizes
with the affine and the layer's `activation` (NORM_ACTIVATIONS, set by fuse_bias_activation: a
GELU or SiLU reading the norm runs inside the apply kernel, NG_ACT; the other two kernels do not
depend on it).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.group_norm_nhwc import FLOATS, GROUP_NORM_NHWC, NORM_ACTIVATIONS, norm_activation
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, defines
from polykit.kernels.cuda.launch_geometry import grid_for
from polykit.kernels.cuda.storage_types import CTYPE

FILE = "norm_nhwc.cu"
THREADS = 256
#: X bytes a partials block reads (about), the most pixel chunks a sample, partial blocks in all (about)
SPLIT_BYTES = 32 * 1024
MAX_SPLITS = 512
MAX_BLOCKS = 2048
KERNELS = ("gn_nhwc_partials", "gn_nhwc_stats", "gn_nhwc_apply")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
#: samples a grid's z extent holds
MAX_BATCH = 65535


def vec_width(itemsize: int) -> int:
    return 16 // itemsize


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def geometry(n: int, p: int, c: int, itemsize: int, vec: int) -> tuple[int, int, int, int]:
    """(tx, CT, S, chunk): threads along C in a partials block (a power of two dividing THREADS), the
    channel tiles of tx * vec channels, the pixel chunks of a sample and their length. S and chunk
    depend on the shape only (not on `vec`)."""
    tx = min(THREADS, _pow2_at_least(-(-c // vec)))
    ct = -(-c // (tx * vec))
    per_block = max(1, SPLIT_BYTES // (min(c, THREADS * 8) * itemsize))
    splits = max(1, min(-(-p // per_block), MAX_SPLITS, max(1, MAX_BLOCKS // max(1, n * -(-c // (THREADS * 8))))))
    chunk = -(-p // splits)
    return tx, ct, -(-p // chunk), chunk


def partials_shared_bytes(tx: int, vec: int) -> int:
    rows = THREADS // tx
    return 4 * (2 * rows * tx * vec + rows)


def workspace_bytes(n: int, splits: int, c: int, groups: int) -> int:
    """The per-channel partials [N, S, C, 2] and the statistics [N, G, 2], fp32; the statistics start
    256-byte aligned."""
    partials = -(-8 * n * splits * c // 256) * 256
    return partials + 8 * n * groups


def _dims(shape) -> tuple[int, int, int]:
    """(N, P, C) of X [N, ..., C]."""
    return int(shape[0]), int(np.prod(shape[1:-1], dtype=np.int64)), int(shape[-1])


def kernel(name: str, dtype: str, vec: int, activation: str = "none") -> KernelSource:
    """`name` for `dtype` and `vec`; the apply kernel with `activation` (NG_ACT, and PK_GELU16 for a
    16-bit GELU as the epilogues compute it); the three share a unit without one."""
    extra = {}
    if name == "gn_nhwc_apply" and activation != "none":
        extra["NG_ACT"] = NORM_ACTIVATIONS.index(activation)
        if activation == "gelu" and dtype != "float32":
            extra["PK_GELU16"] = 1
    return KernelSource(name, FILE, defines=defines(ELEM=CTYPE[dtype], NG_VEC=vec, **extra))


def _supports(layer: Any) -> bool:
    shapes, dts = tuple(getattr(layer, "in_shapes", ()) or ()), tuple(getattr(layer, "in_dtypes", ()) or ())
    if len(shapes) < 3 or not shapes[0] or len(shapes[0]) < 3 or not dts or dts[0] not in FLOATS:
        return False
    if any(d != dts[0] for d in dts[:3]):
        return False
    n, c, groups = shapes[0][0], shapes[0][-1], int(layer.attrs.get("num_groups", 0))
    if norm_activation(layer.attrs) not in NORM_ACTIVATIONS:
        return False
    return (not isinstance(c, int) or (groups >= 1 and c % groups == 0)) and (not isinstance(n, int) or n <= MAX_BATCH)


def _kernels(layer: Any) -> list[KernelSource]:
    dtype = layer.in_dtypes[0] if layer is not None and layer.in_dtypes else "float16"
    c = layer.in_shapes[0][-1] if layer is not None and layer.in_shapes else 0
    wide = vec_width(ITEMSIZE.get(dtype, 2))
    vecs = {1} | ({wide} if isinstance(c, int) and c % wide == 0 else set())
    act = norm_activation(layer.attrs) if layer is not None else "none"
    return [kernel(name, dtype, v, act) for v in sorted(vecs) for name in KERNELS]


def workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
    try:
        x = tensors[layer.inputs[0]]
        n, p, c = _dims(x.shape)
        _, _, splits, _ = geometry(n, p, c, ITEMSIZE[np.dtype(x.dtype).name], 1)
    except (KeyError, IndexError, TypeError, ValueError):
        return 0
    return workspace_bytes(n, splits, c, int(layer.attrs["num_groups"]))


def launch_plan(layer: Any, tensors: Mapping[str, DeviceTensor], ws: int) -> list[tuple]:
    """The three launches: (kernel, grid, block, shared bytes, args) each."""
    x, scale, bias, y = (tensors[name] for name in (*layer.inputs[:3], layer.outputs[0]))
    where = f"layer {layer.name!r}"
    n, p, c = _dims(x.shape)
    groups = int(layer.attrs["num_groups"])
    if x.dtype.name not in FLOATS or any(t.dtype != x.dtype for t in (scale, bias, y)):
        raise DeviceError(f"GroupNormNHWC has no cuda.norm_nhwc kernel for {x.dtype} with parameters of "
                          f"{scale.dtype} / {bias.dtype}", where=where, hint="rebuild the plan (or use --target cpu)")
    if groups < 1 or c % groups or scale.size != c or bias.size != c or y.size != x.size or n > MAX_BATCH:
        raise DeviceError(f"{c} channels in {groups} groups with {scale.size} scales and {bias.size} biases, "
                          f"{n} samples",
                          where=where, hint="rebuild the plan from the model")
    item = x.dtype.itemsize
    vec = vec_width(item) if c % vec_width(item) == 0 and x.ptr % 16 == 0 and y.ptr % 16 == 0 else 1
    tx, ct, splits, chunk = geometry(n, p, c, item, vec)
    stats = ws + workspace_bytes(n, splits, c, groups) - 8 * n * groups
    dtype = x.dtype.name
    i32 = np.int32
    vectors = x.size // vec
    return [
        (kernel("gn_nhwc_partials", dtype, vec), (splits, ct, n), (THREADS, 1, 1), partials_shared_bytes(tx, vec),
         [x, ws, p, i32(c), i32(splits), chunk, i32(tx)]),
        (kernel("gn_nhwc_stats", dtype, vec), (groups, n, 1), (THREADS, 1, 1), 0,
         [ws, stats, p, i32(c), i32(groups), i32(splits), chunk, np.float32(layer.attrs.get("epsilon", 1e-5))]),
        (kernel("gn_nhwc_apply", dtype, vec, norm_activation(layer.attrs)), grid_for(vectors), (THREADS, 1, 1), 0,
         [x, stats, scale, bias, y, vectors, p * c, i32(c), i32(groups)]),
    ]


def enqueue_group_norm_nhwc(layer: Any, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x = tensors[layer.inputs[0]]
    if not x.size:
        return
    n, p, c = _dims(x.shape)
    _, _, splits, _ = geometry(n, p, c, x.dtype.itemsize, 1)
    ws = launcher.workspace(workspace_bytes(n, splits, c, int(layer.attrs["num_groups"])))
    for source, grid, block, shared, args in launch_plan(layer, tensors, ws):
        launcher.launch(source, grid, block, args, shared_mem=shared)


cuda_tactic(GROUP_NORM_NHWC, "cuda.norm_nhwc", domain=POLYKIT_DOMAIN, kernels=_kernels, supports=_supports,
            workspace=workspace)(enqueue_group_norm_nhwc)


def compile_variants() -> list[KernelSource]:
    """Every kernel in every storage type, scalar and with 16-byte vectors; the apply kernel with each
    activation in every storage type (16-byte vectors)."""
    return [kernel(name, dtype, v) for dtype in FLOATS for v in (1, vec_width(ITEMSIZE[dtype]))
            for name in KERNELS] + [kernel("gn_nhwc_apply", dtype, vec_width(ITEMSIZE[dtype]), act)
                                    for dtype in FLOATS for act in NORM_ACTIVATIONS[1:]]
