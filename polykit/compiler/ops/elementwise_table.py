"""The elementwise op table: the one place an ONNX elementwise op is declared.

A row (`ElementwiseOp`) gives the op's shape rule, its numpy reference kernel, the C
expression the CUDA pointwise generator emits for it, the dtype kinds it computes on, how
its result is typed, how each input is used, whether passes may fuse it, and its name in
NetworkDefinition. `register_elementwise(row)` registers the shape rule and the reference
kernel and adds the row; everything else is derived from the table:

- the fusable set of fuse_pointwise / fuse_bias_activation / hoist_activations (`fusable_ops`);
- NetworkDefinition's add_unary / add_elementwise / add_activation names (`api_table`);
- the CUDA generator's expressions, integer/bool signatures and input roles, and its
  compile variants (kernels/cuda/pointwise*.py).

polykit's rows live beside their numpy code (kernels/reference/elementwise.py,
activation.py, cast.py); a plugin registers rows of its own from its `polykit_ops` hook.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from polykit.compiler.ops.registry import ShapeRuleFn, load_ops, refuse_duplicate, shape_rule
from polykit.compiler.ops.references import ReferenceFn, reference

#: dtype kinds an op computes on (the CUDA generator's signatures follow them)
FLOAT = frozenset({"float"})
NUMERIC = frozenset({"float", "int"})
ANY_KIND = frozenset({"float", "int", "bool"})
INT = frozenset({"int"})

#: how a row's output dtype follows its inputs
RESULTS = ("first", "second", "bool", "cast")
#: how an input slot is used: a value ("data"), a condition read as bool ("cond"), a Cast
#: source ("cast", any dtype), an exponent ("exp", ONNX Pow's T1)
ROLES = ("data", "cond", "cast", "exp")
#: NetworkDefinition method groups
APIS = ("unary", "binary", "activation")

CudaEmitter = Callable[[list[str], Mapping[str, Any]], str]


def literal(x: Any) -> str:
    """A Python attribute value as a C literal."""
    return repr(float(x)) if not isinstance(x, bool) else ("true" if x else "false")


@dataclass(frozen=True)
class Call:
    """CUDA emitter `fn(inputs..., attributes...)`: attributes in order, with their defaults."""

    fn: str
    attrs: tuple[tuple[str, float], ...] = ()

    def __call__(self, args: list[str], attrs: Mapping[str, Any]) -> str:
        return f"{self.fn}({', '.join([*args, *(literal(attrs.get(n, d)) for n, d in self.attrs)])})"


def call(fn: str, **defaults: float) -> Call:
    return Call(fn, tuple(defaults.items()))


@dataclass(frozen=True)
class Infix:
    """CUDA emitter `(a OP b)`, each operand first converted with `convert` (e.g. "(bool)")."""

    op: str
    convert: str = ""

    def __call__(self, args: list[str], attrs: Mapping[str, Any]) -> str:
        return f"({self.convert}{args[0]} {self.op} {self.convert}{args[1]})"


@dataclass(frozen=True)
class Fold:
    """CUDA emitter of a variadic op: `fn(fn(a, b), c)...` over the inputs given."""

    fn: str

    def __call__(self, args: list[str], attrs: Mapping[str, Any]) -> str:
        present = [a for a in args if a]
        out = present[0]
        for x in present[1:]:
            out = f"{self.fn}({out}, {x})"
        return out


@dataclass(frozen=True)
class ElementwiseOp:
    """One elementwise op (default ONNX domain).

    `shape` None: the op's own module registers its shape rule (with its importers: Cast,
    Clip, PRelu). `cuda` turns (C expressions of the inputs, "" for omitted; attributes)
    into a C expression over pointwise.cuh; None when the CUDA side supplies it (Cast, whose
    expression needs the CUDA storage types: kernels/cuda/pointwise/pointwise_expr.py's
    CUDA_EMITTERS, which the generator reads over this table). `arity`: the inputs it takes (a variadic op: the
    number its samples use); `variants`: attribute sets that take different code paths
    (compile checks and tests instantiate each). `params` are the attributes
    NetworkDefinition's add_activation takes (default: those of a `Call` emitter)."""

    name: str
    shape: ShapeRuleFn | None
    reference: ReferenceFn
    cuda: CudaEmitter | None
    kinds: frozenset[str] = FLOAT
    result: str = "first"
    roles: tuple[str, ...] = ()
    arity: int = 1
    fusable: bool = True
    variants: tuple[Mapping[str, Any], ...] = field(default=({},), compare=False)
    api: str | None = None
    api_name: str | None = None
    params: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        from polykit.plugins import PluginError

        for what, values, allowed in (("result", (self.result,), RESULTS), ("api", (self.api,), (None, *APIS)),
                                      ("role", self.roles, ROLES), ("kind", tuple(self.kinds) or ("(none)",), ANY_KIND)):
            bad = [v for v in values if v not in allowed]
            if bad:
                raise PluginError(f"elementwise op {self.name!r}: {what} {bad[0]!r} is not one of "
                                  f"{sorted(allowed, key=str)}", hint="fix the row given to register_elementwise")

    def role(self, slot: int) -> str:
        return self.roles[slot] if slot < len(self.roles) else "data"

    @property
    def api_key(self) -> str:
        """The NetworkDefinition name: `api_name`, else the op name in snake case."""
        return self.api_name or re.sub(r"(?<!^)(?=[A-Z])", "_", self.name).lower()

    @property
    def api_params(self) -> tuple[str, ...]:
        if self.params is not None:
            return self.params
        return tuple(n for n, _ in self.cuda.attrs) if isinstance(self.cuda, Call) else ()


#: op name -> row (default ONNX domain)
ELEMENTWISE: dict[str, ElementwiseOp] = {}


def register_elementwise(op: ElementwiseOp) -> ElementwiseOp:
    """Add `op` to the table and register its shape rule and reference kernel (a second,
    different row for a taken name is a PluginError)."""
    if not refuse_duplicate(ELEMENTWISE.get(op.name), op, f"{op.name} elementwise row"):
        ELEMENTWISE[op.name] = op
    if op.shape is not None:
        shape_rule(op.name)(op.shape)
    reference(op.name)(op.reference)
    return op


def elementwise_op(name: str) -> ElementwiseOp | None:
    """The row of default-domain op `name`, or None."""
    load_ops()
    return ELEMENTWISE.get(name)


def elementwise_ops() -> list[ElementwiseOp]:
    """Every row, by name."""
    load_ops()
    return [ELEMENTWISE[k] for k in sorted(ELEMENTWISE)]


def fusable_ops() -> frozenset[str]:
    """Ops a Pointwise body or an epilogue may hold."""
    load_ops()
    return frozenset(name for name, op in ELEMENTWISE.items() if op.fusable)


def api_table(api: str) -> dict[str, ElementwiseOp]:
    """NetworkDefinition name -> row, for the method group `api` (one of APIS)."""
    return {op.api_key: op for op in elementwise_ops() if op.api == api}
