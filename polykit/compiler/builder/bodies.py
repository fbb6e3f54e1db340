"""The builder's step for control flow: each If/Loop/Scan body becomes a plan of its own.

After the outer graph is optimized and shape-inferred, every body Graph in a node's attrs is
built by the same Builder for the same target (its inputs' shapes are the ones shape
inference gave it) and replaced by that sub-Plan, so the layer the
node lowers to carries its bodies as plans: optimized (folding, dead code, fusion inside the
body), with tactics chosen and an arena of their own. The runtime runs a sub-plan once per
iteration (polykit.compiler.ops.control.control_flow_reference on cpu, polykit.kernels.cuda.models.control_flow).

Captured outer tensors that are constants of the outer graph (after its folding) become
constants of the body before it is built (`inline_constant_captures`): the body's own
inference and folding then see their values (an Unsqueeze whose axes the body reads from
the outer scope gets a static shape), and the layer binds only the captures that vary.

A body input whose shape changes across iterations (a Loop-carried y = y_in + x[i:i+1], a growing
history) makes the body plan one for a profile (`body_profile`): each such dim a symbol over [0, a
bound], the iteration number a ruled value, so the shapes it decides are the ops' rules' at bind time
(polykit.compiler.graph.shape_rules) and the context binds each iteration's shapes when it runs; the Loop's
outputs of those shapes are sized at run time (polykit.compiler.ops.control.control_flow). Such a Loop body
runs on cpu and on cuda (polykit.kernels.cuda.models.control_flow binds each iteration), an If branch of
run-time shapes too (bound once per run); Scan bodies of run-time shapes run on cpu only.

A sub-plan's metadata "body_outputs" lists the body's outputs in order (a plan lists each
output once; a body may return one tensor twice).
"""

from __future__ import annotations

from dataclasses import replace
import math
from typing import Any, Mapping

import numpy as np

from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import Graph, Node, subgraphs
from polykit.compiler.ir.symbolic import SymInt
from polykit.compiler.ir.subgraphs import CAPTURES, captured
from polykit.compiler.plan.profiles import BODY_PROFILE
from polykit.errors import BuildError

#: configuration a body does not inherit: marking, side files, build-time input values (fixed or opt),
#: profiles (a body plan runs static shapes)
_OWN = {"mark_outputs": (), "mark_all": False, "expose_tensors": (), "force_marks": False, "tactic_replay": None, "save_tactics": None,
        "save_timing_cache": None, "input_values": {}, "shape_values": {}, "profiles": (), "int8": False, "fp8": False, "calibration_data": None,
        "calibration_cache": None, "tensor_ranges": {}, "layer_precisions": {}}


def build_bodies(graph: Graph, cfg: BuilderConfig, target: str) -> None:
    """Replace the body Graphs of `graph`'s control-flow nodes by plans built for `target`."""
    for node in graph.nodes:
        inline_constant_captures(graph, node)
        for key, body in subgraphs(node):
            node.attrs[key] = build_body(body, node, key, cfg, target, _first_shapes(graph, node, body))


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


def build_body(body: Graph, node: Node, key: str, cfg: BuilderConfig, target: str,
               firsts: Mapping[str, tuple] | None = None) -> Any:
    from polykit.compiler.builder.builder import Builder

    g = body.copy()
    shapes, profiles = body_profile(g, node, key, firsts or {})
    sub = replace(cfg, target=target, input_shapes=shapes, **{**_OWN, "profiles": profiles})
    g.metadata.pop("input_values", None)
    if profiles:
        g.metadata[BODY_PROFILE] = True
    try:
        plan = Builder(sub).build(g)
    except BuildError as exc:
        raise BuildError(f"{key}: {exc.what}", where=f"{node.describe()}: {exc.where or key}", hint=exc.hint) from exc
    plan.metadata = {k: v for k, v in plan.metadata.items() if k not in ("builder_config", "source_model")}
    plan.metadata["body_outputs"] = list(body.outputs)
    return plan


def body_profile(body: Graph, node: Node, key: str,
                 firsts: Mapping[str, tuple]) -> tuple[dict[str, tuple[int, ...]], tuple]:
    """The body's static input shapes, and, when some input's shape changes across iterations, the
    one profile its plan is built for: each such dim a symbol over [0, its bound] (opt: the size the
    first iteration sees, or 1), and the iteration number (a Loop body's first input) a ruled value
    (polykit.compiler.builder.value_ranges), so the shapes it decides (x[i:i+1]) are computed per iteration
    by the ops' rules at bind time (polykit.compiler.graph.shape_rules)."""
    from polykit.compiler.plan.profiles import Profile
    from polykit.compiler.builder.value_ranges import ruled_profile

    static, varying = {}, {}
    for name in body.inputs:
        v = body.value(name)
        if v.shape is None:
            raise BuildError(f"{key} input {name!r} has no known rank", where=node.describe(),
                             hint="give the loop-carried values a fixed rank")
        if v.is_static:
            static[name] = tuple(v.shape)
            continue
        first = firsts.get(name)
        opt = tuple(d if _fixed(d) else (first[a] if first else 1) for a, d in enumerate(v.shape))
        bound = _dim_bound(v.shape)
        varying[name] = (tuple(d if _fixed(d) else 0 for d in v.shape), opt,
                         tuple(d if _fixed(d) else max(bound, o) for d, o in zip(v.shape, opt)))
    if not varying:
        return static, ()
    varying = _share_outer_dims(body, varying)
    values = {body.inputs[0]: np.zeros(static.get(body.inputs[0], ()), np.int64)} if node.op_type == "Loop" else {}
    ruled = ruled_profile(body, {**static, **{n: t[1] for n, t in varying.items()}}, values)
    if ruled is None:
        return static, (Profile(varying),)
    return static, (Profile(varying, ruled.values, ruled.ruled),)


#: the most elements a body input whose shape changes across iterations may reach: each varying dim
#: ranges up to what keeps the input within it (a body plan's arena is planned for its profile's max)
BODY_INPUT_ELEMENTS = 1 << 20


def _fixed(d: Any) -> bool:
    """A static dim (a SymInt, an outer dim's expression, varies)."""
    return isinstance(d, int) and not isinstance(d, SymInt)


def _dim_bound(shape: tuple) -> int:
    fixed = math.prod(d for d in shape if _fixed(d)) or 1
    free = sum(1 for d in shape if not _fixed(d))
    return max(int((BODY_INPUT_ELEMENTS // fixed) ** (1.0 / free)), 1)


def _share_outer_dims(body: Graph, varying: dict[str, tuple]) -> dict[str, tuple]:
    """The body inputs' (min, opt, max) with the dims that one outer dim decides (`_outer_dim`: one
    expression, or one named dim such as the count of a NonZero whose input size the build does not
    know) alike, so the body's profile gives them one symbol (equal at run time, they broadcast
    together) over the narrowest of their ranges: each input's bound is one the count keeps within
    (a dim is compared by what decides it, never by the bound each input's budget gave it)."""
    names: dict[object, str] = {}  # outer dim -> the symbol of the dims it decides
    dims: dict[str, list[tuple[str, int]]] = {}
    for name, (low, opt, high) in varying.items():
        for axis, d in enumerate(body.value(name).shape):
            key = _outer_dim(d)
            if key is not None:
                sym = names.setdefault(key, d if isinstance(d, str) else f"{name}[{axis}]")
                dims.setdefault(sym, []).append((name, axis))
    out = {name: [list(s) for s in triple] for name, triple in varying.items()}
    for sym, places in dims.items():
        high = min(varying[n][2][a] for n, a in places)
        opt = min(high, varying[places[0][0]][1][places[0][1]])
        for name, axis in places:
            out[name][1][axis], out[name][2][axis] = opt, high
            v = body.value(name)
            body.set_value(v.with_(shape=tuple(sym if k == axis else d for k, d in enumerate(v.shape))))
    return {name: tuple(tuple(s) for s in triple) for name, triple in out.items()}


def _outer_dim(d: Any) -> object:
    """What decides body input dim `d` in the outer graph: its expression (a SymInt), its name (a
    named dim: a filtered count whose bound the build does not know), or None (unknown)."""
    if isinstance(d, SymInt):
        return ("expr", str(d.expr))
    if isinstance(d, str) and d:
        return ("name", d)
    return None


def _first_shapes(graph: Graph, node: Node, body: Graph) -> dict[str, tuple]:
    """{body input: the static shape of the outer value bound to it at the first iteration} (a Loop's
    initial state: body input i >= 2 takes node input i)."""
    if node.op_type != "Loop":
        return {}
    out = {}
    for name, outer in zip(body.inputs[2:], node.inputs[2:]):
        shape = graph.value(outer).shape if outer else None
        if shape is not None and all(isinstance(d, int) for d in shape):
            out[name] = tuple(int(d) for d in shape)
    return out
