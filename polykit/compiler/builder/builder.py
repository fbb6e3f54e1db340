"""The builder: Graph -> Plan (TensorRT's model: optimize, lower, pick tactics, plan memory).

Pipeline: copy the graph -> apply input shapes (every input must end up static) ->
infer shapes -> mark forced outputs -> INT8 scales (calibration, polykit.compiler.builder.quantize) ->
optimizer passes (folding, fusion, quantization; forced outputs kept) -> lower to layers ->
select a tactic per layer -> expose observed tensors that lie between layers
(polykit.compiler.builder.marking) -> plan the activation arena -> Plan. The plan's tensors
(their descriptions, the layers stamped with them, their places in memory) are
polykit.compiler.builder.plan_tensors' job.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

import polykit
from polykit.compiler.builder.bodies import build_bodies
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ops.data_dims import DATA_DIMS, bound_order, data_symbols, refuse_sized_target, sized_symbols, \
    with_data
from polykit.compiler.graph.shape_rules import RULED, RULES, refuse_ruled_target, with_rule_symbols
from polykit.compiler.builder.distributed import distribute
from polykit.compiler.builder.layer_precision import round_tf32_weights
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import Graph, Value, has_subgraphs
from polykit.compiler.builder.lower import Lowered, lower
from polykit.compiler.builder.marking import expose, forced_outputs, observed_tensors
from polykit.compiler.builder.concat_placement import place_concat_inputs
from polykit.compiler.builder.plan_tensors import assign_memory, describe_tensors, device_memory, stamp_layer
from polykit.compiler.passes.control.inline_if import inline_known_ifs
from polykit.compiler.passes.control.resolve_sequences import resolve_sequences, touches_sequences
from polykit.compiler.plan.compatibility import Compatibility
from polykit.compiler.passes.io_formats import formats_by_name
from polykit.compiler.plan.file import Plan, check_memory
from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.kernels.profile_tactics import ProfileShapes, pick_tactics, profile_groups, profile_views, recorded, \
    touches
from polykit.compiler.plan.profiles import ProfileSet, apply_profiles, check_corners, profile_set
from polykit.compiler.plan.witnesses import Witnesses
from polykit.compiler.graph.shape_values import host_values
from polykit.compiler.builder.quantize import Int8Setup, plan_int8
from polykit.compiler.builder.sparsity import offer_sparse, settle_sparse
from polykit.compiler.builder.tactic_replay import TacticReplay, load_replay, save_replay
from polykit.compiler.builder.value_ranges import derive_profiles
from polykit.errors import BuildError, PolykitError, UsageError

log = logging.getLogger("polykit")


class Builder:
    """Builds Plans from Graphs with one BuilderConfig."""

    def __init__(self, config: BuilderConfig | None = None):
        self.config = config or BuilderConfig()

    def build(self, graph: Graph) -> Plan:
        cfg = self.config
        if cfg.refittable and any(has_subgraphs(n) for n in graph.nodes):
            raise BuildError("a model with control flow (If, Loop, Scan) cannot be built refittable: its bodies "
                             "are plans of their own", where=f"graph {graph.name!r}", hint="build without --refittable")
        front = self.prepare(graph)
        target, g, lowered, tensors, profiles = front.target, front.graph, front.lowered, front.tensors, front.profiles
        marked, observed, sequence_io = front.marked, front.observed, front.sequence_io
        groups = profile_groups(profiles)
        if cfg.sparsity != "disable":  # eligible layers get a sparse candidate (polykit.compiler.builder.sparsity)
            lowered.layers, lowered.weights, tensors = offer_sparse(lowered.layers, lowered.weights, tensors,
                                                                    cfg.sparsity, profiles=len(groups))
        selection = select_tactics(lowered.layers, target, cfg, tensors, lowered.weights, groups)
        layers = selection.layers
        if cfg.sparsity != "disable":
            layers, lowered.weights, tensors = settle_sparse(layers, lowered.weights, tensors)
        weights = round_tf32_weights(layers, lowered.weights)
        inputs = list(g.inputs)
        exposure = expose(observed, layers, {n: t.shape for n, t in tensors.items()})
        marked += exposure.exposed
        outputs = list(dict.fromkeys(list(g.outputs) + list(exposure.exposed)))
        tensors = {n: replace(t, kind="output") if n in exposure.exposed else t for n, t in tensors.items()}
        # a version-compatible plan places nothing: an older polykit, which does not know
        # memory.placements, may load it (docs/ARCHITECTURE.md, "Concat by placement")
        placements = {} if cfg.version_compatible else place_concat_inputs(layers, tensors, target,
                                                                             keep=inputs + outputs)
        tensors, memory = assign_memory(layers, tensors, inputs, outputs, cfg.memory_strategy, placements)
        metadata: dict[str, Any] = {
            "polykit_version": polykit.__version__,
            "source_model": graph.name,
            "builder_config": cfg.to_json(),
            "tactics": {layer.name: layer.tactic for layer in layers},
            "marked_outputs": [o for o in outputs if o in marked],
            "tuning": selection.tuning,
            "workspace": {"sm_count": selection.sm_count, "layers": selection.workspace},
            "device_memory": device_memory(memory.arena_bytes, weights, selection.workspace),
        }
        metadata.update(front.distributed)
        if observed:
            metadata["fused_away"] = list(exposure.fused_away)
        if sequence_io is not None:
            metadata["sequence_io"] = sequence_io
        if cfg.input_values:
            metadata["input_values"] = cfg.to_json()["input_values"]
        if selection.kernels:
            from polykit.kernels.cuda.base import pack_kernel_table

            metadata["kernels"] = pack_kernel_table(selection.kernels, layers)
        plan = Plan(target=target, layers=layers, tensors=tensors, inputs=inputs, outputs=outputs,
                    weights=weights, memory=memory, metadata=metadata, gpu_arch=target_arch(target, cfg.device),
                    profiles=profiles, compatibility=compatibility_record(target, cfg, layers))
        check_memory(plan, f"model {graph.name!r}", BuildError)  # before anything runs it or saves it
        if cfg.refittable:  # how a refit re-derives the weights (polykit.compiler.builder.refit)
            from polykit.compiler.builder.refit import refit_record

            plan.metadata["refit"] = refit_record(graph, plan)
        if cfg.weight_streaming:  # which weights each layer reads (polykit.runtime.weight_streaming)
            from polykit.runtime.weight_streaming import RECORD_KEY, streaming_record

            plan.metadata[RECORD_KEY] = streaming_record(plan.layers, plan.tensors)
        if cfg.save_tactics is not None:
            save_replay(cfg.save_tactics, TacticReplay.from_layers(layers))
        log.debug("built %r", plan)
        return plan

    def prepare(self, graph: Graph) -> "Front":
        """Everything a build decides before tactics: shapes and profiles applied, the graph
        optimized and lowered, its tensors described (what a refit re-derives weights by)."""
        cfg = self.config
        target = resolve_target(cfg.target)
        if cfg.device is not None and target != "cuda":
            raise UsageError(f"device {cfg.device} was asked for, but the {target} target has no devices to pick",
                             hint="drop --device, or build for --target cuda")
        g = graph.copy()
        sequence_io = resolve_sequences(g, cfg.input_shapes, cfg.input_values) if touches_sequences(g) else None
        # shape-tensor inputs without values range over what the model allows (BuilderConfig.shape_values)
        given = derive_profiles(g, cfg.profiles, cfg.input_shapes, cfg.shape_values, cfg.input_values)
        profiles = profile_set(g, given, cfg.input_shapes) if given else None
        if profiles is not None:
            apply_profiles(g, profiles, given, cfg.input_shapes)
        named = {n for p in given for n in p.shapes}
        apply_input_shapes(g, {n: s for n, s in cfg.input_shapes.items() if n not in named},
                           dynamic=profiles is not None)
        apply_input_values(g, cfg.input_values)
        g.metadata[DATA_DIMS] = True
        if profiles is not None and profiles.ruled:
            g.metadata[RULED] = set(profiles.ruled)
            inline_known_ifs(g)  # their branches' rules read the ruled values a capture carries
        known = infer_shapes(g)
        distributed = distribute(g, cfg)
        known = infer_shapes(g) if distributed else known
        data = data_symbols(g)
        if data:  # output sizes the input values decide: bound at run time
            profiles = replace(profiles or ProfileSet.static(g), data=data, sized=sized_symbols(g))
            refuse_sized_target(profiles.sized, target)
        if g.metadata.get(RULES):  # shapes the shape-tensor values decide: their rules run at bind time
            profiles = replace(profiles, rules=tuple(g.metadata[RULES]))
            refuse_ruled_target(target)
        corners = [env for _, _, env in profiles.corners()] if profiles is not None else []
        if given:
            check_corners(graph, g, profiles, g.metadata.get("input_values", {}), host_values(known, g.inputs))
        marked = forced_outputs(g, cfg)
        observed = observed_tensors(g, cfg)
        g.outputs = list(dict.fromkeys(list(g.outputs) + marked))
        g, lowered, tensors = optimize_and_lower(g, cfg, target, plan_int8(g, cfg, target, graph if profiles is not None else None),
                                               corners)
        if g.metadata.get(RULES):  # the optimized graph's records: a pass may have renamed a ruled node's outputs
            profiles = replace(profiles, rules=tuple(g.metadata[RULES]))
        if data:  # the optimized graph's data symbols: a pass may have renamed their outputs (an Identity after NonZero)
            profiles = replace(profiles, data=data_symbols(g), sized=sized_symbols(g))
        return Front(target, g, lowered, tensors, profiles, marked, observed, sequence_io, distributed)


def live_layers(layers: list[LayerDesc], outputs: Sequence[str]) -> list[LayerDesc]:
    """`layers` without those whose outputs nothing reads: once the shape layers the engine computes
    on the host are gone, what only they read (an index arithmetic whose Shape alone is used) goes too."""
    live, kept = set(outputs), []
    for layer in reversed(layers):
        if any(o in live for o in layer.outputs if o):
            kept.append(layer)
            live.update(n for n in layer.inputs if n)
    return kept[::-1]


def build_plan(model: Any, config: BuilderConfig | None = None) -> Plan:
    """Build a Plan from a model path, an onnx.ModelProto or a polykit Graph."""
    if isinstance(model, Graph):
        graph = model
    else:
        from polykit.compiler.graph.onnx_import import load_onnx

        graph = load_onnx(model)
    return Builder(config).build(graph)


# ---- steps -------------------------------------------------------------------------------
#: conv classes (polykit.compiler.passes.channels_last.conv_class) a channels-last build of a target
#: runs NHWC: those its ConvNHWC tactics serve at least as well as its NCHW ones. The cuda target
#: has NHWC kernels for dense (conv_nhwc, conv_sm90), depthwise (conv_depthwise) and grouped convs
#: (conv_grouped: float32, float16 and bfloat16 storage), so a ResNeXt or RegNet plan keeps no
#: Transposes around its grouped convs. The cpu runs every ConvNHWC (the reference kernel).
NHWC_CONV_CLASSES = {"cuda": ("dense", "depthwise", "grouped"), "cpu": ("dense", "depthwise", "grouped")}


def nhwc_conv_classes(target: str) -> tuple[str, ...]:
    """The conv classes a channels-last build for `target` converts (NHWC_CONV_CLASSES; dense and
    depthwise for a target not listed)."""
    return NHWC_CONV_CLASSES.get(target, ("dense", "depthwise"))


def conv_pixels(graph: Graph) -> list[int]:
    """The output pixels of each 2-D Conv (N * OH * OW), 1-D Conv (N * L', which to_channels_last
    runs as a 2-D ConvNHWC of height 1) and 3-D Conv (N * OD * OH * OW: the 2-D ConvNHWC of its stacked
    depth taps) whose output shape is known: channels_last_for's measure."""
    out = []
    for node in graph.nodes:
        if node.op_type == "Conv" and node.outputs:
            shape = graph.value(node.outputs[0]).shape
            if shape is not None and len(shape) in (3, 4, 5) and all(isinstance(d, int) for d in shape):
                out.append(shape[0] * int(np.prod(shape[2:])))
    return out


def resolve_target(target: str | None) -> str:
    from polykit.runtime.target import TARGETS, default_target

    name = target or default_target()
    if name not in TARGETS:
        raise UsageError(f"unknown target {name!r}", hint=f"use one of: {', '.join(sorted(TARGETS))}")
    return name


def build_device(target: str, device: int | None = None) -> Any:
    """The device a build times on and sizes workspaces for (GPU `device`, default 0; None for
    cuda without a usable GPU)."""
    from polykit.runtime.target import get_target

    try:
        return get_target(target, device).device()
    except Exception:  # no usable device: arch-specific tactics and split-K workspaces are left out
        return None


def compatibility_record(target: str, cfg: BuilderConfig, layers: Sequence[LayerDesc]) -> Compatibility:
    """The plan's compatibility record: this polykit and its tactic set, the build's promises, and
    (version-compatible) the revision of every tactic the layers use, every profile's."""
    from polykit.kernels.tactics import find_tactic, tactic_set

    tactics: dict[str, int] = {}
    if cfg.version_compatible:
        for layer in layers:
            for name in (layer.tactic, *layer.profile_tactics):
                tactic = find_tactic(target, layer.kind, name)
                if tactic is not None:
                    tactics[name] = tactic.revision
    return Compatibility(polykit.__version__, tactic_set(target), cfg.version_compatible,
                         cfg.hardware_compatibility_level, tactics)


def target_arch(target: str, ordinal: int | None = None) -> str:
    """The GPU architecture a plan is built for ("" off-GPU or without a usable GPU)."""
    device = build_device(target, ordinal) if target != "cpu" else None
    return device.arch if device is not None else ""


def apply_input_shapes(g: Graph, shapes: dict[str, tuple[int, ...]], dynamic: bool = False) -> None:
    """Give inputs their concrete shapes; BuildError if an input stays dynamic (unless
    `dynamic`: a build for profiles, whose inputs have SymInt dims)."""
    for name, shape in shapes.items():
        if name not in g.inputs:
            raise BuildError(f"input_shapes names {name!r}, which is not a graph input",
                             where=f"graph {g.name!r}", hint=f"graph inputs are: {', '.join(g.inputs)}")
        old = g.value(name)
        if old.shape is not None:
            if len(old.shape) != len(shape):
                raise BuildError(f"input {name!r} has rank {len(old.shape)} ({_fmt(old.shape)}), "
                                 f"the given shape {_fmt(shape)} has rank {len(shape)}", where=f"graph {g.name!r}")
            for have, want in zip(old.shape, shape):
                if isinstance(have, int) and have != want:
                    raise BuildError(f"input {name!r} has static shape {_fmt(old.shape)}; cannot override it "
                                     f"with {_fmt(shape)}", where=f"graph {g.name!r}")
        g.set_value(Value(name, old.dtype, tuple(shape)))
    for name in g.inputs:
        v = g.value(name)
        if v.dtype is None:
            raise BuildError(f"input {name!r} has no known element type", where=f"graph {g.name!r}",
                             hint="give the input a tensor type in the model")
        if not v.is_static and not (dynamic and v.shape is not None and all(isinstance(d, int) for d in v.shape)):
            raise BuildError(
                f"input {name!r} has dynamic shape {_fmt(v.shape)}; plans are built for concrete shapes",
                where=f"graph {g.name!r}",
                hint=f"pass --input-shapes {name}:[...] (BuilderConfig(input_shapes={{{name!r}: (...)}}))",
            )


def apply_input_values(g: Graph, values: dict[str, np.ndarray]) -> None:
    """Record build-time input values where shape inference reads them (graph.metadata)."""
    for name, arr in values.items():
        v = g.value(name)
        if name not in g.inputs:
            raise BuildError(f"input_values names {name!r}, which is not a graph input", where=f"graph {g.name!r}",
                             hint=f"graph inputs are: {', '.join(g.inputs)}")
        if v.dtype is not None and np.dtype(v.dtype) != arr.dtype or tuple(v.shape or ()) != arr.shape:
            raise BuildError(f"the value given for input {name!r} is {arr.dtype.name}{list(arr.shape)}, the input is "
                             f"{np.dtype(v.dtype).name if v.dtype is not None else '?'}{_fmt(v.shape)}",
                             where=f"graph {g.name!r}", hint="give a value of the input's dtype and shape")
    taken = set(values) & set(g.metadata.get("input_values", {}))
    if taken:
        raise BuildError(f"input {sorted(taken)[0]!r} has both input_values and profile values", where=f"graph {g.name!r}",
                         hint="give a shape-tensor input one value (input_values) or a range (profiles), not both")
    if values:
        g.metadata.setdefault("input_values", {}).update(values)


def run_passes(g: Graph, cfg: BuilderConfig, keep: list[str], target: str, fp32_nodes: tuple[str, ...] = (),
               int8: Int8Setup = Int8Setup(), int8_unfolded: tuple[str, ...] = ()) -> Graph:
    """The optimizer (polykit.compiler.passes.optimize) when it is installed; the optimized graph.

    `fp32_nodes`: nodes whose tensors stay float32 in an fp16/bf16 build, besides those the
    config pins (fp32_layers, layer_precisions fp32/tf32). `int8`: what is quantized (not the nodes
    layer_precisions names, whatever float precision it gives them);
    `int8_unfolded`: quantized ops no INT8 tactic runs (their Q/DQ run as layers, the op in float)."""
    try:
        from polykit.compiler.passes import optimize
    except ImportError:
        log.debug("polykit.compiler.passes.optimize not available; building without passes")
        return g
    reduced = not cfg.strongly_typed and (cfg.fp16 or cfg.bf16)
    pinned = tuple(cfg.fp32_layers) + tuple(n for n, p in cfg.layer_precisions.items() if p in ("fp32", "tf32"))
    offered = {"keep": keep, "fold": cfg.fold_constants, "fold_constants": cfg.fold_constants, "fuse": cfg.fuse,
               "config": cfg, "fp16": reduced and cfg.fp16, "bf16": reduced and cfg.bf16 and not cfg.fp16,
               "fp32_layers": pinned + tuple(fp32_nodes),
               "channels_last": cfg.channels_last_for(target, conv_pixels(g), int8.layers),
               "channels_last_convs": nhwc_conv_classes(target),
               "int8": int8.fold, "int8_scales": dict(int8.scales), "int8_unfolded": int8_unfolded,
               "weight_only": int8.weight_only, "fp8": int8.fp8,
               # a node given any float precision runs in it, not quantized (TensorRT's per-layer precision)
               "unquantized": tuple(cfg.layer_precisions),
               "io_formats": {**formats_by_name(cfg.input_io_formats, g.inputs, "input"),
                              **formats_by_name(cfg.output_io_formats, g.outputs, "output")}}
    params = inspect.signature(optimize).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        kwargs = offered
    else:
        kwargs = {k: v for k, v in offered.items() if k in params}
    result = optimize(g, **kwargs)
    return result if isinstance(result, Graph) else g


#: most rebuilds of the graph with half layers that have no tactic pinned to float32
MAX_PRECISION_ROUNDS = 4


def optimize_and_lower(g: Graph, cfg: BuilderConfig, target: str, int8: Int8Setup = Int8Setup(),
                       corners: Sequence[Mapping[str, int]] = ()) -> tuple[Graph, Lowered, dict[str, TensorDesc]]:
    """Optimize, lower and describe the graph's tensors. In an fp16/bf16 build, layers whose
    half storage no tactic of the target runs fall back to float32 (their nodes are pinned and
    the graph optimized again), unless precision constraints are "obey": then a BuildError.
    INT8 layers no tactic runs (shapes a target's kernels refuse) are left unfolded: they stay
    quantized (the Q/DQ a model carries or insert_qdq makes) and run as Q and DQ layers with the
    op in float32, with a logged warning, so they compute what the INT8 layer would. So do
    WeightOnlyMatMul layers no tactic runs (their weight is then dequantized at build time), and the
    LayerNormQuantize / AttentionQuantize layers no tactic runs (their producer and QuantizeLinear stay layers)."""
    from polykit.compiler.builder.layer_precision import has_tactic
    from polykit.compiler.plan.records import storage_precision
    from polykit.compiler.ops.quant.int8 import is_int8_layer
    from polykit.compiler.ops.quant.output_quantize import is_quantized_output
    from polykit.compiler.ops.quant.weight_only import is_weight_only

    fp32_nodes: tuple[str, ...] = ()
    unfolded: tuple[str, ...] = ()
    keep = list(g.outputs)
    # the build's GPU: which arch-specific tactics run half, INT8, FP8 and weight-only layers
    device = build_device(target, cfg.device) if target != "cpu" else None
    arch = cfg.tactic_arch(device.arch) if device is not None else ("" if target != "cpu" else None)
    for _ in range(MAX_PRECISION_ROUNDS):
        optimized = run_passes(g, cfg, keep, target, fp32_nodes, int8, unfolded)
        known = infer_shapes(optimized, strict=False)
        host = host_values(known, optimized.inputs)
        data = data_symbols(optimized)  # named after the optimized graph's tensors: a pass may have renamed them
        corners = [with_data(env, data) for env in with_rule_symbols(corners, optimized.metadata.get(RULES, ()))]
        build_bodies(optimized, cfg, target)
        lowered = lower(optimized)
        if host:  # shape tensors the engine writes: their layers, and weights only they read, go
            lowered.layers = live_layers([l for l in lowered.layers if not all(o in host for o in l.outputs if o)],
                                         optimized.outputs)
            read = {n for l in lowered.layers for n in l.inputs} | set(optimized.outputs)
            lowered.weights = {n: w for n, w in lowered.weights.items() if n in read}
        tensors = describe_tensors(optimized, lowered, corners, host, known,
                                   {s: data[s] for s in bound_order(data)})
        lowered.layers = [stamp_layer(layer, tensors) for layer in lowered.layers]
        unrun = [l for l in lowered.layers if (is_int8_layer(l) or is_weight_only(l) or is_quantized_output(l))
                 and not has_tactic(l, target, arch)]
        if unrun and not {l.name for l in unrun} <= set(unfolded):
            families = sorted({"INT8" if is_int8_layer(l) else "weight-only" if is_weight_only(l)
                               else "quantized-output" for l in unrun})
            log.warning("no %s %s tactic runs %s; they run in float (their Q/DQ as written)", target, " or ".join(families),
                        ", ".join(f"{l.name!r} ({l.kind} {_fmt(l.in_shapes[2 if is_int8_layer(l) else 1])})"
                                  for l in unrun[:5]))
            unfolded += tuple(l.name for l in unrun)
            continue
        if cfg.strongly_typed or not (cfg.fp16 or cfg.bf16):
            break
        stranded = [l for l in lowered.layers if storage_precision(l) != "fp32" and not has_tactic(l, target, arch)]
        if not stranded:
            break
        names = ", ".join(f"{l.name!r} ({l.kind}, {storage_precision(l)})" for l in stranded[:5])
        if cfg.precision_constraints == "obey":
            raise BuildError(f"no {target} tactic runs these layers in their reduced precision: {names}",
                             hint="use --precision-constraints prefer (they fall back to fp32) or --target cpu")
        log.warning("no %s tactic runs %s in reduced precision; those layers fall back to fp32", target, names)
        pinned = tuple(n for l in stranded for n in l.fused_nodes)
        if set(pinned) <= set(fp32_nodes):
            break
        fp32_nodes += pinned
    return optimized, lowered, tensors


@dataclass
class Front:
    """What Builder.prepare decided: the target, the optimized graph, its layers and weights
    (lowered, layers not yet given tactics), the tensors, the profiles, the outputs marked and
    observed, the sequence I/O layout and the tensor-parallel record."""

    target: str
    graph: Graph
    lowered: Lowered
    tensors: dict[str, TensorDesc]
    profiles: ProfileSet | None
    marked: list[str]
    observed: Any
    sequence_io: Any
    distributed: dict[str, Any]


@dataclass
class Selection:
    """What select_tactics decided: layers with tactics, cuda kernels per layer, workspace
    bytes per layer (non-zero only) for devices with `sm_count` SMs, the tuning record."""

    layers: list[LayerDesc]
    kernels: dict[str, list]
    workspace: dict[str, int]
    sm_count: int
    tuning: dict[str, Any]


def select_tactics(layers: list[LayerDesc], target: str, cfg: BuilderConfig, tensors: dict[str, TensorDesc],
                   weights: dict[str, np.ndarray] | None = None,
                   groups: Sequence[Sequence[Mapping[str, int]]] = (), untimed: list | None = None) -> Selection:
    """Pick a tactic for every layer: the replay's choice, else the tuner's among the candidates
    (those that serve the layer at every profile corner where its shapes are dynamic); with
    several profiles (`groups`: each one's corners, profile_tactics.profile_groups), a layer whose
    shapes they change gets a tactic per profile (polykit.kernels.profile_tactics).
    With an `untimed` list nothing is timed or compiled: each layer takes its first candidate by
    priority and the list receives the kernels of the candidates the tuner would have timed
    (compile_candidates)."""
    from polykit.compiler.builder.tuner import Tuner, candidate_pairs, progress_bar, workspace_over

    replay = load_replay(cfg.tactic_replay)
    replay.check_layers(layers, max(len(groups), 1))
    device = build_device(target, cfg.device) if target != "cpu" else None
    arch, sm_count = (cfg.tactic_arch(device.arch), device.sm_count) if device is not None else ("", 0)
    tuner = Tuner(target, cfg, tensors, weights or {})
    every, views = profile_views(tensors, groups)
    searches = {id(view): Witnesses(tensors, view.envs) for view in (every, *views)}
    witnessed: dict[tuple[int, str], tuple] = {}

    def corners_of(layer: LayerDesc, view: ProfileShapes) -> tuple:
        """The profile's corners and the layer's witness points in it (polykit.compiler.plan.witnesses)."""
        key = (id(view), layer.name)
        if key not in witnessed:
            witnessed[key] = searches[id(view)].corners(layer) if touches(layer, view.opt) else ()
        return view.corners + witnessed[key]

    def candidates_at(layer: LayerDesc, view: ProfileShapes) -> list:
        return candidate_pairs(layer, target, cfg, tensors, arch, sm_count, corners_of(layer, view), view.generic)

    def choose(layer: LayerDesc, pairs: list, view: ProfileShapes) -> Any:
        return tuner.choose(layer, pairs, {**tensors, **view.opt}) if untimed is None else pairs[0]

    def forced(layer: LayerDesc, profile: int) -> Any:
        tactic = replay.forced_tactic(layer, target, profile)
        if tactic is None:
            return None
        if profile == 0:  # the layer at the first precision the tactic supports
            return _replayed(layer, target, cfg, tactic, replay)
        if not tactic.supports(layer):  # later profiles: at profile 0's precision
            raise replay.unsupported(layer, target, profile)
        return layer, tactic

    layers = [stamp_layer(layer, tensors) if not layer.in_dtypes and layer.inputs else layer for layer in layers]
    if target != "cpu" and not replay.layers and len(views) < 2:
        jobs = _candidates_or_none(layers, lambda layer: candidates_at(layer, every))
        if untimed is None:
            tuner.prefetch(jobs)
        else:
            untimed += tuner.kernel_sources(jobs)
    chosen: list[LayerDesc] = []
    kernels: dict[str, list] = {}
    workspace: dict[str, int] = {}
    with progress_bar(len(layers), f"building for {target}") as advance:
        for layer in layers:
            picks = pick_tactics(layer, every, views, candidates_at, choose, forced)
            (base, tactic), _ = picks[0]
            final = replace(base, tactic=tactic.name, tactic_params=dict(tactic.params),
                            profile_tactics=recorded([t.name for (_, t), _ in picks]))
            need = 0
            for (variant, t), view in picks:
                ran = replace(variant, tactic=t.name, tactic_params=dict(t.params), profile_tactics=())
                if hasattr(t, "kernels"):  # every profile's, each kernel once
                    have = kernels.get(final.name)
                    kernels[final.name] = t.kernels(ran) if have is None else have + [
                        k for k in t.kernels(ran) if k not in have]
                need = max(need, workspace_over(t, ran, tensors, corners_of(variant, view), sm_count))
            if need:
                workspace[final.name] = need
            chosen.append(final)
            advance(layer.name)
    return Selection(chosen, kernels, workspace, sm_count, tuner.finish())


def compile_candidates(model: Any, config: BuilderConfig | None = None, arch: str | None = None,
                       workers: int | None = None) -> dict[str, Any]:
    """Compile into the kernel cache (POLYKIT_CACHE_DIR) the kernels a cuda build of `model` with
    `config` compiles (the candidates its tuner times and every layer's first candidate by
    priority, and the timer's stream hold) without timing anything: a later build_plan of the same model and config then finds
    them all cached and spends its time on timing alone, so parallel processes can prepare builds
    while another one times on a quiet GPU. `arch` (default the GPU's) is the architecture to
    compile for; without a GPU the candidates are those a build without a device has, the first
    by priority. `workers`: NVRTC processes (default one per core). What it did: {"layers",
    "kernels" (distinct units), "compile_s"}."""
    import time

    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.runtime.cuda.nvrtc import compile_many, unique_units

    cfg = config or BuilderConfig()
    graph = model if isinstance(model, Graph) else load_onnx(model)
    front = Builder(cfg).prepare(graph)
    if front.target != "cuda":
        raise UsageError(f"compile_candidates prepares cuda builds, not {front.target} ones", hint="build for --target cuda")
    device = build_device(front.target, cfg.device)
    arch = arch or (device.arch if device is not None else "")
    if not arch:
        raise UsageError("no usable GPU here to take the architecture from", hint="pass arch, e.g. sm_90")
    layers, weights, tensors = front.lowered.layers, front.lowered.weights, front.tensors
    groups = profile_groups(front.profiles)
    if cfg.sparsity != "disable":
        layers, weights, tensors = offer_sparse(layers, weights, tensors, cfg.sparsity, profiles=len(groups))
    sources: list = []
    selection = select_tactics(layers, front.target, cfg, tensors, weights, groups, untimed=sources)
    from polykit.kernels.cuda.hold import HOLD  # the tuner's timer launches it ahead of every timed pass

    units = unique_units([HOLD, *sources, *(k for kernels in selection.kernels.values() for k in kernels)])
    t0 = time.perf_counter()
    compile_many(units, arch, workers=workers)
    return {"layers": len(selection.layers), "kernels": len(units), "compile_s": round(time.perf_counter() - t0, 2)}


def _candidates_or_none(layers: Sequence[LayerDesc], candidates_at: Any) -> list[tuple[LayerDesc, list]]:
    """(layer, its candidates) for the layers that have some; a layer without (a BuildError)
    is left for the selection loop to report."""
    jobs = []
    for layer in layers:
        try:
            jobs.append((layer, candidates_at(layer)))
        except PolykitError:
            continue
    return jobs


def _replayed(layer: LayerDesc, target: str, cfg: BuilderConfig, tactic: Any,
              replay: TacticReplay) -> tuple[LayerDesc, Any]:
    """The layer (in the first precision variant `tactic` supports) and the replay's tactic."""
    from polykit.compiler.builder.sparsity import with_sparse_variants
    from polykit.compiler.builder.tuner import precision_variants
    from polykit.compiler.plan.sparse24 import ATTR

    for variant in with_sparse_variants(precision_variants(layer, cfg, target)):
        if bool(tactic.params.get("sparse24")) == (ATTR in variant.attrs) and tactic.supports(variant):
            return variant, tactic
    raise replay.unsupported(layer, target)


def _fmt(shape: Any) -> str:
    return "None" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"
