"""Generate the small example models bundled with polykit (run: python3 examples/models/make_models.py).

- mlp.onnx: x[1,16] -> Gemm -> Relu -> Gemm -> Softmax (a tiny classifier, fixed random weights)
- add_mul.onnx: elementwise only: y = (a + b) * a - b (works with any op family present)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32) * 0.5, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32) * 0.1, "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 10)).astype(np.float32) * 0.5, "w2")
    b2 = numpy_helper.from_array(rng.standard_normal(10).astype(np.float32) * 0.1, "b2")
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["h_relu"], name="relu1"),
        helper.make_node("Gemm", ["h_relu", "w2", "b2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])],
        [w1, b1, w2, b2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], producer_name="polykit-examples")
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def add_mul() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("Mul", ["s", "a"], ["p"], name="mul"),
        helper.make_node("Sub", ["p", "b"], ["y"], name="sub"),
    ]
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 4])  # noqa: E731
    graph = helper.make_graph(nodes, "add_mul", [vi("a"), vi("b")], [vi("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], producer_name="polykit-examples")
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def main() -> None:
    for name, make in (("mlp", mlp), ("add_mul", add_mul)):
        path = HERE / f"{name}.onnx"
        onnx.save_model(make(), str(path))
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
