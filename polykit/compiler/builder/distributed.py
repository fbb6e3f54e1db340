"""Tensor parallelism: split a graph over `ranks` ranks, one rank's graph at a time (docs/DISTRIBUTED.md).

`partition(graph, ranks, rank)` rewrites a folded, statically shaped graph into the graph rank
`rank` runs, Megatron-style: it walks the nodes in order and tracks, for every tensor, whether the
rank holds all of it (replicated), one of `ranks` equal contiguous chunks along an axis (split), or
a summand of it (partial). The rules (polykit.compiler.builder.partition_rules) make a MatMul or Gemm
whose input is replicated column-parallel (its weight's columns split: the output is split on its
last axis) and one whose input is split on its last axis row-parallel (its weight's rows split: the
output is partial); elementwise ops, Reshape (head counts in the shape constants divided by the
rank count), Transpose, batched MatMul, Softmax and LayerNormalization over unsplit axes keep a
split; an embedding Gather splits its table's columns. Anything else reads replicated tensors: a
split one is all-gathered first, a partial one all-reduced (so a row-parallel MatMul's bias is added
once, after the all-reduce); graph outputs are replicated. Each rank's graph holds only its shards.

`distribute(graph, config)` is the builder's step: partition when `config.ranks > 1`, give
collectives imported with "every rank" (onnxruntime's AllReduce) the build's rank count, and
return the plan metadata that says what was split. `build_rank_plans(model, config)` builds one
plan per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ops.models.collective import collective_node, is_collective

#: a tensor's layout on a rank: absent = replicated; ("split", axis); ("partial",)
State = tuple


@dataclass
class Partition:
    """What partition() did on one rank: weights it split (name -> full and local shape), the
    collectives it inserted (name, op, tensor) and the weights every rank keeps whole."""

    rank: int
    ranks: int
    split_weights: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    collectives: list[tuple[str, str, str]] = field(default_factory=list)
    replicated_weights: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        return {"rank": self.rank, "ranks": self.ranks, "partition": {
            "split_weights": {k: {"full": f, "local": l} for k, (f, l) in sorted(self.split_weights.items())},
            "collectives": [{"name": n, "op": op, "tensor": t} for n, op, t in self.collectives],
            "replicated_weights": sorted(self.replicated_weights)}}


class Partitioner:
    """The state of one rank's rewrite: the nodes emitted so far and each tensor's local form."""

    def __init__(self, graph: Graph, ranks: int, rank: int, veto: frozenset[str] = frozenset()):
        self.src = graph
        self.veto = veto  # nodes to leave replicated: their column split had to be gathered again
        self.undo: set[str] = set()  # column-split nodes whose split a non-output reader gathered
        self._origins: dict[str, frozenset[str]] = {}  # split tensor -> the column splits it comes from
        self.ranks, self.rank = ranks, rank
        self.nodes: list[Node] = []
        self.local: dict[str, str] = {}  # original tensor -> its name on this rank
        self.state: dict[str, State] = {}
        self._full: dict[str, str] = {}  # original tensor -> its materialized replicated name
        self._slices: dict[tuple[str, int], str] = {}
        self.summary = Partition(rank, ranks)
        self.initializers = dict(graph.initializers)

    # ---- tensors ------------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        """The full (unsplit) static shape of an original tensor."""
        return tuple(self.src.value(name).shape)

    def of(self, name: str) -> State | None:
        return self.state.get(name)

    def is_weight(self, name: str) -> bool:
        return name in self.src.initializers

    def replicated(self, name: str) -> str:
        """The local name of the whole of `name` (an all-gather or all-reduce when it is not)."""
        st = self.state.get(name)
        if not name or st is None:
            return self.local.get(name, name)
        if name not in self._full:
            self.undo |= self._origins.get(name, frozenset())
            full = self.src.fresh_name(f"{name}__full")
            self._full[name] = full
            self._collect(name, full, st)
        return self._full[name]

    def _collect(self, name: str, out: str, st: State) -> None:
        op = "all_gather" if st[0] == "split" else "all_reduce"
        node = collective_node(op, self.local[name], out, self.ranks, self.src.fresh_name(f"{name}__{op}"),
                               axis=st[1] if st[0] == "split" else 0)
        self.nodes.append(node)
        self.summary.collectives.append((node.name, op, name))

    def split(self, name: str, axis: int) -> str | None:
        """The local name of `name`'s chunk along `axis` (weights sliced, replicated activations cut
        by a Slice node, partial ones reduce-scattered); None when the dim does not divide."""
        st, dim = self.state.get(name), self.shape(name)[axis]
        if st == ("split", axis):
            return self.local[name]
        if dim % self.ranks:
            return None
        key = (name, axis)
        if key in self._slices:
            return self._slices[key]
        size = dim // self.ranks
        if st is None and self.is_weight(name):
            arr = np.take(self.initializers[name], range(self.rank * size, (self.rank + 1) * size), axis=axis)
            out = self.src.fresh_name(f"{name}__rank{self.rank}")
            self.initializers[out] = np.ascontiguousarray(arr)
            self.summary.split_weights[name] = (list(self.shape(name)), list(arr.shape))
        elif st == ("partial",):
            out = self.src.fresh_name(f"{name}__scattered")
            node = collective_node("reduce_scatter", self.local[name], out, self.ranks,
                                   self.src.fresh_name(f"{name}__reduce_scatter"), axis=axis)
            self.nodes.append(node)
            self.summary.collectives.append((node.name, "reduce_scatter", name))
        else:
            source = self.replicated(name)
            out = self.src.fresh_name(f"{name}__chunk")
            consts = [self.constant(np.array([v], np.int64), f"{name}__{k}")
                      for k, v in (("start", self.rank * size), ("end", (self.rank + 1) * size), ("axis", axis))]
            self.nodes.append(Node("Slice", [source] + consts, [out], {}, self.src.fresh_name(f"{name}__slice")))
        self._slices[key] = out
        return out

    def constant(self, array: np.ndarray, prefix: str) -> str:
        name = self.src.fresh_name(prefix)
        self.initializers[name] = array
        return name

    # ---- nodes --------------------------------------------------------------------------------
    def emit(self, node: Node, inputs: list[str], states: list[State | None], column_split: bool = False) -> None:
        """Append a copy of `node` reading `inputs`; its outputs take `states` (split or partial
        outputs get a local name, so the original name always means the whole tensor).
        `column_split`: the node splits a weight's columns (a split to undo if it is gathered)."""
        origins = frozenset().union(*(self._origins.get(i, frozenset()) for i in node.inputs))
        origins |= {node.name} if column_split else set()
        outs = []
        for out, st in zip(node.outputs, states):
            if out and st is not None:
                if st[0] == "split":
                    self._origins[out] = origins
                self.state[out] = st
                self.local[out] = self.src.fresh_name(f"{out}__tp")
                outs.append(self.local[out])
            else:
                outs.append(out)
        self.nodes.append(Node(node.op_type, list(inputs), outs, dict(node.attrs), node.name, node.domain))

    def emit_replicated(self, node: Node) -> None:
        """`node` on whole inputs, as the model has it."""
        self.emit(node, [self.replicated(i) for i in node.inputs], [None] * len(node.outputs))

    def finish(self) -> Graph:
        """The rank's graph: outputs gathered under their own names, unused weights dropped."""
        for out in self.src.outputs:  # a gathered output is the point of a split (a vocabulary's)
            st = self.state.get(out)
            if st is not None:
                self._collect(out, out, st)
        g = Graph(self.nodes, self.src.inputs, self.src.outputs, {}, {n: self.src.value(n) for n in self.src.inputs},
                  self.src.opsets, self.src.name, self.src.metadata)
        read = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
        g.initializers = {k: v for k, v in self.initializers.items() if k in read}
        self.summary.replicated_weights = [k for k, v in g.initializers.items()
                                           if k in self.src.initializers and v.dtype.kind == "f" and v.size > 1]
        return g


#: most partitions of a graph, each leaving replicated the column splits the one before gathered again
MAX_ROUNDS = 8


def partition(graph: Graph, ranks: int, rank: int) -> tuple[Graph, Partition]:
    """Rank `rank`'s graph of `graph` split over `ranks` ranks (the graph itself is left alone).
    A column-parallel MatMul whose split output an inner reader must all-gather (a head count the
    ranks do not divide, a Split of fused QKV) is left replicated, and the graph partitioned again."""
    from polykit.compiler.builder.partition_rules import rule_for

    veto: frozenset[str] = frozenset()
    for _ in range(MAX_ROUNDS):
        p = Partitioner(graph.copy(), ranks, rank, veto)
        for node in graph.nodes:
            rule = rule_for(node)
            if rule is None or not rule(p, node):
                p.emit_replicated(node)
        if p.undo <= veto:
            break
        veto |= p.undo
    return p.finish(), p.summary


def has_collectives(graph: Graph) -> bool:
    return any(is_collective(n) for n in graph.nodes)


def distribute(g: Graph, cfg: Any) -> dict[str, Any]:
    """The builder's step on a shape-inferred graph (edited in place; shapes to infer again): the
    plan metadata it adds."""
    from polykit.compiler.passes import eliminate_dead_code, fold_constants, run_passes

    if has_collectives(g):  # a model already written per rank (onnxruntime's collectives)
        for node in g.nodes:
            if is_collective(node) and node.attrs.get("ranks") == 0:
                node.attrs.update(ranks=cfg.ranks, group=list(range(cfg.ranks)))
        return {"rank": cfg.rank, "ranks": cfg.ranks}
    if cfg.ranks == 1:
        return {}
    run_passes(g, [fold_constants, eliminate_dead_code])  # shapes are static (BuilderConfig takes no profiles)
    split, summary = partition(g, cfg.ranks, cfg.rank)
    g.nodes, g.initializers, g.values = split.nodes, split.initializers, split.values
    return summary.metadata()


def build_rank_plans(model: Any, config: Any) -> list:
    """One plan per rank of `config.ranks` (each built with config.rank set to it)."""
    from polykit.compiler.builder.builder import Builder
    from polykit.compiler.graph.onnx_import import load_onnx

    graph = model if isinstance(model, Graph) else load_onnx(model)
    return [Builder(replace(config, rank=r)).build(graph) for r in range(config.ranks)]
