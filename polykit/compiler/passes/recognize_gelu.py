"""recognize_gelu: turn the exported GELU formulas back into one ONNX Gelu node.

Erf form:  x * 0.5 * (1 + erf(x / sqrt(2)))            -> Gelu(x)
Tanh form: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  -> Gelu(x, approximate="tanh")
Any operand order and association of the products; x / sqrt(2) may be x * (1/sqrt(2));
x^3 may be Pow(x, 3) or Mul(x, Mul(x, x)). Every intermediate must be read only inside
the pattern (and not be a graph output or kept).
"""

from __future__ import annotations

import math
from collections import Counter

from polykit.compiler.ir import Graph, Node
from polykit.compiler.passes.products import factors, sum_operands
from polykit.compiler.passes.rewrite import close_to, protected, scalar, sole_reader
from polykit.compiler.registry import is_supported

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
KAPPA = 0.044715


class _Matcher:
    def __init__(self, graph: Graph, keep: frozenset[str]):
        self.graph = graph
        self.fixed = protected(graph, keep)
        self.producers = graph.producers()
        self.readers = graph.consumers()

    def only_reader(self, name: str) -> Node | None:
        return sole_reader(self.graph, name, self.readers, self.fixed)

    def factors(self, name: str, top: bool = True):
        return factors(self.graph, name, self.producers, self.readers, self.fixed, top=top)

    def erf_argument(self, erf: Node) -> tuple[str, list[Node]] | None:
        """x for erf(x / sqrt2) or erf(x * 1/sqrt2), with the scaling node."""
        arg = erf.input(0)
        node = self.producers.get(arg)
        if node is None or self.only_reader(arg) is not erf or node.domain != "":
            return None
        if node.op_type == "Div" and close_to(scalar(self.graph, node.input(1)), SQRT2):
            return node.input(0), [node]
        if node.op_type == "Mul":
            prod = self.factors(arg)
            if len(prod.tensors) == 1 and close_to(prod.scalar(), 1.0 / SQRT2):
                return prod.tensors[0], prod.nodes
        return None

    def tanh_argument(self, tanh: Node) -> tuple[str, list[Node]] | None:
        """x for tanh(sqrt(2/pi) * (x + 0.044715 * x^3)), with the nodes it spans."""
        inner = tanh.input(0)
        if self.only_reader(inner) is not tanh:
            return None
        prod = self.factors(inner)
        if len(prod.tensors) != 1 or not close_to(prod.scalar(), SQRT_2_OVER_PI):
            return None
        s = prod.tensors[0]
        add = self.producers.get(s)
        ops = None if add is None else sum_operands(self.graph, add)
        if ops is None or ops[1] or len(ops[0]) != 2 or (s != inner and self.only_reader(s) is None):
            return None
        for x, cube in (ops[0], ops[0][::-1]):
            c = self.factors(cube, top=False) if self.only_reader(cube) is add else None
            if c is not None and c.tensors == [x] * 3 and close_to(c.scalar(), KAPPA):
                return x, prod.nodes + [add] + c.nodes
        return None

    def outer_product(self, core: Node, x: str) -> tuple[Node, list[Node]] | None:
        """For core = Add(f(x), 1): the Mul computing 0.5 * x * core, and its nodes."""
        ops = sum_operands(self.graph, core)
        if ops is None or len(ops[0]) != 1 or len(ops[1]) != 1 or not close_to(ops[1][0], 1.0):
            return None
        t = core.outputs[0]
        node = self.only_reader(t)
        for _ in range(4):
            if node is None or node.op_type != "Mul" or node.domain != "":
                return None
            prod = self.factors(node.outputs[0])
            if Counter(prod.tensors) == Counter([t, x]) and close_to(prod.scalar(), 0.5):
                return node, prod.nodes
            node = self.only_reader(node.outputs[0])
        return None


def recognize_gelu(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace GELU subgraphs by Gelu nodes; True if any."""
    if not is_supported("", "Gelu"):
        return False
    m = _Matcher(graph, keep)
    replaced: dict[int, Node] = {}
    dead: list[Node] = []
    taken: set[int] = set()
    for node in graph.nodes:
        if node.domain != "" or node.op_type not in ("Erf", "Tanh") or id(node) in taken:
            continue
        found = m.erf_argument(node) if node.op_type == "Erf" else m.tanh_argument(node)
        core = m.only_reader(node.outputs[0])
        if found is None or core is None:
            continue
        x, inner_nodes = found
        outer = m.outer_product(core, x)
        if outer is None:
            continue
        root, outer_nodes = outer
        pattern = inner_nodes + [node, core] + outer_nodes
        if any(id(n) in taken for n in pattern):
            continue
        taken.update(id(n) for n in pattern)
        attrs = {} if node.op_type == "Erf" else {"approximate": "tanh"}
        replaced[id(root)] = Node("Gelu", [x], [root.outputs[0]], attrs, name=f"{root.name}_gelu")
        dead.extend(n for n in pattern if n is not root)
    if not replaced:
        return False
    graph.nodes = [replaced.get(id(n), n) for n in graph.nodes]
    graph.remove_nodes(dead)
    return True
