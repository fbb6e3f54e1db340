"""BuilderConfig: everything that steers a build, as one frozen record.

The config travels explicitly (no globals): `Builder(config).build(graph)` and
`build_plan(model, config)`. Its JSON form is stored in the plan's metadata so a plan
says how it was built.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from polykit.compiler.tactic_replay import TacticReplay
from polykit.errors import UsageError

#: memory planning strategies understood by polykit.compiler.memory.plan_memory
MEMORY_STRATEGIES = ("best-fit", "first-fit", "none")
#: fields naming files a build reads or writes besides the model; not recorded in plans
SIDE_FILES = frozenset({"tactic_replay", "save_tactics"})


@dataclass(frozen=True)
class BuilderConfig:
    """How to build a plan.

    target: "cpu", "cuda" or None (auto: cuda when a GPU is usable, else cpu).
    fp16: float32 tensors and weights become float16, engine I/O stays float32
        (polykit.compiler.passes.convert_to_fp16); on cpu the reference kernels run in float16.
    fp32_layers: with fp16, layers (node names or op types, e.g. "Softmax") kept in float32.
    input_shapes: concrete shapes for graph inputs with dynamic dims, by input name.
    mark_outputs: intermediate tensors to make plan outputs (kept from being fused away).
    mark_all: mark every intermediate tensor as an output (layerwise debugging).
    fold_constants / fuse: switch the optimizer's folding and fusion passes.
    tactic_replay: tactic choices to force (polykit.compiler.tactic_replay): a replay file
        written by save_tactics, a TacticReplay, or {layer name: tactic name} in process.
    save_tactics: write the chosen tactics to this file (a tactic replay file).
    profile: record per-layer timing while running (execution contexts honour it).
    memory_strategy: "best-fit" (default), "first-fit" or "none" (no arena reuse).
    input_values: build-time values of graph inputs, by name (TensorRT's shape-tensor inputs):
        shape inference sees them, so shapes that depend on an input's data (a Reshape's
        shape, Pad's pads, NonZero's count) become static; the engine then accepts only
        feeds equal to these values for those inputs.
    channels_last: run 2-D convolutions and pools in NHWC (passes.to_channels_last); None (auto)
        turns it on for fp16 builds of the cuda target (channels_last_for).
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
    channels_last: bool | None = None

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
                raise UsageError(f"input shape for {name!r} has a negative dim: {shape!r}")
        object.__setattr__(self, "input_shapes", shapes)
        if isinstance(self.mark_outputs, str):
            object.__setattr__(self, "mark_outputs", (self.mark_outputs,))
        else:
            object.__setattr__(self, "mark_outputs", tuple(self.mark_outputs))
        layers = self.fp32_layers
        object.__setattr__(self, "fp32_layers", (layers,) if isinstance(layers, str) else tuple(layers))
        values = {}
        for name, value in dict(self.input_values or {}).items():
            arr = np.asarray(value)
            if arr.dtype == object:
                raise UsageError(f"input value for {name!r} must be a numeric array")
            values[str(name)] = arr
        object.__setattr__(self, "input_values", values)
        if isinstance(self.tactic_replay, Mapping):
            object.__setattr__(self, "tactic_replay", TacticReplay.from_assignment(self.tactic_replay))
        if self.memory_strategy not in MEMORY_STRATEGIES:
            raise UsageError(
                f"unknown memory strategy {self.memory_strategy!r}",
                hint=f"use one of: {', '.join(MEMORY_STRATEGIES)}",
            )

    def channels_last_for(self, target: str) -> bool:
        """Whether a build for `target` runs convolutions channels-last (None: fp16 cuda builds)."""
        if self.channels_last is not None:
            return bool(self.channels_last)
        return target == "cuda" and self.fp16

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (shapes as lists) for plan metadata. The side files a build reads or
        writes (SIDE_FILES) are left out: they are not what the plan is, so a build that saves
        its tactics and one that replays them give the same plan bytes."""
        d = {k: v for k, v in asdict(self).items() if k not in SIDE_FILES}
        d["input_shapes"] = {k: list(v) for k, v in sorted(self.input_shapes.items())}
        d["input_values"] = {k: {"dtype": v.dtype.name, "shape": list(v.shape), "values": v.ravel().tolist()}
                             for k, v in sorted(self.input_values.items())}
        d["mark_outputs"] = list(self.mark_outputs)
        d["fp32_layers"] = list(self.fp32_layers)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "BuilderConfig":
        known = {k: v for k, v in d.items() if k in BuilderConfig.__dataclass_fields__}
        if "input_values" in known:
            known["input_values"] = {k: np.asarray(v["values"], dtype=v["dtype"]).reshape(v["shape"])
                                     for k, v in known["input_values"].items()}
        if "mark_outputs" in known:
            known["mark_outputs"] = tuple(known["mark_outputs"])
        if "fp32_layers" in known:
            known["fp32_layers"] = tuple(known["fp32_layers"])
        return BuilderConfig(**known)
