"""recognize_attention: keep scaled dot-product attention as one ai.polykit `Attention` node.

    MatMul(Q, K^T) [* s | / s] [+ mask] -> Softmax(axis=-1) -> MatMul(., V)

K^T may be a Transpose of K (last two axes swapped) or any tensor (a Transpose is then
inserted to give K); scalar scales may also sit on Q and/or K^T before the first MatMul
(torch's scaled_dot_product_attention export multiplies both by sqrt(scale)), and the
probabilities may pass torch's guard for fully masked rows, Where(IsNaN(p), 0, p). Every
intermediate must be read only inside the pattern. The form is one rule over the pattern
module (patterns.py). Format: docs/FUSION.md.
"""

from __future__ import annotations

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.passes.patterns import Const, Match, OneOf, Op, Rule, Scaled, Var, rewrite
from polykit.compiler.passes.rewrite import sole_reader


def _last_axis(node: Node, m: Match) -> bool:
    shape = m.graph.value(node.input(0)).shape
    return shape is not None and len(shape) >= 2 and int(node.attrs.get("axis", -1)) % len(shape) == len(shape) - 1


QK = Scaled(Op("MatMul", (Scaled(Var("q"), "q_scale"), Scaled(Var("kt"), "k_scale"))), "scale")
SOFTMAX = Op("Softmax", (OneOf(Op("Add", (QK, Var("mask")), commutative=True), QK),), where=_last_axis)
PROBS = OneOf(Op("Where", (Op("IsNaN", (SOFTMAX,)), Const(lambda v: v == 0.0), SOFTMAX), node="guard"), SOFTMAX)
ATTENTION = Op("MatMul", (PROBS, Var("v")))


def _untransposed(m: Match, kt: str) -> str | None:
    """K when `kt` is a Transpose of K over its last two axes (spanned, to go, when only the
    pattern reads it), else None."""
    node = m.producers.get(kt)
    if node is None or node.op_type != "Transpose" or node.domain != "":
        return None
    perm = node.attrs.get("perm")
    n = len(perm) if perm is not None else None
    if n is None or n < 2 or list(perm) != list(range(n - 2)) + [n - 1, n - 2]:
        return None
    if sole_reader(m.graph, kt, m.readers, m.fixed) is not None:
        m.span(node)
    return node.input(0)


def _accept(m: Match) -> bool:
    """Q and K^T are at least 2-D; a Transpose giving K^T is dropped when only the pattern reads it."""
    shape_q, shape_k = m.graph.value(m["q"]).shape, m.graph.value(m["kt"]).shape
    if shape_q is None or shape_k is None or len(shape_q) < 2 or len(shape_k) < 2:
        return False
    k = _untransposed(m, m["kt"])
    if k is not None:
        m.tensors["k"] = k
    return True


def _attention(m: Match) -> list[Node]:
    graph, root = m.graph, m.root
    new_nodes: list[Node] = []
    k = m.tensors.get("k")
    if k is None:
        rank = len(graph.value(m["kt"]).shape)
        k = graph.fresh_name(f"{m['kt']}_untransposed")
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        new_nodes.append(Node("Transpose", [m["kt"]], [k], {"perm": perm}, name=graph.fresh_name(f"{root.name}_kT")))
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    scale = m.values["scale"] * m.values["q_scale"] * m.values["k_scale"]
    attrs = {"scale": float(scale), "fused_from": [n.name for n in sorted(m.nodes, key=lambda n: order[id(n)])]}
    if "guard" in m.named:
        attrs["nan_probs_to_zero"] = 1
    inputs = [m["q"], k, m["v"]] + ([m["mask"]] if "mask" in m.tensors else [])
    new_nodes.append(Node("Attention", inputs, [root.outputs[0]], attrs, name=f"{root.name}_attention",
                          domain=POLYKIT_DOMAIN))
    return new_nodes


RULES = (Rule(ATTENTION, _attention, _accept),)


def recognize_attention(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace attention subgraphs by Attention nodes; True if any."""
    return rewrite(graph, RULES, keep=keep)
