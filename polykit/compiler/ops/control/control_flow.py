"""Control flow: If, Loop, Scan — importers and shape rules (bodies: polykit.compiler.ops.control.bodies).

Canonical forms, after import (captured outer tensors, C of them, close every input list):

- If:   inputs [cond, captures...];            then_branch / else_branch inputs [captures...]
- Loop: inputs [M, cond, v..., captures...];   body inputs [iter, cond, v..., captures...],
        body outputs [cond, v..., scan...];    node outputs [v..., scan...]
- Scan (opset >= 9): inputs [state..., scan..., captures...];  body inputs alike (a scan input's
        slice); body outputs [state..., scan...]. Scan-8 (a batch axis and sequence_lens) is
        rewritten to a Scan over the batch whose body is the Scan-9 form.

Shape rules infer the bodies in place from the node's input metadata. A Loop's scan outputs
have the trip count as their first dim when it is known at build time (a constant M and a
condition the body passes through unchanged); otherwise the dim is unknown, and the graph
evaluator fills it when the node's inputs are known (build-time input values).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.compiler.ops.data_dims import DataDim, sized_dim
from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule
from polykit.compiler.ir.symbolic import SymInt
from polykit.compiler.ir.sequences import merge_values
from polykit.compiler.ir.subgraphs import CAPTURES, captured, merge_shapes
from polykit.compiler.ops.control.bodies import annotate, import_bodies
from polykit.errors import ShapeError

#: op -> the attributes that hold its bodies
BODY_ATTRS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}


def _import(node: Node, ctx: ImportContext) -> None:
    import_bodies(node, BODY_ATTRS[node.op_type], ctx)


for _op in ("If", "Loop"):
    importer(_op)(_import)


@importer("Scan", since=9)
def _import_scan(node: Node, ctx: ImportContext) -> None:
    _import(node, ctx)


@importer("Scan", since=8)
def _import_scan8(node: Node, ctx: ImportContext) -> list[Node] | None:
    """Scan-8 iterates axis 1 of [batch, seq, ...] inputs for each batch item: a Scan-9 over the
    batch (every input scanned, the states too) whose body is the Scan-9 form of the node."""
    if node.input(0):
        raise ShapeError("Scan-8 with sequence_lens is not supported", where=node.describe(),
                         hint="export the model at opset >= 9 (sequence_lens was removed there)")
    _import(node, ctx)
    body: Graph = node.attrs["body"]
    n_in = len(node.inputs) - 1 - captured(node)
    inner = Node("Scan", [f"{n}__item" for n in node.inputs[1:]], [f"{o}__item" for o in node.outputs],
                 {k: v for k, v in node.attrs.items() if k != "directions"}, f"{node.name}__item")
    if "directions" in node.attrs:
        inner.attrs["scan_input_directions"] = node.attrs["directions"]
    outer_body = Graph([inner], inner.inputs, inner.outputs, opsets=body.opsets, name=f"{node.name}__batch")
    attrs = {"body": outer_body, "num_scan_inputs": n_in}
    if captured(node):
        attrs[CAPTURES] = captured(node)
    return [Node("Scan", node.inputs[1:], node.outputs, attrs, node.name)]


# ---- shape rules -------------------------------------------------------------------------------
def _inputs(ctx: InferContext, start: int, stop: int) -> list[Any]:
    """(dtype, shape) of each input; a sequence's or optional's whole Value."""
    return [_result(ctx.value(i)) for i in range(start, stop)]


def _result(v: Value) -> Any:
    return v if v.wrap else (v.dtype, v.shape)


def _consts(ctx: InferContext, start: int, stop: int) -> list[np.ndarray | None]:
    return [ctx.const(i) for i in range(start, stop)]


@shape_rule("If")
def _if_shape(ctx: InferContext) -> list[tuple[Any, Any]]:
    n = ctx.n_inputs
    branches = [ctx.attr("then_branch"), ctx.attr("else_branch")]
    cond = ctx.const(0)
    if cond is not None:  # only the taken branch must make sense (function expansions guard on rank)
        chosen = branches[0 if bool(np.asarray(cond).reshape(-1)[0]) else 1]
        outs = annotate(chosen, _inputs(ctx, 1, n), _consts(ctx, 1, n))
        if len(outs) < ctx.n_outputs:
            raise ctx.fail(f"the taken branch gives {len(outs)} outputs for the node's {ctx.n_outputs}",
                           hint="both branches of an If must produce one output per node output")
        return [_result(v) for v in outs]
    then, other = (annotate(b, _inputs(ctx, 1, n), _consts(ctx, 1, n)) for b in branches)
    if len(then) != len(other) or len(then) < ctx.n_outputs:
        raise ctx.fail(f"the branches give {len(then)} and {len(other)} outputs for the node's {ctx.n_outputs}",
                       hint="both branches of an If must produce one output per node output")
    out: list[Any] = []
    for a, b in zip(then, other):
        if a.wrap or b.wrap:
            out.append(merge_values(a, b))
            continue
        if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
            raise ctx.fail(f"output {a.name!r} is {a.dtype} in then_branch and {b.dtype} in else_branch",
                           hint="both branches must give each output one element type")
        out.append((a.dtype or b.dtype, _branch_shape(ctx, len(out), a.shape, b.shape)))
    return out


def _branch_shape(ctx: InferContext, output: int, a: Any, b: Any) -> Any:
    """The shape of an If output whose branches give shapes `a` and `b`: dims they agree on kept;
    in a build, a dim they may disagree on (the branch taken decides it) is sized at run time
    (data_dims.sized_dim); else unknown."""
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if same_dim(x, y) else sized_dim(ctx, axis, output) for axis, (x, y) in enumerate(zip(a, b)))


def same_dim(x: Any, y: Any) -> bool:
    """Whether dims `x` and `y` are one size: equal ints, or one expression (a data-dependent dim
    only with itself; an input dim against an int is compared at opt, as shape rules do)."""
    if isinstance(x, DataDim) or isinstance(y, DataDim) or isinstance(x, SymInt) and isinstance(y, SymInt):
        return isinstance(x, SymInt) and isinstance(y, SymInt) and x.expr == y.expr
    return x is not None and x == y


def _settle(body: Graph, lead: list, state: list, rest: list, known: list,
            out0: int) -> tuple[list[tuple[Any, Any]], list[Value]]:
    """Annotate a body with inputs lead + state + rest whose outputs [out0, out0 + len(state))
    are the next state; a state that changes shape across iterations gets unknown dims.
    Returns the state's (dtype, shape) as the body keeps it, and the body's outputs."""
    for _ in range(3):
        outs = annotate(body, lead + state + rest, [None] * (len(lead) + len(state)) + known)
        merged = [merge_values(s, o) if isinstance(s, Value) else (s[0], merge_shapes(s[1], o.shape))
                  for s, o in zip(state, outs[out0: out0 + len(state)])]
        if merged == state:
            break
        state = merged
    return state, outs


@shape_rule("Loop")
def _loop_shape(ctx: InferContext) -> list[tuple[Any, Any]]:
    body: Graph = ctx.attr("body")
    c = captured(ctx.node)
    n = ctx.n_inputs - 2 - c
    lead = [(np.dtype(np.int64), ()), (np.dtype(np.bool_), ())]
    state, outs = _settle(body, lead, _inputs(ctx, 2, 2 + n), _inputs(ctx, 2 + n, ctx.n_inputs),
                          _consts(ctx, 2 + n, ctx.n_inputs), 1)
    if len(outs) < 1 + n or len(outs) - 1 - n != ctx.n_outputs - n:
        raise ctx.fail(f"the body gives {len(outs)} outputs; a Loop with {n} carried values and {ctx.n_outputs} "
                       f"outputs needs {1 + ctx.n_outputs}", hint="body outputs are [cond, carried..., scan...]")
    trip = _trip_count(ctx, body)
    scans = [(v.dtype, None if v.shape is None else
              (trip if trip is not None else sized_dim(ctx, 0, n + k), *_sized(ctx, v.shape, n + k, 1)))
             for k, v in enumerate(outs[1 + n:])]
    return [s if isinstance(s, Value) else (s[0], _sized(ctx, s[1], k)) for k, s in enumerate(state)] + scans


def _sized(ctx: InferContext, shape: Any, output: int, first: int = 0) -> Any:
    """`shape` (of output `output`, from axis `first` on) with the dims the iterations change (unknown
    after _settle) sized at run time in a build (data_dims.sized_dim): the body's run decides them."""
    if shape is None:
        return None
    return tuple(sized_dim(ctx, first + a, output) if d is None else d for a, d in enumerate(shape))


def _trip_count(ctx: InferContext, body: Graph) -> int | None:
    """The loop's iteration count when the build knows it: M constant, and the condition given
    as a constant true (or absent) that the body passes through unchanged."""
    m, cond = ctx.const(0), ctx.const(1) if ctx.has(1) else np.array(True)
    if not isinstance(body, Graph):  # a built body: the plan's tensors say the count
        return None
    if m is None or cond is None or not bool(np.asarray(cond).reshape(-1)[0]):
        return None if m is None or cond is None else 0
    return int(np.asarray(m).reshape(-1)[0]) if passes_condition(body) else None


def passes_condition(body: Graph) -> bool:
    """Whether a Loop body's condition output is its condition input (through Identities): the
    body never stops the loop, which runs its trip count."""
    producers = body.producers()
    name = body.outputs[0]
    while name in producers and producers[name].op_type == "Identity":
        name = producers[name].inputs[0]
    return name == body.inputs[1]


def scan_axes(node: Node, key: str, count: int) -> list[int]:
    """A Scan's per-input or per-output axes/directions attribute (zeros when absent)."""
    values = list(node.attrs.get(key) or [0] * count)
    if len(values) != count:
        raise ShapeError(f"{key} has {len(values)} entries for {count} tensors", where=node.describe(),
                         hint=f"give {key} one entry per scan input/output")
    return [int(v) for v in values]


@shape_rule("Scan")
def _scan_shape(ctx: InferContext) -> list[tuple[Any, Any]]:
    body: Graph = ctx.attr("body")
    m, c = int(ctx.attr("num_scan_inputs")), captured(ctx.node)
    n = ctx.n_inputs - m - c
    if n < 0 or m < 1:
        raise ctx.fail(f"num_scan_inputs {m} does not fit the node's {ctx.n_inputs} inputs")
    axes = scan_axes(ctx.node, "scan_input_axes", m)
    slices, length = [], None
    for i, axis in enumerate(axes):
        dt, shape = ctx.dtype(n + i), ctx.shape(n + i)
        if shape is None:
            slices.append((dt, None))
            continue
        a = ctx.normalize_axis(axis, len(shape))
        length = shape[a] if length is None or not isinstance(length, int) else length
        slices.append((dt, shape[:a] + shape[a + 1:]))
    rest = slices + _inputs(ctx, n + m, ctx.n_inputs)
    state, outs = _settle(body, [], _inputs(ctx, 0, n), rest, [None] * m + _consts(ctx, n + m, ctx.n_inputs), 0)
    if len(outs) != ctx.n_outputs or len(outs) < n:
        raise ctx.fail(f"the body gives {len(outs)} outputs for the node's {ctx.n_outputs}",
                       hint="body outputs are [state..., scan...], one per node output")
    out_axes = scan_axes(ctx.node, "scan_output_axes", len(outs) - n)
    scans = []
    for v, axis in zip(outs[n:], out_axes):
        if v.shape is None:
            scans.append((v.dtype, None))
            continue
        a = ctx.normalize_axis(axis, len(v.shape) + 1)
        scans.append((v.dtype, v.shape[:a] + (length,) + v.shape[a:]))
    return state + scans

