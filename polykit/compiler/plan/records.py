"""Records a plan is made of: tensors, layers, the memory plan (serialization: file.py), and
what a layer's record says by itself (its Node, its storage precision)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node

#: the targets a plan may be built for (polykit.runtime.target.TARGETS gives each its Target)
TARGETS = ("cpu", "cuda")
#: TensorDesc.kind values
TENSOR_KINDS = ("input", "output", "activation", "weight")
#: LayerDesc.precision values: the precision a layer computes in (builder flags pick it)
PRECISIONS = ("fp32", "fp16", "bf16", "tf32", "int8", "fp8")


@dataclass(frozen=True)
class TensorDesc:
    """A tensor the plan knows: engine I/O, activation or weight.

    `kind` is "input", "output", "activation" or "weight". Activations (and outputs, which
    live in the arena too until copied out) have an arena `offset`; weights an offset into
    the plan's weight blob. In a plan built for optimization profiles a tensor whose shape
    depends on the input dims has `dims`: one expression per dim (polykit.compiler.ir.symbolic
    Terms of the input dims' symbols); its `shape` is then the shape at the first profile's opt
    and `nbytes` its largest size at any profile's min/opt/max (what the arena reserves). A
    shape tensor computed from the input dims (Shape -> Gather -> Concat) has `value`: one
    expression per element; the engine writes it before the launches (no layer computes it).
    """

    name: str
    dtype: str  # numpy dtype name, e.g. "float32"
    shape: tuple[int, ...]
    kind: str
    offset: int = -1
    nbytes: int = 0
    dims: tuple = ()
    value: tuple = ()

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)


@dataclass(frozen=True)
class LayerDesc:
    """One plan layer: the lowered form of one node or of several fused nodes.

    `kind` is the op type for a plain layer ("Conv", "Softmax") or a fused kind in the
    ai.polykit domain ("Pointwise", "Attention"); `attrs` are JSON-able; `tactic` names the
    implementation chosen for this layer on the plan's target; `fused_nodes` lists the
    original ONNX node names the layer covers (for inspect and layerwise debugging).
    `in_dtypes`/`out_dtypes` are the numpy dtype names of the inputs/outputs ("" for an
    omitted optional input), and `in_shapes`/`out_shapes` their shapes (() for an omitted
    one), stamped by the builder before tactic selection so a tactic can refuse dtypes or
    shapes it has no kernel for at build time and compile exactly the kernels the plan
    needs; empty for layers built by hand (tests), where tactics must not rely on them.
    In a plan built for several optimization profiles whose profiles chose different tactics
    for the layer, `profile_tactics` names each profile's (`tactic` and `tactic_params` are
    profile 0's, and `profile_tactics[0] == tactic`); empty when every profile runs `tactic`.
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict, hash=False)
    domain: str = ""
    tactic: str = ""
    tactic_params: dict[str, Any] = field(default_factory=dict, hash=False)
    precision: str = "fp32"
    fused_nodes: tuple[str, ...] = ()
    in_dtypes: tuple[str, ...] = ()
    out_dtypes: tuple[str, ...] = ()
    in_shapes: tuple[tuple[int, ...], ...] = ()
    out_shapes: tuple[tuple[int, ...], ...] = ()
    profile_tactics: tuple[str, ...] = ()


def layer_as_node(layer: LayerDesc) -> Node:
    """The Node a reference kernel expects for this layer."""
    return Node(layer.kind, list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name, layer.domain)


_STORAGE = {"float16": "fp16", "bfloat16": "bf16"}


def storage_precision(layer: Any) -> str:
    """"int8" for the INT8 layers (QConv, QMatMul), "fp8" for those on float8_e4m3fn operands;
    "fp16" / "bf16" when the layer computes on half tensors (an epilogue Conv/Gemm/MatMul is judged
    by its base op's inputs), else "fp32" (also for layers without stamped dtypes)."""
    from polykit.compiler.ops.nn.fused import EPILOGUE_ARITY
    from polykit.compiler.ops.quant.int8 import is_fp8_layer, is_int8_layer

    if is_int8_layer(layer):
        return "fp8" if is_fp8_layer(layer) else "int8"
    if layer.domain == POLYKIT_DOMAIN and layer.kind in EPILOGUE_ARITY:
        dtypes = layer.in_dtypes[:EPILOGUE_ARITY[layer.kind]]
    else:
        dtypes = (*layer.in_dtypes, *layer.out_dtypes)
    for dtype in dtypes:
        if dtype in _STORAGE:
            return _STORAGE[dtype]
    return "fp32"
