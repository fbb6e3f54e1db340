"""What the passes share to match patterns and rewrite the graph without breaking names.

Every rename goes through `replace_tensor` / `rename_produced`, which also update the
bodies of fused nodes (docs/FUSION.md), so no pass leaves a body reading a stale name.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ops.nn.fused import rename_fused_tensor


def protected(graph: Graph, keep: Iterable[str] = ()) -> set[str]:
    """Names no pass may fuse away or rename: graph outputs and the caller's `keep`."""
    return set(graph.outputs) | set(keep)


def replace_tensor(graph: Graph, old: str, new: str) -> None:
    """Make every node that reads `old` read `new` (graph outputs unchanged)."""
    for node in graph.nodes:
        if old in node.inputs:
            rename_fused_tensor(node, old, new)


def rename_produced(graph: Graph, old: str, new: str) -> None:
    """Rename tensor `old` to `new` everywhere: its producer, its readers, its metadata."""
    for node in graph.nodes:
        if old in node.inputs or old in node.outputs:
            rename_fused_tensor(node, old, new)
    graph.outputs = [new if o == old else o for o in graph.outputs]
    if old in graph.values:
        graph.values[new] = graph.values.pop(old).with_(name=new)


def replace_nodes(graph: Graph, replacements: dict[int, Node], dead: list[Node]) -> bool:
    """Put each replacement where the node of its key (`id(node)`) stands and drop `dead`;
    True if anything was replaced (the fusion passes' last step)."""
    if not replacements:
        return False
    graph.nodes = [replacements.get(id(n), n) for n in graph.nodes]
    graph.remove_nodes(dead)
    return True


def const(graph: Graph, name: str) -> np.ndarray | None:
    """The constant value of `name` (an initializer), or None."""
    return graph.initializers.get(name) if name else None


def scalar(graph: Graph, name: str) -> float | None:
    """The value of a one-element floating/int constant, or None."""
    arr = const(graph, name)
    if arr is None or arr.size != 1 or arr.dtype.kind not in "fiu":
        return None
    return float(arr.reshape(-1)[0])


def close_to(value: float | None, target: float, rel: float = 1e-3) -> bool:
    return value is not None and abs(value - target) <= rel * abs(target)


def sole_reader(graph: Graph, name: str, readers: dict[str, list[Node]], keep: set[str]) -> Node | None:
    """The one node reading `name`, if exactly one does and `name` may disappear."""
    users = readers.get(name, [])
    if len(users) != 1 or name in keep:
        return None
    return users[0]


def json_safe(value: Any) -> Any:
    """`value` with numpy scalars/arrays turned into plain Python, or raise TypeError."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    raise TypeError(f"attribute value of type {type(value).__name__} is not JSON-serializable")
