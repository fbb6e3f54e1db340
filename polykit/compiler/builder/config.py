"""BuilderConfig: everything that steers a build, as one frozen record.

The config travels explicitly (no globals): `Builder(config).build(graph)` and
`build_plan(model, config)`. Its JSON form is stored in the plan's metadata so a plan
says how it was built.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from polykit.compiler.builder.calibrate import CALIBRATORS
from polykit.compiler.plan.compatibility import HARDWARE_LEVELS
from polykit.compiler.passes.io_formats import IoFormat
from polykit.compiler.plan.profiles import Profile
from polykit.runtime.nvtx import check_verbosity
from polykit.compiler.builder.tactic_replay import TacticReplay
from polykit.errors import UsageError

#: memory planning strategies understood by polykit.compiler.plan.memory.plan_memory
MEMORY_STRATEGIES = ("best-fit", "first-fit", "none")
#: median output pixels of a model's convolutions (1-D and 2-D) from which an fp32 cuda build runs them
#: channels-last (BuilderConfig.channels_last_for): ResNet-50 has 196 at batch 1, 6272 at batch 32
FP32_NHWC_PIXELS = 4096
#: fields naming files a build reads or writes besides the model, and switches of the build
#: process that cannot change the plan; not recorded in plans (so a warm rebuild is byte-identical)
SIDE_FILES = frozenset({"tactic_replay", "save_tactics", "load_timing_cache", "save_timing_cache",
                        "error_on_timing_cache_miss", "calibration_cache", "calibration_data",
                        "calibration_profile", "device"})
#: --precision-constraints: how requested layer precisions bind (TensorRT's obey / prefer / none)
PRECISION_CONSTRAINTS = ("obey", "prefer", "none")
#: --sparsity: 2:4 structured-sparse tactics off, offered to layers whose weights have the pattern,
#: or offered after pruning eligible-shaped weights to it (TensorRT's disable / enable / force)
SPARSITY = ("disable", "enable", "force")
#: layer precisions, highest first (a fused layer takes the highest any of its nodes asks for)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


@dataclass(frozen=True)
class BuilderConfig:
    """How to build a plan.

    target: "cpu", "cuda" or None (auto: cuda when a GPU is usable, else cpu).
    fp16: float32 tensors and weights become float16, engine I/O stays float32 unless
        input/output_io_formats say otherwise (polykit.compiler.passes.convert_precision); on cpu
        the kernels run on float16 arrays.
    fp32_layers: with fp16, layers (node names or op types, e.g. "Softmax") kept in float32.
    input_shapes: concrete shapes for graph inputs with dynamic dims, by input name.
    profiles: optimization profiles (polykit.compiler.plan.profiles.Profile: min/opt/max shapes per
        dynamic input): the plan serves every shape inside one of them; each profile's tactics are
        chosen at its opt shape and serve its min and max (docs/DYNAMIC_SHAPES.md).
        An input a profile leaves out takes its input_shapes value (or its static model shape).
    mark_outputs: intermediate tensors to make plan outputs (kept from being fused away: the
        layers may differ from the unmarked build's; polykit.compiler.builder.marking).
    mark_all / expose_tensors: every intermediate tensor / these ones become plan outputs where
        a layer of the unmarked build already writes them (layerwise debugging: the layers and
        tactics stay those of the unmarked build; the rest are listed in the plan's metadata
        as "fused_away").
    force_marks: mark_all and expose_tensors are forced like mark_outputs (every marked tensor
        becomes a plan output; fusions around them are given up): Polygraphy's marking.
    fold_constants / fuse: switch the optimizer's folding and fusion passes.
    tactic_replay: tactic choices to force (polykit.compiler.builder.tactic_replay): a replay file
        written by save_tactics, a TacticReplay, or {layer name: tactic name} in process.
    save_tactics: write the chosen tactics to this file (a tactic replay file).
    profile: record per-layer timing while running (execution contexts honour it).
    memory_strategy: "best-fit" (default), "first-fit" or "none" (no arena reuse).
    input_values: build-time values of graph inputs, by name (TensorRT's shape-tensor inputs):
        shape inference sees them, so shapes that depend on an input's data (a Reshape's
        shape, Pad's pads) become static; the engine then accepts only
        feeds equal to these values for those inputs.
    shape_values: opt values of shape-tensor inputs (a Reshape target, Resize's scales fed as
        inputs) that no profile gives values: each ranges over what the model allows
        (polykit.compiler.builder.value_ranges, ruled), so one plan serves every value; values of inputs
        that decide no shape are not used. A shape-tensor input with no value at all (here,
        in input_values or in the profiles) is a BuildError naming it.
    channels_last: run 1-D / 2-D / 3-D convolutions and 2-D pools in NHWC (passes.to_channels_last); None (auto)
        turns it on for the cuda target's fp16, bf16 and tf32 builds, builds with INT8 layers,
        and fp32 builds of large convolutions (channels_last_for): its tensor-core convolutions
        (fp32 as 3xTF32) are NHWC implicit GEMMs.
    builder_optimization_level: 0 (first candidate by priority, nothing timed) to 5 (every
        candidate of every layer timed); 3, the default, times layers with several candidates,
        the best few by priority (docs/TUNING.md).
    workspace_limit: most scratch bytes one layer's tactic may borrow (None: no limit);
        tactics that need more are declined (--memory-pool-limit workspace:N).
    load_timing_cache / save_timing_cache: JSON timing caches read before timing and written
        (merged into the file) after; error_on_timing_cache_miss: a layer to time that the
        loaded cache lacks is a BuildError.
    bf16: like fp16 with bfloat16 storage (ml_dtypes on cpu). tf32: float32 layers may use
        tensor-core math that rounds operands to tf32 (tactics that read the layer precision).
    layer_precisions: ONNX node name -> "fp32" | "tf32" | "fp16" | "bf16"; fp32/tf32 keep
        the node's tensors float32; `precision_constraints` says how the request binds the
        layer's math: "obey" (a BuildError when no tactic can), "prefer" (a warning and the
        builder's choice), "none" (a hint: the builder chooses). In an int8 / fp8 build a node
        named here, whatever its precision, is not quantized (TensorRT's per-layer precision).
    strongly_typed: layers run in the model's own dtypes (no fp16/bf16/tf32 flags allowed).
    int8: quantize Conv/Gemm/MatMul with float weights to INT8 layers from calibrated activation
        scales (docs/INT8.md; a model carrying Q/DQ is folded into INT8 layers without it).
    fp8: the same with FP8 (float8_e4m3fn) layers: activation scales max |x| / 448 from the same
        calibration data (always the minmax calibrator), weights per output channel max |w| / 448
        (docs/INT8.md "FP8"); not with int8.
    calibrator: "entropy" (TensorRT's KL-divergence threshold), "minmax" or "percentile"
        (`percentile` percent of |x|, default 99.99).
    calibration_data: the batches calibration runs: a folder of .npz files (or one .npz) of input
        name -> array, or an iterable of feed dicts that can be iterated twice (a data loader).
    calibration_cache: a calibration cache file: read when it exists (calibration skipped),
        written after calibrating otherwise (polykit.compiler.builder.calibration_cache).
    tensor_ranges: tensor name -> (min, max): per-tensor dynamic ranges that override calibration
        (the scale is max(|min|, |max|) / 127; with fp8, / 448).
    calibration_profile: the shapes a build with profiles calibrates at (TensorRT's
        setCalibrationProfile): the calibration batches may have any shape inside it; None: the
        last of `profiles` (Polygraphy's choice). One scale set serves every profile.
    ranks / rank: split the model tensor-parallel over `ranks` ranks and build rank `rank`'s plan
        (polykit.compiler.builder.distributed; build_rank_plans builds every rank's).
    refittable: the plan records how its weights derive from the model's initializers, so
        `polykit refit` / Refitter replace them without a rebuild (polykit.compiler.builder.refit,
        docs/REFIT.md); not with int8 calibration (its scales depend on the weights).
    weight_streaming: the plan records which weights each layer reads, in run order, so the
        runtime can keep only a budget of them resident and stream the rest from host memory
        (Engine.set_weight_streaming_budget, polykit.runtime.weight_streaming, docs/WEIGHT_STREAMING.md).
    version_compatible: the plan loads with other polykit versions whose tactics have the same
        revisions (polykit.compiler.plan.compatibility); otherwise only with this one.
    hardware_compatibility_level: "none" (the plan runs on the build's compute capability) or
        "ampere+" (only tactics that run on every GPU of compute capability 8.0 and later).
    input_io_formats / output_io_formats: the dtype and layout of the engine's inputs / outputs
        as trtexec spells them ("fp16:chw", "fp32:hwc", "bf16:chw", "int8:chw"): one per tensor in
        the model's order, or one for all (polykit.compiler.passes.io_formats); empty: the model's.
    device: the GPU (cuda ordinal) the builder times tactics on and the engine loads on (None:
        device 0); not recorded in the plan (the plan records the architecture it was built for).
    sparsity: "disable" (the default), "enable" (Gemm / MatMul / Conv layers whose constant
        weight already has the 2:4 pattern along the reduction axis are listed in the build log,
        and get a sparse tactic candidate, timed against the dense ones) or "force" (eligible-
        shaped weights are pruned to 2:4 by magnitude first, which changes the results: for
        speed studies); polykit.compiler.builder.sparsity, docs/SPARSITY.md.
    profiling_verbosity: what the NVTX range around each layer launch may say (polykit.runtime.nvtx):
        "none", "layer_names_only" (the default) or "detailed" (the layer's kind and tactic too).
    pdl: the cuda runtime launches the plan's kernels with Programmatic Dependent Launch on sm_90+
        GPUs (each kernel's launch overlaps the tail of the one before it; polykit.kernels.cuda.pdl,
        docs/CUDA_KERNELS.md): recorded in the plan (only when on) as the runtime's default, which
        Engine(plan, pdl=...) overrides. Tactics are timed without it. Off by default (unmeasured).
    """

    target: str | None = None
    fp16: bool = False
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict, hash=False)
    mark_outputs: tuple[str, ...] = ()
    mark_all: bool = False
    fold_constants: bool = True
    fuse: bool = True
    tactic_replay: str | os.PathLike | TacticReplay | None = None
    save_tactics: str | os.PathLike | None = None
    profile: bool = False
    memory_strategy: str = "best-fit"
    fp32_layers: tuple[str, ...] = ()
    input_values: Mapping[str, Any] = field(default_factory=dict, hash=False)
    shape_values: Mapping[str, Any] = field(default_factory=dict, hash=False)
    channels_last: bool | None = None
    builder_optimization_level: int = 3
    workspace_limit: int | None = None
    load_timing_cache: str | os.PathLike | None = None
    save_timing_cache: str | os.PathLike | None = None
    error_on_timing_cache_miss: bool = False
    bf16: bool = False
    tf32: bool = False
    precision_constraints: str = "none"
    layer_precisions: Mapping[str, str] = field(default_factory=dict, hash=False)
    strongly_typed: bool = False
    expose_tensors: tuple[str, ...] = ()
    force_marks: bool = False
    int8: bool = False
    fp8: bool = False
    calibrator: str = "entropy"
    percentile: float = 99.99
    calibration_data: str | os.PathLike | Iterable[Mapping[str, Any]] | None = field(default=None, compare=False)
    calibration_cache: str | os.PathLike | None = None
    tensor_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict, hash=False)
    profiles: tuple[Profile, ...] = ()
    calibration_profile: Profile | None = field(default=None, compare=False)
    ranks: int = 1
    rank: int = 0
    refittable: bool = False
    weight_streaming: bool = False
    version_compatible: bool = False
    hardware_compatibility_level: str = "none"
    input_io_formats: tuple[str, ...] = ()
    output_io_formats: tuple[str, ...] = ()
    device: int | None = None
    profiling_verbosity: str = "layer_names_only"
    sparsity: str = "disable"
    pdl: bool = False

    def __post_init__(self) -> None:
        # Normalize containers so equal configs compare and serialize equally.
        shapes = {}
        for name, shape in dict(self.input_shapes or {}).items():
            try:
                shapes[str(name)] = tuple(int(d) for d in shape)
            except (TypeError, ValueError):
                raise UsageError(
                    f"input shape for {name!r} must be a sequence of ints, got {shape!r}",
                    hint="e.g. input_shapes={'x': (1, 3, 224, 224)}",
                ) from None
            if any(d < 0 for d in shapes[str(name)]):
                raise UsageError(f"input shape for {name!r} has a negative dim: {shape!r}",
                                 hint="dims are >= 0, e.g. --input-shapes x:[1,3,224,224]")
        object.__setattr__(self, "input_shapes", shapes)
        profiles = (self.profiles,) if isinstance(self.profiles, (Profile, Mapping)) else tuple(self.profiles or ())
        object.__setattr__(self, "profiles", tuple(p if isinstance(p, Profile) else Profile(p) for p in profiles))
        if self.calibration_profile is not None and not isinstance(self.calibration_profile, Profile):
            object.__setattr__(self, "calibration_profile", Profile(self.calibration_profile))
        for key in ("mark_outputs", "expose_tensors"):
            names = getattr(self, key)
            object.__setattr__(self, key, (names,) if isinstance(names, str) else tuple(names))
        layers = self.fp32_layers
        object.__setattr__(self, "fp32_layers", (layers,) if isinstance(layers, str) else tuple(layers))
        for key in ("input_io_formats", "output_io_formats"):  # checked and spelled one way
            formats = getattr(self, key)
            formats = (formats,) if isinstance(formats, (str, IoFormat)) else tuple(formats or ())
            object.__setattr__(self, key, tuple(str(IoFormat.parse(str(f))) for f in formats))
        for key in ("input_values", "shape_values"):
            values = {}
            for name, value in dict(getattr(self, key) or {}).items():
                arr = np.asarray(value)
                if arr.dtype == object:
                    raise UsageError(f"{key} for {name!r} must be a numeric array",
                                     hint="give integers, e.g. --trt-opt-shape-values shape:[1,16]")
                values[str(name)] = arr
            object.__setattr__(self, key, values)
        both = sorted(set(self.input_values) & set(self.shape_values))
        if both:
            raise UsageError(f"input {both[0]!r} has both input_values (fixed) and shape_values (opt of a range)",
                             hint="give a shape-tensor input one of them")
        if isinstance(self.tactic_replay, Mapping):
            object.__setattr__(self, "tactic_replay", TacticReplay.from_assignment(self.tactic_replay))
        self._check_tuning()
        self._check_precision()
        self._check_int8()
        self._check_ranks()
        if self.refittable and (self.int8 or self.fp8):
            raise UsageError("a refittable build cannot calibrate INT8 / FP8: the calibrated scales depend on the "
                             "weights a refit replaces",
                             hint="drop --int8 / --fp8 (a model with Q/DQ is refittable), or --refittable")
        if self.sparsity not in SPARSITY:
            raise UsageError(f"unknown sparsity mode {self.sparsity!r}", hint=f"use one of: {', '.join(SPARSITY)}")
        if self.sparsity != "disable" and self.refittable:
            raise UsageError("a refittable build cannot use sparse tactics: their weights are compressed in the plan",
                             hint="drop --sparsity, or --refittable")
        if self.hardware_compatibility_level not in HARDWARE_LEVELS:
            raise UsageError(f"unknown hardware compatibility level {self.hardware_compatibility_level!r}",
                             hint=f"use one of: {', '.join(HARDWARE_LEVELS)}")
        check_verbosity(self.profiling_verbosity)
        if not isinstance(self.pdl, bool):
            raise UsageError(f"pdl {self.pdl!r} is not True or False", hint="e.g. BuilderConfig(pdl=True), or --pdl")
        if self.device is not None and (isinstance(self.device, bool) or not isinstance(self.device, int)
                                        or self.device < 0):
            raise UsageError(f"device {self.device!r} is not a GPU ordinal (an integer >= 0)", hint="e.g. --device 1")
        if self.memory_strategy not in MEMORY_STRATEGIES:
            raise UsageError(
                f"unknown memory strategy {self.memory_strategy!r}",
                hint=f"use one of: {', '.join(MEMORY_STRATEGIES)}",
            )

    def tactic_arch(self, device_arch: str) -> str:
        """The GPU arch whose tactics the build may take: the device's, or "" (the tactics that
        declare no arch, which run on every GPU) for a hardware-compatibility level."""
        return device_arch if self.hardware_compatibility_level == "none" else ""

    def channels_last_for(self, target: str, conv_pixels: Sequence[int] = (), int8_layers: bool = False) -> bool:
        """Whether a build for `target` runs convolutions channels-last. None (auto): the cuda
        target's half and tf32 builds, builds with INT8 layers (`int8`, or `int8_layers` when the
        model's Q/DQ fold), and fp32 builds whose convolutions are large (median output pixels
        N * OH * OW of the 2-D convolutions, N * L' of the 1-D and N * OD * OH * OW of the 3-D ones, `conv_pixels`, at least
        FP32_NHWC_PIXELS): the NHWC 3xTF32 tensor-core kernels win there (ResNet-50 bs32 7.6 vs
        18.5 ms on the H100), the NCHW SIMT and split-K kernels at small ones (bs1 1.2 vs 2.3 ms)."""
        if self.channels_last is not None:
            return bool(self.channels_last)
        if target != "cuda":
            return False
        if self.fp16 or self.bf16 or self.tf32 or self.int8 or self.fp8 or int8_layers:
            return True
        return bool(conv_pixels) and sorted(conv_pixels)[len(conv_pixels) // 2] >= FP32_NHWC_PIXELS

    def _check_tuning(self) -> None:
        level = self.builder_optimization_level
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 5:
            raise UsageError(f"builder optimization level {level!r} is not an integer from 0 to 5",
                             hint="0: no timing, 3: the default, 5: time every candidate")
        limit = self.workspace_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise UsageError(f"workspace limit {limit!r} is not a byte count >= 0", hint="e.g. workspace_limit=1 << 30")

    def _check_ranks(self) -> None:
        ranks, rank = self.ranks, self.rank
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise UsageError(f"ranks {ranks!r} is not an integer >= 1", hint="e.g. --ranks 2")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
            raise UsageError(f"rank {rank!r} is not in 0..{ranks - 1}", hint="ranks are numbered from 0")
        if ranks > 1 and (self.profiles or self.int8 or self.fp8 or self.mark_outputs or self.mark_all or self.expose_tensors):
            raise UsageError("a build split over ranks takes static input shapes and no profiles, INT8 or marked "
                             "outputs", hint="drop --ranks, or those options")

    def _check_precision(self) -> None:
        if self.precision_constraints not in PRECISION_CONSTRAINTS:
            raise UsageError(f"unknown precision constraints {self.precision_constraints!r}",
                             hint=f"use one of: {', '.join(PRECISION_CONSTRAINTS)}")
        layers = {str(k): str(v) for k, v in dict(self.layer_precisions or {}).items()}
        bad = {k: v for k, v in layers.items() if v not in PRECISIONS}
        if bad:
            name, value = next(iter(bad.items()))
            raise UsageError(f"layer precision {value!r} for {name!r} is not one of {', '.join(PRECISIONS)}",
                             hint="e.g. layer_precisions={'conv1': 'fp32'}")
        object.__setattr__(self, "layer_precisions", dict(sorted(layers.items())))
        if self.strongly_typed and (self.fp16 or self.bf16 or self.tf32):
            raise UsageError("a strongly typed build follows the model's dtypes; it takes no --fp16/--bf16/--tf32",
                             hint="drop --strongly-typed, or the precision flags")

    def _check_int8(self) -> None:
        if self.int8 and self.fp8:
            raise UsageError("a build quantizes to INT8 or to FP8, not both", hint="drop --int8 or --fp8")
        if self.calibrator not in CALIBRATORS:
            raise UsageError(f"unknown calibrator {self.calibrator!r}", hint=f"use one of: {', '.join(sorted(CALIBRATORS))}")
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)) \
                or not 0 < self.percentile <= 100:
            raise UsageError(f"percentile {self.percentile!r} is not a number in (0, 100]", hint="e.g. 99.99")
        ranges = {}
        for name, pair in dict(self.tensor_ranges or {}).items():
            try:
                low, high = (float(v) for v in pair)
            except (TypeError, ValueError):
                raise UsageError(f"the range of {name!r} is not (min, max): {pair!r}",
                                 hint="e.g. tensor_ranges={'conv1_out': (-4.0, 6.0)}") from None
            if not (math.isfinite(low) and math.isfinite(high) and low <= high and max(-low, high) > 0):
                raise UsageError(f"the range of {name!r} is not finite min <= max around a non-zero value: "
                                 f"({low}, {high})", hint="give min <= max, e.g. --tensor-ranges x:-4,4")
            ranges[str(name)] = (low, high)
        object.__setattr__(self, "tensor_ranges", dict(sorted(ranges.items())))

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (shapes as lists) for plan metadata. The side files a build reads or
        writes (SIDE_FILES) are left out: they are not what the plan is, so a build that saves
        its tactics and one that replays them give the same plan bytes."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in SIDE_FILES}
        d["input_shapes"] = {k: list(v) for k, v in sorted(self.input_shapes.items())}
        for key in ("input_values", "shape_values"):
            d[key] = {k: {"dtype": v.dtype.name, "shape": list(v.shape), "values": v.ravel().tolist()}
                      for k, v in sorted(getattr(self, key).items())}
        d["mark_outputs"] = list(self.mark_outputs)
        d["expose_tensors"] = list(self.expose_tensors)
        d["fp32_layers"] = list(self.fp32_layers)
        d["layer_precisions"] = dict(self.layer_precisions)
        d["tensor_ranges"] = {k: list(v) for k, v in self.tensor_ranges.items()}
        d["profiles"] = [p.to_json() for p in self.profiles]
        if not self.refittable:  # recorded only when set: other plans' bytes stay as they were
            del d["refittable"]
        if not self.weight_streaming:
            del d["weight_streaming"]
        if self.sparsity == "disable":
            del d["sparsity"]
        for key in ("input_io_formats", "output_io_formats"):  # absent when unset: older plans' bytes stay
            if d[key]:
                d[key] = list(d[key])
            else:
                del d[key]
        if self.profiling_verbosity == "layer_names_only":
            del d["profiling_verbosity"]
        if not self.pdl:
            del d["pdl"]
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "BuilderConfig":
        known = {k: v for k, v in d.items() if k in BuilderConfig.__dataclass_fields__}
        for key in ("input_values", "shape_values"):
            if key in known:
                known[key] = {k: np.asarray(v["values"], dtype=v["dtype"]).reshape(v["shape"])
                              for k, v in known[key].items()}
        for key in ("mark_outputs", "expose_tensors"):
            if key in known:
                known[key] = tuple(known[key])
        if "fp32_layers" in known:
            known["fp32_layers"] = tuple(known["fp32_layers"])
        if "profiles" in known:
            known["profiles"] = tuple(Profile.from_json(p) for p in known["profiles"])
        if "tensor_ranges" in known:
            known["tensor_ranges"] = {k: tuple(v) for k, v in known["tensor_ranges"].items()}
        return BuilderConfig(**known)
