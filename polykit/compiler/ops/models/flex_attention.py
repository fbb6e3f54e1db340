"""FlexAttention (ai.onnx.preview, version 1): an importer that rewrites it into ops polykit
runs on both targets (no shape rule or kernel of its own).

The installed onnx (1.23) has no schema for it; its backend cases pin the semantics: each
`test_flexattention_*` has an `_expanded_ver26` twin holding the function body, and this
rewrite emits that body, stage by stage in the same dtypes:

    K', V' = K, V with each kv head repeated Hq / Hkv times (GQA: query head h reads h // rep)
    r      = Cast(Sqrt(scale), T)       scale: the attribute, else 1 / sqrt(E) in float32
    S      = Cast((Q * r) @ Transpose(K' * r), P)    P: float64 for double Q, else float32
    S      = score_mod(S); S = mask_mod(S)            (each optional)
    Y      = prob_mod(Softmax(S, axis=-1)) @ V'       (V' cast to P and Y back when V is not P)

score_mod, mask_mod and prob_mod are graphs of one tensor in ([B, H, L, S]) and one out, as
in onnx 1.23's test data; their nodes are inlined (outer-scope reads stay outer reads).
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.dtypes import to_onnx
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.node_emitter import NodeEmitter
from polykit.compiler.ops.registry import ImportContext, importer
from polykit.compiler.ir.subgraphs import inline_body, outer_names
from polykit.errors import NodeAttributeError

DOMAIN = "ai.onnx.preview"
#: the subgraph attributes, in the order they apply
MODS = ("score_mod", "mask_mod", "prob_mod")
ATTRS = frozenset(MODS) | {"scale"}


def _dtype(node: Node, ctx: ImportContext, name: str) -> np.dtype:
    dtype = ctx.graph.value(name).dtype
    if dtype is None:
        raise NodeAttributeError(f"the element type of {name!r} is not known at import", where=node.describe(),
                                 hint="give the tensor a type in the model's value_info (FlexAttention computes "
                                      "its softmax in float64 for double inputs, else float32)")
    return np.dtype(dtype)


def _apply_mod(emit: NodeEmitter, key: str, tensor: str) -> str:
    """`tensor` through the node's `key` subgraph (inlined), or unchanged when absent."""
    import onnx

    node, ctx = emit.node, emit.ctx
    proto = node.attrs.get(key)
    if proto is None:
        return tensor
    if not isinstance(proto, onnx.GraphProto) or len(proto.input) != 1 or len(proto.output) != 1:
        raise NodeAttributeError(f"{key} must be a graph of one input and one output", where=node.describe(),
                                 hint="polykit runs FlexAttention-1 as onnx 1.23 defines it: each modifier maps "
                                      "the [B, H, L, S] scores (or probabilities) to a tensor of that shape")
    holder = onnx.NodeProto()
    holder.attribute.append(onnx.helper.make_attribute(key, proto))
    outer = outer_names(holder)
    body = ctx.import_graph(proto, f"{node.describe()}: {key}", outer)
    nodes, outs = inline_body(ctx.graph, body, [tensor, *outer], prefix=f"{node.name or 'FlexAttention'}/{key}")
    emit.nodes.extend(nodes)
    return outs[0]


@importer("FlexAttention", domain=DOMAIN)
def _flex_attention(node: Node, ctx: ImportContext) -> list[Node]:
    unknown = sorted(set(node.attrs) - ATTRS)
    if unknown:
        raise NodeAttributeError(f"FlexAttention has no attribute {unknown[0]!r} in the form polykit runs",
                                 where=node.describe(), hint=f"its attributes are {sorted(ATTRS)}")
    if len(node.inputs) != 3 or len(node.outputs) != 1:
        raise NodeAttributeError(f"FlexAttention takes Q, K, V and gives Y; the node has {len(node.inputs)} "
                                 f"inputs and {len(node.outputs)} outputs", where=node.describe())
    q, k, v = node.inputs
    qt, vt = _dtype(node, ctx, q), _dtype(node, ctx, v)
    precise = np.dtype(np.float64) if qt == np.float64 else np.dtype(np.float32)
    emit = NodeEmitter(node, ctx)
    batch = emit("Shape", [q], start=0, end=1)
    q_heads, kv_heads = emit("Shape", [q], start=1, end=2), emit("Shape", [k], start=1, end=2)
    repeat, kv_len = emit("Div", [q_heads, kv_heads]), emit("Shape", [k], start=-2, end=-1)
    axis2 = emit.const(np.array([2], np.int64), "axis2")

    def aligned(x: str) -> str:  # [B, Hkv, S, D] -> [B, Hq, S, D], each kv head repeated
        size = emit("Shape", [x], start=3, end=4)
        wide = emit("Expand", [emit("Unsqueeze", [x, axis2]), emit("Concat", [batch, kv_heads, repeat, kv_len, size],
                                                                     axis=0)])
        return emit("Reshape", [wide, emit("Concat", [batch, q_heads, kv_len, size], axis=0)])

    if "scale" in node.attrs:
        scale = emit.const(np.float32(node.attrs["scale"]), "scale")
    else:
        head = emit("Gather", [emit("Shape", [q]), emit.const(np.int64(3), "head_axis")], axis=0)
        root_e = emit("Sqrt", [emit("Cast", [head], to=to_onnx(np.float32))])
        scale = emit("Div", [emit.const(np.float32(1.0), "one"), root_e])
    root = emit("Cast", [emit("Sqrt", [scale])], to=to_onnx(qt))
    keys = emit("Transpose", [emit("Mul", [aligned(k), root])], perm=[0, 1, 3, 2])
    scores = emit("Cast", [emit("MatMul", [emit("Mul", [q, root]), keys])], to=to_onnx(precise))
    for key in MODS[:2]:
        scores = _apply_mod(emit, key, scores)
    probs = _apply_mod(emit, "prob_mod", emit("Softmax", [scores], axis=-1))
    values = aligned(v)
    if vt == precise:
        emit("MatMul", [probs, values], output=node.outputs[0])
    else:
        wide = emit("MatMul", [probs, emit("Cast", [values], to=to_onnx(precise))])
        emit("Cast", [wide], to=to_onnx(vt), output=node.outputs[0])
    return emit.nodes
