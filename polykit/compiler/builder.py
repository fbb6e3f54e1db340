"""The builder: Graph -> Plan (TensorRT's model: optimize, lower, pick tactics, plan memory).

Pipeline: copy the graph -> apply input shapes (every input must end up static) ->
infer shapes -> mark extra outputs -> optimizer passes (folding, fusion; marked outputs
kept) -> lower to layers -> select a tactic per layer -> plan the activation arena -> Plan.
"""

from __future__ import annotations

import inspect
import math
import logging
from dataclasses import replace
from typing import Any

import numpy as np

import polykit
from polykit.compiler.config import BuilderConfig
from polykit.compiler.infer import infer_shapes
from polykit.compiler.ir import Graph, Value
from polykit.compiler.lower import Lowered, lower
from polykit.compiler.memory import compute_lifetimes, plan_memory
from polykit.compiler.plan import Plan, weight_offsets
from polykit.compiler.plan_schema import MAX_BYTES
from polykit.compiler.plan_records import LayerDesc, TensorDesc
from polykit.compiler.tactic_replay import TacticReplay, load_replay, save_replay
from polykit.errors import BuildError, UsageError

log = logging.getLogger("polykit")

_FLOAT_NAMES = ("float16", "float32", "float64")


class Builder:
    """Builds Plans from Graphs with one BuilderConfig."""

    def __init__(self, config: BuilderConfig | None = None):
        self.config = config or BuilderConfig()

    def build(self, graph: Graph) -> Plan:
        cfg = self.config
        target = resolve_target(cfg.target)
        g = graph.copy()
        apply_input_shapes(g, cfg.input_shapes)
        apply_input_values(g, cfg.input_values)
        infer_shapes(g)
        marked = marked_outputs(g, cfg)
        g.outputs = list(dict.fromkeys(list(g.outputs) + marked))
        g = run_passes(g, cfg, keep=list(g.outputs), target=target)
        infer_shapes(g, strict=False)
        lowered = lower(g)
        tensors = describe_tensors(g, lowered)
        layers, kernels = select_tactics(lowered.layers, target, cfg, tensors)
        inputs = list(g.inputs)
        outputs = list(dict.fromkeys(g.outputs))
        tensors, memory = assign_memory(layers, tensors, inputs, outputs, cfg.memory_strategy)
        metadata: dict[str, Any] = {
            "polykit_version": polykit.__version__,
            "source_model": graph.name,
            "builder_config": cfg.to_json(),
            "tactics": {layer.name: layer.tactic for layer in layers},
            "marked_outputs": [o for o in outputs if o in marked],
        }
        if cfg.input_values:
            metadata["input_values"] = cfg.to_json()["input_values"]
        if kernels:
            from polykit.kernels.cuda.base import pack_kernel_table

            metadata["kernels"] = pack_kernel_table(kernels)
        plan = Plan(target=target, layers=layers, tensors=tensors, inputs=inputs, outputs=outputs,
                    weights=lowered.weights, memory=memory, metadata=metadata, gpu_arch=target_arch(target))
        if cfg.save_tactics is not None:
            save_replay(cfg.save_tactics, TacticReplay.from_layers(layers))
        log.debug("built %r", plan)
        return plan


def build_plan(model: Any, config: BuilderConfig | None = None) -> Plan:
    """Build a Plan from a model path, an onnx.ModelProto or a polykit Graph."""
    if isinstance(model, Graph):
        graph = model
    else:
        from polykit.compiler.onnx_import import load_onnx

        graph = load_onnx(model)
    return Builder(config).build(graph)


# ---- steps -------------------------------------------------------------------------------
def resolve_target(target: str | None) -> str:
    from polykit.runtime.target import TARGETS, default_target

    name = target or default_target()
    if name not in TARGETS:
        raise UsageError(f"unknown target {name!r}", hint=f"use one of: {', '.join(sorted(TARGETS))}")
    return name


def target_arch(target: str) -> str:
    """The GPU architecture a plan is built for ("" off-GPU); asked of the target if it knows."""
    if target == "cpu":
        return ""
    try:
        from polykit.runtime.target import get_target

        arch = getattr(get_target(target), "gpu_arch", None)
        return str(arch() if callable(arch) else arch or "")
    except Exception:  # no usable device or target: the plan records no arch
        return ""


def apply_input_shapes(g: Graph, shapes: dict[str, tuple[int, ...]]) -> None:
    """Give inputs their concrete shapes; BuildError if an input stays dynamic."""
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
        if not v.is_static:
            raise BuildError(
                f"input {name!r} has dynamic shape {_fmt(v.shape)}; plans are built for concrete shapes",
                where=f"graph {g.name!r}",
                hint=f"pass --input-shapes {name}:1x... (BuilderConfig(input_shapes={{{name!r}: (...)}}))",
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
    if values:
        g.metadata["input_values"] = dict(values)


def marked_outputs(g: Graph, cfg: BuilderConfig) -> list[str]:
    """Intermediate tensors to make engine outputs (mark_outputs, or every one for mark_all)."""
    produced = [o for n in g.nodes for o in n.outputs if o]
    known = set(produced) | set(g.inputs)
    for name in cfg.mark_outputs:
        if name not in known:
            raise BuildError(f"cannot mark {name!r} as an output: no node produces it", where=f"graph {g.name!r}",
                             hint="list tensor names with `polykit inspect model`")
    names = list(cfg.mark_outputs)
    if cfg.mark_all:
        names += [o for n in g.nodes if not (n.op_type == "Constant" and n.domain == "") for o in n.outputs if o]
    return [n for n in dict.fromkeys(names) if n not in g.outputs]


def run_passes(g: Graph, cfg: BuilderConfig, keep: list[str], target: str) -> Graph:
    """The optimizer (polykit.compiler.passes.optimize) when it is installed; the optimized graph."""
    try:
        from polykit.compiler.passes import optimize
    except ImportError:
        log.debug("polykit.compiler.passes.optimize not available; building without passes")
        return g
    offered = {"keep": keep, "fold": cfg.fold_constants, "fold_constants": cfg.fold_constants, "fuse": cfg.fuse,
               "config": cfg, "fp16": cfg.fp16, "fp32_layers": cfg.fp32_layers,
               "channels_last": cfg.channels_last_for(target)}
    params = inspect.signature(optimize).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        kwargs = offered
    else:
        kwargs = {k: v for k, v in offered.items() if k in params}
    result = optimize(g, **kwargs)
    return result if isinstance(result, Graph) else g


def describe_tensors(g: Graph, lowered: Lowered) -> dict[str, TensorDesc]:
    """TensorDesc of every tensor the plan touches (offsets filled in by assign_memory)."""
    names: list[str] = list(g.inputs)
    for layer in lowered.layers:
        names += [n for n in layer.inputs + layer.outputs if n]
    names += list(g.outputs)
    tensors: dict[str, TensorDesc] = {}
    outputs, inputs = set(g.outputs), set(g.inputs)
    for name in dict.fromkeys(names):
        if name in lowered.weights:
            arr = lowered.weights[name]
            tensors[name] = TensorDesc(name, arr.dtype.name, tuple(arr.shape), "weight", -1, int(arr.nbytes))
            continue
        v = g.value(name)
        if v.dtype is None or not v.is_static:
            raise BuildError(
                f"tensor {name!r} has {'unknown dtype' if v.dtype is None else f'non-static shape {_fmt(v.shape)}'}",
                where=f"graph {g.name!r}",
                hint="its shape depends on data or on a dynamic input; fix the input shapes or fold the graph",
            )
        dt = np.dtype(v.dtype)
        if dt == object:
            raise BuildError(f"tensor {name!r} holds strings, which plans cannot run", where=f"graph {g.name!r}")
        kind = "input" if name in inputs else "output" if name in outputs else "activation"
        nbytes = math.prod(int(d) for d in v.shape) * dt.itemsize
        if nbytes > MAX_BYTES or min(v.shape, default=0) < 0:
            raise BuildError(f"tensor {name!r} has shape {_fmt(v.shape)}: {nbytes} bytes is beyond what a plan holds",
                             where=f"graph {g.name!r}", hint="check the model's and --input-shapes' dims")
        tensors[name] = TensorDesc(name, dt.name, tuple(int(d) for d in v.shape), kind, -1, nbytes)
    return tensors


def select_tactics(layers: list[LayerDesc], target: str, cfg: BuilderConfig,
                   tensors: dict[str, TensorDesc]) -> tuple[list[LayerDesc], dict[str, list]]:
    """Pick a tactic for every layer: the replay's choice, else the first candidate."""
    from polykit.compiler.passes.precision import layer_runs_in_half
    from polykit.kernels.registry import find_reference
    from polykit.kernels.tactics import candidates

    replay = load_replay(cfg.tactic_replay)
    replay.check_layers(layers)
    chosen: list[LayerDesc] = []
    kernels: dict[str, list] = {}
    for layer in layers:
        layer = replace(layer, in_dtypes=tuple(tensors[n].dtype if n else "" for n in layer.inputs),
                        out_dtypes=tuple(tensors[n].dtype if n else "" for n in layer.outputs),
                        in_shapes=tuple(tensors[n].shape if n else () for n in layer.inputs),
                        out_shapes=tuple(tensors[n].shape if n else () for n in layer.outputs))
        # fp16 builds: the optimizer made float tensors float16 (passes.convert_to_fp16)
        is_half = cfg.fp16 and layer_runs_in_half(layer.kind, layer.domain, layer.inputs, layer.outputs,
                                                  lambda n: tensors[n].dtype if n in tensors else None)
        tries = [replace(layer, precision="fp16"), layer] if is_half else [layer]
        picked = None
        forced = replay.forced_tactic(layer, target)
        for candidate_layer in tries:
            if forced is not None:
                if not forced.supports(candidate_layer):
                    continue
                tactic = forced
            else:
                found = candidates(target, layer.kind, candidate_layer)
                if not found:
                    continue
                tactic = found[0]
            picked = (candidate_layer, tactic)
            break
        if picked is not None and target == "cpu" and find_reference(layer.domain, layer.kind) is None:
            picked = None
        if picked is None and forced is not None:
            raise replay.unsupported(layer, target)
        if picked is None:
            raise BuildError(f"no {target} tactic can run this {layer.kind} layer", where=f"layer {layer.name!r}",
                             hint="try --target cpu, or report the layer's shapes and attributes")
        base, tactic = picked
        if target == "cpu" and is_half:
            base = replace(base, precision="fp16")  # the reference kernels run it on float16 arrays
        final = replace(base, tactic=tactic.name, tactic_params=dict(tactic.params))
        if hasattr(tactic, "kernels"):
            kernels[final.name] = tactic.kernels(final)
        chosen.append(final)
    return chosen, kernels


#: layer kinds whose output is its input's bytes under another shape (views, no copy)
VIEW_KINDS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def view_aliases(layers: list[LayerDesc], tensors: dict[str, TensorDesc], io: set[str]) -> dict[str, str]:
    """View output -> the activation whose arena slot it shares (chains resolved to the root)."""
    out: dict[str, str] = {}
    for layer in layers:
        if layer.domain or layer.kind not in VIEW_KINDS or not layer.inputs or not layer.outputs:
            continue
        src, dst = layer.inputs[0], layer.outputs[0]
        if not src or not dst or dst in io or tensors[src].kind == "weight":
            continue
        if tensors[src].nbytes != tensors[dst].nbytes or tensors[src].dtype != tensors[dst].dtype:
            continue
        out[dst] = out.get(src, src)
    return out


def assign_memory(layers: list[LayerDesc], tensors: dict[str, TensorDesc], inputs: list[str], outputs: list[str],
                  strategy: str):
    """Plan the arena and write each tensor's offset into its TensorDesc."""
    weights = {n for n, t in tensors.items() if t.kind == "weight"}
    lifetimes = compute_lifetimes([(l.inputs, l.outputs) for l in layers], inputs, outputs, skip=weights)
    sizes = {n: tensors[n].nbytes for n in lifetimes}
    aliases = view_aliases(layers, tensors, set(inputs) | set(outputs)) if strategy != "none" else {}
    memory = plan_memory(sizes, lifetimes, io_names=list(inputs) + list(outputs), strategy=strategy,
                         aliases=aliases)
    blob = weight_offsets({n: tensors[n].nbytes for n in weights})
    out = {}
    for name, t in tensors.items():
        out[name] = replace(t, offset=blob[name] if t.kind == "weight" else memory.offsets[name])
    return out, memory


def _fmt(shape: Any) -> str:
    return "None" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"
