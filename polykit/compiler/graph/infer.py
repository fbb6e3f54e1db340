"""Shape and dtype inference with polykit's own rules (onnx.shape_inference only cross-checks).

Walks the graph in order and asks each op's shape rule for its outputs. Small tensors
whose inputs are all known (shape chains: Shape -> Gather -> Concat -> Reshape) are
evaluated on the way with the reference kernels (the graph evaluator's partial evaluation,
polykit.compiler.graph.evaluator.try_node), so rules that read a shape from an input (Reshape,
Expand, Slice, ...) see it as a constant and give exact shapes, and a node whose output
shape depends on values (NonZero, Unique, ...) gets the shape of its evaluated output.
In a build for optimization profiles, shape chains over SymInt dims are followed with
symbolic values (polykit.compiler.graph.shape_values) instead.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ops.control.bodies import register_body_inference
from polykit.compiler.ops.data_dims import DATA_DIMS, keep_sized_dims
from polykit.compiler.graph.evaluator import Partial, try_node
from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.compiler.graph.shape_rules import (RULED, RULES, at_opt, broadcast_undecided, reads_ruled, record_broadcast,
                                         record_rule, value_blind)
from polykit.compiler.graph.shape_values import is_symbolic, symbolic_values
from polykit.compiler.ir.symbolic import is_dynamic
from polykit.errors import PolykitError, ShapeError, UnsupportedModelError

#: Tensors up to this many elements are evaluated during inference when their inputs are known.
PROPAGATE_MAX_ELEMENTS = 4096


def infer_shapes(graph: Graph, strict: bool = True) -> dict[str, np.ndarray]:
    """Fill `graph.values` for every tensor; return the small constant values found.

    With strict=True an op without a shape rule raises UnsupportedModelError listing every
    such node; with strict=False their outputs stay unknown.
    """
    known: dict[str, np.ndarray] = {k: v for k, v in graph.initializers.items() if v.size <= PROPAGATE_MAX_ELEMENTS}
    # build-time values of inputs (BuilderConfig.input_values): shape tensors whose data shapes depend on
    for name, arr in (graph.metadata.get("input_values") or {}).items():
        if name in graph.inputs:
            known[name] = np.asarray(arr)
    partial = Partial(graph, PROPAGATE_MAX_ELEMENTS)
    data_dims = bool(graph.metadata.get(DATA_DIMS))
    ruled = graph.metadata.get(RULED) or set()
    if ruled:
        graph.metadata[RULES] = []
    missing: list[tuple[str, str, str, int]] = []
    for node in graph.nodes:
        rule = find_shape_rule(node.domain, node.op_type)
        if rule is None:
            missing.append((node.name, node.op_type, node.domain, graph.opsets.get(node.domain, graph.opset)))
            continue
        dtypes, shapes, consts, values = [], [], [], []
        for name in node.inputs:
            v = graph.value(name) if name else Value("")
            dtypes.append(v.dtype)
            shapes.append(v.shape)
            consts.append(known.get(name) if name else None)
            values.append(v)
        by_rule = bool(ruled) and reads_ruled(consts, ruled) and not value_blind(node)  # its rule at bind time
        ctx = InferContext(node, dtypes, shapes, at_opt(consts, dtypes) if by_rule else consts, values,
                           data_dims=data_dims)
        try:
            results = rule(ctx)
        except PolykitError:
            raise
        except Exception as exc:  # a rule bug or a malformed node: report the node, not a bare error
            raise ShapeError(
                f"shape inference failed: {type(exc).__name__}: {exc}",
                where=node.describe(),
                hint="check the node's inputs and attributes against the ONNX spec",
            ) from exc
        if len(results) < len([o for o in node.outputs if o]):
            raise ShapeError(
                f"shape rule gave {len(results)} outputs for {len(node.outputs)} declared",
                where=node.describe(),
            )
        for out, result in zip(node.outputs, results):
            if out:
                graph.set_value(keep_sized_dims(graph.values.get(out), result_value(out, result)))
        symbolic = symbolic_values(node, known, graph)
        if by_rule:
            record_rule(node, graph, consts, symbolic is not None)
        elif ruled and broadcast_undecided(node, shapes, graph):
            record_broadcast(node, graph, consts)
        if symbolic is not None or any(is_symbolic(c) for c in consts):
            _learn_values(node, graph, known, symbolic)
        else:
            _learn_values(node, graph, known, try_node(node, known, partial))
    if missing and strict:
        raise UnsupportedModelError(missing, where=f"graph {graph.name!r}")
    return known


def result_value(name: str, result: "tuple | Value") -> Value:
    """The Value a shape rule's result gives output `name`: (dtype, shape), or a Value."""
    if isinstance(result, Value):
        return result.with_(name=name)
    dt, shape = result
    return Value(name, None if dt is None else np.dtype(dt), None if shape is None else tuple(shape))


def _learn_values(node: Node, graph: Graph, known: dict[str, np.ndarray], outs: list[np.ndarray] | None) -> None:
    """Keep the small values of an evaluated node (not of a tensor with dynamic dims); a shape
    its rule could not know (NonZero, Unique, ...) is the shape of the value."""
    for name, arr in zip(node.outputs, outs or ()):
        if not name:
            continue
        if is_dynamic(graph.value(name).shape):
            continue  # its value at opt (a Slice of a table up to a dim) holds at opt only
        if not graph.value(name).is_static and not is_dynamic(graph.value(name).shape):
            graph.set_value(Value(name, graph.value(name).dtype or arr.dtype, tuple(arr.shape)))
        if arr.size <= PROPAGATE_MAX_ELEMENTS:
            known[name] = arr


def infer_body(body: Graph, values: Sequence[Any], known: Sequence[np.ndarray | None] = ()) -> list[Value]:
    """Give a control-flow body's inputs the (dtype, shape) or Value of `values` (positional) and
    infer the rest of it; `known` are build-time values of inputs (captured constants) shape
    rules may read (the Graph bodies' inference: polykit.compiler.ops.control.bodies.annotate).
    Returns its outputs."""
    for name, given in zip(body.inputs, values):
        if isinstance(given, Value):  # a sequence or optional: its whole metadata
            body.set_value(given.with_(name=name))
            continue
        dtype, shape = given
        have = body.value(name)
        body.set_value(Value(name, have.dtype if dtype is None else np.dtype(dtype),
                             None if shape is None else tuple(shape)))
    bound = {n: v for n, v in zip(body.inputs, known) if v is not None}
    body.metadata["input_values"] = bound
    infer_shapes(body, strict=True)
    return [body.value(n) for n in body.outputs]


register_body_inference(Graph, infer_body)
