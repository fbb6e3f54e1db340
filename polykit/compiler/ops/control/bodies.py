"""How the control-flow ops (If, Loop, Scan, SequenceMap) reach their bodies.

A body is a Graph (imported models, folding, shape inference) or a Plan (a built control-flow
layer: polykit.compiler.builder.bodies). Importing a body, inferring it and running it are
services of layers above the ops: the ONNX importer turns a GraphProto into a canonical Graph
(`ImportContext.import_graph`), shape inference infers a Graph and the graph evaluator runs
one (compiler.graph), the plan checks a Plan's inputs (compiler.plan) and an engine runs it
(runtime). Those layers register their service here by body type when their module is
imported; the importers, shape rules and reference kernels look it up (the capture
convention itself: polykit.compiler.ir.subgraphs).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Sequence

import numpy as np

from polykit.compiler.ir.graph import Node, Value
from polykit.compiler.ir.subgraphs import CAPTURES, outer_names
from polykit.compiler.ops.registry import ImportContext
from polykit.errors import GraphError, PolykitError

#: a body as a function of its inputs (positional) returning its outputs (positional)
BodyFn = Callable[[Sequence[np.ndarray]], "list[np.ndarray]"]
#: body -> a context manager of its BodyFn (set up once, called per iteration)
BodyRunner = Callable[[Any], ContextManager[BodyFn]]
#: (body, each input's (dtype, shape) or Value, build-time values of inputs) -> its outputs' Values:
#: annotates the body in place (a Graph), or raises ShapeError when it cannot take those inputs
BodyInference = Callable[[Any, Sequence[Any], Sequence["np.ndarray | None"]], "list[Value]"]

#: body type -> its runner (compiler.graph.evaluator: Graph; runtime.engine: Plan)
RUNNERS: dict[type, BodyRunner] = {}
#: body type -> its inference (compiler.graph.infer: Graph; compiler.plan.file: Plan)
INFERENCES: dict[type, BodyInference] = {}


def register_body_runner(kind: type, runner: BodyRunner) -> None:
    RUNNERS[kind] = runner


def register_body_inference(kind: type, inference: BodyInference) -> None:
    INFERENCES[kind] = inference


def _service(table: dict[type, Any], body: Any, what: str) -> Any:
    for kind in type(body).__mro__:
        if kind in table:
            return table[kind]
    raise PolykitError(f"nothing {what} a control-flow body of type {type(body).__name__}",
                       where=f"body {getattr(body, 'name', '')!r}",
                       hint="bodies are Graphs (polykit.compiler.graph registers them) or Plans (polykit.runtime "
                            "and polykit.compiler.plan do); import the layer that handles the body's type")


def body_runner(body: Any) -> ContextManager[BodyFn]:
    """A context manager of the function of the body's inputs (positional) returning its outputs."""
    return _service(RUNNERS, body, "runs")(body)


def annotate(body: Any, values: Sequence[Any], known: Sequence[np.ndarray | None] = ()) -> list[Value]:
    """Give the body's inputs the (dtype, shape) or Value of `values` (positional) and infer the rest of
    the body; `known` are build-time values of inputs (captured constants) shape rules may read.
    Returns the body's outputs, in order. A built body (a Plan) is checked instead: the node must give
    it the inputs it was built for (polykit.compiler.plan.body_inputs)."""
    return _service(INFERENCES, body, "infers")(body, values, known)


def import_bodies(node: Node, keys: Sequence[str], ctx: ImportContext) -> None:
    """Turn the GraphProto attributes `keys` of an imported node into canonical Graphs whose
    outer reads are captured (polykit.compiler.ir.subgraphs); a node imported already is left
    as it is."""
    import onnx

    protos = {k: node.attrs[k] for k in keys if isinstance(node.attrs.get(k), onnx.GraphProto)}
    if not protos:
        return
    missing = [k for k in keys if k not in node.attrs]
    if missing:
        raise GraphError(f"the node has no {missing[0]!r} graph attribute", where=node.describe(),
                         hint="add the body graph (see the ONNX operator spec)")
    proto_node = onnx.NodeProto()
    for key, proto in protos.items():
        proto_node.attribute.append(onnx.helper.make_attribute(key, proto))
    outer = outer_names(proto_node)
    opsets = ctx.graph.opsets
    for key, proto in protos.items():
        body = ctx.import_graph(proto, f"{node.describe()}: {key}", outer)
        body.opsets = dict(opsets)
        node.attrs[key] = body
    node.inputs = list(node.inputs) + outer
    if outer:
        node.attrs[CAPTURES] = len(outer)

