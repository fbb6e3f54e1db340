"""The state of resolve_sequences' walk over a graph (polykit.compiler.passes.control.resolve_sequences):
the nodes it emitted, what each sequence/optional holds (a *layout*: a tensor name, a list of
layouts, or None for an empty optional) and the constants known on the way."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from polykit.compiler.graph.evaluator import RANDOM_OPS, run_node
from polykit.compiler.graph.infer import result_value
from polykit.compiler.ir.graph import Graph, Node, Value, has_subgraphs, subgraphs
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.compiler.ir.subgraphs import captured
from polykit.errors import BuildError

#: tensors up to this many elements are evaluated on the way (positions, trip counts, conditions)
CONST_MAX_ELEMENTS = 4096

Layout = Any  # a tensor name, a list of layouts (sequence) or None (an empty optional), or a dict below
#: layout key of a sequence whose length only the run knows: {"length": a 0-d int64 tensor, "items": [its
#: elements, as many as it can hold]} (runtime.sequences packs the first `length`)
RUN_LENGTH = "length"
#: layout key of an optional whose presence only the run knows: {"present": a 0-d bool tensor, "item": its
#: element's layout} (runtime.sequences packs the item when the flag is set, else None)
PRESENT = "present"
#: layout keys of a sequence a Loop grew by run-time iterations (passes.sequence_loop): {"ragged": a 1-D
#: tensor of its appended elements' values, flattened and concatenated, "shapes": a [count, rank] int64
#: tensor of their shapes, "prefix": [the layouts of the elements it started with]}
RAGGED, RAGGED_SHAPES, RAGGED_PREFIX = "ragged", "shapes", "prefix"


def layout_names(layout: Layout) -> list[str]:
    """The tensor names a layout holds, in order."""
    if layout is None:
        return []
    if isinstance(layout, list):
        return [n for item in layout for n in layout_names(item)]
    if isinstance(layout, dict) and PRESENT in layout:
        return [layout[PRESENT]] + layout_names(layout["item"])
    if isinstance(layout, dict) and RAGGED in layout:
        return layout_names(layout[RAGGED_PREFIX]) + [layout[RAGGED], layout[RAGGED_SHAPES]]
    if isinstance(layout, dict):
        return layout_names(layout["items"]) + [layout[RUN_LENGTH]]
    return [layout]


class Walk:
    """The pass's state: nodes emitted so far, the structure of each sequence, known constants."""

    def __init__(self, graph: Graph, resolvers: Mapping[str, Callable[["Walk", Node], None]]):
        self.graph = graph
        self.resolvers = resolvers  # op type -> how the walk lowers it (resolve_sequences._RESOLVERS)
        self.emitted: list[Node] = []
        self.structs: dict[str, Layout] = {}
        self.consts: dict[str, np.ndarray] = {k: v for k, v in graph.initializers.items()
                                              if v.size <= CONST_MAX_ELEMENTS}

    # ---- helpers ---------------------------------------------------------------------------
    def fail(self, node: Node, what: str) -> BuildError:
        return BuildError(f"{what}: a plan needs every sequence's length at build time", where=node.describe(),
                          hint="make it a constant, or run the model in the graph evaluator "
                               "(polykit.compiler.graph.evaluator.evaluate_model), which runs sequences of any length")

    def struct(self, name: str) -> Layout:
        return self.structs[name]

    def items(self, node: Node, i: int = 0) -> list[Layout]:
        """The elements of the sequence input `i` of `node` (BuildError when the run decides its length)."""
        seq = self.structs[node.input(i)]
        if isinstance(seq, dict):
            what = "whether its optional holds" if PRESENT in seq else "the length of its sequence"
            what = "the elements of its loop-grown sequence" if RAGGED in seq else what
            raise self.fail(node, f"{what} ({node.input(i)!r}) is known only at run time")
        return seq

    def const(self, node: Node, i: int, what: str) -> np.ndarray | None:
        name = node.input(i)
        if not name:
            return None
        if name not in self.consts:
            raise self.fail(node, f"its {what} ({name!r}) is not known at build time")
        return self.consts[name]

    def add_const(self, array: np.ndarray, name: str | None = None) -> str:
        name = name or self.graph.fresh_name("seq_const")
        self.graph.initializers[name] = np.asarray(array)
        self.graph.set_value(Value(name, np.asarray(array).dtype, np.shape(array)))
        self.consts[name] = np.asarray(array)
        return name

    def emit(self, node: Node) -> None:
        """Append a tensor node, infer its outputs (exact: the walk knows every shape) and
        evaluate it when it reads constants only."""
        self.emitted.append(node)
        from polykit.compiler.passes.control.resolve_sequences import resolve_sequences, touches_sequences

        for _, body in subgraphs(node):
            if touches_sequences(body):
                resolve_sequences(body, {})
        rule = find_shape_rule(node.domain, node.op_type)
        values = [self.graph.value(n) if n else Value("") for n in node.inputs]
        if rule is not None:
            ctx = InferContext(node, [v.dtype for v in values], [v.shape for v in values],
                               [self.consts.get(n) for n in node.inputs], values)
            for out, result in zip(node.outputs, rule(ctx)):
                if out:
                    self.graph.set_value(result_value(out, result))
        if node.op_type in RANDOM_OPS or has_subgraphs(node) or any(n and n not in self.consts for n in node.inputs):
            return
        if any(self.consts[n].size > CONST_MAX_ELEMENTS for n in node.inputs if n):
            return
        for out, value in zip(node.outputs, run_node(node, [self.consts[n] if n else None for n in node.inputs])):
            if out and isinstance(value, np.ndarray) and value.size <= CONST_MAX_ELEMENTS:
                self.consts[out] = value

    def alias(self, src: Layout, out: str) -> None:
        """`out` holds what `src` holds: a tensor gets an Identity, a sequence/optional its structure."""
        if isinstance(src, str) and not self.graph.value(out).wrap:
            self.emit(Node("Identity", [src], [out], name=f"{out}__alias"))
        else:
            self.structs[out] = src

    # ---- the walk --------------------------------------------------------------------------
    def run(self, nodes: list[Node]) -> None:
        for node in nodes:
            wrapped = any(n and self.graph.value(n).wrap for n in (*node.inputs, *node.outputs))
            handler = self.resolvers.get(node.op_type) if node.domain == "" else None
            if handler is not None and (wrapped or node.op_type not in ("If", "Loop", "Identity")):
                handler(self, node)
            else:
                self.emit(node)

    def inline(self, body: Graph, node: Node, bound: list[str], tag: str) -> list[Layout]:
        """Run `body`'s nodes in the outer graph with its inputs bound to `bound` (names) and
        its captures to the node's; returns what its outputs hold."""
        c = captured(node)
        names = dict(zip(body.inputs, bound + (list(node.inputs[len(node.inputs) - c:]) if c else [])))
        for name, arr in body.initializers.items():
            names[name] = self.add_const(arr, self.graph.fresh_name(f"{tag}/{name}"))
        for n in body.nodes:
            for out in n.outputs:
                if out:
                    names[out] = self.graph.fresh_name(f"{tag}/{out}")
        for old, new in names.items():
            if old not in body.inputs and old not in body.initializers:
                self.graph.set_value(body.value(old).with_(name=new))
        self.run([Node(n.op_type, [names.get(i, i) if i else "" for i in n.inputs],
                       [names[o] if o else "" for o in n.outputs], dict(n.attrs), f"{tag}/{n.name}", n.domain)
                  for n in body.nodes])
        return [self.struct(names.get(o, o)) if self.graph.value(names.get(o, o)).wrap else names.get(o, o)
                for o in body.outputs]
