"""ai.polykit Attention on Hopper tensor cores (flash_attention_sm90.cu): tactic
`cuda.attention.flash_sm90` (one consumer warpgroup, 64 query rows a block, key tiles of 64),
GPUs of compute capability 9.0. The kernel also takes key tiles of 128 (BKV) and two consumer
warpgroups (CONSUMERS); both measured slower than this shape on every shape tried on the H100
(2026-11-24, docs/PERFORMANCE.md), so they are not registered: timing them only lengthened builds.

They take the layers `cuda.attention.flash` takes of head size 64 or 128 (flash_attention.flash_geometry:
float16 / bfloat16, [B, H, S, D] or [B, S, H, D] layouts, broadcast batch / head
dims, an additive or bool mask, which is also how a causal layer arrives) and run them with
wgmma: Q, K and V come through TMA tensor maps (rank 4, one 64-element box of d by the tile's
rows), so each must start 16-byte aligned; the builder times them against the mma.sync kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, TensorMapSpec, cuda_tactic, defines
from polykit.kernels.cuda.attention.flash_attention import ELEMS, LAYOUT_ATTRS, flash_geometry, flash_launch, logical_shape

FILE = "flash_attention_sm90.cu"
ARCHS = ("sm_90",)
BOX_D = 64  # head elements of one TMA box (128 bytes)
HEAD_SIZES = (64, 128)  # whole boxes (head size 32 runs cuda.attention.flash)


@dataclass(frozen=True)
class Sm90Flash:
    """One block shape: `consumers` warpgroups of 64 query rows, key tiles of `block_kv`, a
    producer warp."""

    consumers: int
    block_kv: int = 64

    @property
    def block_q(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * self.consumers + 32

    def smem(self, head: int) -> int:
        """Dynamic shared memory: 1 KiB alignment slack, Q, two stages of K and V, 5 mbarriers."""
        return 1024 + (self.block_q + 4 * self.block_kv) * head * 2 + 64

    @property
    def name(self) -> str:
        return ("cuda.attention.flash_sm90" + ("_2wg" if self.consumers == 2 else "")
                + (f"_kv{self.block_kv}" if self.block_kv != 64 else ""))


SHAPES = (Sm90Flash(1),)


def kernel_for(shape: Sm90Flash, elem: str, head: int) -> KernelSource:
    tile = defines(ELEM=elem, HD=head, CONSUMERS=shape.consumers, BKV=shape.block_kv)
    return KernelSource("flash_attention_sm90", file=FILE, defines=tile, arch="sm_90a")


def tensor_map(x: DeviceTensor, layout: str, rows: int) -> tuple[TensorMapSpec, int]:
    """The TMA map of Q, K or V stored as `layout` (boxes of 64 d by `rows` sequence rows) and
    the tensor's three `geo` bits (flash_attention_sm90.cu: 1 [B, S, H, D], 2 batch of 1, 4 one head)."""
    b, h, s, d = logical_shape(x.shape, layout)
    es = np.dtype(x.dtype).itemsize
    if x.ptr % 16:
        raise DeviceError(f"tensor at {x.ptr:#x} is not 16-byte aligned, which TMA needs",
                          where="tactic cuda.attention.flash_sm90", hint="use cuda.attention.flash for this layer")
    bshd = layout == "bshd"
    dims = (d, h, s, b) if bshd else (d, s, h, b)
    box = (BOX_D, 1, rows, 1) if bshd else (BOX_D, rows, 1, 1)
    strides = (dims[0] * es, dims[0] * dims[1] * es, dims[0] * dims[1] * dims[2] * es)
    bits = int(bshd) | (int(b == 1) << 1) | (int(h == 1) << 2)
    return TensorMapSpec(x.ptr, x.dtype, dims, strides, box), bits


def _supports(layer: Any) -> bool:
    return flash_geometry(layer, heads=HEAD_SIZES) is not None


def _kernels(shape: Sm90Flash):
    def kernels(layer: Any) -> list[KernelSource]:
        dtype, head = flash_geometry(layer, heads=HEAD_SIZES)
        return [kernel_for(shape, ELEMS[dtype], head)]

    return kernels


def _enqueue(shape: Sm90Flash):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        run = flash_launch(layer, tensors)
        if run is None:
            return
        layouts = [str(layer.attrs.get(a, "bhsd")) for a in LAYOUT_ATTRS]
        maps, geo = [], 0
        for i, (name, rows) in enumerate(zip(layer.inputs[:3], (shape.block_q, shape.block_kv, shape.block_kv))):
            spec, bits = tensor_map(tensors[name], layouts[i], rows)
            maps.append(spec)
            geo |= bits << (3 * i)
        # flash_launch's arguments: Q, K, V, O, mask, S, Skv, 4 x (b, h, s) strides, 4 mask strides, scale, kind, nan
        q, k, v, o, mask, S, Skv = run.args[:7]
        rest = run.args[7 + 3 * 3:]  # O's strides onwards
        _, H, B = run.grid
        elem = ELEMS[np.dtype(tensors[layer.inputs[0]].dtype).name]
        launcher.launch(kernel_for(shape, elem, run.head), (-(-int(S) // shape.block_q), H, B), (shape.threads,),
                        [*maps, o, mask, S, Skv, *rest, np.int32(geo)], shared_mem=shape.smem(run.head))

    return enqueue


def compile_variants() -> list[KernelSource]:
    return [kernel_for(s, e, d) for s in SHAPES for e in ELEMS.values() for d in HEAD_SIZES]


for _shape in SHAPES:
    cuda_tactic("Attention", _shape.name, kernels=_kernels(_shape), supports=_supports, priority=20, archs=ARCHS,
                params={"block_q": _shape.block_q, "block_kv": _shape.block_kv, "consumers": _shape.consumers, "stages": 2})(
        _enqueue(_shape))
