"""Reference kernels of polykit's fused ops: Pointwise, epilogue Conv/Gemm/MatMul, Attention
(ConvNHWC, epilogue or not: channels_last.py).

Pointwise and epilogue bodies are evaluated step by step with the registered reference
kernels of their plain ONNX ops, so a fused node computes exactly what the nodes it
replaced computed (docs/FUSION.md is the format).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.concat_operands import concat_operands
from polykit.compiler.ops.nn.view_operands import gather_view, view_operands
from polykit.compiler.ops.nn.fused import (EPILOGUE_ARITY, LAYOUT_ATTRS, POLYKIT_BASES, VIEW_ATTRS, base_node,
                                          kv_groups, operand_view, step_node)
from polykit.compiler.ops.references import reference, run_reference


def evaluate_body(body: list[dict[str, Any]], env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a fused body over `env` (name -> array), adding every value it writes."""
    for k, step in enumerate(body):
        sub = step_node(step, k)
        outs = run_reference(sub, [env[n] if n else None for n in sub.inputs])
        for name, arr in zip(sub.outputs, outs):
            if name:
                env[name] = arr
    return env


def _external(node: Node, inputs: Sequence[np.ndarray | None], start: int = 0) -> dict[str, np.ndarray]:
    return {name: arr for name, arr in zip(node.inputs[start:], inputs[start:]) if name}


@reference("Pointwise", domain=POLYKIT_DOMAIN)
def pointwise(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    env = _external(node, inputs)
    for e in concat_operands(node.attrs, len(node.inputs), node.describe()):  # absorbed Concats
        env[e["name"]] = np.concatenate(list(inputs[e["first"]:e["first"] + e["count"]]), axis=e["axis"])
    for e in view_operands(node.attrs, len(node.inputs), node.describe(),
                           [None if x is None else x.size for x in inputs]):  # absorbed movement
        env[e["name"]] = gather_view(inputs[e["input"]], e)
    env = evaluate_body(node.attrs["body"], env)
    return [env[name] for name in node.outputs]


def run_epilogue(node: Node, inputs: Sequence[np.ndarray | None], base_fn: Any = run_reference) -> list[np.ndarray]:
    """An epilogue Conv/Gemm/MatMul: `base_fn(base node, inputs)` (the reference kernel, or a
    cpu tactic's), then the epilogue body on its result."""
    arity = EPILOGUE_ARITY[node.op_type]
    base = base_node(node)
    (raw,) = base_fn(base, list(inputs[: len(base.inputs)]))[:1]
    env = _external(node, inputs, arity)
    env[node.attrs["epilogue"]["input"]] = raw
    env = evaluate_body(node.attrs["epilogue"]["body"], env)
    return [env[node.outputs[0]]]


reference(*(op for op in EPILOGUE_ARITY if op not in POLYKIT_BASES), domain=POLYKIT_DOMAIN)(run_epilogue)


@reference("Attention", domain=POLYKIT_DOMAIN)
def attention(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """softmax(Q @ K^T * scale + mask) @ V, softmax over the last axis; tensors stored "bshd"
    (attrs q_layout / k_layout / v_layout / out_layout) are read and written as [B, S, H, D];
    Q, K, V with a view (q_view / k_view / v_view) are read through its offset and strides; with
    kv_groups g, K and V hold H / g heads (axis -3) and query head h reads key/value head h // g."""
    q, k, v = (_operand(node, i, x) for i, x in enumerate(inputs[:3]))
    g = kv_groups(node.attrs)
    if g > 1:
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    mask = inputs[3] if len(inputs) > 3 else None
    scale = float(node.attrs.get("scale", 1.0 / np.sqrt(q.shape[-1])))
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(scale, dtype=q.dtype)
    if mask is not None:
        if mask.dtype == np.bool_:
            scores = np.where(mask, scores, np.asarray(-np.inf, dtype=q.dtype))
        else:
            scores = scores + mask
    with np.errstate(invalid="ignore"):
        shifted = scores - np.max(scores, axis=-1, keepdims=True)
        e = np.exp(shifted)
        probs = e / np.sum(e, axis=-1, keepdims=True)
    if int(node.attrs.get("nan_probs_to_zero", 0)):
        probs = np.where(np.isnan(probs), np.zeros((), probs.dtype), probs)
    out = np.matmul(probs, v).astype(q.dtype, copy=False)
    return [_from_layout(out, node.attrs.get("out_layout", "bhsd"))]


def _operand(node: Node, i: int, x: np.ndarray) -> np.ndarray:
    """Input i as the [..., S, D] array Attention computes on."""
    if node.attrs.get(VIEW_ATTRS[i]) is None:
        return _from_layout(x, node.attrs.get(LAYOUT_ATTRS[i], "bhsd"))
    view = operand_view(node.attrs, i, tuple(int(d) for d in x.shape))
    flat = np.ascontiguousarray(x).reshape(-1)
    es = flat.dtype.itemsize
    return np.lib.stride_tricks.as_strided(flat[view.offset:], view.shape, [s * es for s in view.strides],
                                           writeable=False)


def _from_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """[..., S, H, D] <-> [..., H, S, D] for layout "bshd" (the swap is its own inverse)."""
    return np.ascontiguousarray(np.swapaxes(x, -3, -2)) if layout == "bshd" else x
