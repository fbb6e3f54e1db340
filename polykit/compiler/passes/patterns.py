"""Graph patterns as data, and the pass that rewrites their matches (in the spirit of
tinygrad's PatternMatcher and torch.fx's replace_pattern): the recognizers' rules.

    HALF_X_CORE = Prod(Const(near(0.5)), Var("x"), Op("Add", (Const(near(1.0)), ERF), commutative=True))
    GELU = Rule(HALF_X_CORE, lambda m: [Node("Gelu", [m["x"]], [m.root.outputs[0]])])
    rewrite(graph, [GELU])

A pattern describes the tensor a subgraph computes:

- `Op(op_type, inputs)`: produced by a default-domain node of that type (or one of a tuple)
  whose inputs match `inputs` in order (either order of two with `commutative=True`; further
  inputs unchecked with `rest=True`); `where(node, match)` adds a condition (attributes);
- `Var(name)`: any tensor, bound to `name` (a name bound twice must be the same tensor);
- `Const(pred, name)`: a one-element constant whose value satisfies `pred`;
- `Prod(*factors)`: a product in any association and order (Mul nodes, Pow by 2..4; see
  products.factors), its constant operands multiplied into the one `Const` factor, each tensor
  operand matched by one other factor;
- `Scaled(inner, name)`: `inner` times / divided by a chain of one-element constants (none
  too), the total factor bound to `name`;
- `OneOf(*options)`: the first option that matches.

A match spans the nodes it walked; it holds only when every spanned node's outputs, except
the root's, are read by spanned nodes alone and are neither graph outputs nor kept (so a
rewrite never drops a tensor someone else reads). `rewrite(graph, rules)` tries the rules
(indexed by their root's op) at each node from the last to the first, so a larger match
claims its nodes before a smaller one inside it, and puts the nodes a rule builds where the
root stood (rules whose `accept` refuses a match leave the node to the next rule).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.products import factors
from polykit.compiler.passes.rewrite import close_to, protected, scalar


def near(target: float, rel: float = 1e-3) -> Callable[[float], bool]:
    """A constant predicate: within `rel` of `target`."""
    return lambda value: close_to(value, target, rel)


@dataclass
class Match:
    """What a pattern bound: tensors and constants by name, the nodes it spans, the root node."""

    graph: Graph
    producers: dict[str, Node]
    readers: dict[str, list[Node]]
    fixed: set[str]
    root: Node | None = None
    tensors: dict[str, str] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    named: dict[str, Node] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)

    def __getitem__(self, name: str) -> str:
        return self.tensors[name]

    def bind(self, name: str | None, tensor: str) -> bool:
        if name is None:
            return True
        return self.tensors.setdefault(name, tensor) == tensor

    def span(self, node: Node) -> None:
        if not any(n is node for n in self.nodes):
            self.nodes.append(node)

    def state(self) -> tuple:
        return dict(self.tensors), dict(self.values), dict(self.named), list(self.nodes)

    def restore(self, state: tuple) -> None:
        self.tensors, self.values, self.named, self.nodes = (type(s)(s) for s in state)

    def private(self) -> bool:
        """Every spanned node's outputs but the root's are read only inside the match."""
        for node in self.nodes:
            if node is self.root:
                continue
            for out in node.outputs:
                if out and (out in self.fixed or any(not any(r is n for n in self.nodes)
                                                     for r in self.readers.get(out, []))):
                    return False
        return True


class Pattern:
    """A pattern over one tensor; `match` binds into `m` (left partly bound on failure: the
    caller restores its saved state)."""

    def match(self, tensor: str, m: Match) -> bool:
        raise NotImplementedError("need match")


@dataclass(frozen=True)
class Var(Pattern):
    name: str | None = None

    def match(self, tensor: str, m: Match) -> bool:
        return bool(tensor) and m.bind(self.name, tensor)


@dataclass(frozen=True)
class Const(Pattern):
    pred: Callable[[float], bool] = lambda value: True
    name: str | None = None

    def match(self, tensor: str, m: Match) -> bool:
        value = scalar(m.graph, tensor)
        if value is None or not self.pred(value) or not m.bind(self.name, tensor):
            return False
        if self.name is not None:
            m.values[self.name] = value
        return True


def _try(m: Match, attempt: Callable[[], bool]) -> bool:
    saved = m.state()
    if attempt():
        return True
    m.restore(saved)
    return False


@dataclass(frozen=True)
class Op(Pattern):
    op: str | tuple[str, ...]
    inputs: tuple[Pattern, ...] = ()
    name: str | None = None
    commutative: bool = False
    rest: bool = False
    where: Callable[[Node, Match], bool] | None = None
    node: str | None = None

    @property
    def ops(self) -> tuple[str, ...]:
        return (self.op,) if isinstance(self.op, str) else tuple(self.op)

    def match(self, tensor: str, m: Match) -> bool:
        node = m.producers.get(tensor)
        if node is None or node.domain != "" or node.op_type not in self.ops:
            return False
        if len(node.inputs) < len(self.inputs) or (len(node.inputs) > len(self.inputs) and not self.rest):
            return False
        if not m.bind(self.name, tensor) or (self.where is not None and not self.where(node, m)):
            return False
        if self.node is not None:
            m.named[self.node] = node
        m.span(node)
        names = node.inputs[:len(self.inputs)]
        orders = [names, names[::-1]] if self.commutative and len(names) == 2 else [names]
        return any(_try(m, lambda order=order: all(p.match(t, m) for p, t in zip(self.inputs, order)))
                   for order in orders)


@dataclass(frozen=True)
class Prod(Pattern):
    factors: tuple[Pattern, ...]
    name: str | None = None

    def __init__(self, *factors: Pattern, name: str | None = None):
        object.__setattr__(self, "factors", factors)
        object.__setattr__(self, "name", name)

    def match(self, tensor: str, m: Match) -> bool:
        prod = factors(m.graph, tensor, m.producers, m.readers, m.fixed)
        consts = [p for p in self.factors if isinstance(p, Const)]
        others = [p for p in self.factors if not isinstance(p, Const)]
        if not prod.nodes or len(prod.tensors) != len(others) or len(consts) > 1 or bool(consts) != bool(prod.scalars):
            return False
        if consts and not consts[0].pred(prod.scalar()):
            return False
        if not m.bind(self.name, tensor):
            return False
        for node in prod.nodes:
            m.span(node)
        return any(_try(m, lambda order=order: all(p.match(t, m) for p, t in zip(others, order)))
                   for order in dict.fromkeys(itertools.permutations(prod.tensors)))


@dataclass(frozen=True)
class Scaled(Pattern):
    """`inner` multiplied and/or divided by one-element constants (none, one or a chain):
    peels Mul/Div-by-constant nodes while their output is read by the next alone, binds the total
    factor to `name` (in `values`), and matches what is left with `inner`."""

    inner: Pattern
    name: str

    def match(self, tensor: str, m: Match) -> bool:
        factor = 1.0
        while True:
            node = m.producers.get(tensor)
            own = m.root is not None and node is m.root  # the root's output may be read anywhere
            if (node is None or node.domain != "" or node.op_type not in ("Mul", "Div") or len(node.inputs) != 2
                    or not (own or (tensor not in m.fixed and len(m.readers.get(tensor, [])) == 1))):
                break
            a, b = scalar(m.graph, node.inputs[0]), scalar(m.graph, node.inputs[1])
            if node.op_type == "Div" and b is not None and b != 0.0:
                factor, tensor = factor / b, node.inputs[0]
            elif node.op_type == "Mul" and b is not None:
                factor, tensor = factor * b, node.inputs[0]
            elif node.op_type == "Mul" and a is not None:
                factor, tensor = factor * a, node.inputs[1]
            else:
                break
            m.span(node)
        m.values[self.name] = factor
        return self.inner.match(tensor, m)


@dataclass(frozen=True)
class OneOf(Pattern):
    options: tuple[Pattern, ...]

    def __init__(self, *options: Pattern):
        object.__setattr__(self, "options", options)

    def match(self, tensor: str, m: Match) -> bool:
        return any(_try(m, lambda p=p: p.match(tensor, m)) for p in self.options)


def root_ops(pattern: Pattern) -> tuple[str, ...]:
    """The op types a match of `pattern` can be rooted at."""
    if isinstance(pattern, Op):
        return pattern.ops
    if isinstance(pattern, Prod):
        return ("Mul", "Pow")
    if isinstance(pattern, Scaled):
        return ("Mul", "Div", *root_ops(pattern.inner))
    if isinstance(pattern, OneOf):
        return tuple(dict.fromkeys(op for p in pattern.options for op in root_ops(p)))
    return ()


@dataclass(frozen=True)
class Rule:
    """`pattern` rooted at a node, where `accept(match)` holds (it may span more nodes: ones
    the rewrite drops too) -> the nodes `build(match)` returns in the root's place."""

    pattern: Pattern
    build: Callable[[Match], list[Node]]
    accept: Callable[[Match], bool] = lambda m: True


def match_at(graph: Graph, pattern: Pattern, node: Node, *, keep: Iterable[str] = (),
             producers: dict[str, Node] | None = None, readers: dict[str, list[Node]] | None = None) -> Match | None:
    """The match of `pattern` rooted at `node` (its first output), or None."""
    m = Match(graph, producers if producers is not None else graph.producers(),
              readers if readers is not None else graph.consumers(), protected(graph, keep), root=node)
    if not node.outputs or not pattern.match(node.outputs[0], m) or not any(n is node for n in m.nodes):
        return None
    return m if m.private() else None


def rewrite(graph: Graph, rules: Iterable[Rule], *, keep: Iterable[str] = ()) -> bool:
    """Replace each match of `rules` by the nodes its rule builds; True if any. Matches are
    claimed from the last node to the first (first rule first), so a larger match takes its
    nodes before a smaller one inside it; they are built in graph order (fresh names follow
    the graph)."""
    index: dict[str, list[Rule]] = {}
    for rule in rules:
        for op in root_ops(rule.pattern):
            index.setdefault(op, []).append(rule)
    producers, readers = graph.producers(), graph.consumers()
    found: dict[int, tuple[Rule, Match]] = {}
    taken: set[int] = set()
    for node in reversed(graph.nodes):
        if node.domain != "" or id(node) in taken:
            continue
        for rule in index.get(node.op_type, ()):
            m = match_at(graph, rule.pattern, node, keep=keep, producers=producers, readers=readers)
            if m is None or any(id(n) in taken for n in m.nodes) or not rule.accept(m):
                continue
            if any(id(n) in taken for n in m.nodes):  # accept spanned a node taken already
                continue
            taken.update(id(n) for n in m.nodes)
            found[id(node)] = (rule, m)
            break
    if not found:
        return False
    nodes: list[Node] = []
    for n in graph.nodes:
        if id(n) in found:
            rule, m = found[id(n)]
            nodes.extend(rule.build(m))
        elif id(n) not in taken:
            nodes.append(n)
    graph.nodes = nodes
    return True
