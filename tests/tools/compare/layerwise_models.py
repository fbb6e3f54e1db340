"""Real conv and matmul models for the layerwise tests (first divergence, marking, reports)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.cli_models import save


def _weights(seed: int, perturb: str | None):
    rng = np.random.default_rng(seed)
    inits = []

    def w(name: str, shape: tuple[int, ...], scale: float = 0.3) -> str:
        arr = (rng.standard_normal(shape) * scale).astype(np.float32)
        if perturb == name:
            arr.reshape(arr.shape[0], -1)[0] += 0.5  # the first output channel / row, all of it
        inits.append(numpy_helper.from_array(arr, name))
        return name

    return inits, w


def convnet(path: Path, perturb: str | None = None, channels: int = 8, size: int = 16) -> str:
    """conv1-relu1-conv2-relu2-conv3 -> GlobalAveragePool -> Flatten -> fc (MatMul + Add) -> Softmax.

    polykit fuses conv1+relu1 and conv2+relu2 (their Conv outputs c1, c2 are fused away) and
    fc's MatMul + Add; conv3's output c3 lies between layers. `perturb` names a weight (w1, w2,
    w3, wf...) whose first output channel is shifted by 0.5."""
    inits, w = _weights(7, perturb)
    c = channels
    nodes = [
        helper.make_node("Conv", ["x", w("w1", (c, 3, 3, 3)), w("b1", (c,))], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", w("w2", (c, c, 3, 3)), w("b2", (c,))], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", w("w3", (c, c, 3, 3)), w("b3", (c,))], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c3"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", w("wf", (c, 5))], ["m"], name="fc"),
        helper.make_node("Add", ["m", w("bf", (5,))], ["logits"], name="fc_bias"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 5])], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def gelu_mlp(path: Path) -> str:
    """MatMul + Add + Gelu (opset 20) -> MatMul + Add: polykit fuses each into one layer."""
    inits, w = _weights(3, None)
    nodes = [
        helper.make_node("MatMul", ["x", w("w1", (16, 32))], ["h"], name="fc1"),
        helper.make_node("Add", ["h", w("b1", (32,))], ["hb"], name="fc1_bias"),
        helper.make_node("Gelu", ["hb"], ["a"], name="gelu"),
        helper.make_node("MatMul", ["a", w("w2", (32, 8))], ["o"], name="fc2"),
        helper.make_node("Add", ["o", w("b2", (8,))], ["y"], name="fc2_bias"),
    ]
    graph = helper.make_graph(nodes, "gelu_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
