"""Data-dependent dims: output sizes that depend on input values (NonZero, Compress, Unique,
NonMaxSuppression), decided at run time (TensorRT's output allocator).

In a build (graph.metadata["data_dims"]) such a dim is a `DataDim`: a SymInt whose expression
is a symbol of its own, `data(tensor)[axis]`, and whose int value is its upper bound at the
first profile's opt (NonZero of an n-element input has at most n columns). Downstream shapes
become expressions of it like of any input dim; the plan records each data symbol with its
bound (an expression of the input symbols and of earlier data symbols: a NonZero over what a
NonZero kept is bounded by the first one's size; ProfileSet.data), the profile corners give it
its bound, evaluated in order (bound_order), so the arena reserves the largest output. At run time the layer reports the real size
and the runtime binds the symbol (polykit.runtime.output_alloc). Outside a build (inspection,
surgeon tools) these rules keep a named dim_param (`fresh_dim`).

A dim no expression bounds (a Loop's scan outputs when the build does not know its iteration
count: the trip count is computed from input values) is **sized** (`sized_dim`): its bound is
SIZED_BOUND, what the build plans and stamps tactics at, which the run does not hold it to; the
plan lists it in `profiles.sized`. Only targets that allocate a layer's output as the layer
returns it (SIZED_TARGETS) run such a plan; others refuse the build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from polykit.compiler.ir.symbolic import OPS, Expr, ShapeEvalError, SymInt, Term, evaluate, extreme, symbol, term_of

if TYPE_CHECKING:
    from polykit.compiler.ir.graph import Graph, Value
    from polykit.compiler.ops.registry import InferContext
#: graph.metadata key that asks shape rules for DataDims (set by the builder)
DATA_DIMS = "data_dims"
#: the size a build plans for a sized data dim (module docstring)
SIZED_BOUND = 1
#: targets that run plans with sized data dims: the cpu target allocates every output as its layer returns
#: it; cuda's control-flow layers allocate them once they know the sizes (polykit.runtime.cuda.layer_outputs)
SIZED_TARGETS = frozenset({"cpu", "cuda"})


class DataDim(SymInt):
    """A data-dependent dim during a build: its int value is its bound at opt, `bound` the
    bound's expression of the input symbols, `expr` its own symbol."""

    bound: Term
    #: no expression bounds it: the run sizes it (module docstring)
    sized: bool

    def __new__(cls, name: str, value: int, bound: Term, sized: bool = False) -> "DataDim":
        obj = int.__new__(cls, int(value))
        obj.expr = symbol(name)
        obj.bound = bound
        obj.sized = sized
        return obj

    def __reduce__(self):  # copy.deepcopy keeps the symbol, the bound and whether it is sized
        return DataDim, (self.expr.args[0], int(self), self.bound, self.sized)


def data_symbol(tensor: str, axis: int) -> str:
    return f"data({tensor})[{axis}]"


def is_data_dependent(d: object) -> bool:
    """Whether dim `d` is an expression that names a data symbol (a filtered count): its value at
    the build's opt is only its bound, so nothing may be decided from it there."""
    return isinstance(d, SymInt) and isinstance(d.expr, Expr) and any(s.startswith("data(") for s in d.expr.symbols())


def dim_extreme(op: str, a: int, b: int) -> int:
    """min or max (`op`) of two dims: an expression when one is data-dependent (is_data_dependent:
    its value in a build is a bound, so the choice is the run's), else decided at opt as shape
    rules do (the profile corners check the choice)."""
    if is_data_dependent(a) or is_data_dependent(b):
        return SymInt(OPS[op][1](int(a), int(b)), extreme(op, term_of(a), term_of(b)))
    return min(a, b) if op == "min" else max(a, b)


def data_dim(ctx: "InferContext", tag: str, bound: object, axis: int, output: int = 0):
    """The dim `axis` of output `output` whose size the input values decide, at most `bound`:
    a DataDim in a build whose bound is known (0 stays 0), else a named symbolic dim."""
    from polykit.compiler.ops.tensor.shape_ops import fresh_dim

    if not ctx.data_dims or not isinstance(bound, int):
        return fresh_dim(ctx, tag, output)
    if not isinstance(bound, SymInt) and int(bound) == 0:
        return 0
    name = ctx.node.outputs[output] if output < len(ctx.node.outputs) else ctx.node.name
    return DataDim(data_symbol(name, axis), int(bound), term_of(bound))


def sized_dim(ctx: "InferContext", axis: int, output: int) -> "DataDim | None":
    """Dim `axis` of output `output`, whose size only the run knows and nothing bounds: a sized
    DataDim in a build, else None (unknown)."""
    if not ctx.data_dims:
        return None
    name = ctx.node.outputs[output] if output < len(ctx.node.outputs) else ctx.node.name
    return DataDim(data_symbol(name, axis), SIZED_BOUND, SIZED_BOUND, sized=True)


def keep_sized_dims(old: "Value | None", new: "Value") -> "Value":
    """`new` (a re-inferred value) with the sized dims `old` held at the same axes: a pass that renamed
    the tensor (remove_identity giving a Loop's output the graph output's name) leaves the symbol the
    build's profiles already bound (a fresh `data(new name)[axis]` would be unbound)."""
    if old is None or old.shape is None or new.shape is None or len(old.shape) != len(new.shape) or \
            not any(isinstance(d, DataDim) and d.sized for d in old.shape):
        return new
    return new.with_(shape=tuple(o if isinstance(o, DataDim) and o.sized and isinstance(d, DataDim) and d.sized else d
                                 for o, d in zip(old.shape, new.shape)))


def sized_symbols(g: "Graph") -> frozenset[str]:
    """The graph's sized data symbols (sized_dim)."""
    return frozenset(d.expr.args[0] for v in g.values.values() for d in v.shape or ()
                     if isinstance(d, DataDim) and d.sized)


def run_bounded(profiles: Any) -> frozenset[str]:
    """The sized data symbols and those whose bounds name one (a NonZero over an If's output that
    a run sizes): only the run bounds them."""
    if profiles is None or not profiles.sized:
        return frozenset()
    out = set(profiles.sized)
    for name in bound_order(profiles.data):  # a bound after the symbols it names
        bound = profiles.data[name]
        if isinstance(bound, Expr) and bound.symbols() & out:
            out.add(name)
    return frozenset(out)


def sized_tensors(plan: Any) -> frozenset[str]:
    """The plan's tensors whose dims name a data symbol only the run bounds (run_bounded): no
    reserved bytes bound them."""
    sized = run_bounded(plan.profiles)
    return frozenset(n for n, t in plan.tensors.items()
                     if sized and any(isinstance(d, Expr) and d.symbols() & sized for d in t.dims))


def refuse_sized_target(sized: "frozenset[str]", target: str) -> None:
    """BuildError when a target outside SIZED_TARGETS would run sized data dims."""
    if sized and target not in SIZED_TARGETS:
        from polykit.errors import BuildError

        raise BuildError(f"the size of {sorted(sized)[0]} is known only when its layer has run, and nothing bounds "
                         f"it: the {target} target cannot allocate it then", where=f"target {target!r}",
                         hint="give the values that decide it (a Loop's trip count: input_values), or build for "
                              f"{', '.join(sorted(SIZED_TARGETS))}")


def data_symbols(g: "Graph") -> dict[str, Term]:
    """Each data symbol of the graph's tensors with its bound."""
    out: dict[str, Term] = {}
    for value in g.values.values():
        for d in value.shape or ():
            if isinstance(d, DataDim):
                out.setdefault(d.expr.args[0], d.bound)
    return dict(sorted(out.items()))


def bound_order(data: Mapping[str, Term]) -> list[str]:
    """The data symbols of `data` in an order where each bound names only the input symbols and
    earlier data symbols: a nested size (NonZero over what an earlier NonZero kept) is bounded by
    the earlier one's size, so it is evaluated after it, at run time as at the build's corners.
    ShapeEvalError when bounds name each other in a cycle."""
    order: list[str] = []
    state: dict[str, bool] = {}  # False: being visited, True: placed

    def visit(name: str) -> None:
        if state.get(name) is False:
            raise ShapeEvalError(f"the bound of data symbol {name!r} names itself through other data symbols")
        if name in state:
            return
        state[name] = False
        bound = data[name]
        for s in sorted(bound.symbols() & set(data) if isinstance(bound, Expr) else ()):
            visit(s)
        state[name] = True
        order.append(name)

    for name in data:
        visit(name)
    return order


def with_data(env: Mapping[str, int], data: Mapping[str, Term]) -> dict[str, int]:
    """Symbol values `env` of the input symbols plus each data symbol at its bound there (bounds
    that name other data symbols evaluated after them: bound_order)."""
    out = dict(env)
    for s in bound_order(data):
        out[s] = evaluate(data[s], out)
    return out


def bounding_symbols(names: "set[str] | frozenset[str]", data: Mapping[str, Term]) -> set[str]:
    """The data symbols among `names` and those their bounds name, transitively (what evaluating
    them at their bounds reads)."""
    out: set[str] = set()
    todo = [n for n in names if n in data]
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            bound = data[name]
            todo.extend(s for s in (bound.symbols() if isinstance(bound, Expr) else ()) if s in data)
    return out


def small_data_corners(corners: Sequence[Mapping[str, int]], data: Mapping[str, Term]) -> list[dict[str, int]]:
    """The profile `corners` with every data symbol at 2 (or its bound when smaller): where tactics
    must serve a layer too, with the kernels they compile at the bound (a tactic that bakes a
    data-dependent size into its kernels is refused, as for an input dim)."""
    if not data:
        return []
    return [{**env, **{s: min(2, env[s]) for s in data}} for env in corners]
