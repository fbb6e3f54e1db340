"""The plan check of dynamic shapes: optimization profiles and tensors' dim expressions.

One rule of plan_check's RULES: a plan's "profiles" field (ProfileSet's JSON form) names
every engine input and gives each symbol min <= opt <= max in every profile; an input's
dynamic dims are exactly its symbols; every tensor's "dims" are expressions of those symbols
(polykit.compiler.ir.symbolic) that give the tensor's `shape` at the first profile's opt, and its
`nbytes` is the largest size they give at any profile corner (what the arena reserves).
"""

from __future__ import annotations

from typing import Any, Mapping

from polykit.compiler.plan.schema import MAX_BYTES, Field, Invalid, integer, list_of, map_of, nbytes_of, nullable, \
    record, text
from polykit.compiler.ops.data_dims import bound_order, with_data
from polykit.compiler.graph.shape_rules import ShapeRule
from polykit.compiler.ir.symbolic import ShapeEvalError, Term, evaluate, expr_from_json, remainder_size

Doc = Mapping[str, Any]
#: dtypes of float shape-tensor inputs (ruled: Resize's scales, OneHot's depth, Range's operands)
FLOAT_VALUES = ("float16", "bfloat16", "float32", "float64")


def _number(value: Any, path: str) -> None:
    """An int, or a finite float (an element of a float shape-tensor input's domain)."""
    if type(value) is float:
        if not abs(value) <= MAX_BYTES:
            raise Invalid(path, f"{value} is not a number in [-{MAX_BYTES}, {MAX_BYTES}]")
        return
    integer(-MAX_BYTES, MAX_BYTES)(value, path)


def _triple(value: Any, path: str) -> None:
    list_of(_number, max_len=3)(value, path)  # a ruled value range may be negative
    if len(value) != 3 or not value[0] <= value[1] <= value[2]:
        raise Invalid(path, f"{value} is not [min, opt, max] with min <= opt <= max")


def _symbol_or_int(value: Any, path: str) -> None:
    if type(value) is not str:
        _number(value, path)


def _expr(value: Any, path: str) -> None:
    try:
        expr_from_json(value)
    except ValueError as exc:
        raise Invalid(path, str(exc)) from None


def _rule(value: Any, path: str) -> None:
    try:
        ShapeRule.from_json(value)
    except (ValueError, TypeError, KeyError) as exc:
        raise Invalid(path, f"is no shape rule record: {type(exc).__name__}: {exc}") from None


PROFILE_FIELDS = (
    Field("ranges", list_of(map_of(_triple), max_len=1 << 10)),
    Field("inputs", map_of(list_of(nullable(text())))),
    Field("values", map_of(list_of(_symbol_or_int)), required=False),
    Field("data", map_of(_expr), required=False),
    Field("ruled", list_of(text()), required=False),
    Field("rules", list_of(_rule, max_len=1 << 12), required=False),
    Field("sized", list_of(text()), required=False),
)


def check_dims(doc: Doc, weights_len: int) -> None:
    """Invalid naming the first profile or dims field that does not hold."""
    profiles = doc.get("profiles")
    tensors = doc["tensors"]
    if profiles is None:
        for name, t in tensors.items():
            for key in ("dims", "value"):
                if key in t:
                    raise Invalid(f"tensors[{name!r}].{key}", "a plan without profiles has no dynamic dims")
        return
    symbols = _check_profiles(doc, profiles)
    ruled = set(profiles.get("ruled", ()))
    if not ruled <= symbols:
        raise Invalid("profiles.ruled", f"names {sorted(ruled - symbols)[0]!r}, which is no value symbol")
    corners = [{s: r[1 if s in ruled else k] for s, r in p.items()} for p in profiles["ranges"] for k in range(3)]
    data = _check_data(profiles.get("data", {}), symbols, corners)
    stray = sorted(set(profiles.get("sized", ())) - set(data))
    if stray:
        raise Invalid("profiles.sized", f"names {stray[0]!r}, which is no data symbol")
    corners = [with_data(env, data) for env in corners]
    ordered = {s: data[s] for s in bound_order(data)}
    symbols |= set(data)
    rules = _check_rules(profiles.get("rules", ()), symbols)
    at_opt = {s: d for r in rules for s, d in r.symbols_at_opt().items()}
    corners = [{**env, **at_opt} for env in corners]
    symbols |= set(at_opt)
    for name, t in tensors.items():
        if "dims" in t:
            _check_tensor(name, t, symbols, corners, ordered)
        if "value" in t:
            _check_value(name, t, symbols, corners, doc["inputs"])


def _check_profiles(doc: Doc, profiles: Doc) -> set[str]:
    inputs = profiles["inputs"]
    if not profiles["ranges"]:
        raise Invalid("profiles.ranges", "is empty: a plan with profiles has at least one")
    if sorted(inputs) != sorted(doc["inputs"]):
        raise Invalid("profiles.inputs", f"names {sorted(inputs)}, the engine inputs are {sorted(doc['inputs'])}")
    symbols = {s for dims in inputs.values() for s in dims if s is not None}
    ruled = set(profiles.get("ruled", ()))
    for name, syms in profiles.get("values", {}).items():
        t = doc["tensors"].get(name)
        # a float input's elements are ruled symbols (domains for the shape rules that read them)
        floats = t is not None and t["dtype"] in FLOAT_VALUES and all(s in ruled for s in syms if type(s) is str)
        if name not in doc["inputs"] or t is None or t["dtype"] not in ("int64", "int32") and not floats \
                or "dims" in t or len(syms) != nbytes_of(t["dtype"], t["shape"]) // nbytes_of(t["dtype"], []):
            raise Invalid(f"profiles.values[{name!r}]", "names no static integer engine input of that many elements "
                                                        "(nor a float one whose elements are all ruled)")
        if not floats and any(type(s) is float for s in syms):
            raise Invalid(f"profiles.values[{name!r}]", "fixes an integer input's element to a float")
        symbols |= {s for s in syms if type(s) is str}
    for i, ranges in enumerate(profiles["ranges"]):
        if set(ranges) != symbols:
            raise Invalid(f"profiles.ranges[{i}]", f"gives ranges for {sorted(ranges)}, the inputs' symbols are "
                                                   f"{sorted(symbols)}")
    for name, syms in inputs.items():
        t = doc["tensors"].get(name)
        if t is None:
            raise Invalid(f"profiles.inputs[{name!r}]", "names an engine input that has no tensor record")
        path = f"tensors[{name!r}].dims"
        want = [s if s is not None else d for s, d in zip(syms, t["shape"])]
        if len(syms) != len(t["shape"]):
            raise Invalid(f"profiles.inputs[{name!r}]", f"has {len(syms)} dims, the input has rank {len(t['shape'])}")
        if any(s is not None for s in syms) and t.get("dims") != want:
            raise Invalid(path, f"{t.get('dims')} differs from the input's symbols {want}")
    return symbols


def _check_data(data: Doc, symbols: set[str], corners: list[dict[str, int]]) -> dict[str, Term]:
    """The data symbols' bounds: expressions of the input symbols and of other data symbols (a
    nested size) in no cycle, non-negative at every corner."""
    out: dict[str, Term] = {}
    for name, bound in data.items():
        path = f"profiles.data[{name!r}]"
        if not name.startswith("data(") or name in symbols:
            raise Invalid(path, "a data symbol is named data(tensor)[axis] and is no input symbol")
        try:
            out[name] = expr_from_json(bound, symbols | set(data))
        except ValueError as exc:
            raise Invalid(path, str(exc)) from None
    try:
        order = bound_order(out)
    except ShapeEvalError as exc:
        raise Invalid("profiles.data", str(exc)) from None
    for env in corners:
        env = dict(env)
        for name in order:
            try:
                env[name] = evaluate(out[name], env)
            except ShapeEvalError as exc:
                raise Invalid(f"profiles.data[{name!r}]", str(exc)) from None
            if env[name] < 0:
                raise Invalid(f"profiles.data[{name!r}]", f"bound {data[name]} is negative at a profile corner")
    return out


def _check_rules(rules: Any, symbols: set[str]) -> list[ShapeRule]:
    """The shape rules, in order: each names only input symbols and earlier rules' symbols."""
    out: list[ShapeRule] = []
    known = set(symbols)
    for i, d in enumerate(rules):
        try:
            rule = ShapeRule.from_json(d, known)
        except ValueError as exc:
            raise Invalid(f"profiles.rules[{i}]", str(exc)) from None
        fresh = set(rule.symbols_at_opt())
        if fresh & known:
            raise Invalid(f"profiles.rules[{i}]", f"defines {sorted(fresh & known)[0]!r} again")
        known |= fresh
        out.append(rule)
    return out


def host_written(doc: Doc) -> set[str]:
    """Tensors the engine writes before the launches: the inputs and the shape tensors with a value."""
    return set(doc["inputs"]) | {n for n, t in doc["tensors"].items() if "value" in t}


def _check_value(name: str, t: Doc, symbols: set[str], corners: list[dict[str, int]], inputs: list) -> None:
    path = f"tensors[{name!r}].value"
    if t["kind"] == "weight" or name in inputs or "dims" in t:
        raise Invalid(path, "only a statically shaped activation or output has a value computed from the dims")
    if t["dtype"] not in ("int64", "int32"):
        raise Invalid(path, f"a {t['dtype']} tensor holds no dims")
    if type(t["value"]) is not list or len(t["value"]) != nbytes_of(t["dtype"], t["shape"]) // nbytes_of(t["dtype"], []):
        raise Invalid(path, f"must be a list of one expression per element of shape {t['shape']}")
    try:
        value = [expr_from_json(v, symbols) for v in t["value"]]
        for env in corners:
            for v in value:
                evaluate(v, env)
    except (ValueError, ShapeEvalError) as exc:
        raise Invalid(path, str(exc)) from None


def _check_tensor(name: str, t: Doc, symbols: set[str], corners: list[dict[str, int]],
                  data: Mapping[str, Term]) -> None:
    path = f"tensors[{name!r}].dims"
    if t["kind"] == "weight":
        raise Invalid(path, "a weight has static dims")
    if type(t["dims"]) is not list or len(t["dims"]) != len(t["shape"]):
        raise Invalid(path, f"must be a list of one expression per dim of shape {t['shape']}")
    try:
        dims = [expr_from_json(d, symbols) for d in t["dims"]]
    except ValueError as exc:
        raise Invalid(path, str(exc)) from None
    largest = 0
    for k, env in enumerate(corners):
        try:
            shape = [evaluate(d, env) for d in dims]
        except ShapeEvalError as exc:
            raise Invalid(path, f"cannot be evaluated at a profile corner: {exc}") from None
        if min(shape, default=0) < 0:
            raise Invalid(path, f"gives the negative shape {shape} at a profile corner")
        if k == 1 and shape != t["shape"]:
            raise Invalid(path, f"gives {shape} at the first profile's opt, the tensor's shape is {t['shape']}")
        largest = max(largest, nbytes_of(t["dtype"], shape))
    largest = max(largest, nbytes_of(t["dtype"], [remainder_size(dims, corners, data)]))
    if t["nbytes"] != largest:
        raise Invalid(f"tensors[{name!r}].nbytes", f"{t['nbytes']} != {largest}, its largest size at a profile corner "
                                                   f"(or the bound of its dims that are not monotone)")
