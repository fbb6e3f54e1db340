"""fold_conv_batchnorm: fold an inference BatchNormalization into the Conv (or Gemm/MatMul) before it.

BN(y) = (y - mean) * f + beta with f = scale / sqrt(var + eps), per channel (axis 1).
For Conv, channel m of y comes from filter m: W'[m] = W[m] * f[m], B' = (B - mean) * f + beta.
For a 2-D Gemm/MatMul with constant weights the channel is the last axis: the weight
columns scale by f and the bias becomes (C - mean) * f + beta (a MatMul becomes a Gemm).
All BN parameters and the weights must be constants, the BN in inference mode, and the
base op's output read by the BN alone.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.rewrite import const, protected, sole_reader


def fold_conv_batchnorm(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Fold BN into its producer wherever possible; True if any folded."""
    fixed = protected(graph, keep)
    readers = graph.consumers()
    producers = graph.producers()
    folded: list[Node] = []
    for bn in list(graph.nodes):
        if bn.op_type != "BatchNormalization" or bn.domain != "":
            continue
        params = _bn_params(graph, bn)
        base = producers.get(bn.input(0))
        if params is None or base is None or base.domain != "":
            continue
        if sole_reader(graph, bn.input(0), readers, fixed) is not bn:
            continue
        fold = FOLDERS.get(base.op_type)
        if fold is not None and fold(graph, base, *params):
            base.outputs[0] = bn.outputs[0]
            folded.append(bn)
    graph.remove_nodes(folded)
    return bool(folded)


def _bn_params(graph: Graph, bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(f, shift) with BN(y) = y * f + shift, or None when BN cannot fold."""
    if int(bn.attrs.get("training_mode", 0)) != 0 or any(o for o in bn.outputs[1:]):
        return None
    arrays = [const(graph, bn.input(i)) for i in range(1, 5)]
    if any(a is None for a in arrays):
        return None
    scale, beta, mean, var = (a.astype(np.float64).reshape(-1) for a in arrays)
    f = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    return f, beta - mean * f


def _fold_conv(graph: Graph, conv: Node, f: np.ndarray, shift: np.ndarray) -> bool:
    w = const(graph, conv.input(1))
    b = const(graph, conv.input(2)) if conv.input(2) else None
    if w is None or (conv.input(2) and b is None) or w.shape[0] != f.size:
        return False
    new_w = (w.astype(np.float64) * f.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    bias = np.zeros(f.size) if b is None else b.astype(np.float64)
    new_b = (bias * f + shift).astype(w.dtype)
    conv.inputs = [conv.input(0), graph.add_initializer(new_w, f"{conv.name}_W_bn"),
                   graph.add_initializer(new_b, f"{conv.name}_B_bn")]
    return True


def _fold_gemm(graph: Graph, gemm: Node, f: np.ndarray, shift: np.ndarray) -> bool:
    if gemm.op_type == "MatMul":
        attrs: dict = {}
        a_rank = graph.value(gemm.input(0)).shape
        if a_rank is None or len(a_rank) != 2:
            return False
    else:
        attrs = dict(gemm.attrs)
    w = const(graph, gemm.input(1))
    if w is None or w.ndim != 2:
        return False
    trans_b = int(attrs.get("transB", 0))
    n = w.shape[0] if trans_b else w.shape[1]
    if n != f.size:
        return False
    c = const(graph, gemm.input(2)) if gemm.input(2) else None
    if gemm.input(2) and c is None:
        return False
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    scale = (f[:, None] if trans_b else f[None, :]) * alpha
    new_w = (w.astype(np.float64) * scale).astype(w.dtype)
    bias = np.zeros(f.size) if c is None else beta * c.astype(np.float64)
    new_c = (bias * f + shift).astype(w.dtype)
    attrs.update(alpha=1.0, beta=1.0)
    gemm.op_type, gemm.attrs = "Gemm", attrs
    gemm.inputs = [gemm.input(0), graph.add_initializer(new_w, f"{gemm.name}_W_bn"),
                   graph.add_initializer(new_c, f"{gemm.name}_C_bn")]
    return True


FOLDERS = {"Conv": _fold_conv, "Gemm": _fold_gemm, "MatMul": _fold_gemm}
