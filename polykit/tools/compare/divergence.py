"""The first divergence of a layerwise comparison: which tensor, in the ONNX graph's topological
order, is the first whose runners disagree, the node that produces it, and that node's inputs,
which still agree.

    order = GraphOrder.from_onnx("model.onnx")
    results, report = run_comparison(runners, settings, optional=order.intermediates)
    layerwise = analyze(report, order)
    layerwise.first_divergence.node          # e.g. "/layer3/conv2/Conv"

When a runner fused some ONNX tensors away (polykit compares at fused-layer boundaries, see
polykit.compiler.builder.marking), the tensors between the divergent one and the agreeing ones were
not compared: `region` lists the nodes that compute them (the fused layer, or the nodes no
marked tensor observes), so the culprit is among them.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass
from typing import Any

from polykit.tools.compare.comparator import AccuracyReport, PairResult
from polykit.tools.compare.funcs import OutputComparison

#: InputState.state values
INPUT_STATES = ("agrees", "diverges", "graph input", "weight", "not compared")


@dataclass(frozen=True)
class Producer:
    """An ONNX node output: the tensor, its node (name, or op_index when unnamed), op and inputs."""

    tensor: str
    node: str
    op: str
    inputs: tuple[str, ...]
    index: int


@dataclass(frozen=True)
class GraphOrder:
    """The node outputs of an ONNX graph in topological order, and what else the graph holds."""

    producers: tuple[Producer, ...]
    inputs: frozenset[str]
    weights: frozenset[str]  # initializers and Constant node outputs
    outputs: tuple[str, ...]

    @staticmethod
    def from_onnx(model: Any) -> "GraphOrder":
        """From a path (weights stored externally are not read) or an onnx.ModelProto."""
        import onnx

        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
        graph = proto.graph
        inits = {t.name for t in graph.initializer}
        constants = {o for n in graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx") for o in n.output}
        producers = [Producer(o, n.name or f"{n.op_type}_{i}", n.op_type, tuple(x for x in n.input if x), i)
                     for i, n in _toposorted(graph.node) for o in n.output if o and o not in constants]
        return GraphOrder(tuple(producers), frozenset(i.name for i in graph.input) - inits,
                          frozenset(inits | constants), tuple(o.name for o in graph.output))

    @property
    def intermediates(self) -> frozenset[str]:
        """Produced tensors that are not graph outputs (what marking adds; a runner may lack some)."""
        return frozenset(p.tensor for p in self.producers) - set(self.outputs)

    def producer(self, tensor: str) -> Producer | None:
        return self._by_tensor.get(tensor)

    def position(self, tensor: str) -> int:
        """The tensor's rank in topological order (after every produced tensor when none produces it)."""
        return self._positions.get(tensor, len(self._positions))

    @functools.cached_property
    def _by_tensor(self) -> dict[str, Producer]:
        return {p.tensor: p for p in self.producers}

    @functools.cached_property
    def _positions(self) -> dict[str, int]:
        return {p.tensor: k for k, p in enumerate(self.producers)}


def _toposorted(nodes: Any) -> list[tuple[int, Any]]:
    """(file index, node) in topological order, file order among ready nodes (Kahn's algorithm)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waiting = [0] * len(nodes)
    readers: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        deps = {producer[x] for x in n.input if x in producer and producer[x] != i}
        waiting[i] = len(deps)
        for d in deps:
            readers.setdefault(d, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers.get(i, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    order += [i for i, w in enumerate(waiting) if w > 0]  # a cycle: keep file order for the rest
    return [(i, nodes[i]) for i in order]


@dataclass(frozen=True)
class InputState:
    """An input of the divergent region: compared ("agrees"/"diverges", with its error), a graph
    input (identical feeds), a weight, or "not compared"."""

    name: str
    state: str
    error: OutputComparison | None = None


@dataclass(frozen=True)
class LayerRow:
    """One compared tensor in topological order (node and op "" for a tensor no node produces)."""

    tensor: str
    node: str
    op: str
    error: OutputComparison


@dataclass(frozen=True)
class Divergence:
    """The first divergent tensor of one runner vs the reference on one iteration."""

    tensor: str
    node: str
    op: str
    error: OutputComparison
    inputs: tuple[InputState, ...]
    region: tuple[tuple[str, str], ...]  # (node, op) from the agreeing inputs to `tensor`, in order


@dataclass(frozen=True)
class LayerwiseReport:
    """Per-layer errors of one pair (the first that diverges, else the first), its first
    divergence, and the tensors some runner lacked (fused away: not compared), in graph order.
    `marked`: whether anything besides the graph outputs was compared or fused away."""

    runner: str
    reference: str
    iteration: int
    layers: tuple[LayerRow, ...]
    first_divergence: Divergence | None
    fused_away: tuple[str, ...]
    marked: bool


def analyze(report: AccuracyReport, order: GraphOrder) -> LayerwiseReport | None:
    """The layerwise view of `report` (None without pairs to compare)."""
    if not report.pairs:
        return None
    analyses = [(pair, _rows(pair, order)) for pair in report.pairs]
    pair, rows = next(((p, r) for p, r in analyses if any(not row.error.passed for row in r)), analyses[0])
    first = next((row for row in rows if not row.error.passed), None)
    missing = {n for p in report.pairs for n in p.not_compared}
    fused_away = tuple(sorted(missing, key=lambda n: (order.position(n), n)))
    marked = bool(fused_away) or any(r.node and r.tensor not in order.outputs for r in rows)
    return LayerwiseReport(pair.runner, pair.reference, pair.iteration, tuple(rows),
                           _divergence(first, pair, order) if first else None, fused_away, marked)


def _rows(pair: PairResult, order: GraphOrder) -> list[LayerRow]:
    ranked = sorted(pair.outputs, key=lambda o: order.position(o.name))
    rows = []
    for o in ranked:
        p = order.producer(o.name)
        rows.append(LayerRow(o.name, p.node if p else "", p.op if p else "", o))
    return rows


def _divergence(row: LayerRow, pair: PairResult, order: GraphOrder) -> Divergence:
    """The region behind `row`: walk up from its producer through tensors not compared."""
    compared = {o.name: o for o in pair.outputs}
    start = order.producer(row.tensor)
    region: dict[int, Producer] = {}
    frontier: dict[str, InputState] = {}
    stack = list(start.inputs) if start else []
    if start:
        region[start.index] = start
    while stack:
        name = stack.pop()
        if name in frontier:
            continue
        p = order.producer(name)
        if name in compared:
            o = compared[name]
            frontier[name] = InputState(name, "agrees" if o.passed else "diverges", o)
        elif name in order.inputs:
            frontier[name] = InputState(name, "graph input")
        elif name in order.weights:
            frontier[name] = InputState(name, "weight")
        elif p is None:
            frontier[name] = InputState(name, "not compared")
        elif p.index not in region:
            region[p.index] = p
            stack.extend(p.inputs)
    nodes = sorted(region.values(), key=lambda p: order.position(p.tensor))
    names = dict.fromkeys(n for p in nodes for n in p.inputs if n in frontier)
    return Divergence(row.tensor, row.node, row.op, row.error, tuple(frontier[n] for n in names),
                      tuple((p.node, p.op) for p in nodes))
