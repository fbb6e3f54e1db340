"""Reference kernel of ai.polykit SqueezeExcite (polykit.compiler.ops.nn.squeeze_excite): what the
nodes it replaced computed, value by value: the mean in float32 rounded to x's dtype, each product
in float32 (plus bias) rounded to it, the bodies step by step with the ops' reference kernels, and with
`scale` each x * s rounded to x's dtype (the Mul's product)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.fused_reference import evaluate_body
from polykit.compiler.ops.nn.squeeze_excite import ARITY, SQUEEZE_EXCITE, gate_shape, holder, scales, se_dims
from polykit.compiler.ops.references import reference
from polykit.errors import RuntimeInputError


def _fc(v: np.ndarray, w: np.ndarray, b: np.ndarray, rows: int, dtype: np.dtype) -> np.ndarray:
    """v [N, K] . w^T ([rows, K] flat) + b, in float32, rounded to `dtype`."""
    w2 = w.astype(np.float32).reshape(rows, -1)
    return (v.astype(np.float32) @ w2.T + b.astype(np.float32).reshape(1, rows)).astype(dtype)


@reference(SQUEEZE_EXCITE, domain=POLYKIT_DOMAIN)
def squeeze_excite(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    where = node.describe()
    if x.ndim != 4 or len(inputs) < ARITY or any(a is None for a in inputs[:ARITY]):
        raise RuntimeInputError(f"SqueezeExcite reads x of rank 4 and W1, b1, W2, b2; got x of shape {x.shape}",
                                where=where, hint="the inputs are not the ones the node was built for")
    w1, b1, w2, b2 = (np.asarray(a) for a in inputs[1:ARITY])
    try:
        layout, c, cr = se_dims(node, x.shape, w1.size, w2.size)
        act, gate = holder(node, "act"), holder(node, "gate")
        scaled = scales(node)
    except ValueError as exc:
        raise RuntimeInputError(str(exc), where=where, hint="the node's inputs or attributes are not a "
                                                           "SqueezeExcite's") from None
    if b1.size != cr or b2.size != c:
        raise RuntimeInputError(f"biases of {b1.size} and {b2.size} elements; Cr = {cr}, C = {c}", where=where,
                                hint="the inputs are not the ones the node was built for")
    n = x.shape[0]
    spatial = (1, 2) if layout == "nhwc" else (2, 3)
    pooled = x.astype(np.float32).mean(axis=spatial).astype(x.dtype)  # [N, C]
    env = {name: arr for name, arr in zip(node.inputs[ARITY:], inputs[ARITY:]) if name}
    env[act["input"]] = _fc(pooled, w1, b1, cr, x.dtype).reshape(gate_shape(n, cr, layout))
    env = evaluate_body(act["body"], env)
    hidden = np.asarray(env[act["output"]]).reshape(n, cr)
    env[gate["input"]] = _fc(hidden, w2, b2, c, x.dtype).reshape(gate_shape(n, c, layout))
    env = evaluate_body(gate["body"], env)
    s = np.asarray(env[gate["output"]])
    if scaled:  # y = x * s, each product rounded to x's dtype (exact in float32 before it for 16-bit types)
        return [(x.astype(np.float32) * s.astype(np.float32)).astype(x.dtype)]
    return [np.ascontiguousarray(s)]
