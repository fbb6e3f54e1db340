"""NodeEmitter: builds the list of nodes an importer replaces a node with (fresh names, constants)."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.dtypes import to_onnx
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import ImportContext


class NodeEmitter:
    """`emit(op, inputs, output=None, **attrs)` appends a default-domain node and returns its
    output's name (a fresh one unless `output` is given); `emit.nodes` is the replacement list."""

    def __init__(self, node: Node, ctx: ImportContext):
        self.node, self.ctx, self.nodes = node, ctx, []

    def __call__(self, op: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        g = self.ctx.graph
        base = self.node.name or self.node.op_type
        out = output or g.fresh_name(f"{base}_{op}")
        self.nodes.append(Node(op, inputs, [out], attrs, name=g.fresh_name(f"{base}_{op}")))
        return out

    def const(self, value, prefix: str) -> str:
        """An initializer holding `value`; returns its name."""
        return self.ctx.add_constant(np.asarray(value), prefix=f"{self.node.name}_{prefix}")

    def double(self, name: str) -> str:
        """`name` cast to float64."""
        return self("Cast", [name], to=to_onnx(np.float64))
