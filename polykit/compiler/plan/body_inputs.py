"""The inference of a control-flow body plan (polykit.compiler.ops.control.bodies.annotate; a built
body is not inferred again): the node must give the body the inputs it was built for, and the body's
outputs have the shapes its plan records at the sizes the node gives.

A body input whose dim the outer plan decides at run time (an input dim of the outer profile, a
data-dependent count: SSDLite's batched_nms `If` reads the boxes a NonZero kept) is built for a
profile of its own (polykit.compiler.builder.bodies.body_profile): the dim is a symbol of the body's
plan over a range, and its recorded shape is the one at the body's opt, which is no size the node
gives. Such a dim is checked as what it is: the node's size there lies in the symbol's range (of
one body profile, for every symbol at once), and the dims the body gives one symbol get one size.
A static dim must be the node's size exactly. The outputs' dims are their expressions evaluated at
those sizes; one that names what the node does not give (a count of the body's own NonZero, an
unknown input dim) is unknown: the run decides it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import Value
from polykit.compiler.ir.symbolic import ShapeEvalError, evaluate
from polykit.errors import ShapeError

_WHERE = "control-flow body"
_HINT = "the plan is inconsistent; rebuild it"


def infer_body_plan(plan: Any, values: Sequence[tuple[Any, Any]], known: Sequence[Any] = ()) -> list[Value]:
    """The outputs (in order) of body plan `plan` given `values`, the (dtype, shape) of each input the
    node gives (positional); ShapeError unless they fit the plan's inputs: each dtype, each rank, each
    static dim; each dynamic dim (a symbol of the body's profiles) inside its range, one size per
    symbol (module docstring). Unknown dims pass."""
    if len(values) != len(plan.inputs):
        raise ShapeError(f"the node gives its body {len(values)} inputs, its plan takes {len(plan.inputs)}",
                         where=_WHERE, hint=_HINT)
    sizes: dict[str, tuple[int, str]] = {}  # symbol -> (the node's size, the body input that gave it)
    for name, (dtype, shape) in zip(plan.inputs, values):
        desc = plan.tensors[name]
        symbols = input_symbols(plan, name, len(desc.shape))
        if dtype is not None and np.dtype(dtype) != desc.np_dtype or shape is not None and (
                len(shape) != len(desc.shape) or any(isinstance(a, int) and s is None and a != b
                                                     for a, b, s in zip(shape, desc.shape, symbols))):
            recorded = [b if s is None else s for b, s in zip(desc.shape, symbols)]
            given = "" if dtype is None else np.dtype(dtype).name
            raise ShapeError(f"body input {name!r} is {desc.dtype}{recorded} in the body's plan, the node "
                             f"gives {given}{list(shape or ())}", where=_WHERE, hint=_HINT)
        for axis, (a, s) in enumerate(zip(shape or (), symbols)):
            if s is None or not isinstance(a, int):
                continue
            if s in sizes and sizes[s][0] != int(a):
                raise ShapeError(f"body input {name!r} dim {axis} is {int(a)}, but {sizes[s][1]} gives "
                                 f"{sizes[s][0]} for the same body dim {s!r}", where=_WHERE, hint=_HINT)
            sizes.setdefault(s, (int(a), f"body input {name!r}"))
    _in_some_profile(plan, sizes)
    env = {s: size for s, (size, _) in sizes.items()}
    return [Value(n, plan.tensors[n].np_dtype, _shape_at(plan.tensors[n], env)) for n in plan.metadata["body_outputs"]]


def _shape_at(desc: Any, env: dict[str, int]) -> tuple:
    """Tensor `desc`'s shape at symbol values `env`: a dim it cannot give is unknown (None)."""
    if not desc.dims:
        return tuple(desc.shape)
    out = []
    for d in desc.dims:
        try:
            out.append(evaluate(d, env))
        except ShapeEvalError:
            out.append(None)
    return tuple(out)


def input_symbols(plan: Any, name: str, rank: int) -> tuple[str | None, ...]:
    """The symbol of each dim of body input `name` in the body's profiles (None: a static dim)."""
    profiles = plan.profiles
    return tuple(profiles.inputs.get(name, (None,) * rank)) if profiles is not None else (None,) * rank


def _in_some_profile(plan: Any, sizes: dict[str, tuple[int, str]]) -> None:
    """ShapeError unless one body profile's ranges hold every symbol's size."""
    if not sizes:
        return
    misses = []
    for index, ranges in enumerate(plan.profiles.ranges):
        miss = next(((s, size, who) for s, (size, who) in sizes.items() if not ranges[s][0] <= size <= ranges[s][2]),
                    None)
        if miss is None:
            return
        misses.append((index, miss))
    index, (symbol, size, who) = misses[0]
    low, _, high = plan.profiles.ranges[index][symbol]
    raise ShapeError(f"{who} has size {size} at body dim {symbol!r}, outside the body plan's range [{low}, {high}] "
                     f"(profile {index}{f' of {len(misses)}' if len(misses) > 1 else ''})", where=_WHERE,
                     hint="the node gives its body more than the body was built for; rebuild the plan")
