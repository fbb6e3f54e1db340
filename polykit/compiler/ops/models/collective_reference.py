"""The numpy definition of every DistCollective op, and its reference kernel.

`collective_result(attrs, contributions, index)` is what group member `index` receives when the
members' inputs are `contributions` (in group order). The cpu target's collective tactic
(kernels/cpu/collective.py) exchanges the inputs between simulated ranks and calls it; the
reference kernel, which sees one rank alone, runs a group of one (a collective over more ranks
needs a communicator: polykit.runtime.collectives).

Reductions accumulate in float64 (integers in int64) and round once to the input's dtype; avg is
the sum divided by the group size (integer division for integer dtypes). gather and reduce leave
zeros on members other than the root (NCCL leaves their buffers unspecified).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.models.collective import KIND
from polykit.errors import UsageError
from polykit.compiler.ops.references import reference


def _reduce(contributions: Sequence[np.ndarray], how: str) -> np.ndarray:
    dtype = contributions[0].dtype
    wide = np.float64 if dtype.kind == "f" else np.int64 if dtype.kind in "iu" else dtype
    stack = np.stack([np.asarray(c, dtype=wide) for c in contributions])
    if how == "avg":
        total = stack.sum(axis=0)
        out = total / len(contributions) if dtype.kind == "f" else total // len(contributions)
    else:
        out = REDUCERS[how](stack, axis=0)
    return out.astype(dtype)


REDUCERS: dict[str, Callable[..., np.ndarray]] = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def _chunks(x: np.ndarray, n: int, axis: int) -> list[np.ndarray]:
    return np.split(x, n, axis=axis)


def _all_reduce(a: Mapping[str, Any], xs: Sequence[np.ndarray], i: int) -> np.ndarray:
    return _reduce(xs, a.get("reduce", "sum"))


def _reduce_to_root(a: Mapping[str, Any], xs: Sequence[np.ndarray], i: int) -> np.ndarray:
    return _reduce(xs, a.get("reduce", "sum")) if i == a.get("root", 0) else np.zeros_like(xs[i])


def _broadcast(a: Mapping[str, Any], xs: Sequence[np.ndarray], i: int) -> np.ndarray:
    return np.array(xs[a.get("root", 0)], copy=True)


def _all_gather(a: Mapping[str, Any], xs: Sequence[np.ndarray], i: int) -> np.ndarray:
    return np.concatenate(xs, axis=a.get("axis", 0))


def _gather(a: Mapping[str, Any], xs: Sequence[np.ndarray], i: int) -> np.ndarray:
    out = np.concatenate(xs, axis=a.get("axis", 0))
    return out if i == a.get("root", 0) else np.zeros_like(out)


def _reduce_scatter(a: Mapping[str, Any], xs: Sequence[np.ndarray], i: int) -> np.ndarray:
    return np.ascontiguousarray(_chunks(_reduce(xs, a.get("reduce", "sum")), len(xs), a.get("axis", 0))[i])


def _scatter(a: Mapping[str, Any], xs: Sequence[np.ndarray], i: int) -> np.ndarray:
    return np.ascontiguousarray(_chunks(xs[a.get("root", 0)], len(xs), a.get("axis", 0))[i])


def _all_to_all(a: Mapping[str, Any], xs: Sequence[np.ndarray], i: int) -> np.ndarray:
    axis = a.get("axis", 0)
    return np.concatenate([_chunks(x, len(xs), axis)[i] for x in xs], axis=axis)


#: op -> fn(attrs, contributions in group order, member index) -> that member's output
COLLECTIVES: dict[str, Callable[[Mapping[str, Any], Sequence[np.ndarray], int], np.ndarray]] = {
    "all_reduce": _all_reduce, "reduce": _reduce_to_root, "broadcast": _broadcast, "all_gather": _all_gather,
    "gather": _gather, "reduce_scatter": _reduce_scatter, "scatter": _scatter, "all_to_all": _all_to_all,
}


def collective_result(attrs: Mapping[str, Any], contributions: Sequence[np.ndarray], index: int) -> np.ndarray:
    """Member `index`'s output of the collective `attrs` over `contributions` (one per member)."""
    return COLLECTIVES[attrs["op"]](attrs, [np.asarray(c) for c in contributions], index)


@reference(KIND, domain=POLYKIT_DOMAIN)
def _collective(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    if int(node.attrs.get("ranks", 1)) > 1:
        raise UsageError(f"a {node.attrs.get('op')} over {node.attrs.get('ranks')} ranks needs the other ranks",
                         where=node.describe(),
                         hint="run each rank's plan in a context with a communicator "
                              "(polykit.runtime.collectives.SimulatedGroup on cpu)")
    return [collective_result(node.attrs, [inputs[0]], 0)]
