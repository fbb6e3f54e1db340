"""What a build quantizes to INT8 (docs/INT8.md): the builder's one call, `plan_int8`.

Explicit quantization: a model that carries QuantizeLinear/DequantizeLinear is folded into INT8
layers as written (passes.fold_qdq), with or without BuilderConfig.int8. Implicit: with int8,
every Conv/Gemm/MatMul with float weights whose activation has a scale is quantized
(passes.insert_qdq). Scales come from `tensor_ranges` first, then from a calibration cache that
exists, else from calibrating the unfused graph (polykit.compiler.builder.calibrate; the cache is then
written). The activation tensors that need a scale are named on the graph as imported (input
shapes applied), before any pass, so the same names serve every build of the model.

With fp8 the same happens in FP8 (float8_e4m3fn layers, scales max |x| / 448 from the minmax
calibrator, a cache marked `type=fp8`); a cache of the other type is a DataFileError.

A target without INT8 tactics (a plugin's) builds float: the model's Q/DQ run as written and
--int8 is ignored, each with a logged warning. An INT8 layer that the target's tactics refuse
(cuda: grouped convolutions, batched MatMul operands) stays quantized but unfolded: its Q/DQ
run as layers and the op in float (builder.optimize_and_lower).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import polykit
from polykit.compiler.builder.calibrate import FP8_MAX, QMAX, calibrate, scale_of
from polykit.compiler.builder.calibration_cache import CalibrationCache, read_calibration_cache, write_calibration_cache
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph
from polykit.compiler.ops.quant.int8 import INT8_KINDS
from polykit.compiler.ops.quant.weight_only import KIND as WEIGHT_ONLY_KIND
from polykit.compiler.passes.insert_qdq import constant_tensors, int8_candidates, residual_candidates
from polykit.errors import BuildError, DataFileError

log = logging.getLogger("polykit")

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class Int8Setup:
    """What the optimizer does about INT8: fold Q/DQ into INT8 layers (`fold`), and quantize the
    activations named in `scales` (tensor -> int8 scale) with their layers' weights. `layers`:
    the build makes INT8 layers (the model has Q/DQ, or int8 is on), which a cuda build runs
    channels-last."""

    fold: bool = False
    scales: Mapping[str, float] = field(default_factory=dict, hash=False)
    layers: bool = False
    #: keep weight-only quantized MatMul/Gemm weights packed (passes.fold_weight_only)
    weight_only: bool = False
    #: `scales` are e4m3 scales: insert_qdq makes FP8 layers
    fp8: bool = False


def target_runs_int8(target: str) -> bool:
    """Whether `target` has tactics for the INT8 layer kinds."""
    return target_runs(target, INT8_KINDS)


def target_runs(target: str, kinds: Iterable[str]) -> bool:
    """Whether `target` has tactics for any of the ai.polykit layer `kinds`."""
    from polykit.kernels.tactics import tactic_table

    table = tactic_table(target)
    return any(table.of_kind(target, POLYKIT_DOMAIN, kind) for kind in kinds)


def plan_int8(g: Graph, cfg: BuilderConfig, target: str, model: Graph | None = None) -> Int8Setup:
    """The INT8 setup of a build of `g` (input shapes applied, shapes inferred). `model`: the
    graph as given, before its inputs took a profile's symbolic dims: a build with profiles
    calibrates it at the calibration profile's shapes (calibrate.calibration_engine)."""
    explicit = any(n.op_type in QDQ_OPS and n.domain == "" for n in g.nodes)
    runs = target_runs_int8(target)
    weight_only = explicit and target_runs(target, (WEIGHT_ONLY_KIND,))
    flag = "--fp8" if cfg.fp8 else "--int8"
    if not runs and (explicit or cfg.int8 or cfg.fp8):
        log.warning("the %s target has no INT8 tactics: %s", target,
                    "the model's Q/DQ run as written, in float" if explicit else f"{flag} is ignored, layers run in float")
        return Int8Setup(weight_only=weight_only)
    if not (cfg.int8 or cfg.fp8):
        return Int8Setup(fold=runs, layers=runs and explicit, weight_only=weight_only)
    if explicit:
        log.info("%s: the model carries Q/DQ (explicit quantization); nothing is calibrated", flag)
        return Int8Setup(fold=True, layers=True, weight_only=weight_only)
    candidates = int8_candidates(g, constant_tensors(g))
    needed = list(dict.fromkeys(x for _, x in candidates))
    if not needed:
        log.warning("%s: the model has no Conv/Gemm/MatMul with float weights to quantize", flag)
    residuals = [y for y in residual_candidates(g, candidates) if y not in needed]
    return Int8Setup(fold=True, scales=activation_scales(g, needed, cfg, target, model, optional=residuals),
                     layers=True, fp8=cfg.fp8)


def activation_scales(g: Graph, needed: list[str], cfg: BuilderConfig, target: str,
                      model: Graph | None = None, optional: list[str] = ()) -> dict[str, float]:
    """Scale of every tensor in `needed`: tensor_ranges, else the cache, else calibration (e4m3
    scales with cfg.fp8, from the minmax calibrator). `optional` (insert_qdq's residual_candidates):
    those that tensor_ranges or the cache hold, all of them where the build calibrates; one missing
    costs speed, not a build (a cache written before they were calibrated still serves)."""
    kind, qmax = ("fp8", FP8_MAX) if cfg.fp8 else ("int8", QMAX)
    calibrator = "minmax" if cfg.fp8 else cfg.calibrator
    known = set(g.inputs) | {o for n in g.nodes for o in n.outputs if o}
    unknown = [name for name in cfg.tensor_ranges if name not in known]
    if unknown:
        raise BuildError(f"tensor_ranges names tensors the model does not have: {_names(unknown)}",
                         where=f"graph {g.name!r}", hint="list tensor names with `polykit inspect model`")
    scales = {name: scale_of(max(-low, high), qmax) for name, (low, high) in cfg.tensor_ranges.items()}
    missing = [name for name in needed if name not in scales]
    extra = [name for name in optional if name not in scales]
    path = cfg.calibration_cache
    if not needed and path is not None and not Path(path).is_file():  # nothing to calibrate: an empty cache, as asked
        write_calibration_cache(path, CalibrationCache(calibrator, {}, type=kind))
        log.info("wrote calibration cache %s (no tensor to quantize)", path)
    if not missing:
        return {name: scales[name] for name in (*needed, *optional) if name in scales}
    cache = read_calibration_cache(path) if path is not None and Path(path).is_file() else None
    if cache is not None and cache.polykit_version != polykit.__version__:
        if cfg.calibration_data is None:
            raise DataFileError(f"the calibration cache was written by polykit {cache.polykit_version}; this is "
                                f"polykit {polykit.__version__}, which does not take another version's scales",
                                where=str(path), hint="calibrate again: build with calibration data (the cache is "
                                                      "written anew), or remove the file")
        log.warning("calibration cache %s was written by polykit %s (this is %s): ignored, calibrating again",
                    path, cache.polykit_version, polykit.__version__)
        cache = None
    if cache is not None and cache.type != kind:
        raise DataFileError(f"the calibration cache holds {cache.type.upper()} scales; this {kind.upper()} build "
                            f"(--{kind}) cannot use them", where=str(path),
                            hint=f"give a cache an --{kind} build wrote, or a new file name to calibrate into")
    if cache is not None:
        absent = [name for name in missing if name not in cache.scales]
        if absent:
            raise DataFileError(f"the calibration cache does not match the network: it has no scale for "
                                f"{len(absent)} tensor(s): {_names(absent)}", where=str(path),
                                hint="calibrate again: remove the cache file and build with calibration data")
        if cache.calibrator != calibrator:
            log.info("calibration cache %s was made by the %s calibrator; using it as it is", path, cache.calibrator)
        calibrated = dict(cache.scales)
    else:
        names = [*needed, *extra]
        t0 = time.perf_counter()
        calibrated = (calibrate(g, names, cfg.calibration_data, target, calibrator, cfg.percentile, qmax=qmax)
                      if model is None else
                      calibrate(model, names, cfg.calibration_data, target, calibrator, cfg.percentile, cfg, qmax))
        log.info("calibration: %d %s tensors (%s) in %.1f s", len(calibrated), kind, calibrator,
                 time.perf_counter() - t0)
        if path is not None:
            write_calibration_cache(path, CalibrationCache(calibrator, calibrated, type=kind))
            log.info("wrote calibration cache %s (%d %s tensors, %s)", path, len(calibrated), kind, calibrator)
    found = {name: scales.get(name, calibrated.get(name)) for name in needed}
    found.update({name: scales.get(name, calibrated.get(name)) for name in optional
                  if name in scales or name in calibrated})
    return found


def _names(names: list[str], most: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
