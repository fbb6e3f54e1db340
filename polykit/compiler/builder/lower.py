"""Lowering: an optimized Graph -> plan layers (LayerDesc) and the weights they read.

Each node becomes one layer of the same kind (fused nodes from the passes are already one
node of a fused kind, with the names of the nodes they replace in attrs["fused_from"]).
Constant nodes become weights. Graph outputs that no layer writes (a constant output)
get an Identity layer so every engine output is produced by some layer or is an input.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ops.nn.fused import rename_fused_tensor
from polykit.compiler.plan.records import LayerDesc, layer_as_node
from polykit.errors import BuildError

#: Constant node attribute -> how to turn it into an array (ONNX Constant's value_* forms)
_CONSTANT_FORMS = {
    "value": lambda v: np.asarray(v),
    "value_float": lambda v: np.array(v, dtype=np.float32),
    "value_floats": lambda v: np.array(v, dtype=np.float32),
    "value_int": lambda v: np.array(v, dtype=np.int64),
    "value_ints": lambda v: np.array(v, dtype=np.int64),
}


@dataclass
class Lowered:
    layers: list[LayerDesc]
    weights: dict[str, np.ndarray]
    #: constant engine output -> the weight its Identity layer copies from
    renamed_weights: dict[str, str] = field(default_factory=dict)


def constant_value(node: Node) -> np.ndarray:
    """The array a Constant node produces; BuildError for forms polykit cannot store."""
    for key, convert in _CONSTANT_FORMS.items():
        if key in node.attrs:
            return convert(node.attrs[key])
    raise BuildError(
        f"Constant node has no supported value attribute (has {sorted(node.attrs)})",
        where=node.describe(),
        hint="polykit stores numeric constants only (value, value_float(s), value_int(s))",
    )


def _layer_name(node: Node, idx: int, used: set[str]) -> str:
    base = node.name or f"{node.op_type}_{idx}"
    name, k = base, 1
    while name in used:
        name, k = f"{base}_{k}", k + 1
    used.add(name)
    return name


def lower(graph: Graph) -> Lowered:
    """Turn graph nodes into layers; collect the initializers the layers read as weights."""
    constants = dict(graph.initializers)
    layers: list[LayerDesc] = []
    used: set[str] = set()
    for idx, node in enumerate(graph.nodes):
        if node.op_type == "Constant" and node.domain == "":
            constants[node.outputs[0]] = constant_value(node)
            continue
        attrs = {k: v for k, v in node.attrs.items() if k != "fused_from"}
        fused = node.attrs.get("fused_from")
        name = _layer_name(node, idx, used)
        layers.append(LayerDesc(
            name=name,
            kind=node.op_type,
            inputs=tuple(node.inputs),
            outputs=tuple(node.outputs),
            attrs=attrs,
            domain=node.domain,
            fused_nodes=tuple(str(x) for x in fused) if fused else (node.name or name,),
        ))

    renamed: dict[str, str] = {}
    written = {o for layer in layers for o in layer.outputs if o}
    for out in dict.fromkeys(graph.outputs):
        if out in written or out in graph.inputs:
            continue
        if out not in constants:
            raise BuildError(f"graph output {out!r} is produced by nothing", where=f"graph {graph.name!r}",
                             hint="the model is malformed; check its outputs")
        # A constant engine output: keep the array as a weight under another name, copy it out.
        source = graph.fresh_name(f"{out}__const")
        constants[source] = constants[out]
        renamed[out] = source
        layers = [_read_renamed(l, out, source) for l in layers]
        layers.append(LayerDesc(name=_layer_name(Node("Identity", [], [], name=f"{out}__identity"), 0, used),
                                kind="Identity", inputs=(source,), outputs=(out,), fused_nodes=()))
    read = {i for layer in layers for i in layer.inputs if i}
    weights = {name: np.asarray(arr) for name, arr in constants.items() if name in read}
    return Lowered(layers, weights, renamed)


def _read_renamed(layer: LayerDesc, old: str, new: str) -> LayerDesc:
    """`layer` reading tensor `new` where it read `old` (inside a fused layer's body too)."""
    if old not in layer.inputs:
        return layer
    node = layer_as_node(layer)
    node.attrs = copy.deepcopy(node.attrs)
    rename_fused_tensor(node, old, new)
    return replace(layer, inputs=tuple(node.inputs), attrs=node.attrs)


def describe_layers(layers: list[LayerDesc]) -> list[dict[str, Any]]:
    """A compact, JSON-able summary of layers (for logs and inspect)."""
    return [{"name": l.name, "kind": l.kind, "tactic": l.tactic, "precision": l.precision} for l in layers]
