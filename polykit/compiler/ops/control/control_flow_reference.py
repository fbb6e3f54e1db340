"""Reference kernels: If, Loop, Scan (canonical forms: polykit.compiler.ops.control.control_flow).

The iteration is written once, over host arrays, for both kinds of body a node may hold: a
Graph (imported models, folding, shape inference: the graph evaluator runs it) and a Plan (a
built control-flow layer: polykit.compiler.builder.bodies; an execution context of the plan's
target runs it, which is how the cpu target runs If/Loop/Scan layers). Each runs through the
runner its layer registers (polykit.compiler.ops.control.bodies.body_runner).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from polykit import limits
from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ir.subgraphs import captured
from polykit.compiler.ops.control.bodies import body_runner
from polykit.compiler.ops.control.control_flow import passes_condition
from polykit.errors import LimitError, PolykitError, RuntimeInputError
from polykit.compiler.ops.references import as_value, reference


def output_shape(body: Any, index: int) -> tuple[tuple[int, ...], np.dtype]:
    """The static shape and dtype of body output `index` (for a scan output of zero iterations)."""
    if isinstance(body, Graph):
        v = body.value(body.outputs[index])
        shape, dtype = v.shape, v.dtype
    else:
        desc = body.tensors[body.metadata["body_outputs"][index]]
        shape, dtype = desc.shape, desc.np_dtype
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise PolykitError("a scan output of a loop that ran no iteration has no known shape",
                           where=f"body {getattr(body, 'name', '')!r}", hint="give the body's outputs static shapes")
    return tuple(shape), dtype


def _stack(parts: list[np.ndarray], body: Any, index: int) -> np.ndarray:
    if parts:
        odd = next((t for t, p in enumerate(parts) if p.shape != parts[0].shape), None)
        if odd is not None:  # a body of run-time shapes (polykit.compiler.builder.bodies) may give them
            raise RuntimeInputError(f"iteration {odd} gives scan output {index} the shape {parts[odd].shape}; "
                                    f"iteration 0 gave {parts[0].shape}", where=f"body {getattr(body, 'name', '')!r}",
                                    hint="a scan output takes one shape in every iteration: feed values (e.g. a "
                                         "trip count) for which the body's shapes stay the same")
        return np.stack(parts)
    shape, dtype = output_shape(body, index)
    return np.zeros((0, *shape), dtype)


def _scalar(value: np.ndarray | None, default: Any) -> Any:
    return default if value is None else np.asarray(value).reshape(-1)[0].item()


@dataclass
class _Budget:
    """Loop iterations left to one evaluation (shared by the loops nested in it)."""

    limit: str  # the polykit.limits field: "fold_iterations" (build time) or "run_iterations"
    left: int
    spent: int = 0


_BUDGET: ContextVar["_Budget | None"] = ContextVar("polykit loop budget", default=None)


@contextmanager
def iteration_budget(limit: str) -> Iterator[None]:
    """Count the Loop iterations run inside the block against limit `limit` of polykit.limits
    (constant folding: "fold_iterations"); outside any such block each outermost Loop gets
    "run_iterations"."""
    token = _BUDGET.set(_Budget(limit, getattr(limits.current(), limit)))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def _over_budget(node: Node, budget: _Budget, iterations: str) -> LimitError:
    when = "at build time (constant folding)" if budget.limit == "fold_iterations" else "in one run"
    return LimitError(f"the loop runs {iterations} iterations {when}, more than the {budget.limit} limit "
                      f"({getattr(limits.current(), budget.limit)}) allows", where=node.describe(),
                      hint=limits.raise_hint(budget.limit) if budget.limit == "run_iterations" else
                      f"{limits.raise_hint(budget.limit)}; or check the loop's trip count and condition")


@reference("If")
def if_(node: Node, inputs):
    branch = node.attrs["then_branch" if bool(_scalar(inputs[0], False)) else "else_branch"]
    with body_runner(branch) as run:
        return [as_value(o) for o in run(list(inputs[1:]))]


@reference("Loop")
def loop(node: Node, inputs):
    body = node.attrs["body"]
    c = captured(node)
    n = len(inputs) - 2 - c
    trip = _scalar(inputs[0], None)
    go = bool(_scalar(inputs[1], True))
    state, rest = list(inputs[2:2 + n]), list(inputs[2 + n:])
    scans: list[list[np.ndarray]] = [[] for _ in range(len(node.outputs) - n)]
    i = 0
    budget = _BUDGET.get()
    if budget is None:
        with iteration_budget("run_iterations"):
            return loop(node, inputs)
    if go and trip is not None and trip > budget.left and isinstance(body, Graph) and passes_condition(body):
        raise _over_budget(node, budget, str(trip))  # known now: no need to run up to the limit
    with body_runner(body) as run:
        while go and (trip is None or i < trip):
            if budget.left <= 0:
                raise _over_budget(node, budget, f"more than {budget.spent}")
            budget.left -= 1
            budget.spent += 1
            outs = run([np.array(i, np.int64), np.array(go), *state, *rest])
            go = bool(_scalar(outs[0], True))
            state = outs[1:1 + n]
            for k, part in enumerate(outs[1 + n:]):
                scans[k].append(part)
            i += 1
    return state + [_stack(parts, body, 1 + n + k) for k, parts in enumerate(scans)]


@reference("Scan")
def scan(node: Node, inputs):
    from polykit.compiler.ops.control.control_flow import scan_axes

    body = node.attrs["body"]
    m, c = int(node.attrs["num_scan_inputs"]), captured(node)
    n = len(inputs) - m - c
    xs = [np.moveaxis(x, a % x.ndim, 0) for x, a in zip(inputs[n:n + m], scan_axes(node, "scan_input_axes", m))]
    xs = [x[::-1] if d else x for x, d in zip(xs, scan_axes(node, "scan_input_directions", m))]
    length = xs[0].shape[0]
    if any(x.shape[0] != length for x in xs):
        raise PolykitError(f"the scan inputs have lengths {[x.shape[0] for x in xs]} along their scan axes",
                           where=node.describe(), hint="every scan input must have the same sequence length")
    state, rest = list(inputs[:n]), list(inputs[n + m:])
    k = len(node.outputs) - n
    scans: list[list[np.ndarray]] = [[] for _ in range(k)]
    with body_runner(body) as run:
        for t in range(length):
            outs = run([*state, *(x[t] for x in xs), *rest])
            state = outs[:n]
            for j, part in enumerate(outs[n:]):
                scans[j].append(part)
    out = list(state)
    for j, (parts, axis, direction) in enumerate(zip(scans, scan_axes(node, "scan_output_axes", k),
                                                     scan_axes(node, "scan_output_directions", k))):
        stacked = _stack(parts[::-1] if direction else parts, body, n + j)
        out.append(np.moveaxis(stacked, 0, axis % stacked.ndim))
    return out
