"""fp32 ai.polykit Attention on tf32 tensor cores (flash_attention_f32.cu).

`cuda.attention.flash_f32` runs float32 layers of precision "fp32" at fp32 accuracy (3xTF32:
each operand split into two tf32 parts, three products); `cuda.attention.flash_tf32` runs the
layers a `--tf32` build lets round to tf32 (one product, precision "tf32"). Both take what
`cuda.attention.flash` takes of head size D = Dv in {64, 128} (flash_attention.py: rank 3 or 4,
broadcast batch and head dims, additive float or bool masks contiguous or broadcast along the
key axis, [B, H, S, D] or [B, S, H, D] tensors through strides), so fp32 BERT's head transposes
vanish too. The builder times them against `cuda.attention.simple`.
"""

from __future__ import annotations

from typing import Any, Mapping

from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.attention.flash_attention import BQ, flash_geometry, flash_launch, has_mask, mask_defines

FILE = "flash_attention_f32.cu"
STORED = {"float32": "float"}
WARPS = 4
#: keys per shared-memory tile by head size: K and V double-buffered take 64 KiB
BLOCK_KV = {64: 64, 128: 32}
HEAD_SIZES = tuple(BLOCK_KV)
#: tactic -> (layer precision it serves, tf32 products per fp32 product)
VARIANTS = {"cuda.attention.flash_f32": ("fp32", 3), "cuda.attention.flash_tf32": ("tf32", 1)}


def kernel_for(head: int, products: int, masked: bool = True) -> KernelSource:
    return KernelSource("flash_attention_f32", file=FILE,
                        defines=defines(HD=head, BKV=BLOCK_KV[head], SPLIT3=int(products == 3), **mask_defines(masked)))


def shared_bytes(head: int) -> int:
    """The Q tile and K and V tiles, two buffers each, float."""
    return (BQ + 4 * BLOCK_KV[head]) * head * 4


def _variant(precision: str, products: int):
    def supports(layer: Any) -> bool:
        outs = getattr(layer, "out_dtypes", ())
        return (getattr(layer, "precision", None) == precision and tuple(outs[:1]) == ("float32",)
                and flash_geometry(layer, STORED, HEAD_SIZES) is not None)

    def kernels(layer: Any) -> list[KernelSource]:
        return [kernel_for(flash_geometry(layer, STORED, HEAD_SIZES)[1], products, has_mask(layer))]

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        run = flash_launch(layer, tensors)
        if run is not None:
            launcher.launch(kernel_for(run.head, products, has_mask(layer)), run.grid, (WARPS * 32,), list(run.args),
                            shared_mem=shared_bytes(run.head))

    return supports, kernels, enqueue


for _name, (_precision, _products) in VARIANTS.items():
    _supports, _kernels, _enqueue = _variant(_precision, _products)
    cuda_tactic("Attention", _name, kernels=_kernels, supports=_supports, priority=20,
                params={"block_q": BQ, "block_kv_h64": BLOCK_KV[64], "block_kv_h128": BLOCK_KV[128], "warps": WARPS,
                        "tf32_products": _products})(_enqueue)


def compile_variants() -> list[KernelSource]:
    return [kernel_for(d, p) for d in HEAD_SIZES for _, p in VARIANTS.values()] + [kernel_for(128, 3, masked=False)]
