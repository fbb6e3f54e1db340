"""ai.polykit Attention on Hopper tensor cores (flash_attention_sm90.cu): tactic
`cuda.attention.flash_sm90` (one consumer warpgroup, 64 query rows a block, key tiles of 64),
GPUs of compute capability 9.0. The kernel also takes key tiles of 128 (BKV) and two consumer
warpgroups (CONSUMERS); both measured slower than this shape on every shape tried on the H100
(2026-11-24, docs/PERFORMANCE.md), so they are not registered on their own: timing them only lengthened builds.
`cuda.attention.flash_sm90_pp`, `_pp_s3` and `_pp_persist_s3` are FlashAttention-3's head-128 form of it
(PINGPONG: two consumer warpgroups of 64 rows taking turns on the tensor cores, a producer warpgroup that
gives its registers to them through setmaxnreg, key tiles of 128; 2 or 3 K/V stages; PERSISTENT: a grid
of one block an SM looping over the query blocks, the next one's loads under the current one's end), one
priority below flash_sm90 until a GPU session has run their tests and timed them: the builder times them
against it, a plan built without timing keeps flash_sm90. Their speed is predicted, not measured
(flash_attention_sm90.cu's header, docs/CUDA_NOTES.md).

They take the layers `cuda.attention.flash` takes of head size 64 or 128 (flash_attention.flash_geometry:
float16 / bfloat16, [B, H, S, D] or [B, S, H, D] layouts or strided views, broadcast batch / head
dims, grouped-query heads, an additive or bool mask, which is also how a causal layer arrives) and run them with
wgmma: Q, K and V come through TMA tensor maps (rank 4, one 64-element box of d by the tile's
rows, the view's strides as the map's), so each must start 16-byte aligned, and a view whose dims
do not nest in stride order (tma_layout) is left to the mma.sync kernel; the builder times them
against it.

Every shape also runs ai.polykit AttentionQuantize (an FP8 model's attention writing the e4m3 input of its output
projection) where it runs the Attention: the kernel compiled with FLASH_Q8 (flash_common.cuh's e4m3 output stage,
the one flash_attention.cu's FLASH_Q8 kernels write), the same priorities, so the FP8 model's attention gets
flash_sm90 wherever the fp16 model's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.attention_quantize import KIND as QUANTIZED
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import ANY, DeviceTensor, KernelSource, TensorMapSpec, cuda_tactic, defines
from polykit.kernels.cuda.attention.flash_attention import (ELEMS, OUTER_ARGS, HeadView, flash_geometry, flash_launch,
                                                             has_mask, head_view, mask_defines, quantized_output,
                                                             quantized_scale, split_batch)

FILE = "flash_attention_sm90.cu"
ARCHS = ("sm_90",)
BOX_D = 64  # head elements of one TMA box (128 bytes)
HEAD_SIZES = (64, 128)  # whole boxes (head size 32 runs cuda.attention.flash)


@dataclass(frozen=True)
class Sm90Flash:
    """One block shape: `consumers` warpgroups of 64 query rows, key tiles of `block_kv`, `stages`
    K/V stages, a producer warp; `pingpong`: the consumers take turns on the tensor cores and the
    producer is a whole warpgroup that hands its registers to them (the kernel's PINGPONG)."""

    consumers: int
    block_kv: int = 64
    stages: int = 2
    pingpong: bool = False
    #: (with pingpong) a grid of at most one block an SM looping over the (query block, head, batch) items: the
    #: producer loads the next item's Q, K and V while the consumers finish the current one (the kernel's PERSISTENT)
    persistent: bool = False
    priority: int = 20

    @property
    def block_q(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1) if self.pingpong else 128 * self.consumers + 32

    def smem(self, head: int) -> int:
        """Dynamic shared memory: 1 KiB alignment slack, Q, the stages of K and V, the mbarriers
        (1 + 2 stages of 8 bytes, in 16 (stages + 2))."""
        return 1024 + (self.block_q + 2 * self.stages * self.block_kv) * head * 2 + 16 * (self.stages + 2)

    @property
    def name(self) -> str:
        if self.pingpong:
            return ("cuda.attention.flash_sm90_pp" + ("_persist" if self.persistent else "")
                    + (f"_s{self.stages}" if self.stages != 2 else ""))
        return ("cuda.attention.flash_sm90" + ("_2wg" if self.consumers == 2 else "")
                + (f"_kv{self.block_kv}" if self.block_kv != 64 else ""))

    @property
    def params(self) -> dict[str, int]:
        # flash_sm90 keeps the params it had
        extra = {"pingpong": 1, "persistent": int(self.persistent)} if self.pingpong else {}
        return {"block_q": self.block_q, "block_kv": self.block_kv, "consumers": self.consumers,
                "stages": self.stages, **extra}

    def grid(self, S: int, heads: int, batch: int, sm_count: int) -> tuple[int, int, int]:
        """Blocks of block_q query rows by heads by batch; persistent: one block an SM at most (x only)."""
        qblocks = -(-S // self.block_q)
        if self.persistent:
            return (max(1, min(qblocks * heads * batch, sm_count)), 1, 1)
        return (qblocks, heads, batch)


#: flash_sm90; then FlashAttention-3's ping-pong form with key tiles of 128 and two or three stages, and
#: its persistent grid (three stages), one priority below it (a plan built without timing keeps
#: flash_sm90) until a GPU session times them
SHAPES = (Sm90Flash(1),
          Sm90Flash(2, 128, stages=2, pingpong=True, priority=19),
          Sm90Flash(2, 128, stages=3, pingpong=True, priority=19),
          Sm90Flash(2, 128, stages=3, pingpong=True, persistent=True, priority=19))


def kernel_for(shape: Sm90Flash, elem: str, head: int, masked: bool = True, q8: bool = False) -> KernelSource:
    """`q8`: AttentionQuantize's e4m3 output stage (FLASH_Q8)."""
    # STAGES and PINGPONG only for the ping-pong shapes: flash_sm90 keeps the defines (and cache keys) it had
    extra = {"STAGES": shape.stages, "PINGPONG": 1} if shape.pingpong else {}
    if shape.persistent:
        extra["PERSISTENT"] = 1
    if q8:
        extra["FLASH_Q8"] = 1
    tile = defines(ELEM=elem, HD=head, CONSUMERS=shape.consumers, BKV=shape.block_kv, **extra, **mask_defines(masked))
    return KernelSource("flash_attention_sm90", file=FILE, defines=tile, arch="sm_90a")


def tma_layout(view: HeadView, itemsize: int) -> tuple[tuple[int, ...], tuple[int, ...], bool] | None:
    """The rank-4 TMA map of a view (dims innermost first: d, then seq and head in the order of their
    strides, then batch; the byte strides of dims 1..3; whether head comes before seq), or None
    when TMA cannot read it so: an offset or a stride not a multiple of 16 bytes, or dims that do
    not nest (a stride below the extent of the dims inside it: torchvision's batch-second
    projection at batch > 1 -- the mma.sync kernel reads those)."""
    b, h, s, d = view.shape
    sb, sh, ss = view.strides
    bshd = h > 1 and sh < ss
    outer = [(h, sh), (s, ss)] if bshd else [(s, ss), (h, sh)]
    strides, extent = [], d
    for n, st in outer + [(b, sb)]:
        st = st if n > 1 else extent  # a size-1 dim: packed after the dims inside it
        if st < extent or (st * itemsize) % 16 or st * itemsize >= 1 << 40:
            return None
        strides.append(st * itemsize)
        extent = st * n
    if (view.offset * itemsize) % 16:
        return None
    dims = (d, *(n for n, _ in outer), b)
    return dims, tuple(strides), bshd


def tensor_map(x: DeviceTensor, view: HeadView, rows: int) -> tuple[TensorMapSpec, int]:
    """The TMA map of Q, K or V (`x` already at the view's offset; boxes of 64 d by `rows`
    sequence rows) and the tensor's three `geo` bits (flash_attention_sm90.cu: 1 head before
    seq in the map, 2 batch of 1, 4 one head)."""
    b, h, _, _ = view.shape
    if x.ptr % 16:
        raise DeviceError(f"tensor at {x.ptr:#x} is not 16-byte aligned, which TMA needs",
                          where="tactic cuda.attention.flash_sm90", hint="use cuda.attention.flash for this layer")
    layout = tma_layout(view, np.dtype(x.dtype).itemsize)
    if layout is None:
        raise DeviceError(f"a view with offset {view.offset} and strides {view.strides} is no TMA map",
                          where="tactic cuda.attention.flash_sm90", hint="use cuda.attention.flash for this layer")
    dims, strides, bshd = layout
    box = (BOX_D, 1, rows, 1) if bshd else (BOX_D, rows, 1, 1)
    bits = int(bshd) | (int(b == 1) << 1) | (int(h == 1) << 2)
    return TensorMapSpec(x.ptr, x.dtype, dims, strides, box), bits


def _supports(layer: Any) -> bool:
    geo = flash_geometry(layer, heads=HEAD_SIZES)
    if geo is None or split_batch(layer) or (layer.kind == QUANTIZED and not quantized_output(layer)):
        return False
    itemsize = np.dtype(geo[0]).itemsize
    views = [head_view(layer.attrs, i, layer.in_shapes[i]) for i in range(3)]
    return all(v is not None and tma_layout(v, itemsize) is not None for v in views)


def _kernels(shape: Sm90Flash):
    def kernels(layer: Any) -> list[KernelSource]:
        dtype, head = flash_geometry(layer, heads=HEAD_SIZES)
        return [kernel_for(shape, ELEMS[dtype], head, has_mask(layer), layer.kind == QUANTIZED)]

    return kernels


def _enqueue(shape: Sm90Flash):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        y_scale = quantized_scale(layer, tensors)  # FLASH_Q8's last argument (AttentionQuantize)
        run = flash_launch(layer, tensors)
        if run is None:
            return
        maps, geo = [], 0
        for i, rows in enumerate((shape.block_q, shape.block_kv, shape.block_kv)):
            spec, bits = tensor_map(run.args[i], run.views[i], rows)
            maps.append(spec)
            geo |= bits << (3 * i)
        # flash_launch's arguments: Q, K, V, O, mask, S, Skv, 4 x (b, h, s) strides, 4 mask strides, scale, kind, nan,
        # kv_groups, causal offset (not the trailing outer-batch arguments: _supports refuses rank-5 attention)
        q, k, v, o, mask, S, Skv = run.args[:7]
        rest = run.args[7 + 3 * 3:-OUTER_ARGS]  # O's strides onwards
        _, H, B = run.grid
        elem = ELEMS[np.dtype(tensors[layer.inputs[0]].dtype).name]
        items = [np.int32(H), np.int32(B)] if shape.persistent else []  # the kernel's ITEM_PARAMS
        grid = shape.grid(int(S), H, B, launcher.sm_count if shape.persistent else 0)
        launcher.launch(kernel_for(shape, elem, run.head, has_mask(layer), layer.kind == QUANTIZED), grid,
                        (shape.threads,), [*maps, o, mask, S, Skv, *rest, np.int32(geo), *items, *y_scale],
                        shared_mem=shape.smem(run.head))

    return enqueue


def compile_variants() -> list[KernelSource]:
    """Every shape, storage type and head size; the unmasked form at head 128; the e4m3 output stage (FLASH_Q8)
    of every shape and storage type at BERT's head 64, and in float16 at head 128."""
    return [kernel_for(s, e, d) for s in SHAPES for e in ELEMS.values() for d in HEAD_SIZES] + \
        [kernel_for(s, "half_t", 128, masked=False) for s in SHAPES] + \
        [kernel_for(s, e, 64, q8=True) for s in SHAPES for e in ELEMS.values()] + \
        [kernel_for(s, "half_t", 128, q8=True) for s in SHAPES]


for _shape in SHAPES:
    for _kind in ("Attention", QUANTIZED):
        cuda_tactic(_kind, _shape.name, kernels=_kernels(_shape), supports=_supports, priority=_shape.priority,
                    archs=ARCHS, domain=POLYKIT_DOMAIN if _kind == QUANTIZED else ANY,
                    params=_shape.params)(_enqueue(_shape))
