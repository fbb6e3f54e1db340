"""The builder's step for control flow: each If/Loop/Scan body becomes a plan of its own.

After the outer graph is optimized and shape-inferred, every body Graph in a node's attrs is
built by the same Builder for the same target (its inputs' shapes are the ones shape
inference gave it: every one must be static) and replaced by that sub-Plan, so the layer the
node lowers to carries its bodies as plans: optimized (folding, dead code, fusion inside the
body), with tactics chosen and an arena of their own. The runtime runs a sub-plan once per
iteration (polykit.kernels.reference.control_flow on cpu, polykit.kernels.cuda.control_flow).

Captured outer tensors that are constants of the outer graph (after its folding) become
constants of the body before it is built (`inline_constant_captures`): the body's own
inference and folding then see their values (an Unsqueeze whose axes the body reads from
the outer scope gets a static shape), and the layer binds only the captures that vary.

A sub-plan's metadata "body_outputs" lists the body's outputs in order (a plan lists each
output once; a body may return one tensor twice).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from polykit.compiler.config import BuilderConfig
from polykit.compiler.ir import Graph, Node, subgraphs
from polykit.compiler.subgraphs import CAPTURES, captured
from polykit.errors import BuildError

#: configuration a body does not inherit: marking, side files, build-time input values (fixed or opt),
#: profiles (a body plan runs static shapes)
_OWN = {"mark_outputs": (), "mark_all": False, "expose_tensors": (), "tactic_replay": None, "save_tactics": None,
        "save_timing_cache": None, "input_values": {}, "shape_values": {}, "profiles": (), "int8": False, "calibration_data": None,
        "calibration_cache": None, "tensor_ranges": {}, "layer_precisions": {}}


def build_bodies(graph: Graph, cfg: BuilderConfig, target: str) -> None:
    """Replace the body Graphs of `graph`'s control-flow nodes by plans built for `target`."""
    for node in graph.nodes:
        inline_constant_captures(graph, node)
        for key, body in subgraphs(node):
            node.attrs[key] = build_body(body, node, key, cfg, target)


def inline_constant_captures(graph: Graph, node: Node) -> None:
    """Make each captured outer tensor of `node` that is a constant of `graph` a constant of
    every body instead (dropping the node input and the body inputs bound to it)."""
    c = captured(node)
    bodies = [body for _, body in subgraphs(node)]
    if not c or not bodies:
        return
    first = len(node.inputs) - c
    keep = []
    for i, outer in enumerate(node.inputs[first:]):
        slot = len(bodies[0].inputs) - c + i
        names = [body.inputs[slot] for body in bodies]
        if outer in graph.initializers and not any(n in b.outputs for n, b in zip(names, bodies)):
            for name, body in zip(names, bodies):
                body.initializers[name] = graph.initializers[outer]
        else:
            keep.append(i)
    for body in bodies:
        lead = len(body.inputs) - c
        body.inputs = body.inputs[:lead] + [body.inputs[lead + i] for i in keep]
    node.inputs = node.inputs[:first] + [node.inputs[first + i] for i in keep]
    if keep:
        node.attrs[CAPTURES] = len(keep)
    else:
        node.attrs.pop(CAPTURES, None)


def build_body(body: Graph, node: Node, key: str, cfg: BuilderConfig, target: str) -> Any:
    from polykit.compiler.builder import Builder

    shapes = {}
    for name in body.inputs:
        v = body.value(name)
        if not v.is_static:
            raise BuildError(f"{key} input {name!r} has shape {v.shape}: it changes across iterations or depends "
                             "on data, and a body plan runs static shapes", where=node.describe(),
                             hint="a Loop like this is unrolled when the build knows its trip count and its body "
                                  "passes the condition through: make the count a constant or give it in "
                                  "BuilderConfig.input_values (polykit.compiler.passes.unroll_loops); else give the "
                                  "loop-carried values fixed shapes (collect growing results as scan outputs)")
        shapes[name] = tuple(v.shape)
    sub = replace(cfg, target=target, input_shapes=shapes, **_OWN)
    g = body.copy()
    g.metadata.pop("input_values", None)
    try:
        plan = Builder(sub).build(g)
    except BuildError as exc:
        raise BuildError(f"{key}: {exc.what}", where=f"{node.describe()}: {exc.where or key}", hint=exc.hint) from exc
    plan.metadata = {k: v for k, v in plan.metadata.items() if k not in ("builder_config", "source_model")}
    plan.metadata["body_outputs"] = list(body.outputs)
    return plan
