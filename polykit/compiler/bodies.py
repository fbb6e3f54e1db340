"""The builder's step for control flow: each If/Loop/Scan body becomes a plan of its own.

After the outer graph is optimized and shape-inferred, every body Graph in a node's attrs is
built by the same Builder for the same target (its inputs' shapes are the ones shape
inference gave it: every one must be static) and replaced by that sub-Plan, so the layer the
node lowers to carries its bodies as plans: optimized (folding, dead code, fusion inside the
body), with tactics chosen and an arena of their own. The runtime runs a sub-plan once per
iteration (polykit.kernels.reference.control_flow on cpu, polykit.kernels.cuda.control_flow).

A sub-plan's metadata "body_outputs" lists the body's outputs in order (a plan lists each
output once; a body may return one tensor twice).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from polykit.compiler.config import BuilderConfig
from polykit.compiler.ir import Graph, Node, subgraphs
from polykit.errors import BuildError

#: configuration a body does not inherit: marking, side files, build-time input values
_OWN = {"mark_outputs": (), "mark_all": False, "expose_tensors": (), "tactic_replay": None, "save_tactics": None,
        "save_timing_cache": None, "input_values": {}, "int8": False, "calibration_data": None,
        "calibration_cache": None, "tensor_ranges": {}, "layer_precisions": {}}


def build_bodies(graph: Graph, cfg: BuilderConfig, target: str) -> None:
    """Replace the body Graphs of `graph`'s control-flow nodes by plans built for `target`."""
    for node in graph.nodes:
        for key, body in subgraphs(node):
            node.attrs[key] = build_body(body, node, key, cfg, target)


def build_body(body: Graph, node: Node, key: str, cfg: BuilderConfig, target: str) -> Any:
    from polykit.compiler.builder import Builder

    shapes = {}
    for name in body.inputs:
        v = body.value(name)
        if not v.is_static:
            raise BuildError(f"{key} input {name!r} has shape {v.shape}: it changes across iterations or depends "
                             "on data, and a body plan runs static shapes", where=node.describe(),
                             hint="give the loop-carried values fixed shapes (collect growing results as scan "
                                  "outputs), or run the model with `polykit run --onnxrt`")
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
