"""Which math precisions a layer may run in (LayerDesc.precision), by preference.

Storage comes first: an fp16/bf16 build converts float32 tensors before lowering
(polykit.compiler.passes.precision), so a layer's stamped dtypes say whether it stores
float16, bfloat16 or float32. Its math then follows the builder flags, weakly typed as
in TensorRT: a half layer may run "fp16"/"bf16" or, where only that has a tactic, "fp32"
math on its half storage; a float32 layer may run "tf32" tensor-core math with --tf32, else
"fp32"; an INT8 layer (QConv, QMatMul) runs "int8", an FP8 one (float8_e4m3fn operands) "fp8". A strongly typed build, and the cpu (whose kernels compute on the arrays they get,
floats in float64), take the storage precision. A precision requested for
the layer's ONNX nodes (BuilderConfig.layer_precisions; a fused layer takes the highest its
nodes ask for) binds as `precision_constraints` says: obey (that precision only), prefer
(first, the others after), none (a hint the builder may ignore).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

import numpy as np

from polykit.compiler.builder.config import PRECISIONS, BuilderConfig
from polykit.compiler.plan.records import storage_precision


def requested_precision(layer: Any, cfg: BuilderConfig) -> str | None:
    """The highest precision `layer_precisions` (or `fp32_layers`) asks for any of the layer's nodes."""
    asked = [cfg.layer_precisions[n] for n in (*layer.fused_nodes, layer.name) if n in cfg.layer_precisions]
    if any(n in cfg.fp32_layers for n in (*layer.fused_nodes, layer.name, layer.kind)):
        asked.append("fp32")
    return min(asked, key=PRECISIONS.index) if asked else None


def allowed_precisions(layer: Any, cfg: BuilderConfig, target: str) -> list[str]:
    """The precisions the builder may choose from for `layer`, lowest (fastest) first. The
    cpu computes in the storage's precision (floats accumulate in float64): one choice."""
    storage = storage_precision(layer)
    if cfg.strongly_typed or target == "cpu" or storage in ("int8", "fp8"):
        return [storage]
    if storage != "fp32":
        return [storage, "fp32"]
    return (["tf32"] if cfg.tf32 else []) + ["fp32"]


def precision_options(layer: Any, cfg: BuilderConfig, target: str) -> tuple[list[str], str | None]:
    """(precisions to try in order, the requested one that could not be honoured or None)."""
    allowed = allowed_precisions(layer, cfg, target)
    want = requested_precision(layer, cfg)
    if want is None or cfg.precision_constraints == "none":
        return allowed, None
    if cfg.precision_constraints == "obey":
        return [want], None
    if want in allowed or (target == "cpu" and want == "fp32"):
        return [want] + [p for p in allowed if p != want], None
    return allowed, want


def has_tactic(layer: Any, target: str, arch: str | None = None) -> bool:
    """Whether some tactic of `target` runs the layer at a precision its storage allows (on
    GPUs of `arch`, when given: the build's device)."""
    from dataclasses import replace

    from polykit.kernels.tactics import candidates

    return any(candidates(target, layer.kind, replace(layer, precision=p), arch=arch)
               for p in allowed_precisions(layer, BuilderConfig(), target))


#: inputs of each layer kind that tensor cores read as tf32 (round_tf32_weights)
MMA_OPERANDS = {"Conv": (1,), "ConvNHWC": (1,), "MatMul": (0, 1), "Gemm": (0, 1)}


def to_tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to tf32 (10 mantissa bits; nearest, ties away from zero, as
    cvt.rna.tf32.f32), still stored as float32; NaN and infinities unchanged."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), rounded, x).astype(np.float32)


def round_tf32_weights(layers: list[Any], weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights with those that only tf32 layers read, and only as tensor-core operands,
    rounded to tf32 once at build time. Tensor cores would drop the low 13 mantissa bits of
    each operand (truncation): a bias toward zero that compounds over a deep network;
    rounding keeps the error unbiased (the tf32 kernels round their float outputs too)."""
    readers: dict[str, set[str]] = defaultdict(set)
    for layer in layers:
        operands = MMA_OPERANDS.get(layer.kind, ())
        for i, name in enumerate(layer.inputs):
            if name in weights:
                readers[name].add(layer.precision if i in operands else "other")
    return {name: to_tf32(w) if readers.get(name) == {"tf32"} and w.dtype == np.float32 else w
            for name, w in weights.items()}
