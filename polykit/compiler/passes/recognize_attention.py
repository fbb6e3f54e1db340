"""recognize_attention: keep scaled dot-product attention as one ai.polykit `Attention` node.

    MatMul(Q, K^T) [* s | / s] [+ mask] -> Softmax(axis=-1) -> MatMul(., V)

K^T may be a Transpose of K (last two axes swapped) or any tensor (a Transpose is then
inserted to give K); scalar scales may also sit on Q and/or K^T before the first MatMul
(torch's scaled_dot_product_attention export multiplies both by sqrt(scale)). Every
intermediate must be read only inside the pattern. Format: docs/FUSION.md.
"""

from __future__ import annotations

from polykit.compiler.ir import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.passes.rewrite import protected, scalar, sole_reader


class _Walk:
    def __init__(self, graph: Graph, keep: frozenset[str]):
        self.graph = graph
        self.fixed = protected(graph, keep)
        self.producers = graph.producers()
        self.readers = graph.consumers()

    def private(self, name: str) -> Node | None:
        """The producer of `name` when only one node reads it and it may disappear."""
        if sole_reader(self.graph, name, self.readers, self.fixed) is None:
            return None
        node = self.producers.get(name)
        return node if node is not None and node.domain == "" else None

    def scaled(self, name: str) -> tuple[str, float, list[Node]]:
        """Peel Mul/Div-by-scalar nodes off `name`: (base name, total scale, peeled nodes)."""
        scale, peeled = 1.0, []
        while True:
            node = self.private(name)
            if node is None or node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
                return name, scale, peeled
            a, b = scalar(self.graph, node.inputs[0]), scalar(self.graph, node.inputs[1])
            if node.op_type == "Div" and b is not None and b != 0.0:
                scale, name = scale / b, node.inputs[0]
            elif node.op_type == "Mul" and b is not None:
                scale, name = scale * b, node.inputs[0]
            elif node.op_type == "Mul" and a is not None:
                scale, name = scale * a, node.inputs[1]
            else:
                return name, scale, peeled
            peeled.append(node)

    def untransposed(self, kt: str) -> tuple[str | None, list[Node]]:
        """(K, nodes) when `kt` is a Transpose of K over its last two axes, else (None, [])."""
        node = self.producers.get(kt)
        if node is None or node.op_type != "Transpose" or node.domain != "":
            return None, []
        perm = node.attrs.get("perm")
        n = len(perm) if perm is not None else None
        if n is None or n < 2 or list(perm) != list(range(n - 2)) + [n - 1, n - 2]:
            return None, []
        private = sole_reader(self.graph, kt, self.readers, self.fixed) is not None
        return node.input(0), [node] if private else []


def recognize_attention(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace attention subgraphs by Attention nodes; True if any."""
    w = _Walk(graph, keep)
    replaced: dict[int, list[Node]] = {}
    dead: list[Node] = []
    for softmax in graph.nodes:
        if softmax.op_type != "Softmax" or softmax.domain != "":
            continue
        found = _match(graph, w, softmax)
        if found is None or any(n in dead for n in found[1]):
            continue
        new_nodes, pattern, root = found
        replaced[id(root)] = new_nodes
        dead.extend(n for n in pattern if n is not root)
    if not replaced:
        return False
    nodes: list[Node] = []
    for n in graph.nodes:
        nodes.extend(replaced.get(id(n), [n]))
    graph.nodes = nodes
    graph.remove_nodes(dead)
    return True


def _match(graph: Graph, w: _Walk, softmax: Node):
    shape = graph.value(softmax.input(0)).shape
    if shape is None or len(shape) < 2 or int(softmax.attrs.get("axis", -1)) % len(shape) != len(shape) - 1:
        return None
    probs, guard = _nan_guard(graph, w, softmax.outputs[0])
    out_mm = sole_reader(graph, probs, w.readers, w.fixed)
    if out_mm is None or out_mm.op_type != "MatMul" or out_mm.domain != "" or out_mm.input(0) != probs:
        return None
    pattern = [softmax, *guard, out_mm]
    scores, mask = softmax.input(0), ""
    add = w.private(scores)
    if add is not None and add.op_type == "Add" and len(add.inputs) == 2:
        for cand, other in (add.inputs, add.inputs[::-1]):
            if _qk(graph, w, cand) is not None:
                scores, mask = cand, other
                pattern.append(add)
                break
    found = _qk(graph, w, scores)
    if found is None:
        return None
    q, kt, scale, qk_nodes = found
    pattern += qk_nodes
    k, t_nodes = w.untransposed(kt)
    new_nodes: list[Node] = []
    if k is None:
        rank = len(graph.value(kt).shape or ())
        if rank < 2:
            return None
        k = graph.fresh_name(f"{kt}_untransposed")
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        new_nodes.append(Node("Transpose", [kt], [k], {"perm": perm}, name=graph.fresh_name(f"{out_mm.name}_kT")))
    pattern += t_nodes
    inputs = [q, k, out_mm.input(1)] + ([mask] if mask else [])
    attrs = {"scale": float(scale), "fused_from": [n.name for n in reversed(pattern)]}
    if guard:
        attrs["nan_probs_to_zero"] = 1
    new_nodes.append(Node("Attention", inputs, [out_mm.outputs[0]], attrs, name=f"{out_mm.name}_attention",
                          domain=POLYKIT_DOMAIN))
    return new_nodes, pattern, out_mm


def _nan_guard(graph: Graph, w: _Walk, probs: str) -> tuple[str, list[Node]]:
    """Look through Where(IsNaN(p), 0, p) (torch's guard for fully masked rows)."""
    users = w.readers.get(probs, [])
    if len(users) != 2 or probs in w.fixed:
        return probs, []
    isnan = next((u for u in users if u.op_type == "IsNaN" and u.domain == ""), None)
    where = next((u for u in users if u.op_type == "Where" and u.domain == ""), None)
    if isnan is None or where is None or sole_reader(graph, isnan.outputs[0], w.readers, w.fixed) is not where:
        return probs, []
    if where.input(0) != isnan.outputs[0] or where.input(2) != probs or scalar(graph, where.input(1)) != 0.0:
        return probs, []
    if where.outputs[0] in w.fixed:
        return probs, []
    return where.outputs[0], [isnan, where]


def _qk(graph: Graph, w: _Walk, scores: str) -> tuple[str, str, float, list[Node]] | None:
    """(Q, K^T, scale, nodes) when `scores` is [scaled] MatMul([scaled] Q, [scaled] K^T)."""
    base, scale, nodes = w.scaled(scores)
    mm = w.private(base)
    if mm is None or mm.op_type != "MatMul":
        return None
    q, q_scale, q_nodes = w.scaled(mm.input(0))
    kt, k_scale, k_nodes = w.scaled(mm.input(1))
    shape_q, shape_k = graph.value(q).shape, graph.value(kt).shape
    if shape_q is None or shape_k is None or len(shape_q) < 2 or len(shape_k) < 2:
        return None
    return q, kt, scale * q_scale * k_scale, nodes + [mm] + q_nodes + k_nodes
