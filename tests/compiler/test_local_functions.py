"""ONNX local functions (ModelProto.functions): expanded at import, so a model whose exporter kept
a module whole as a function runs and is inspected like its flat form (issue 32, point 10)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.tools.cli.app import main


def _model() -> onnx.ModelProto:
    """Y = ScaledRelu(X, S) twice, ScaledRelu(x, s) = Relu(x * s) + alpha (an attribute of the call)."""
    body = [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
            helper.make_node("Constant", [], ["alpha"], name="alpha_ref", value_float=0.0),
            helper.make_node("Add", ["r", "alpha"], ["y"])]
    ref = onnx.AttributeProto(name="value_float", ref_attr_name="alpha", type=onnx.AttributeProto.FLOAT)
    body[2].ClearField("attribute")
    body[2].attribute.extend([ref])
    fn = helper.make_function("local", "ScaledRelu", ["x", "s"], ["y"], body, [helper.make_opsetid("", 18)],
                              attributes=["alpha"])
    calls = [helper.make_node("ScaledRelu", ["X", "S"], ["h"], domain="local", alpha=0.25),
             helper.make_node("ScaledRelu", ["h", "S"], ["Y"], domain="local", alpha=-1.0)]
    graph = helper.make_graph(calls, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 5]),
                                           helper.make_tensor_value_info("S", TensorProto.FLOAT, [5])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                              functions=[fn])
    onnx.checker.check_model(model)
    return model


def test_a_model_with_local_functions_imports_as_its_expanded_ops_and_computes_what_onnxruntime_does():
    model = _model()
    graph = load_onnx(model)
    assert {n.op_type for n in graph.nodes} <= {"Mul", "Relu", "Add", "Constant"}
    feeds = {"X": np.random.default_rng(3).standard_normal((2, 5)).astype(np.float32),
             "S": np.linspace(-1, 1, 5).astype(np.float32)}
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(evaluate_graph(graph, feeds)["Y"], want, rtol=1e-6, atol=1e-6)


def test_inspect_capability_and_run_take_a_model_with_local_functions(tmp_path, capsys):
    path = tmp_path / "functions.onnx"
    onnx.save(_model(), path)
    assert main(["inspect", "capability", str(path), "--json"]) == 0
    assert main(["run", str(path), "--trt", "--onnxrt", "--target", "cpu"]) == 0
