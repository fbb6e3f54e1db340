"""The graph IR: ONNX-level nodes over named tensors.

Edges are tensor names, as in ONNX: a node lists the names it reads and writes, the
graph keeps initializers (constant arrays) and the metadata (dtype, shape) of every
tensor it knows. Passes are plain functions that edit a Graph in place; `Graph.copy()`
gives an independent graph when the caller must keep the original.

Shapes: a tuple of dims, each an int (static), a str (symbolic, e.g. "batch") or None
(unknown); the whole shape is None when even the rank is unknown. In a build for
optimization profiles a dynamic dim is a SymInt (polykit.compiler.ir.symbolic): an int at the
profile's opt shape that carries its expression of the input dims.
"""

from __future__ import annotations

import copy as _copy
import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator

import numpy as np

from polykit.compiler.ir.symbolic import SymInt
from polykit.errors import GraphError

Dim = int | str | None
Shape = tuple[Dim, ...] | None

#: Value.wrap entries: a value that is not a plain tensor (polykit.compiler.ir.sequences)
SEQUENCE, OPTIONAL = "sequence", "optional"

#: The domain of polykit's own fused ops (Pointwise, Attention, ...).
POLYKIT_DOMAIN = "ai.polykit"


@dataclass(frozen=True)
class Value:
    """Metadata of one value: name, numpy dtype (None if unknown) and shape.

    Most values are tensors. `wrap` names the containers around the element tensor,
    outermost first: ("sequence",) a sequence of tensors, ("optional",) an optional tensor,
    ("optional", "sequence") an optional sequence. For those, dtype and shape describe the
    element tensor (the shape every element fits), and `elements` gives each element's shape
    of a sequence whose length the build knows (None when it does not).
    """

    name: str
    dtype: np.dtype | None = None
    shape: Shape = None
    wrap: tuple[str, ...] = ()
    elements: tuple[Shape, ...] | None = None

    @property
    def is_static(self) -> bool:
        """Every dim a plain int (a SymInt, a profile build's dynamic dim, is not static)."""
        return self.shape is not None and all(isinstance(d, int) and not isinstance(d, SymInt) for d in self.shape)

    @property
    def is_tensor(self) -> bool:
        return not self.wrap

    def with_(self, **changes: Any) -> "Value":
        return replace(self, **changes)


@dataclass
class Node:
    """One operation. `inputs` may hold "" for an omitted optional input."""

    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input(self, i: int) -> str:
        """The i-th input name, or "" if absent."""
        return self.inputs[i] if i < len(self.inputs) else ""

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type})" if self.name else f"{self.op_type} node -> {self.outputs}"


class Graph:
    """A model: nodes in topological order, graph inputs/outputs, initializers, tensor metadata."""

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        inputs: Iterable[str] = (),
        outputs: Iterable[str] = (),
        initializers: dict[str, np.ndarray] | None = None,
        values: dict[str, Value] | None = None,
        opsets: dict[str, int] | None = None,
        name: str = "graph",
        metadata: dict[str, Any] | None = None,
    ):
        self.nodes: list[Node] = list(nodes)
        self.inputs: list[str] = list(inputs)
        self.outputs: list[str] = list(outputs)
        self.initializers: dict[str, np.ndarray] = dict(initializers or {})
        self.values: dict[str, Value] = dict(values or {})
        self.opsets: dict[str, int] = dict(opsets or {"": 21})
        self.name = name
        self.metadata: dict[str, Any] = dict(metadata or {})
        self._counter = itertools.count()

    # ---- lookups -------------------------------------------------------------------
    @property
    def opset(self) -> int:
        """The default-domain (ai.onnx) opset the graph's nodes follow."""
        return self.opsets.get("", 21)

    def value(self, name: str) -> Value:
        """Metadata for `name` (an empty Value if nothing is known)."""
        v = self.values.get(name)
        if v is None and name in self.initializers:
            arr = self.initializers[name]
            v = Value(name, arr.dtype, tuple(arr.shape))
        return v or Value(name)

    def set_value(self, value: Value) -> None:
        self.values[value.name] = value

    def producers(self) -> dict[str, Node]:
        """Tensor name -> the node that writes it."""
        return {out: n for n in self.nodes for out in n.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        """Tensor name -> nodes that read it (a node reading a name twice appears once)."""
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for name in dict.fromkeys(n.inputs):
                if name:
                    users.setdefault(name, []).append(n)
        return users

    def is_constant(self, name: str) -> bool:
        return name in self.initializers

    def fresh_name(self, prefix: str) -> str:
        """A tensor/node name not used anywhere in the graph."""
        used = self._all_names()
        while True:
            candidate = f"{prefix}__{next(self._counter)}"
            if candidate not in used:
                return candidate

    def _all_names(self) -> set[str]:
        names = set(self.inputs) | set(self.outputs) | set(self.initializers) | set(self.values)
        for n in self.nodes:
            names.update(n.inputs)
            names.update(n.outputs)
            names.add(n.name)
        return names

    def add_initializer(self, array: np.ndarray, prefix: str = "const") -> str:
        name = self.fresh_name(prefix)
        self.initializers[name] = np.asarray(array)
        return name

    def iter_nodes(self) -> Iterator[Node]:
        return iter(list(self.nodes))

    # ---- structure -----------------------------------------------------------------
    def toposort(self) -> None:
        """Order nodes so every producer precedes its consumers; raise GraphError on a cycle."""
        available = set(self.inputs) | set(self.initializers) | {""}
        producers = self.producers()
        pending = list(self.nodes)
        ordered: list[Node] = []
        # Kahn's algorithm keyed by names; stable with respect to the original order.
        indeg: dict[int, int] = {}
        waiting: dict[str, list[int]] = {}
        for idx, n in enumerate(pending):
            missing = {i for i in n.inputs if i not in available and i in producers}
            indeg[idx] = len(missing)
            for name in missing:
                waiting.setdefault(name, []).append(idx)
        ready = [i for i, d in indeg.items() if d == 0]
        import heapq

        heapq.heapify(ready)
        while ready:
            idx = heapq.heappop(ready)
            n = pending[idx]
            ordered.append(n)
            for out in n.outputs:
                for j in waiting.pop(out, []):
                    indeg[j] -= 1
                    if indeg[j] == 0:
                        heapq.heappush(ready, j)
        if len(ordered) != len(pending):
            stuck = [pending[i] for i, d in indeg.items() if d > 0]
            names = ", ".join(repr(n.name or n.op_type) for n in stuck[:8])
            raise GraphError(
                f"the graph has a cycle through {len(stuck)} node(s): {names}",
                where=f"graph {self.name!r}",
                hint="an ONNX graph must be acyclic; check which node output feeds back into its own inputs",
            )
        self.nodes = ordered

    def validate(self) -> None:
        """Check that every name read is produced exactly once; raise GraphError otherwise."""
        defined: dict[str, str] = {}
        for name in self.inputs:
            defined[name] = "graph input"
        for name in self.initializers:
            defined.setdefault(name, "initializer")
        problems: list[str] = []
        for n in self.nodes:
            for out in n.outputs:
                if not out:
                    continue
                if out in defined and defined[out] != "initializer":
                    problems.append(f"tensor {out!r} is written by {n.describe()} and also by {defined[out]}")
                defined[out] = n.describe()
        producers = set(defined)
        for n in self.nodes:
            for i in n.inputs:
                if i and i not in producers:
                    problems.append(f"{n.describe()} reads {i!r}, which no node, input or initializer defines")
        for o in self.outputs:
            if o not in producers:
                problems.append(f"graph output {o!r} is not produced by any node, input or initializer")
        if problems:
            raise GraphError(
                "the graph is malformed:\n  - " + "\n  - ".join(problems[:20]),
                where=f"graph {self.name!r}",
                hint="fix the dangling or duplicated names in the model (e.g. re-export it)",
            )

    def remove_nodes(self, dead: Iterable[Node]) -> None:
        ids = {id(n) for n in dead}
        self.nodes = [n for n in self.nodes if id(n) not in ids]

    def rename_tensor(self, old: str, new: str) -> None:
        """Make every reader of `old` read `new` instead (graph outputs included)."""
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        self.outputs = [new if o == old else o for o in self.outputs]

    def copy(self) -> "Graph":
        g = Graph(
            nodes=[_copy.deepcopy(n) for n in self.nodes],
            inputs=self.inputs,
            outputs=self.outputs,
            initializers=dict(self.initializers),
            values=dict(self.values),
            opsets=self.opsets,
            name=self.name,
            metadata=_copy.deepcopy(self.metadata),
        )
        return g

    def __deepcopy__(self, memo: dict) -> "Graph":  # a body in a node's attrs (If/Loop/Scan) copies with it
        return self.copy()

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes, inputs={self.inputs}, outputs={self.outputs})"


def subgraphs(node: Node) -> list[tuple[str, Graph]]:
    """(attribute, body) of each graph a node holds (If branches, Loop and Scan bodies), by attribute name."""
    return [(key, value) for key, value in sorted(node.attrs.items()) if isinstance(value, Graph)]


def has_subgraphs(node: Node) -> bool:
    return any(isinstance(value, Graph) for value in node.attrs.values())
