"""The cuda pointwise kernels generated for fixed models (the torch test models and a
ResNet-50-shaped conv net, fp32 and fp16) do not change unnoticed: their sources hash to
tests/data/pointwise_kernels.json. After an intended change (a new fusion, a generator
improvement) regenerate it with `python -m tests.kernels.cuda.test_pointwise_golden` and say
why in the commit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from polykit.compiler.builder.plan_tensors import describe_tensors, stamp_layer
from polykit.compiler.builder.lower import lower
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes import optimize
from polykit.kernels.tactics import candidates
from tests.conv_models import resnet

DATA = Path(__file__).resolve().parents[2] / "data"
GOLDEN = DATA / "pointwise_kernels.json"
MODELS = ("bert_tiny_dynamo", "gpt2_tiny_dynamo", "vit_tiny_dynamo", "convnet_dynamo", "bert_tiny_ts", "gpt2_tiny_ts")


def generated() -> dict[str, str]:
    """`model/precision/layer/kernel` -> hash of the generated source, for every layer the
    cuda.pointwise tactic runs."""
    graphs = [(name, load_onnx(DATA / "torch" / f"{name}.onnx")) for name in MODELS]
    graphs.append(("resnet", load_onnx(resnet())))
    out = {}
    for name, graph in graphs:
        for precision in ("fp32", "fp16"):
            g = optimize(graph, fp16=precision == "fp16")
            lowered = lower(g)
            tensors = describe_tensors(g, lowered)
            for layer in lowered.layers:
                layer = stamp_layer(layer, tensors)
                for tactic in candidates("cuda", layer.kind, layer):
                    if tactic.name == "cuda.pointwise":
                        for k in tactic.kernels(layer):
                            out[f"{name}/{precision}/{layer.name}/{k.name}"] = hashlib.sha256(k.code.encode()).hexdigest()[:16]
    return out


def test_generated_pointwise_kernels_of_fixed_models_are_unchanged():
    assert generated() == json.loads(GOLDEN.read_text())


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(generated(), indent=0, sort_keys=True) + "\n")
