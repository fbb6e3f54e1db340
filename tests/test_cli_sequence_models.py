"""Acceptance (issue 15): an LSTM model built with onnx.helper (random weights, seq 7, batch 3,
bidirectional, with Y, Y_h and Y_c feeding later nodes) passes `polykit run --trt --onnxrt` at
default tolerances on the cpu target, and on cuda where a GPU is present."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.plugins import reset_plugin_manager
from polykit.tools.cli.app import main

SEQ, BATCH, INPUT, HIDDEN = 7, 3, 10, 16


@pytest.fixture(autouse=True)
def fresh_plugins():
    reset_plugin_manager()
    yield
    reset_plugin_manager()


def lstm_model(path):
    rng = np.random.default_rng(15)
    w = lambda *s: numpy_helper.from_array(rng.uniform(-0.4, 0.4, s).astype(np.float32))  # noqa: E731
    inits = [w(2, 4 * HIDDEN, INPUT), w(2, 4 * HIDDEN, HIDDEN), w(2, 8 * HIDDEN), w(2 * HIDDEN, 5), w(2, 3 * HIDDEN)]
    for t, name in zip(inits, ("W", "R", "B", "proj", "P")):
        t.name = name
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B", "", "h0", "", "P"], ["y", "y_h", "y_c"],
                         direction="bidirectional", hidden_size=HIDDEN),
        # (seq, 2, batch, hidden) -> (seq, batch, 2 * hidden) -> a projection
        helper.make_node("Transpose", ["y"], ["y_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["y_t", "shape"], ["y_flat"]),
        helper.make_node("MatMul", ["y_flat", "proj"], ["logits"]),
        helper.make_node("Add", ["y_h", "y_c"], ["state"]),
    ]
    inits.append(numpy_helper.from_array(np.array([SEQ, BATCH, 2 * HIDDEN], np.int64), "shape"))
    graph = helper.make_graph(
        nodes, "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SEQ, BATCH, INPUT]),
         helper.make_tensor_value_info("h0", TensorProto.FLOAT, [2, BATCH, HIDDEN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [SEQ, BATCH, 5]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, BATCH, HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return str(path)


def test_lstm_model_passes_trt_vs_onnxrt_on_cpu(tmp_path, capsys):
    assert main(["run", lstm_model(tmp_path / "lstm.onnx"), "--trt", "--onnxrt", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "FAILED" not in out


@pytest.mark.gpu
def test_lstm_model_passes_trt_vs_onnxrt_on_cuda(tmp_path, capsys):
    assert main(["run", lstm_model(tmp_path / "lstm.onnx"), "--trt", "--onnxrt", "--target", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "FAILED" not in out
