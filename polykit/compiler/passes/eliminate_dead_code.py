"""eliminate_dead_code: drop nodes nobody reads, unused initializers and stale metadata.

Live roots are the graph outputs and the caller's `keep` names; graph inputs always stay
(they are the model's interface).
"""

from __future__ import annotations

from polykit.compiler.ir.graph import Graph


def eliminate_dead_code(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Remove dead nodes and unused initializers; True if anything went."""
    live = set(graph.outputs) | set(keep)
    alive = []
    for node in reversed(graph.nodes):
        if any(out and out in live for out in node.outputs):
            alive.append(node)
            live.update(name for name in node.inputs if name)
    alive.reverse()
    changed = len(alive) != len(graph.nodes)
    graph.nodes = alive
    unused = [name for name in graph.initializers if name not in live]
    for name in unused:
        del graph.initializers[name]
    known = live | set(graph.inputs) | {out for n in graph.nodes for out in n.outputs}
    for name in [n for n in graph.values if n not in known]:
        del graph.values[name]
    return changed or bool(unused)
