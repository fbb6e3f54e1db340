"""Small ONNX models and fixtures shared by the CLI-level test folders (tools, backends)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
MLP = REPO / "examples" / "models" / "mlp.onnx"
ADD_MUL = REPO / "examples" / "models" / "add_mul.onnx"


def save(model: onnx.ModelProto, path: Path) -> str:
    model.ir_version = 10
    onnx.save_model(model, str(path))
    return str(path)


def perturbed_mlp(path: Path, row: int = 3, col: int = 4, delta: float = 0.5) -> str:
    """The example MLP with one weight of fc2 changed."""
    model = onnx.load(str(MLP))
    for t in model.graph.initializer:
        if t.name == "w2":
            arr = numpy_helper.to_array(t).copy()
            arr[row, col] += delta
            t.CopyFrom(numpy_helper.from_array(arr, "w2"))
    return save(model, path)


def dynamic_model(path: Path) -> str:
    """y = Relu(x) * 2 with x of shape [N, 4] (dynamic batch)."""
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Mul", ["r", "two"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [two])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)


def nan_model(path: Path) -> str:
    """y = Log(x) - Log(x): NaN for x <= 0 (both runners agree on it)."""
    nodes = [helper.make_node("Log", ["x"], ["l"], name="log"), helper.make_node("Sub", ["l", "l"], ["y"], name="sub")]
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)


def int_input_model(path: Path) -> str:
    """y = Cast(i, float) + x, with an int64 input i."""
    nodes = [helper.make_node("Cast", ["i"], ["f"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Add", ["f", "x"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "ints",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [3]), helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)


@pytest.fixture
def mlp() -> str:
    return str(MLP)


@pytest.fixture
def add_mul() -> str:
    return str(ADD_MUL)


@pytest.fixture
def bad_mlp(tmp_path: Path) -> str:
    return perturbed_mlp(tmp_path / "mlp_bad.onnx")


@pytest.fixture
def dyn_model(tmp_path: Path) -> str:
    return dynamic_model(tmp_path / "dyn.onnx")


@pytest.fixture
def fresh_plugins(monkeypatch):
    """No plugin from the environment, a fresh plugin manager for the test, wide reports."""
    from polykit.plugins import reset_plugin_manager

    monkeypatch.delenv("POLYKIT_PLUGINS", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    reset_plugin_manager()
    yield
    reset_plugin_manager()


FAULT_PLUGIN = REPO / "examples" / "polykit-fault-plugin"


@pytest.fixture
def fault_plugin(fresh_plugins, monkeypatch):
    """The example fault plugin registered through POLYKIT_PLUGINS (importable from sys.path, as
    CI installs only polykit) in a fresh plugin manager, and no faulty layer until a test sets
    POLYKIT_FAULT_LAYERS."""
    monkeypatch.syspath_prepend(str(FAULT_PLUGIN))
    monkeypatch.setenv("POLYKIT_PLUGINS", "polykit_fault")
    monkeypatch.delenv("POLYKIT_FAULT_LAYERS", raising=False)
