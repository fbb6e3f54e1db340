"""unroll_loops: a Loop whose body has no static shapes becomes the nodes of its iterations.

A body plan (polykit.compiler.builder.bodies) runs one set of static shapes: every body input keeps its
shape across iterations. A loop-carried value that grows per iteration (a decode appending a
token) or that the body computes with shapes read from data (ONNX's test_loop11 slices a
constant at the iteration number) has none. When the build knows the trip count (a constant,
or an input given in BuilderConfig.input_values) and the body passes its condition through
unchanged, such a Loop is replaced by its iterations: copy i of the body reads the constant i
as its iteration number and the previous copy's carried values, so every copy's shapes are
static and fold, fuse and run like any other nodes on every target. Scan outputs are stacked
(Unsqueeze + Concat on axis 0). Loops whose body is static stay control-flow layers; a loop
that would take more than MAX_UNROLL iterations, or whose count or condition the build does
not know, is left as it is (building its body then names it: polykit.compiler.builder.bodies).
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ops.control.control_flow import passes_condition
from polykit.compiler.ir.subgraphs import captured, inline_body

#: a Loop is unrolled up to this many iterations
MAX_UNROLL = 1024


def unroll_loops(graph: Graph) -> bool:
    """Unroll each Loop whose body has a non-static input and a known trip count."""
    changed = False
    for node in list(graph.nodes):
        count = _unrollable(graph, node)
        if count is None:
            continue
        at = graph.nodes.index(node)
        graph.nodes[at:at + 1] = _iterations(graph, node, count)
        changed = True
    return changed


def _known(graph: Graph, name: str) -> np.ndarray | None:
    if not name:
        return None
    value = graph.initializers.get(name)
    return value if value is not None else graph.metadata.get("input_values", {}).get(name)


def _unrollable(graph: Graph, node: Node) -> int | None:
    """The node's iteration count when it is a Loop to unroll (module docstring), else None."""
    body = node.attrs.get("body")
    if node.op_type != "Loop" or node.domain or not isinstance(body, Graph):
        return None
    if all(body.value(n).is_static for n in body.inputs):  # a body plan runs it (polykit.compiler.builder.bodies)
        return None
    trip, cond = _known(graph, node.input(0)), _known(graph, node.input(1))
    if trip is None or node.input(1) and cond is None or not passes_condition(body):
        return None
    count = int(np.asarray(trip).reshape(-1)[0]) if cond is None or bool(np.asarray(cond).reshape(-1)[0]) else 0
    n = len(node.inputs) - 2 - captured(node)
    if count > MAX_UNROLL or count == 0 and len(node.outputs) > n:
        return None  # zero iterations: the scan outputs' shapes come from nowhere
    return count


def _iterations(graph: Graph, node: Node, count: int) -> list[Node]:
    body: Graph = node.attrs["body"]
    c = captured(node)
    n = len(node.inputs) - 2 - c
    state = list(node.inputs[2:2 + n])
    rest = list(node.inputs[len(node.inputs) - c:]) if c else []
    go = graph.add_initializer(np.array(True), f"{node.name}/cond")
    nodes: list[Node] = []
    scans: list[list[str]] = [[] for _ in node.outputs[n:]]
    for i in range(count):
        step = graph.add_initializer(np.array(i, np.int64), f"{node.name}/iter")
        copied, outs = inline_body(graph, body, [step, go, *state, *rest], prefix=f"{node.name}/{i}")
        nodes += copied
        state = outs[1:1 + n]
        for parts, part in zip(scans, outs[1 + n:]):
            parts.append(part)
    for out, src in zip(node.outputs[:n], state):
        if out:
            nodes.append(Node("Identity", [src], [out], name=graph.fresh_name(f"{node.name}/state")))
    axis = graph.add_initializer(np.array([0], np.int64), f"{node.name}/axis")
    for out, parts in zip(node.outputs[n:], scans):
        if not out:
            continue
        items = [graph.fresh_name(f"{out}/item") for _ in parts]
        nodes += [Node("Unsqueeze", [p, axis], [item], name=f"{item}__unsqueeze") for p, item in zip(parts, items)]
        nodes.append(Node("Concat", items, [out], {"axis": 0}, graph.fresh_name(f"{out}/stack")))
    return nodes
