"""Data-dependent dims: output sizes that depend on input values (NonZero, Compress, Unique,
NonMaxSuppression), decided at run time (TensorRT's output allocator).

In a build (graph.metadata["data_dims"]) such a dim is a `DataDim`: a SymInt whose expression
is a symbol of its own, `data(tensor)[axis]`, and whose int value is its upper bound at the
first profile's opt (NonZero of an n-element input has at most n columns). Downstream shapes
become expressions of it like of any input dim; the plan records each data symbol with its
bound (an expression of the input symbols, ProfileSet.data), the profile corners give it its
bound, so the arena reserves the largest output. At run time the layer reports the real size
and the runtime binds the symbol (polykit.runtime.output_alloc). Outside a build (inspection,
surgeon tools) these rules keep a named dim_param (`fresh_dim`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from polykit.compiler.symbolic import SymInt, Term, evaluate, symbol, term_of

if TYPE_CHECKING:
    from polykit.compiler.ir import Graph
    from polykit.compiler.registry import InferContext
#: graph.metadata key that asks shape rules for DataDims (set by the builder)
DATA_DIMS = "data_dims"


class DataDim(SymInt):
    """A data-dependent dim during a build: its int value is its bound at opt, `bound` the
    bound's expression of the input symbols, `expr` its own symbol."""

    bound: Term

    def __new__(cls, name: str, value: int, bound: Term) -> "DataDim":
        obj = int.__new__(cls, int(value))
        obj.expr = symbol(name)
        obj.bound = bound
        return obj

    def __reduce__(self):  # copy.deepcopy keeps the symbol and the bound
        return DataDim, (self.expr.args[0], int(self), self.bound)


def data_symbol(tensor: str, axis: int) -> str:
    return f"data({tensor})[{axis}]"


def data_dim(ctx: "InferContext", tag: str, bound: object, axis: int, output: int = 0):
    """The dim `axis` of output `output` whose size the input values decide, at most `bound`:
    a DataDim in a build whose bound is known (0 stays 0), else a named symbolic dim."""
    from polykit.compiler.ops.shape_ops import fresh_dim

    if not ctx.data_dims or not isinstance(bound, int):
        return fresh_dim(ctx, tag, output)
    if not isinstance(bound, SymInt) and int(bound) == 0:
        return 0
    name = ctx.node.outputs[output] if output < len(ctx.node.outputs) else ctx.node.name
    return DataDim(data_symbol(name, axis), int(bound), term_of(bound))


def data_symbols(g: "Graph") -> dict[str, Term]:
    """Each data symbol of the graph's tensors with its bound."""
    out: dict[str, Term] = {}
    for value in g.values.values():
        for d in value.shape or ():
            if isinstance(d, DataDim):
                out.setdefault(d.expr.args[0], d.bound)
    return dict(sorted(out.items()))


def with_data(env: Mapping[str, int], data: Mapping[str, Term]) -> dict[str, int]:
    """Symbol values `env` of the input symbols plus each data symbol at its bound there."""
    return {**env, **{s: evaluate(b, env) for s, b in data.items()}}


def small_data_corners(corners: Sequence[Mapping[str, int]], data: Mapping[str, Term]) -> list[dict[str, int]]:
    """The profile `corners` with every data symbol at 2 (or its bound when smaller): where tactics
    must serve a layer too, with the kernels they compile at the bound (a tactic that bakes a
    data-dependent size into its kernels is refused, as for an input dim)."""
    if not data:
        return []
    return [{**env, **{s: min(2, env[s]) for s in data}} for env in corners]
