"""Flatten a product into its operands (the `Prod` pattern of patterns.py).

`factors(graph, name)` sees through single-reader Mul nodes (and Pow by a small integer)
so `(x * 0.5) * y`, `x * (0.5 * y)` and `0.5 * (y * x)` all give {x, 0.5, y}; the nodes seen
through are returned so a rewrite can check they may disappear.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.rewrite import scalar


@dataclass
class Product:
    """The operands of a product: tensor names, constant scalars, and the nodes walked."""

    tensors: list[str] = field(default_factory=list)
    scalars: list[float] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)

    def scalar(self) -> float:
        out = 1.0
        for s in self.scalars:
            out *= s
        return out


def factors(graph: Graph, name: str, producers: dict[str, Node], readers: dict[str, list[Node]],
            fixed: set[str], *, top: bool = True) -> Product:
    """Operands of the product that computes `name` (a leaf when not a product)."""
    prod = Product()
    node = producers.get(name)
    value = scalar(graph, name)
    inner_ok = top or (len(readers.get(name, [])) == 1 and name not in fixed)
    if value is not None:
        prod.scalars.append(value)
    elif node is not None and node.domain == "" and inner_ok and node.op_type in ("Mul", "Pow"):
        if node.op_type == "Mul":
            prod.nodes.append(node)
            for operand in node.inputs:
                sub = factors(graph, operand, producers, readers, fixed, top=False)
                prod.tensors += sub.tensors
                prod.scalars += sub.scalars
                prod.nodes += sub.nodes
        else:
            exponent = scalar(graph, node.input(1))
            if exponent is not None and exponent in (2.0, 3.0, 4.0) and scalar(graph, node.input(0)) is None:
                prod.nodes.append(node)
                prod.tensors += [node.input(0)] * int(exponent)
            else:
                prod.tensors.append(name)
    else:
        prod.tensors.append(name)
    return prod

