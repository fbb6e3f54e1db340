"""Refit: new weights for a plan built `--refittable`, without a rebuild (TensorRT's refit).

A refittable plan records (metadata["refit"], refit_record) the model it was built from as ONNX
bytes, with the large initializers a refit may replace left out, and for each refittable
initializer (floating point, int8 and uint8 ones: weights, biases, BatchNorm statistics,
quantized weights and their per-channel scales) where its current value is: "plan" (a plan
weight of the same name holds it bit for bit, so it costs nothing), "model" (small: kept in the
recorded model) or "caller" (folded, cast or packed into the plan's weights: a refit must be
given it). Integer initializers (shapes, axes, indices) are the model's structure, not weights.

A refit (refit_plan, Refitter) puts the new values into the recorded model and runs the build's
own front on it with the plan's BuilderConfig (Builder.prepare: import, constant folding,
BatchNorm folded into Conv, transposes, NHWC packing, fp16 casts, Q/DQ folding, lowering) and
the plan's tactics' tf32 rounding (round_tf32_weights): every weight is derived by the code the
builder ran, so a refitted plan computes bit for bit what a plan built from the new weights
with the same tactics computes. The re-derived layers must be the plan's (names, kinds,
attributes, dtypes, shapes) and its weights the same names, dtypes and shapes; a value that
would change the plan's structure (a fold that depends on it) is a BuildError naming the first
difference: such a model needs a rebuild.
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import replace
from typing import Any, Iterable, Mapping

import numpy as np

from polykit.compiler.builder.builder import Builder
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.layer_precision import round_tf32_weights
from polykit.compiler.ir.graph import Graph
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.records import LayerDesc
from polykit.errors import BuildError, PlanError, UsageError

log = logging.getLogger("polykit")

REFIT_FORMAT = 1
#: refittable initializers of at most this many elements are kept in the record's model (epsilons,
#: activation constants, per-tensor Q/DQ scales, Resize scales): a refit never needs them given
SMALL_ELEMENTS = 64
#: LayerDesc fields tactic selection sets: a refit re-derives the layers before it and keeps the plan's
_TACTIC_FIELDS = ("tactic", "tactic_params", "precision", "profile_tactics")
_REBUILD = "rebuild the plan from the new model (polykit convert --refittable)"


def is_refittable(array: np.ndarray) -> bool:
    """Whether an initializer is a weight a refit may replace (floating point, int8, uint8)."""
    dtype = np.asarray(array).dtype
    return dtype.kind == "f" or dtype.name in ("bfloat16", "int8", "uint8")


def refit_record(graph: Graph, plan: Plan) -> dict[str, Any]:
    """The record a refittable plan carries: the source `graph` (no control flow: Builder.build
    refuses it) as ONNX bytes, its large refittable initializers left out, and where each
    refittable initializer's value is."""
    from polykit.compiler.graph.onnx_export import to_onnx

    weights: dict[str, dict[str, Any]] = {}
    kept: dict[str, np.ndarray] = {}
    for name, array in graph.initializers.items():
        arr = np.asarray(array)
        if not is_refittable(arr):
            kept[name] = arr
            continue
        if arr.size <= SMALL_ELEMENTS:
            source = "model"
            kept[name] = arr
        elif _same_bits(plan.weights.get(name), arr):
            source = "plan"
        else:
            source = "caller"
        weights[name] = {"dtype": arr.dtype.name, "shape": list(arr.shape), "source": source}
    shell = copy.copy(graph)  # the graph with only the kept initializers (no copy of the others)
    shell.initializers = kept
    model = to_onnx(shell)
    infos = [vi for vi in model.graph.value_info if vi.name not in weights or weights[vi.name]["source"] == "model"]
    del model.graph.value_info[:]
    model.graph.value_info.extend(infos)
    return {"format": REFIT_FORMAT, "model": np.frombuffer(model.SerializeToString(), dtype=np.uint8),
            "weights": weights}


def _same_bits(a: Any, b: np.ndarray) -> bool:
    if a is None:
        return False
    a = np.asarray(a)
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == \
        np.ascontiguousarray(b).tobytes()


def record_of(plan: Plan, where: str = "plan") -> dict[str, Any]:
    """The plan's refit record; PlanError when it was not built refittable (or the record is damaged)."""
    record = plan.metadata.get("refit")
    if record is None:
        raise PlanError("the plan was not built refittable", where=where,
                        hint="build it with polykit convert --refittable (BuilderConfig(refittable=True))")
    model = record.get("model") if isinstance(record, dict) else None
    if not isinstance(model, np.ndarray) or model.dtype != np.uint8 or model.ndim != 1 \
            or not isinstance(record.get("weights"), dict):
        raise PlanError("the plan's refit record is damaged (metadata.refit.model is not the model's bytes)",
                        where=where, hint="rebuild the plan with --refittable")
    for name, spec in record["weights"].items():
        if spec["source"] == "plan" and (name not in plan.weights or plan.weights[name].dtype.name != spec["dtype"]
                                         or list(plan.weights[name].shape) != list(spec["shape"])):
            raise PlanError(f"the refit record says plan weight {name!r} holds initializer {name!r}, the plan "
                            "has no such weight", where=where, hint="rebuild the plan with --refittable")
    return record


def check_weight(record: Mapping[str, Any], name: str, array: Any, where: str = "refit") -> np.ndarray:
    """`array` as the new value of refittable initializer `name`: UsageError for a name the plan
    does not know as a weight, a dtype or a shape that differs."""
    spec = record["weights"].get(name)
    if spec is None:
        known = sorted(record["weights"])
        raise UsageError(f"{name!r} is not a refittable weight of the plan", where=where,
                         hint=f"refittable weights are the model's float and int8 initializers: "
                              f"{', '.join(known[:8])}{', ...' if len(known) > 8 else ''}"
                         if known else "the plan has no refittable weights")
    arr = np.asarray(array)
    if arr.dtype.name != spec["dtype"] or list(arr.shape) != list(spec["shape"]):
        raise UsageError(f"weight {name!r} is {arr.dtype.name}{list(arr.shape)}, the plan was built with "
                         f"{spec['dtype']}{list(spec['shape'])}", where=where,
                         hint="give the weight its dtype and shape in the model (a different shape needs a rebuild)")
    return arr


def missing_weights(record: Mapping[str, Any], given: Iterable[str]) -> list[str]:
    """The refittable initializers a refit must still be given: those folded, cast or packed
    into the plan's weights (source "caller") that are not in `given`."""
    have = set(given)
    return sorted(n for n, spec in record["weights"].items() if spec["source"] == "caller" and n not in have)


def refit_plan(plan: Plan, weights: Mapping[str, Any], where: str = "plan") -> Plan:
    """A copy of refittable `plan` whose weights derive from the new initializer values
    `weights` (name -> array; the refittable initializers not given keep their values, and
    those the plan folded away must all be given: missing_weights). Tactics, memory plan and
    kernels are the plan's."""
    record = record_of(plan, where)
    values = {name: check_weight(record, name, arr) for name, arr in weights.items()}
    missing = missing_weights(record, values)
    if missing:
        raise UsageError(f"the refit lacks {len(missing)} weight(s) the plan folded into others: "
                         f"{', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''}", where=where,
                         hint="give every weight of the model (an ONNX model or a .npz of all its float initializers): "
                              "the plan does not hold their old values")
    graph = source_graph(record, plan, values)
    config = BuilderConfig.from_json(plan.metadata.get("builder_config", {}))
    front = Builder(replace(config, target=plan.target)).prepare(graph)
    check_structure(plan, front.lowered.layers, front.lowered.weights, f"{where} (refit of {', '.join(sorted(values)[:4])}"
                    f"{', ...' if len(values) > 4 else ''})")
    derived = round_tf32_weights(plan.layers, front.lowered.weights)
    refitted = replace(plan, weights={name: derived[name] for name in plan.weights}, metadata=dict(plan.metadata))
    refitted.metadata["refit"] = refit_record(graph, refitted)
    return refitted


def source_graph(record: Mapping[str, Any], plan: Plan, values: Mapping[str, np.ndarray]) -> Graph:
    """The recorded model with each refittable initializer's value: `values`' where given, else
    the plan's weight or the model's own."""
    from onnx import numpy_helper

    from polykit.compiler.graph.onnx_import import load_onnx

    model = _recorded_model(record)
    inits = model.graph.initializer
    kept = [t for t in inits if t.name not in values]
    del inits[:]
    inits.extend(kept)
    for name, spec in record["weights"].items():
        if name in values:
            inits.append(numpy_helper.from_array(values[name], name))
        elif spec["source"] == "plan":
            inits.append(numpy_helper.from_array(np.asarray(plan.weights[name]), name))
    return load_onnx(model)


def check_structure(plan: Plan, layers: list[LayerDesc], weights: Mapping[str, np.ndarray], where: str) -> None:
    """BuildError unless the re-derived `layers` and `weights` are the plan's (tactic choices aside)."""
    def stripped(layer: LayerDesc) -> LayerDesc:
        return replace(layer, **{f: LayerDesc.__dataclass_fields__[f].default for f in ("tactic", "precision")},
                       tactic_params={}, profile_tactics=())

    if len(layers) != len(plan.layers):
        raise BuildError(f"the new weights give {len(layers)} layers, the plan has {len(plan.layers)}", where=where,
                         hint=f"a fold of the model depends on the weights' values; {_REBUILD}")
    for new, old in zip(layers, plan.layers):
        if stripped(new) != stripped(old):
            field = next((f for f in LayerDesc.__dataclass_fields__ if f not in _TACTIC_FIELDS
                          and getattr(new, f) != getattr(old, f)), "?")
            raise BuildError(f"with the new weights layer {old.name!r} differs in its {field}", where=where,
                             hint=f"a fold of the model depends on the weights' values; {_REBUILD}")
    if set(weights) != set(plan.weights):
        extra = sorted(set(weights) ^ set(plan.weights))
        raise BuildError(f"the new weights give other plan weights ({', '.join(extra[:4])})", where=where,
                         hint=f"a fold of the model depends on the weights' values; {_REBUILD}")
    for name, arr in weights.items():
        old = plan.weights[name]
        if arr.dtype != old.dtype or arr.shape != old.shape:
            raise BuildError(f"plan weight {name!r} would be {arr.dtype.name}{list(arr.shape)}, the plan holds "
                             f"{old.dtype.name}{list(old.shape)}", where=where, hint=_REBUILD)


def weights_from_file(path: str | os.PathLike, record: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """New initializer values from an ONNX model (its refittable initializers; its other ones
    must be those of the model the plan was built from) or a .npz (name -> array, no pickle)."""
    from polykit.files import require_file

    file = require_file(path, "weights file", UsageError)
    if file.suffix == ".npz":
        from polykit.npy_io import open_npz

        return open_npz(file)
    from onnx import numpy_helper

    from polykit.compiler.graph.onnx_import import load_onnx

    graph = load_onnx(file)
    model = _recorded_model(record)
    structure = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name not in record["weights"]}
    for name, arr in graph.initializers.items():
        if name in record["weights"]:
            continue
        if name not in structure:
            raise UsageError(f"initializer {name!r} of the new model is not in the model the plan was built from",
                             where=str(file), hint=f"a refit takes the same model with new weights; {_REBUILD}")
        if not _same_bits(np.asarray(arr), structure[name]):
            raise UsageError(f"initializer {name!r} ({np.asarray(arr).dtype.name}) differs from the built model's: "
                             "it is structure (a shape, axes, indices), not a weight", where=str(file),
                             hint=_REBUILD)
    return {name: np.asarray(arr) for name, arr in graph.initializers.items() if name in record["weights"]}


def _recorded_model(record: Mapping[str, Any]) -> Any:
    import onnx

    model = onnx.ModelProto()
    try:
        model.ParseFromString(record["model"].tobytes())
    except Exception as exc:  # protobuf's DecodeError and friends
        raise PlanError(f"the plan's recorded model does not parse: {exc}", where="metadata.refit.model",
                        hint="rebuild the plan with --refittable") from None
    return model


class Refitter:
    """Refits a live Engine of a refittable plan in place, between inferences (TensorRT's
    IRefitter): set_named_weights for the new initializer values, then refit_cuda_engine.

        refitter = Refitter(engine)
        for name, array in new_weights.items():
            refitter.set_named_weights(name, array)
        assert refitter.refit_cuda_engine()

    Works on every target (the name is TensorRT's): the engine's contexts compute with the new
    weights from their next run."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._record = record_of(engine.plan)
        self._values: dict[str, np.ndarray] = {}

    def set_named_weights(self, name: str, weights: Any) -> bool:
        """Set initializer `name`'s new value (UsageError for an unknown name, another dtype or
        shape); True when set."""
        self._values[name] = check_weight(self._record, name, weights)
        return True

    def get_missing_weights(self) -> list[str]:
        """The weights still to set before refit_cuda_engine can succeed: those the plan folded,
        cast or packed (it does not hold their old values) and that are not set yet."""
        return missing_weights(self._record, self._values)

    def get_all_weights(self) -> list[str]:
        """Every refittable initializer name of the plan."""
        return sorted(self._record["weights"])

    def refit_cuda_engine(self) -> bool:
        """Derive the plan's weights from the values set and put them into the engine; False
        (and a logged error) when weights are missing. A value that would change the plan's
        structure is a BuildError. The values set are consumed."""
        missing = self.get_missing_weights()
        if missing:
            log.error("refit: %d weight(s) missing: %s", len(missing), ", ".join(missing[:6]))
            return False
        refitted = refit_plan(self.engine.plan, self._values, where="engine")
        changed = {n: w for n, w in refitted.weights.items() if not _same_bits(self.engine.plan.weights[n], w)}
        self.engine.refit_weights(changed)
        self.engine.plan.metadata["refit"] = self._record = refitted.metadata["refit"]
        self._values = {}
        return True
