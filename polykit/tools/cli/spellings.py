"""Polygraphy's spellings that need more than a second option name (docs/POLYGRAPHY.md):

- `--model-type onnx|engine|...`: polykit tells a plan from an ONNX model by its bytes; the
  option is checked against that, and TensorRT-only kinds are refused with the reason;
- `--trt-outputs` / `--onnx-outputs` NAME... | `mark all` | `*`: polykit's --mark / --mark-all;
- precision names in `--layer-precisions` (float32, float16, bfloat16, tf32 and TensorRT's
  aliases) -> polykit's fp32 / fp16 / bf16 / tf32.
"""

from __future__ import annotations

from typing import Sequence

from polykit.errors import UsageError

#: Polygraphy --model-type -> polykit's model kind (backends.loaders.model_type)
MODEL_TYPES = {"onnx": "onnx", "engine": "plan", "plan": "plan"}
#: Polygraphy --model-type values polykit cannot run, and why
FOREIGN_MODEL_TYPES = {
    "frozen": "a TensorFlow frozen graph", "keras": "a Keras model", "ckpt": "a TensorFlow checkpoint",
    "tf": "a TensorFlow model", "trt-network-script": "a script building a TensorRT network with TensorRT's API",
    "caffe": "a Caffe model", "uff": "a UFF model",
}
#: precision names (polykit's, numpy's/ONNX's, TensorRT's DataType aliases) -> polykit's
PRECISION_NAMES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "tf32": "tf32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
}


def check_model_type(model: str, declared: str | None) -> None:
    """UsageError when Polygraphy's --model-type names a kind the file is not, or one polykit
    cannot run; nothing when it is not given."""
    if declared is None:
        return
    from polykit.backends.loaders import model_type

    key = declared.lower()
    if key in FOREIGN_MODEL_TYPES:
        raise UsageError(f"--model-type {declared}: {FOREIGN_MODEL_TYPES[key]} is not something polykit runs",
                         where=model, hint="polykit runs ONNX models and its own plans; export the model to ONNX")
    if key not in MODEL_TYPES:
        raise UsageError(f"--model-type {declared!r} is not onnx or engine (plan)", hint='give --model-type onnx, engine or plan, or leave it out: polykit tells the kind from the file')
    actual = model_type(model)
    if MODEL_TYPES[key] != actual:
        hint = ("polykit builds its own plans: `polykit convert MODEL.onnx -o MODEL.plan` (a TensorRT engine "
                "cannot be read)") if actual == "onnx" else "drop --model-type: polykit tells the kind from the file"
        raise UsageError(f"--model-type {declared} says {'a plan' if key != 'onnx' else 'an ONNX model'}, but the "
                         f"file is {'a polykit plan' if actual == 'plan' else 'not a polykit plan'}",
                         where=model, hint=hint)


def polygraphy_marks(mark_all: bool, mark_outputs: Sequence[str], outputs: Sequence[str]) -> tuple[bool, list[str]]:
    """--mark-all / --mark-outputs with the values of --trt-outputs / --onnx-outputs folded in
    ("mark all", "mark-all" or "*": every tensor; other values: tensor names)."""
    rest, i = [], 0
    while i < len(outputs):
        every = 2 if list(outputs[i:i + 2]) == ["mark", "all"] else 1 if outputs[i] in ("*", "mark-all") else 0
        mark_all = mark_all or every > 0
        rest += [] if every else [outputs[i]]
        i += every or 1
    return mark_all, list(dict.fromkeys(list(mark_outputs) + rest))


def precision_name(name: str) -> str | None:
    """polykit's precision for a name Polygraphy or polykit accepts (case-insensitive); None if unknown."""
    return PRECISION_NAMES.get(name.strip().lower())
