"""Shapes a node's shape rule computes on the host at bind time, from shape-tensor input values.

A shape-tensor input of a profile's `ruled` inputs (polykit.compiler.builder.value_ranges gives their
ranges from the model) has value symbols whose range is a validity domain, not a set of corners:
the output shape of a Reshape, TopK, Slice, Reduce... that reads such a value is no expression
of the symbols (Reshape's -1 and 0, Slice's clamps, which axes a reduction removes). Instead,
in a build each output dim of such a node becomes a *rule symbol* `rule(tensor)[axis]` and the
plan records the node (`ShapeRule`: op, attributes, opset, each input's dtype, dim expressions
and, for the small constant operands, value expressions). `ShapeBinder.bind` evaluates the
records in order with the op's own shape rule (polykit.compiler.graph.infer, the evaluator that
serves every build) for the run's input shapes and values, binding the rule symbols; the
tensors whose dims name one are sized at run time (the cpu target allocates each output as it
is produced). Profile corners give a ruled value symbol and a rule symbol their opt values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.compiler.ir.symbolic import Expr, SymInt, evaluate, expr_from_json, expr_to_json, symbol, term_of
from polykit.errors import BuildError, PolykitError, RuntimeInputError

#: graph.metadata keys of a build: ruled value symbols (set) and the ShapeRules found (list)
RULED = "ruled_symbols"
RULES = "shape_rules"

#: targets that size rule-sized tensors at bind time: cpu allocates each output as a layer returns it,
#: cuda gives them device memory per shape set (polykit.runtime.cuda.sized)
RUN_TIME_SIZED_TARGETS = frozenset({"cpu", "cuda"})

#: values every rule symbol takes at the extra corners tactics must serve (small_rule_corners)
RULE_CORNER_VALUES = (2, 3)

#: attribute value kinds a record keeps, besides small numeric tensors (a node with a graph attribute is not ruled)
_SCALARS = (int, float, str)
#: the most elements of a tensor attribute a record keeps (ConstantOfShape's fill value)
MAX_TENSOR_ATTR = 64


def rule_symbol(tensor: str, axis: int) -> str:
    return f"rule({tensor})[{axis}]"


class RuledFloat(float):
    """An element of a ruled float shape-tensor input during a build (Resize's scales, OneHot's
    depth, Range's start/limit/delta): its value at opt, `expr` its value symbol. Arithmetic gives
    plain floats: value_ranges admits such inputs only as direct operands of ops' shape rules."""

    expr: Expr

    def __new__(cls, value: float, expr: Expr) -> "RuledFloat":
        obj = super().__new__(cls, float(value))
        obj.expr = expr
        return obj

    def __repr__(self) -> str:
        return f"RuledFloat({float(self)}, {self.expr})"

    def __reduce__(self):  # copy.deepcopy keeps the symbol
        return RuledFloat, (float(self), self.expr)


@dataclass(frozen=True)
class RuleInput:
    """One input of a ruled node: dtype name, dim expressions, and the value (expressions for an
    integer one, plain numbers otherwise) when the rule may read it; "" names an omitted input."""

    name: str
    dtype: str = ""
    dims: tuple = ()
    value: tuple | None = None


@dataclass(frozen=True)
class ShapeRule:
    """A node whose output shapes its shape rule computes at bind time; `opt`: the output
    shapes at the first profile's opt (where corners put the rule symbols)."""

    op: str
    domain: str
    opset: int
    attrs: Mapping[str, Any]
    inputs: tuple[RuleInput, ...]
    outputs: tuple[str, ...]
    opt: tuple[tuple[int, ...], ...]

    def symbols_at_opt(self) -> dict[str, int]:
        return {rule_symbol(o, a): d for o, shape in zip(self.outputs, self.opt) if o for a, d in enumerate(shape)}

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "domain": self.domain, "opset": self.opset,
                "attrs": {k: _attr_json(v) for k, v in self.attrs.items()},
                "inputs": [{"name": i.name, "dtype": i.dtype, "dims": [expr_to_json(d) for d in i.dims],
                            **({"value": [_value_json(v) for v in i.value]} if i.value is not None else {})}
                           for i in self.inputs],
                "outputs": list(self.outputs), "opt": [list(s) for s in self.opt]}

    @staticmethod
    def from_json(d: Mapping[str, Any], symbols: "set[str] | None" = None) -> "ShapeRule":
        """The record of a plan's JSON form; ValueError (what is wrong) when it is not one."""
        from polykit.compiler.ops.registry import find_shape_rule

        if find_shape_rule(d["domain"], d["op"]) is None:
            raise ValueError(f"op {d['domain']}::{d['op']} has no shape rule")
        attrs = {str(k): _attr_from_json(v) for k, v in d["attrs"].items()}
        inputs = tuple(RuleInput(str(i["name"]), str(i["dtype"]), tuple(expr_from_json(e, symbols) for e in i["dims"]),
                                 None if "value" not in i else tuple(_value_from_json(v, symbols) for v in i["value"]))
                       for i in d["inputs"])
        for i in inputs:
            if i.name:
                np.dtype(i.dtype)  # TypeError for a name numpy does not know
        opt = tuple(tuple(int(x) for x in s) for s in d["opt"])
        if len(opt) != len(d["outputs"]):
            raise ValueError("needs one opt shape per output")
        return ShapeRule(str(d["op"]), str(d["domain"]), int(d["opset"]), attrs, inputs,
                         tuple(str(o) for o in d["outputs"]), opt)


def _scalar_list(v: Any) -> bool:
    return type(v) is list and all(type(x) in _SCALARS for x in v)


def _small_tensor(v: Any) -> bool:
    return isinstance(v, np.ndarray) and v.dtype.kind in "biuf" and v.size <= MAX_TENSOR_ATTR


def _attr_json(v: Any) -> Any:
    """An attribute's plan form: a scalar, a list, or a small tensor as {"dtype", "shape", "values"}."""
    if isinstance(v, np.ndarray):
        return {"dtype": v.dtype.name, "shape": list(v.shape), "values": v.ravel().tolist()}
    return v


def _attr_from_json(v: Any) -> Any:
    """An attribute of a plan's record; ValueError when it is none of the forms `_attr_json` writes."""
    if type(v) in _SCALARS or _scalar_list(v):
        return v
    if type(v) is not dict or set(v) != {"dtype", "shape", "values"}:
        raise ValueError("attributes must be numbers, strings, lists of them or small tensors")
    dtype, shape, values = np.dtype(v["dtype"]), v["shape"], v["values"]
    if dtype.kind not in "biuf" or not _scalar_list(shape) or not _scalar_list(values) \
            or not all(type(d) is int and d >= 0 for d in shape) or len(values) > MAX_TENSOR_ATTR \
            or int(np.prod(shape)) != len(values):
        raise ValueError(f"a tensor attribute needs a numeric dtype, a shape and as many values "
                         f"(at most {MAX_TENSOR_ATTR})")
    return np.asarray(values, dtype=dtype).reshape(shape)


def _value_json(v: Any) -> Any:
    return v if isinstance(v, float) else expr_to_json(v)


def _value_from_json(v: Any, symbols: "set[str] | None") -> Any:
    return v if type(v) is float else expr_from_json(v, symbols)


# ---- build ---------------------------------------------------------------------------------------
def reads_ruled(consts: list, ruled: "set[str]") -> bool:
    """Whether one of a node's known operands holds a SymInt or RuledFloat over a ruled value symbol."""
    return any(c is not None and c.dtype == object and any(
        isinstance(v, (SymInt, RuledFloat)) and v.expr.symbols() & ruled for v in c.ravel()) for c in consts)


def value_blind(node: Node) -> bool:
    """Whether `node`'s output shapes never read its operands' values: an elementwise op (the one
    table, polykit.compiler.ops.elementwise_table) or a fused Pointwise group of them (a window's angles
    computed from its ruled length need no record)."""
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN
    from polykit.compiler.ops.elementwise_table import ELEMENTWISE

    if node.domain == POLYKIT_DOMAIN:
        return node.op_type == "Pointwise"
    return node.domain in ("", "ai.onnx") and node.op_type in ELEMENTWISE


def at_opt(consts: list, dtypes: list) -> list:
    """The operands with their SymInts and RuledFloats at their opt values, in the operands'
    dtypes (what the rule decides at opt)."""
    return [np.asarray([v for v in c.ravel()], dtype=np.dtype(dt) if dt is not None else np.int64).reshape(c.shape)
            if c is not None and c.dtype == object else c for c, dt in zip(consts, dtypes)]


def capture(node: Node, graph: Graph, consts: list) -> "ShapeRule | None":
    """The ShapeRule of `node` (its outputs' inferred shapes in `graph` are its opt shapes), or
    None when a record cannot hold it (a graph or tensor attribute, an output of unknown rank)."""
    if not all(type(v) in _SCALARS or _scalar_list(_listed(v)) or _small_tensor(v) for v in node.attrs.values()):
        return None
    outs = [graph.value(o) if o else None for o in node.outputs]
    if any(v is not None and (v.shape is None or v.dtype is None) for v in outs):
        return None
    inputs = []
    for name, const in zip(node.inputs, consts):
        if not name:
            inputs.append(RuleInput(""))
            continue
        v = graph.value(name)
        if v.shape is None or v.dtype is None or not v.is_tensor:
            return None
        value = None if const is None else _const_terms(np.asarray(const))
        if const is not None and value is None:
            return None
        inputs.append(RuleInput(name, np.dtype(v.dtype).name, tuple(term_of(d) for d in v.shape), value))
    opt = tuple(tuple(int(d) for d in v.shape) if v is not None else () for v in outs)
    return ShapeRule(node.op_type, node.domain, graph.opsets.get(node.domain, graph.opset),
                     {k: _listed(v) for k, v in node.attrs.items()}, tuple(inputs), tuple(node.outputs), opt)


#: op -> operand indices whose values decide a movement op's output shape (polykit.compiler.graph.shape_values)
_SHAPE_OPERANDS = {"Reshape": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,),
                   "Expand": (1,), "Tile": (1,), "ReduceSum": (1,), "ReduceProd": (1,), "ReduceMax": (1,),
                   "ReduceMin": (1,)}


def record_rule(node: Node, graph: Graph, consts: list, host: bool) -> None:
    """Make `node`'s output shapes rule symbols (graph.metadata[RULES] gets its record); `host`:
    its values were computed on the host, which holds only when no ruled operand decides its shape.
    BuildError when neither holds: its shapes would be decided at opt for every value."""
    ruled = graph.metadata[RULED]
    deciding = [i for i in _SHAPE_OPERANDS.get(node.op_type, ()) if i < len(consts) and reads_ruled([consts[i]], ruled)]
    if host and not deciding:
        return
    record = capture(node, graph, consts)  # (a host value whose shape a ruled operand decides: a layer computes it)
    if record is None:
        raise BuildError("its output shapes depend on shape-tensor input values in a way the plan cannot record",
                         where=node.describe(), hint="give those inputs fixed values (input_values)")
    graph.metadata.setdefault(RULES, []).append(record)
    rule_dims(record, graph)


def broadcast_undecided(node: Node, shapes: list, graph: Graph) -> bool:
    """Whether elementwise `node` broadcasts a dim naming a rule symbol against another dim that is
    no static 1 and not the same expression: which one the output takes (x[i:i+1] is [1] or [0],
    broadcast with [1]) is the run's, so the node's rule runs at bind time (`record_broadcast`). A
    fused Pointwise group (a graph attribute no record holds) keeps the broadcast decided at opt."""
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN

    if node.domain == POLYKIT_DOMAIN or not value_blind(node) or not graph.metadata.get(RULES) \
            or any(s is None for s in shapes):
        return False
    rules = rule_symbols(tuple(graph.metadata[RULES]))
    rank = max((len(s) for s in shapes), default=0)
    for k in range(rank):
        terms = {term_of(s[len(s) - rank + k]) for s in shapes if len(s) - rank + k >= 0}
        terms.discard(1)
        named = any(isinstance(t, Expr) and t.symbols() & rules for t in terms)
        if named and len(terms) > 1 and not any(isinstance(t, int) for t in terms):
            return True
    return False


def record_broadcast(node: Node, graph: Graph, consts: list) -> None:
    """Make elementwise `node`'s output dims rule symbols (its record: `broadcast_undecided`)."""
    record = capture(node, graph, consts)
    if record is None:
        raise BuildError("its broadcast compares dims that shape-tensor input values decide, in a node the plan "
                         "cannot record", where=node.describe(), hint="give those inputs fixed values (input_values)")
    graph.metadata[RULES].append(record)
    rule_dims(record, graph)


def _const_terms(const: np.ndarray) -> "tuple | None":
    """A known operand's elements as terms (ints, SymInt expressions, a RuledFloat's symbol) or
    floats; None for strings."""
    if const.dtype == object:
        if not all(isinstance(x, (int, float)) for x in const.ravel()):
            return None
        return tuple(x.expr if isinstance(x, RuledFloat) else x if isinstance(x, float) else term_of(x)
                     for x in const.ravel())
    if const.dtype.kind == "f":
        return tuple(float(x) for x in const.ravel())
    return tuple(int(x) for x in const.ravel()) if const.dtype.kind in "iub" else None


def _listed(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, (list, tuple)):
        return [x.item() if isinstance(x, np.generic) else x for x in v]
    return v.item() if isinstance(v, np.generic) else v


def rule_dims(rule: ShapeRule, graph: Graph) -> None:
    """Give the node's outputs rule symbols as dims (SymInts at their opt values)."""
    for name, shape in zip(rule.outputs, rule.opt):
        if name:
            v = graph.value(name)
            graph.set_value(Value(name, v.dtype, tuple(SymInt(d, symbol(rule_symbol(name, a)))
                                                       for a, d in enumerate(shape))))


def refuse_ruled_target(target: str) -> None:
    """BuildError unless `target` allocates tensors sized at run time (the cpu target's outputs are
    arrays its kernels return; the cuda arena is planned at build time)."""
    if target not in RUN_TIME_SIZED_TARGETS:
        raise BuildError(f"the plan has tensors whose shapes shape-tensor input values decide, which the {target} "
                         f"target cannot size at run time yet", where=f"target {target!r}",
                         hint="give those inputs values ranges whose corners hold (--trt-min-shape-values/"
                              "--trt-max-shape-values) or fixed "
                              "values (input_values)")


# ---- bind ----------------------------------------------------------------------------------------
def evaluate_rules(rules: "tuple[ShapeRule, ...]", dims: Mapping[str, int]) -> dict[str, int]:
    """`dims` plus every rule symbol, each record's shape rule run on the concrete input shapes and
    values (RuntimeInputError naming the node when the values do not fit it)."""
    from polykit.compiler.graph.infer import infer_shapes

    env = dict(dims)
    for rule in rules:
        g = _one_node(rule, env)
        try:
            infer_shapes(g)
        except PolykitError as exc:
            raise RuntimeInputError(f"the shape-tensor values do not fit {rule.op} node -> {list(rule.outputs)}: "
                                    f"{exc.what}", where=exc.where or f"tensor {rule.outputs[0]!r}",
                                    hint="feed values the op accepts for these input shapes") from None
        for name, opt in zip(rule.outputs, rule.opt):
            shape = g.value(name).shape if name else ()
            if name and (shape is None or len(shape) != len(opt)):
                raise RuntimeInputError(f"tensor {name!r} would have shape {shape} for these shape-tensor values; the "
                                        f"plan was built for rank {len(opt)}", where=f"tensor {name!r}",
                                        hint="feed values of the same kind (e.g. as many axes) as at build time")
            env.update({rule_symbol(name, a): int(d) for a, d in enumerate(shape or ())})
    return env


def _one_node(rule: ShapeRule, env: Mapping[str, int]) -> Graph:
    values, known = {}, {}
    for i in rule.inputs:
        if not i.name:
            continue
        shape = tuple(evaluate(d, env) for d in i.dims)
        values[i.name] = Value(i.name, np.dtype(i.dtype), shape)
        if i.value is not None:
            flat = [_operand(v, env) for v in i.value]
            known[i.name] = np.asarray(flat, dtype=np.dtype(i.dtype)).reshape(shape)
    names = list(dict.fromkeys(i.name for i in rule.inputs if i.name))
    node = Node(rule.op, [i.name for i in rule.inputs], list(rule.outputs), dict(rule.attrs), "", rule.domain)
    return Graph([node], names, [o for o in rule.outputs if o], values=values,
                 opsets={"": rule.opset, rule.domain: rule.opset} if rule.domain else {"": rule.opset},
                 metadata={"input_values": known})


def _operand(v: Any, env: Mapping[str, Any]) -> Any:
    """An operand element's value: a float, a float input's symbol (its float value), or an int expression."""
    if isinstance(v, Expr) and v.op == "sym" and isinstance(env.get(v.args[0]), float):
        return env[v.args[0]]
    return v if isinstance(v, float) else evaluate(v, env)


def rule_symbols(rules: "tuple[ShapeRule, ...]") -> set[str]:
    return {s for r in rules for s in r.symbols_at_opt()}


def run_time_sized(tensors: Mapping[str, Any], rules: "tuple[ShapeRule, ...]") -> frozenset[str]:
    """The tensors (name -> TensorDesc) whose dims name a rule symbol: no reserved bytes bound them."""
    ruled = rule_symbols(rules)
    return frozenset(n for n, t in tensors.items()
                     if any(isinstance(d, Expr) and d.symbols() & ruled for d in t.dims))


def with_rule_symbols(corners: Sequence[Mapping[str, int]], rules: Sequence[ShapeRule]) -> list[dict[str, int]]:
    """The `corners` with every rule symbol of `rules` at its opt value. Passes rename tensors (an
    Identity after a ruled Split leaves: remove_identity), and the optimized graph's records name
    the rule symbols after the outputs' new names."""
    at_opt = {s: d for r in rules for s, d in r.symbols_at_opt().items()}
    return [{**env, **at_opt} for env in corners]


def small_rule_corners(corners: "list[Mapping[str, int]]", rules: "tuple[ShapeRule, ...]") -> list[dict[str, int]]:
    """The profile `corners` with every rule symbol at each of RULE_CORNER_VALUES: where tactics
    must serve a layer too, with the kernels they compile at opt (a tactic that bakes a size a
    shape-tensor value decides into its kernels, or needs it aligned, is refused there, as for an
    input dim; polykit.compiler.builder.tuner.serves_corners). Corners give rule symbols their opt values."""
    ruled = rule_symbols(rules)
    return [{**env, **{s: v for s in ruled}} for v in RULE_CORNER_VALUES for env in corners] if ruled else []

