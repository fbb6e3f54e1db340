"""Symbolic dims: shapes as small expressions of the engine's input dims.

A plan built for optimization profiles keeps every dynamic dim as an expression of the
input dims (sums, products, floor and ceiling divisions, remainders, min/max of symbols and
constants), evaluated on the host for each set of input shapes at run time. Dims a model computes
through float arithmetic (`floor(h * (320 / min(h, w)))` in float32) keep those float ops
(FLOAT_OPS), each rounded to its float type at every step as the graph states it (and onnxruntime
computes it), not an exact fraction.

During a build a dynamic dim is a `SymInt`: an int whose value is the dim at the profile's
opt shape (what tactics are chosen and timed at) and which carries its `expr`. Every shape
rule keeps working on it unchanged (SymInt passes `isinstance(d, int)` and its arithmetic
builds the expression as it computes the opt value); what a rule decides by comparing dims
is decided at opt, so the builder re-infers the graph concretely at the profile's corners
and refuses a tensor whose expression disagrees there (polykit.compiler.plan.profiles).

`Expr` nodes are (op, args) records; `expr_to_json` / `expr_from_json` are their plan form:
an int, a symbol name, or [op, arg, ...] with op one of OPS. Loading validates the form.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

#: bound of constants in an expression and of the values it evaluates to (plan_schema.MAX_BYTES)
MAX_VALUE = 1 << 48
#: deepest expression a plan may hold
MAX_DEPTH = 64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: op -> (fewest args, evaluation of the arg values); "+"/"*"/"min"/"max" take two or more
OPS: dict[str, tuple[int, Callable[..., int]]] = {
    "+": (2, lambda *a: sum(a)),
    "*": (2, lambda *a: math.prod(a)),
    "//": (2, lambda a, b: a // b),
    "cdiv": (2, _cdiv),
    "%": (2, lambda a, b: a % b),
    "min": (2, lambda *a: min(a)),
    "max": (2, lambda *a: max(a)),
}
_BINARY = {"//", "cdiv", "%"}

#: float types of float expressions: the cast op that makes one -> its numpy type
FLOAT_TYPES: dict[str, type] = {"f32": np.float32, "f64": np.float64}


def _finite(value: Any) -> Any:
    if not math.isfinite(value):
        raise ShapeEvalError(f"a float dim computation gives {value}")
    return value


def _fdiv(a: Any, b: Any) -> Any:
    if b == 0:
        raise ShapeEvalError("float division by zero in a dim computation")
    with np.errstate(over="ignore", under="ignore"):
        return _finite(a / b)


def _to_int(fn: Callable[[float], int]) -> Callable[[Any], int]:
    return lambda a: fn(float(_finite(a)))


#: float arithmetic over dims (dim_floats): a cast of an int (or of a float literal, or of another float type)
#: to a float type, binary ops whose numpy scalars round to their operands' type at each step, and the ops
#: back to ints (floor, ceil, trunc: a Cast to an integer type); the float ops take exactly their arity
FLOAT_OPS: dict[str, tuple[int, Callable[..., Any]]] = {
    **{name: (1, lambda a, t=t: t(a)) for name, t in FLOAT_TYPES.items()},
    "f+": (2, lambda a, b: _finite(a + b)),
    "f-": (2, lambda a, b: _finite(a - b)),
    "f*": (2, lambda a, b: _finite(a * b)),
    "f/": (2, _fdiv),
    "fmin": (2, lambda a, b: min(a, b)),
    "fmax": (2, lambda a, b: max(a, b)),
    "floor": (1, _to_int(math.floor)),
    "ceil": (1, _to_int(math.ceil)),
    "trunc": (1, _to_int(math.trunc)),
}
OPS.update(FLOAT_OPS)
#: ops whose value is a float (the others give ints)
FLOAT_VALUED = frozenset(FLOAT_OPS) - {"floor", "ceil", "trunc"}

Term = Union[int, "Expr"]


class ShapeEvalError(ValueError):
    """An expression cannot be evaluated (unbound symbol, division by zero, bound exceeded)."""


@dataclass(frozen=True)
class Expr:
    """One expression node: op "sym" with args (name,), or an op of OPS over Terms."""

    op: str
    args: tuple

    def __str__(self) -> str:
        if self.op == "sym":
            return self.args[0]
        if self.op in ("+", "*"):
            return "(" + self.op.join(_text(a) for a in self.args) + ")"
        if self.op in ("//", "%", "f+", "f-", "f*", "f/"):
            return f"({_text(self.args[0])}{self.op}{_text(self.args[1])})"
        return f"{self.op}({', '.join(_text(a) for a in self.args)})"

    def symbols(self) -> set[str]:
        if self.op == "sym":
            return {self.args[0]}
        return set().union(*(a.symbols() for a in self.args if isinstance(a, Expr)))


def _text(term: Term) -> str:
    return str(term)


def symbol(name: str) -> Expr:
    return Expr("sym", (str(name),))


def _key(term: Term) -> str:
    return json.dumps(expr_to_json(term))


def _flatten(op: str, terms: tuple[Term, ...]) -> list[Term]:
    out: list[Term] = []
    for t in terms:
        out.extend(t.args if isinstance(t, Expr) and t.op == op else [t])
    return out


def add(*terms: Term) -> Term:
    const, rest = 0, []
    for t in _flatten("+", terms):
        if isinstance(t, Expr):
            rest.append(t)
        else:
            const += int(t)
    if not rest:
        return const
    rest = _like_terms(rest)
    if not rest:
        return const
    rest.sort(key=_key)
    args = tuple(rest) + ((const,) if const else ())
    return args[0] if len(args) == 1 else Expr("+", args)


def _like_terms(terms: list[Expr]) -> list[Term]:
    """Terms of a sum with those equal up to a constant factor combined (`-1*x + x + y` is `y`: a
    Pad's output `h + (ceil(h / 32) * 32 - h)` is the padded size, whose bounds then hold)."""
    groups: dict[str, list] = {}
    for t in terms:
        coef, part = 1, t
        if t.op == "*" and not isinstance(t.args[0], Expr):
            coef, part = int(t.args[0]), (t.args[1] if len(t.args) == 2 else Expr("*", t.args[1:]))
        group = groups.setdefault(_key(part), [0, part])
        group[0] += coef
    if len(groups) == len(terms):
        return list(terms)
    out = [mul(coef, part) for coef, part in groups.values() if coef]
    return [t for t in out if isinstance(t, Expr)]


def mul(*terms: Term) -> Term:
    const, rest = 1, []
    for t in _flatten("*", terms):
        if isinstance(t, Expr):
            rest.append(t)
        else:
            const *= int(t)
    if not rest or const == 0:
        return const
    rest.sort(key=_key)
    args = ((const,) if const != 1 else ()) + tuple(rest)
    if len(args) == 1:
        return args[0]
    if const != 1 and len(rest) == 1 and isinstance(rest[0], Expr) and rest[0].op == "+":
        return add(*(mul(const, t) for t in rest[0].args))  # distribute a constant over a sum
    return Expr("*", args)


def _factors(term: Term) -> list[Term]:
    if isinstance(term, Expr) and term.op == "*":
        return list(term.args)
    return [term]


def _cancel(a: Term, b: Term) -> tuple[Term, Term]:
    """a / b with common factors removed (exact integer constants divided out)."""
    num, den = _factors(a), _factors(b)
    for f in list(den):
        if isinstance(f, Expr) and f in num:
            num.remove(f)
            den.remove(f)
    n_const = math.prod(int(f) for f in num if not isinstance(f, Expr))
    d_const = math.prod(int(f) for f in den if not isinstance(f, Expr))
    g = math.gcd(n_const, d_const) or 1
    if d_const < 0:
        g = -g
    num = [n_const // g] + [f for f in num if isinstance(f, Expr)]
    den = [d_const // g] + [f for f in den if isinstance(f, Expr)]
    return mul(*num), mul(*den)


def _multiple(a: Term, b: Term) -> "int | None":
    """c when sum `a` is c times sum `b` (their constant terms' ratio, checked on every term)."""
    if not (isinstance(a, Expr) and isinstance(b, Expr) and a.op == b.op == "+"):
        return None
    ca, cb = a.args[-1], b.args[-1]
    if isinstance(ca, Expr) or isinstance(cb, Expr) or int(ca) % int(cb):
        return None
    c = int(ca) // int(cb)
    return c if add(a, mul(-c, b)) == 0 else None


def divide(op: str, a: Term, b: Term) -> Term:
    """a // b, ceil(a / b) or a % b, simplified where the divisor cancels."""
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return OPS[op][1](int(a), int(b))
    multiple = _multiple(a, b)
    if multiple is not None:  # (15*x + 15) // (x + 1), a Reshape's -1 over a sum: 15
        return 0 if op == "%" else multiple
    if op == "%":
        num, den = _cancel(a, b)
        return 0 if den == 1 else Expr("%", (a, b))
    num, den = _cancel(a, b)
    if den == 1:
        return num
    return Expr(op, (num, den))


def extreme(op: str, *terms: Term) -> Term:
    consts = [int(t) for t in terms if not isinstance(t, Expr)]
    rest = sorted(dict.fromkeys(t for t in terms if isinstance(t, Expr)), key=_key)
    if not rest:
        return OPS[op][1](*consts)
    args = tuple(rest) + ((OPS[op][1](*consts),) if consts else ())
    return args[0] if len(args) == 1 else Expr(op, args)


def evaluate(term: Term, dims: Mapping[str, int], memo: "dict[int, Any] | None" = None) -> int:
    """The value of `term` for symbol values `dims`; ShapeEvalError when it has none. A float
    expression's value is a numpy scalar of its float type (FLOAT_OPS). `memo` (one dict for one
    `dims`, by node identity) evaluates a subexpression many dims share once: a plan loaded with
    `expr_from_json(..., shared=...)` shares equal subexpressions (a detector's float scale)."""
    if not isinstance(term, Expr):
        return term if type(term) is float else int(term)
    if term.op == "sym":
        try:
            return int(dims[term.args[0]])
        except KeyError:
            raise ShapeEvalError(f"symbol {term.args[0]!r} is not bound") from None
    if memo is not None:
        known = memo.get(id(term))
        if known is not None:
            return known
    values = [evaluate(a, dims, memo) for a in term.args]
    if term.op in _BINARY and values[1] == 0:
        raise ShapeEvalError(f"division by zero in {term}")
    value = OPS[term.op][1](*values)
    if abs(value) > MAX_VALUE:
        raise ShapeEvalError(f"{term} = {value} is beyond {MAX_VALUE}")
    if memo is not None:
        memo[id(term)] = value
    return value


def uses(term: Term, op: str) -> bool:
    """Whether `term` applies `op` anywhere."""
    return isinstance(term, Expr) and (term.op == op or any(uses(a, op) for a in term.args))


def bounds(term: Term, ranges: Mapping[str, tuple[int, int]]) -> "tuple[int, int] | None":
    """[low, high] of `term` with each symbol anywhere in its (low, high) range (interval
    arithmetic: safe, not always tight); None when a symbol has no range or a division's
    divisor range holds 0 or negatives."""
    if not isinstance(term, Expr):
        return (term, term) if type(term) is float else (int(term), int(term))
    if term.op == "sym":
        return tuple(ranges[term.args[0]]) if term.args[0] in ranges else None  # type: ignore[return-value]
    args = [bounds(a, ranges) for a in term.args]
    if any(a is None for a in args):
        return None
    if term.op in FLOAT_OPS:
        return _float_bounds(term.op, args)
    if term.op == "+":
        return sum(a[0] for a in args), sum(a[1] for a in args)
    if term.op in ("min", "max"):
        pick = OPS[term.op][1]
        return pick(*(a[0] for a in args)), pick(*(a[1] for a in args))
    if term.op == "*":
        low, high = args[0]
        for a in args[1:]:
            products = [x * y for x in (low, high) for y in a]
            low, high = min(products), max(products)
        return low, high
    (a_low, a_high), (b_low, b_high) = args
    if b_low <= 0:
        return None
    if term.op == "%":
        return (0, min(b_high - 1, a_high)) if a_low >= 0 else (0, b_high - 1)
    values = [OPS[term.op][1](x, y) for x in (a_low, a_high) for y in (b_low, b_high)]  # monotone in each
    return min(values), max(values)


def float_type(term: Term) -> "str | None":
    """The float type ("f32", "f64") of a float expression (its casts decide it); None for an int term."""
    while isinstance(term, Expr) and term.op in FLOAT_VALUED - set(FLOAT_TYPES):
        term = term.args[0]
    return term.op if isinstance(term, Expr) and term.op in FLOAT_TYPES else None


def _float_bounds(op: str, args: list) -> "tuple[Any, Any] | None":
    """[low, high] of a float op (or floor/ceil/trunc) over argument ranges: each op, rounded, is
    monotone in each argument (a quotient where the divisor keeps its sign), so its extremes lie at
    the ranges' ends, computed with the op's own rounding."""
    fn = FLOAT_OPS[op][1]
    try:
        if op == "f/" and args[1][0] <= 0 <= args[1][1]:
            return None
        if len(args) == 1:
            return fn(args[0][0]), fn(args[0][1])
        values = [fn(x, y) for x in args[0] for y in args[1]]
    except ShapeEvalError:
        return None
    return min(values), max(values)


def is_monotone(term: Term) -> bool:
    """Whether `term` grows with every symbol (so a profile's max corner gives its largest value):
    not so when it holds a remainder or float arithmetic (a scale 320 / min(h, w))."""
    return not isinstance(term, Expr) or term.op == "sym" or (
        term.op != "%" and term.op not in FLOAT_OPS and all(is_monotone(a) for a in term.args))


def remainder_size(dims: Sequence[Term], corners: Sequence[Mapping[str, int]],
                   data: "Mapping[str, Term] | None" = None) -> int:
    """Elements of a tensor a dim of which is not monotone in the symbols (a remainder `(-w) % 7`, a
    float scale `floor(h * (320 / min(h, w)))`: the corners can miss its largest value): the product of
    the dims' upper bounds with every symbol between its least and largest corner value, a data symbol
    (`data`: the bounds, in data_dims.bound_order) up to its bound's upper bound where that bound is
    not monotone either; 0 when every dim is monotone or a bound is unknown."""
    data = data or {}
    rough: set[str] = set()  # data symbols whose bounds are not monotone, or name such a symbol
    for name, bound in data.items():  # in bound order (data_dims.bound_order): a bound after the symbols it names
        if not is_monotone(bound) or _symbols_of(bound) & rough:
            rough.add(name)
    if not corners or all(is_monotone(d) and not (rough & _symbols_of(d)) for d in dims):
        return 0
    ranges = {s: (min(env[s] for env in corners), max(env[s] for env in corners)) for s in corners[0]}
    for name in [n for n in data if n in rough]:
        high = bounds(data[name], ranges)
        if high is None:
            return 0
        ranges[name] = (0, max(ranges.get(name, (0, 0))[1], int(high[1])))
    highs = [bounds(d, ranges) for d in dims]
    return 0 if any(b is None for b in highs) else math.prod(max(0, int(b[1])) for b in highs)


def _symbols_of(term: Term) -> set[str]:
    return term.symbols() if isinstance(term, Expr) else set()


# ---- plan form ------------------------------------------------------------------------------
def expr_to_json(term: Term) -> Any:
    if not isinstance(term, Expr):
        return term if type(term) is float else int(term)
    if term.op == "sym":
        return term.args[0]
    return [term.op] + [expr_to_json(a) for a in term.args]


def expr_from_json(value: Any, symbols: "set[str] | None" = None, depth: int = 0, floats: bool = False,
                   shared: "dict | None" = None) -> Term:
    """The Term of a plan's JSON form; ValueError (what is wrong) when it is not one, or
    names a symbol outside `symbols` (when given). A dim is an int term; float ops (FLOAT_OPS)
    take float operands (`floats`) and give ints only through floor/ceil/trunc. `shared` (one dict
    for a plan): equal subexpressions become one object (evaluate's memo then computes them once)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"is nested deeper than {MAX_DEPTH} levels")
    if type(value) is int and not floats:
        if abs(value) > MAX_VALUE:
            raise ValueError(f"constant {value} is beyond {MAX_VALUE}")
        return value
    if type(value) is str and not floats:
        if not value:
            raise ValueError("a symbol name is empty")
        if symbols is not None and value not in symbols:
            raise ValueError(f"symbol {value!r} is not a dim of an engine input")
        return _shared(symbol(value), shared)
    if type(value) is not list or not value or value[0] not in OPS:
        raise ValueError(f"{str(value)[:60]} is not {'a float operation' if floats else 'an int, a symbol'} or "
                         f"[op, args...] with op in {sorted(OPS)}")
    op, args = value[0], value[1:]
    if (op in FLOAT_VALUED) != floats:
        raise ValueError(f"{op!r} gives {'a float' if op in FLOAT_VALUED else 'an int'} where "
                         f"{'a float' if floats else 'an int (a dim)'} is due")
    least = OPS[op][0]
    exact = op in _BINARY or op in FLOAT_OPS
    if len(args) < least or (exact and len(args) != least):
        raise ValueError(f"{op!r} takes {least if exact else f'{least} or more'} args, not {len(args)}")
    if op in FLOAT_TYPES:  # a cast: of an int term, of a finite float literal, or of another float type
        arg = args[0]
        if type(arg) is float:
            if not math.isfinite(arg) or abs(arg) > MAX_VALUE:
                raise ValueError(f"float constant {arg!r} is not finite or is beyond {MAX_VALUE}")
            return _shared(Expr(op, (arg,)), shared)
        floating = type(arg) is list and bool(arg) and arg[0] in FLOAT_VALUED
        return _shared(Expr(op, (expr_from_json(arg, symbols, depth + 1, floating, shared),)), shared)
    inner = op in FLOAT_OPS  # f+ ... and floor/ceil/trunc take floats
    return _shared(Expr(op, tuple(expr_from_json(a, symbols, depth + 1, inner, shared) for a in args)), shared)


def _shared(term: Expr, shared: "dict | None") -> Expr:
    """The one object of `shared` equal to `term` (its args already shared: keyed by their identity)."""
    if shared is None:
        return term
    key = (term.op,) + tuple(id(a) if isinstance(a, Expr) else (type(a), a) for a in term.args)
    return shared.setdefault(key, term)


# ---- SymInt ------------------------------------------------------------------------------------
class SymInt(int):
    """A dynamic dim during a build: its int value is the dim at opt, `expr` its expression."""

    expr: Expr

    def __new__(cls, value: int, expr: Term) -> "int | SymInt":
        if not isinstance(expr, Expr):
            return int(expr)
        obj = super().__new__(cls, int(value))
        obj.expr = expr
        return obj

    def __repr__(self) -> str:
        return f"SymInt({int(self)}, {self.expr})"

    __str__ = __repr__

    def __hash__(self) -> int:
        return int.__hash__(self)

    def __reduce__(self):  # copy.deepcopy keeps the expression
        return SymInt, (int(self), self.expr)

    def __add__(self, o):
        return _lift(o, lambda a, b: a + b, lambda a, b: add(a, b), self) if _is_int(o) else NotImplemented

    def __radd__(self, o):
        return _lift(o, lambda a, b: b + a, lambda a, b: add(b, a), self) if _is_int(o) else NotImplemented

    def __sub__(self, o):
        return _lift(o, lambda a, b: a - b, lambda a, b: add(a, mul(-1, b)), self) if _is_int(o) else NotImplemented

    def __rsub__(self, o):
        return _lift(o, lambda a, b: b - a, lambda a, b: add(b, mul(-1, a)), self) if _is_int(o) else NotImplemented

    def __mul__(self, o):
        return _lift(o, lambda a, b: a * b, lambda a, b: mul(a, b), self) if _is_int(o) else NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return _lift(o, lambda a, b: a // b, lambda a, b: divide("//", a, b), self) if _is_int(o) else NotImplemented

    def __rfloordiv__(self, o):
        return _lift(o, lambda a, b: b // a, lambda a, b: divide("//", b, a), self) if _is_int(o) else NotImplemented

    def __mod__(self, o):
        return _lift(o, lambda a, b: a % b, lambda a, b: divide("%", a, b), self) if _is_int(o) else NotImplemented

    def __rmod__(self, o):
        return _lift(o, lambda a, b: b % a, lambda a, b: divide("%", b, a), self) if _is_int(o) else NotImplemented

    def __neg__(self):
        return SymInt(-int(self), mul(-1, self.expr))

    def __pos__(self):
        return self

    def __abs__(self):
        return self if int(self) >= 0 else -self


def _is_int(o: Any) -> bool:
    return isinstance(o, (int, np.integer)) and not isinstance(o, bool)


def term_of(d: int) -> Term:
    """The expression of a dim (its int value when it is static)."""
    return d.expr if isinstance(d, SymInt) else int(d)


def same_dims(a: Sequence[int], b: Sequence[int]) -> bool:
    """Equal shapes during a build: static dims equal, dynamic dims (SymInts) of the same expression
    (two SymInts equal as ints are only equal at opt)."""
    return len(a) == len(b) and all(term_of(x) == term_of(y) for x, y in zip(a, b))


def _lift(other: Any, value: Callable[[int, int], int], expr: Callable[[Term, Term], Term], self: SymInt) -> Any:
    o = int(other)
    return SymInt(value(int(self), o), expr(self.expr, term_of(other) if isinstance(other, int) else o))


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) that keeps a SymInt's expression."""
    if isinstance(a, SymInt) or isinstance(b, SymInt):
        return SymInt(_cdiv(int(a), int(b)), divide("cdiv", term_of(a), term_of(b)))
    return _cdiv(a, b)


def float32_fraction(f: float) -> Fraction:
    """The fraction with the smallest denominator (a power of two at most) that rounds to float32
    `f`: what a model's float constant means (0.5 -> 1/2, 0.7f -> 7/10), so floor(dim * f) as an
    expression (dim * 7) // 10 agrees with the float32 product wherever dim * 10 stays far below 2**23."""
    f = np.float32(f)
    if not np.isfinite(f):
        raise ValueError(f"{f} is no fraction")
    exact = Fraction(float(f))
    half_ulp = Fraction(float(np.spacing(f))) / 2
    limit = 1
    while True:
        ratio = exact.limit_denominator(limit)
        if abs(ratio - exact) <= half_ulp:
            return ratio
        limit *= 2


def is_dynamic(dims: Any) -> bool:
    """Whether a shape holds a SymInt."""
    return dims is not None and any(isinstance(d, SymInt) for d in dims)
