"""Optimization profiles: min/opt/max shapes of the dynamic inputs a plan serves.

    BuilderConfig(profiles=[Profile({"x": ((1, 3, 32, 32), (4, 3, 64, 64), (8, 3, 128, 128))})])

A build for profiles (TensorRT's model) gives each dynamic input dim a symbol: the ONNX
dim_param when the model names it (inputs sharing a name share the symbol and must agree),
else "input[axis]". Shape inference runs once with SymInt dims at the first profile's opt
shape (what tactics are chosen and timed at), so every tensor's shape becomes an expression
of the symbols; `check_corners` then infers the graph concretely at every profile's min, opt
and max and refuses (BuildError naming the node) a tensor whose expression disagrees.

`ProfileSet` is what a plan records (its "profiles" field): per profile, each symbol's
(min, opt, max); the runtime binds feeds' shapes to symbols through it (`bind_shapes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import Graph, Value
from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.compiler.ops.data_dims import DATA_DIMS, with_data
from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.graph.shape_rules import RuledFloat, ShapeRule, evaluate_rules
from polykit.compiler.ir.symbolic import ShapeEvalError, SymInt, Term, evaluate, expr_from_json, expr_to_json, symbol, \
    term_of
from polykit.errors import BuildError, PolykitError, RuntimeInputError, UsageError

Range = tuple[int, int, int]  # (min, opt, max)
#: graph.metadata key of a control-flow body whose profile the builder derived from the sizes the outer
#: graph may give its inputs (polykit.compiler.builder.bodies.body_profile), not one the user gave
BODY_PROFILE = "body_profile"


@dataclass(frozen=True)
class Profile:
    """min/opt/max shapes by input name: {"x": (min_shape, opt_shape, max_shape)}; `values`:
    min/opt/max values of shape-tensor inputs (1-D int inputs whose values set shapes, e.g.
    a Reshape's target), {"shape": ((1, 16), (8, 128), (8, 512))}."""

    shapes: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict,
                                                                                         hash=False)
    values: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict,
                                                                                         hash=False)
    #: shape-tensor inputs of `values` whose (min, max) is a validity domain, not corners: the shapes
    #: they decide are computed at bind time by their consumers' shape rules (polykit.compiler.graph.shape_rules)
    ruled: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "ruled", tuple(sorted(str(n) for n in self.ruled)))
        for key, what in (("shapes", "shape"), ("values", "value")):
            norm = {str(name): _triple(str(name), triple, what, str(name) in self.ruled)
                    for name, triple in dict(getattr(self, key) or {}).items()}
            object.__setattr__(self, key, dict(sorted(norm.items())))
        stray = sorted(set(self.ruled) - set(self.values))
        if stray:
            raise UsageError(f"the profile rules input {stray[0]!r} but gives it no values",
                             hint="ruled inputs are shape-tensor inputs with values ranges")
        both = sorted(set(self.shapes) & set(self.values))
        if both:
            raise UsageError(f"the profile gives input {both[0]!r} both shapes and values",
                             hint="values are for shape-tensor inputs, whose own shape is static")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {key: {name: [list(s) for s in triple] for name, triple in getattr(self, key).items()}
                             for key in ("shapes", "values")}
        if self.ruled:
            d["ruled"] = list(self.ruled)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Profile":
        return Profile(*({name: tuple(tuple(s) for s in triple) for name, triple in d.get(key, {}).items()}
                         for key in ("shapes", "values")), tuple(d.get("ruled", ())))


def _triple(name: str, triple: Any, what: str, ruled: bool = False) -> tuple[tuple[int, ...], ...]:
    """(min, opt, max) of one input's shape or values, checked: one length, min <= opt <= max."""
    try:
        low, opt, high = (tuple(_number(d, ruled) for d in s) for s in triple)
    except (TypeError, ValueError):
        raise UsageError(f"the profile of input {name!r} is not (min {what}, opt {what}, max {what}): {triple!r}",
                         hint="e.g. Profile({'x': ((1, 3), (4, 3), (8, 3))})") from None
    if not len(low) == len(opt) == len(high):
        raise UsageError(f"the profile of input {name!r} has min/opt/max {what}s of ranks "
                         f"{len(low)}/{len(opt)}/{len(high)}", hint=f"give the three {what}s one length")
    for axis, (a, b, c) in enumerate(zip(low, opt, high)):
        if not (a <= b <= c and (a >= 0 or a == c or ruled)):
            label = "dim" if what == "shape" else "element"
            raise UsageError(f"the profile of input {name!r} has {label} {axis} min {a}, opt {b}, max {c}",
                             hint="each needs 0 <= min <= opt <= max (a fixed value may be negative)"
                             if what == "value" else "each dim needs 0 <= min <= opt <= max")
    if what == "shape" and min(low, default=0) < 0:
        raise UsageError(f"the profile of input {name!r} has a negative dim: {low}", hint="dims are >= 0")
    return (low, opt, high)


def _number(d: Any, ruled: bool) -> "int | float":
    """An element of a profile: an int; a ruled input's (a float shape operand's domain) may be a float."""
    if ruled and isinstance(d, (float, np.floating)):
        return float(d)
    return int(d)


@dataclass(frozen=True)
class ProfileSet:
    """The profiles of a plan as symbol ranges: `ranges[i][symbol] = (min, opt, max)`, and
    where each symbol comes from: `inputs[name]` a symbol name or None per axis of every input,
    `values[name]` one per element of a shape-tensor input: a symbol "value(name)[i]", or the
    int the element is fixed to; `data[symbol]` the bound (an expression of the other symbols)
    of each data-dependent dim (polykit.compiler.ops.data_dims), which corners give their bound."""

    ranges: tuple[dict[str, Range], ...]
    inputs: dict[str, tuple[str | None, ...]]
    values: dict[str, tuple[str | int, ...]] = field(default_factory=dict)
    data: dict[str, Term] = field(default_factory=dict)
    #: value symbols whose range is a domain (Profile.ruled), and the shape rules evaluated at bind time
    ruled: frozenset = frozenset()
    rules: tuple[ShapeRule, ...] = ()
    #: data symbols no expression bounds, which the run sizes (polykit.compiler.ops.data_dims.sized_dim)
    sized: frozenset = frozenset()

    def corners(self) -> list[tuple[int, str, dict[str, int]]]:
        """(profile index, "min"/"opt"/"max", symbol values) of every profile corner (ruled value
        symbols and rule symbols at their opt values)."""
        at_opt = {s: d for r in self.rules for s, d in r.symbols_at_opt().items()}
        return [(i, label, {**with_data({s: r[1 if s in self.ruled else k] for s, r in ranges.items()}, self.data),
                            **at_opt})
                for i, ranges in enumerate(self.ranges) for k, label in enumerate(("min", "opt", "max"))]

    def input_shapes(self, profile: int, name: str, shape: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """(min, opt, max) shapes of input `name` (`shape`: its static dims) in profile `profile`."""
        ranges = self.ranges[profile]
        syms = self.inputs[name]
        return tuple(tuple(ranges[s][k] if s is not None else d for s, d in zip(syms, shape)) for k in range(3))

    def to_json(self) -> dict[str, Any]:
        d = {"ranges": [{s: list(r) for s, r in sorted(p.items())} for p in self.ranges],
             "inputs": {n: list(dims) for n, dims in sorted(self.inputs.items())}}
        if self.values:
            d["values"] = {n: list(syms) for n, syms in sorted(self.values.items())}
        if self.data:
            d["data"] = {s: expr_to_json(b) for s, b in sorted(self.data.items())}
        if self.ruled:
            d["ruled"] = sorted(self.ruled)
        if self.rules:
            d["rules"] = [r.to_json() for r in self.rules]
        if self.sized:
            d["sized"] = sorted(self.sized)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "ProfileSet":
        return ProfileSet(tuple({s: tuple(r) for s, r in p.items()} for p in d["ranges"]),
                          {n: tuple(dims) for n, dims in d["inputs"].items()},
                          {n: tuple(syms) for n, syms in d.get("values", {}).items()},
                          {s: expr_from_json(b) for s, b in d.get("data", {}).items()},
                          frozenset(d.get("ruled", ())), tuple(ShapeRule.from_json(r) for r in d.get("rules", ())),
                          frozenset(d.get("sized", ())))

    @staticmethod
    def static(g: Graph) -> "ProfileSet":
        """The one-profile set of a build without profiles: static inputs, no ranges (data
        symbols are added with `replace(..., data=...)`)."""
        return ProfileSet(({},), {n: (None,) * len(g.value(n).shape or ()) for n in g.inputs})

    def bind_shapes(self, shapes: Mapping[str, Sequence[int]], static: Mapping[str, Sequence[int]],
                    profile: int, values: Mapping[str, Sequence[int]] | None = None) -> dict[str, int]:
        """Symbol values of input `shapes` (all inputs) and of the shape-tensor inputs' `values`,
        checked against profile `profile` and the inputs' static dims; RuntimeInputError naming
        the input, the dim (element) and the range."""
        ranges = self.ranges[profile]
        env: dict[str, int] = {}
        origin: dict[str, str] = {}
        for name, syms in self.values.items():
            given = list((values or {}).get(name, ()))
            if len(given) != len(syms):
                raise RuntimeInputError(f"shape-tensor input {name!r} needs {len(syms)} host values, got {len(given)}",
                                        where=f"tensor {name!r}", hint="feed it (execute) or set_input_values(name, ...)")
            for i, (got, sym) in enumerate(zip(given, syms)):
                if not isinstance(sym, str):
                    if got != sym:
                        raise RuntimeInputError(f"shape-tensor input {name!r} has element {i} = {got}; the plan was "
                                                f"built for {sym} there", where=f"tensor {name!r}")
                else:
                    env[sym] = _in_range(ranges[sym], got, profile, f"shape-tensor input {name!r} has element {i}",
                                         name, "values", "--trt-min-shape-values/--trt-max-shape-values")
        for name in shapes:  # in the caller's (the engine's input) order
            dims, shape = self.inputs[name], tuple(shapes[name])
            want = static[name]
            if len(shape) != len(dims):
                raise RuntimeInputError(f"input {name!r} has shape {shape} of rank {len(shape)}, the engine's "
                                        f"input has rank {len(dims)}", where=f"tensor {name!r}")
            for axis, (got, sym) in enumerate(zip(shape, dims)):
                if sym is None:
                    if got != want[axis]:
                        raise RuntimeInputError(f"input {name!r} has dim {axis} = {got}; the engine's input has "
                                                f"static dim {want[axis]} there", where=f"tensor {name!r}",
                                                hint=f"feed shape {tuple(want)} with dim {axis} = {want[axis]}")
                    continue
                _in_range(ranges[sym], got, profile, f"input {name!r} has dim {axis}", name, "a shape",
                          "--trt-min-shapes/--trt-max-shapes")
                if sym in env and env[sym] != got:
                    raise RuntimeInputError(f"input {name!r} has dim {axis} = {got}, but {origin[sym]} gives "
                                            f"{env[sym]} for the same model dim {sym!r}", where=f"tensor {name!r}",
                                            hint="the model says these dims are equal; feed equal sizes")
                env[sym] = got
                origin[sym] = f"input {name!r}"
        return env


def _in_range(r: Range, got: int, profile: int, what: str, name: str, feed: str, flags: str) -> int:
    """`got` when it lies in range `r` of optimization profile `profile`; else a RuntimeInputError."""
    if not r[0] <= got <= r[2]:
        raise RuntimeInputError(f"{what} = {got}, outside optimization profile {profile}'s range [{r[0]}, {r[2]}]",
                                where=f"tensor {name!r}", hint=f"feed {feed} inside the profile, pick another "
                                                               f"profile, or rebuild with a wider {flags}")
    return got


def profile_set(g: Graph, profiles: Sequence[Profile], fixed: Mapping[str, tuple[int, ...]]) -> ProfileSet:
    """The ProfileSet of `profiles` for graph `g`, validated against its inputs; `fixed`
    (BuilderConfig.input_shapes) pins inputs a profile leaves out."""
    where = f"graph {g.name!r}"
    per_input: dict[str, list[tuple[tuple[int, ...], ...]]] = {}
    for i, prof in enumerate(profiles):
        for name in list(prof.shapes) + list(prof.values):
            if name not in g.inputs:
                raise BuildError(f"profile {i} names {name!r}, which is not a graph input", where=where,
                                 hint=f"graph inputs are: {', '.join(g.inputs)}")
    for name in g.inputs:
        model = g.value(name).shape
        for i, prof in enumerate(profiles):
            triple = prof.shapes.get(name)
            if triple is None:
                if name in fixed:
                    triple = (tuple(fixed[name]),) * 3
                elif model is not None and all(isinstance(d, int) for d in model):
                    triple = (tuple(model),) * 3
                else:
                    raise BuildError(f"profile {i} gives no shapes for dynamic input {name!r} {_fmt(model)}",
                                     where=where, hint=f"pass --trt-min-shapes/--trt-opt-shapes/--trt-max-shapes "
                                                       f"{name}:[...] (or --input-shapes {name}:[...] to pin it)")
            _check_against_model(name, model, triple, i, where)
            per_input.setdefault(name, []).append(triple)
    ranges: list[dict[str, Range]] = [{} for _ in profiles]
    value_syms = _value_symbols(g, profiles, ranges)
    ruled = frozenset(s for p in profiles for n in p.ruled for s in value_syms[n] if isinstance(s, str))
    inputs: dict[str, tuple[str | None, ...]] = {}
    for name, triples in per_input.items():
        model = g.value(name).shape
        syms: list[str | None] = []
        for axis in range(len(triples[0][0])):
            values = {(t[0][axis], t[1][axis], t[2][axis]) for t in triples}
            if len(values) == 1 and len({*next(iter(values))}) == 1:
                syms.append(None)
                continue
            dim = model[axis] if model is not None else None
            sym = dim if isinstance(dim, str) and dim else f"{name}[{axis}]"
            for i, t in enumerate(triples):
                r = (t[0][axis], t[1][axis], t[2][axis])
                if ranges[i].setdefault(sym, r) != r:
                    who = "the outer graph gives body" if g.metadata.get(BODY_PROFILE) else f"profile {i} gives"
                    raise BuildError(f"{who} input {name!r} dim {axis} the range {r}, but another input "
                                     f"with the same model dim {sym!r} has {ranges[i][sym]}", where=where,
                                     hint="give dims that the model names alike the same min/opt/max")
            syms.append(sym)
        inputs[name] = tuple(syms)
    return ProfileSet(tuple(ranges), inputs, value_syms, ruled=ruled)


def _value_symbols(g: Graph, profiles: Sequence[Profile], ranges: list[dict[str, Range]]) -> dict[str, tuple]:
    """Per shape-tensor input of `profiles`: a symbol per element whose value varies (its
    ranges added to `ranges`), else the element's fixed value."""
    where = f"graph {g.name!r}"
    out: dict[str, tuple] = {}
    for name in sorted({n for p in profiles for n in p.values}):
        v = g.value(name)
        # a float shape operand (Resize's scales) takes a domain only: ruled in every profile
        floats = v.dtype is not None and is_float(v.dtype) \
            and all(name in p.ruled for p in profiles if name in p.values)
        if name not in g.inputs or v.dtype is None or not (np.dtype(v.dtype).kind in "iu" or floats) \
                or not v.is_static or len(v.shape) > 1:
            raise BuildError(f"profile values are given for {name!r}, which is not a static 1-D integer graph input",
                             where=where, hint="--trt-min-shape-values/--trt-max-shape-values are for shape-tensor "
                                               "inputs (e.g. a Reshape's target fed as an input)")
        cast = float if floats else int
        count = math.prod(v.shape)
        triples = []
        for i, prof in enumerate(profiles):
            triple = prof.values.get(name)
            if triple is None or len(triple[0]) != count:
                raise BuildError(f"profile {i} gives {'no' if triple is None else len(triple[0])} values for "
                                 f"shape-tensor input {name!r}, which holds {count}", where=where,
                                 hint=f"give every profile {count} min/opt/max values for {name!r}")
            triples.append(triple)
        syms: list[str | int] = []
        for k in range(count):
            per = [(cast(t[0][k]), cast(t[1][k]), cast(t[2][k])) for t in triples]
            if len(set(per)) == 1 and len(set(per[0])) == 1:
                syms.append(per[0][0])
                continue
            sym = f"value({name})[{k}]"
            for i, r in enumerate(per):
                ranges[i][sym] = r
            syms.append(sym)
        out[name] = tuple(syms)
    return out


def _check_against_model(name: str, model: Any, triple: tuple, index: int, where: str) -> None:
    if model is None:
        return
    if len(model) != len(triple[0]):
        raise BuildError(f"profile {index} gives input {name!r} rank {len(triple[0])}; the model's input has rank "
                         f"{len(model)} {_fmt(model)}", where=where, hint="give shapes of the input's rank")
    for axis, dim in enumerate(model):
        if isinstance(dim, int) and any(s[axis] != dim for s in triple):
            raise BuildError(f"profile {index} gives input {name!r} dim {axis} the range "
                             f"{[s[axis] for s in triple]}; the model fixes that dim to {dim}", where=where,
                             hint=f"use {dim} for dim {axis} in min, opt and max")


def apply_profiles(g: Graph, profiles: ProfileSet, given: Sequence[Profile],
                   fixed: Mapping[str, tuple[int, ...]]) -> None:
    """Give the inputs their shapes at profile 0's opt (SymInts for dynamic dims; a model dim that
    every profile keeps at one value is that value) and the shape-tensor inputs their values
    (SymInts for varying elements; graph.metadata["input_values"])."""
    env = profiles.corners()[1][2]
    for name, syms in profiles.inputs.items():
        old = g.value(name)
        static = _static_shape(g, name, given, fixed)
        dims = tuple(SymInt(env[s], symbol(s)) if s is not None else static[axis] for axis, s in enumerate(syms))
        g.set_value(Value(name, old.dtype, dims))
    for name, syms in profiles.values.items():
        num = RuledFloat if is_float(g.value(name).dtype) else SymInt
        value = np.empty(len(syms), dtype=object)
        value[:] = [num(env[s], symbol(s)) if isinstance(s, str) else s for s in syms]
        g.metadata.setdefault("input_values", {})[name] = value.reshape(g.value(name).shape)


def _static_shape(g: Graph, name: str, given: Sequence[Profile], fixed: Mapping[str, tuple[int, ...]]) -> tuple:
    """The input's dims where they are static: the first profile's min shape (a dim no profile
    moves has that value in every one), else input_shapes' or the model's static shape (profile_set
    checked that one of them holds)."""
    triple = given[0].shapes.get(name) if given else None
    if triple is not None:
        return tuple(triple[0])
    if name in fixed:
        return tuple(fixed[name])
    model = g.value(name).shape
    return tuple(d if isinstance(d, int) else 0 for d in model) if model is not None else ()


def corner_shapes(g: Graph, profiles: ProfileSet, env: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Concrete input shapes of graph `g` (inputs with SymInt dims) at symbol values `env`."""
    return {name: tuple(evaluate(term_of(d), env) for d in g.value(name).shape) for name in profiles.inputs}


def check_corners(original: Graph, symbolic: Graph, profiles: ProfileSet, values: Mapping[str, Any],
                  host: Mapping[str, Any] | None = None) -> None:
    """Infer `original` concretely at every profile corner; BuildError naming the node whose
    output's shape expression (in `symbolic`) disagrees there, or that fails there; and so for
    the shape tensors `host` (symbolic values) whose value expressions disagree."""
    from polykit.compiler.graph.infer import infer_shapes

    producers = symbolic.producers()
    # in node order: the first disagreement is the node that decided a dim, not one of its consumers
    ordered = list(dict.fromkeys([o for node in symbolic.nodes for o in node.outputs if o]
                                 + list(symbolic.values) + list(host or {})))
    for index, label, env in profiles.corners():
        g = original.copy()
        g.metadata[DATA_DIMS] = bool(profiles.data)
        for name, shape in corner_shapes(symbolic, profiles, env).items():
            g.set_value(Value(name, symbolic.value(name).dtype, shape))
        if values:
            g.metadata["input_values"] = {name: value_at(v, env, symbolic.value(name).dtype)
                                          for name, v in values.items()}
        at = f"at profile {index}'s {label} shape ({_fmt_env(env)})" if not original.metadata.get(BODY_PROFILE) \
            else f"when the body's inputs have the sizes the outer graph may give them ({_fmt_env(env)})"
        try:
            env = evaluate_rules(profiles.rules, env)  # the rule symbols this corner's dims give
            known = infer_shapes(g)
        except PolykitError as exc:
            raise BuildError(f"{exc.what} {at}", where=exc.where,
                             hint="the model does not hold for every shape in the profile; narrow the profile"
                             ) from None
        for name in ordered:  # a shape tensor's value before its consumers' shapes: it decided them
            if name in (host or {}):
                want_value = [evaluate(term_of(v), env) for v in host[name].ravel()]
                got_value = known.get(name)
                if got_value is not None and [int(v) for v in got_value.ravel()] != want_value:
                    raise _disagreement(symbolic, producers, name,
                                        f"holds {[int(v) for v in got_value.ravel()]} {at}, but its expressions "
                                        f"{[str(term_of(v)) for v in host[name].ravel()]} give {want_value}",
                                        "shape tensor")
            sym_value, got = symbolic.values.get(name), g.values.get(name)
            if sym_value is None or sym_value.shape is None or got is None or got.shape is None \
                    or name in symbolic.inputs:
                continue
            exprs = tuple(term_of(d) if isinstance(d, int) else d for d in sym_value.shape)
            want = tuple(evaluate(d, env) if not isinstance(d, str) and d is not None else d for d in exprs)
            if len(got.shape) != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                                  for a, b in zip(got.shape, want)):
                raise _disagreement(symbolic, producers, name, f"has shape {_fmt(got.shape)} {at}, but its expression "
                                                             f"{_fmt(exprs)} gives {_fmt(want)}")


def _disagreement(symbolic: Graph, producers: Mapping[str, Any], name: str, what: str,
                  kind: str = "tensor") -> BuildError:
    node = producers.get(name)
    return BuildError(f"{kind} {name!r} {what}", where=node.describe() if node else f"graph {symbolic.name!r}",
                      hint="the node's output depends on the input dims in a way polykit cannot express (or decided "
                           "at the opt shape); pin those dims or narrow the profile")


def corner_size(name: str, dims: tuple, env: Mapping[str, int]) -> int:
    """Elements of a tensor with dim expressions `dims` at symbol values `env` (BuildError if none)."""
    try:
        shape = [evaluate(d, env) for d in dims]
    except ShapeEvalError as exc:
        raise BuildError(f"the shape of tensor {name!r} cannot be evaluated at a profile corner: {exc}") from None
    if min(shape, default=0) < 0:
        raise BuildError(f"tensor {name!r} has shape {shape} at a profile corner ({_fmt_env(env)})",
                         hint="the profile reaches dims the model cannot take; narrow it")
    return math.prod(shape)


def generic_corners(corners: Sequence[Mapping[str, int]]) -> list[dict[str, int]]:
    """The corners with each symbol of 1 raised to 2 where its range reaches 2 (polykit.compiler.builder.tuner.serves_corners)."""
    high = {s: max(env[s] for env in corners) for s in (corners[0] if corners else {})}
    return [{s: max(v, min(2, high[s])) for s, v in env.items()} for env in corners]


def at_corner(layer: LayerDesc, corner: Mapping[str, TensorDesc]) -> LayerDesc:
    """`layer` stamped with the shapes of its dynamic tensors at one profile corner."""
    def shapes(names, stamped):
        return tuple(corner[n].shape if n in corner else s for n, s in zip(names, stamped))
    return replace(layer, in_shapes=shapes(layer.inputs, layer.in_shapes),
                   out_shapes=shapes(layer.outputs, layer.out_shapes))


def tensors_at(tensors: Mapping[str, TensorDesc], env: Mapping[str, int]) -> dict[str, TensorDesc]:
    """The dynamic tensors of `tensors` with their shapes at symbol values `env`."""
    return {n: replace(t, shape=tuple(evaluate(d, env) for d in t.dims)) for n, t in tensors.items() if t.dims}


def value_at(value: np.ndarray, env: Mapping[str, int], dtype: Any = None) -> np.ndarray:
    """A (possibly symbolic) array with its SymInts evaluated at symbol values `env` (as int64
    unless `dtype`); a RuledFloat takes its symbol's value."""
    if value.dtype != object:
        return value
    return np.asarray([env[v.expr.args[0]] if isinstance(v, RuledFloat) else evaluate(term_of(v), env)
                       for v in value.ravel()], dtype=np.dtype(dtype) if dtype is not None else np.int64
                      ).reshape(value.shape)


def _fmt(shape: Any) -> str:
    return "None" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"


def _fmt_env(env: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
