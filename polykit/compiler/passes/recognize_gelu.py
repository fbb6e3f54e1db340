"""recognize_gelu: turn the exported GELU formulas back into one ONNX Gelu node.

Erf form:  x * 0.5 * (1 + erf(x / sqrt(2)))            -> Gelu(x)
Tanh form: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  -> Gelu(x, approximate="tanh")
Any operand order and association of the products; x / sqrt(2) may be x * (1/sqrt(2));
x^3 may be Pow(x, 3) or Mul(x, Mul(x, x)). Every intermediate must be read only inside
the pattern (and not be a graph output or kept). The two forms are rules over the pattern
module (patterns.py).
"""

from __future__ import annotations

import math

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.patterns import Const, Match, OneOf, Op, Prod, Rule, Var, near, rewrite
from polykit.compiler.ops.registry import is_supported

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
KAPPA = 0.044715

X = Var("x")


def _half_x_times(inner: Op) -> Prod:
    """0.5 * x * (1 + inner)."""
    return Prod(Const(near(0.5)), X, Op(("Add", "Sum"), (Const(near(1.0)), inner), commutative=True))


ERF = Op("Erf", (OneOf(Op("Div", (X, Const(near(SQRT2)))), Prod(X, Const(near(1.0 / SQRT2)))),))
TANH = Op("Tanh", (Prod(Const(near(SQRT_2_OVER_PI)),
                        Op(("Add", "Sum"), (X, Prod(Const(near(KAPPA)), X, X, X)), commutative=True)),))


def _gelu(approximate: str | None):
    def build(m: Match) -> list[Node]:
        attrs = {"approximate": approximate} if approximate else {}
        return [Node("Gelu", [m["x"]], [m.root.outputs[0]], attrs, name=f"{m.root.name}_gelu")]
    return build


RULES = (Rule(_half_x_times(ERF), _gelu(None)), Rule(_half_x_times(TANH), _gelu("tanh")))


def recognize_gelu(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace GELU subgraphs by Gelu nodes; True if any."""
    if not is_supported("", "Gelu"):
        return False
    return rewrite(graph, RULES, keep=keep)
