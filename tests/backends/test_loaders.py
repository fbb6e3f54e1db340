import numpy as np
import onnx
import pytest

from polykit.backends.loaders import (
    MARK_ALL, EngineBytesFromPath, EngineFromOnnx, EngineFromPath, EngineFromPlan, FoldConstants, GraphFromOnnx,
    ModifyOutputs, OnnxFromPath, PlanFromOnnx, SaveEngine, SaveOnnx,
)
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import ModelLoadError, PlanError, UsageError

CPU = BuilderConfig(target="cpu")


def test_loader_constructor_does_no_work(tmp_path):
    loader = OnnxFromPath(tmp_path / "missing.onnx")  # nothing read yet
    with pytest.raises(ModelLoadError):
        loader()


def test_onnx_from_path_returns_model_proto(mlp):
    model = OnnxFromPath(mlp)()
    assert isinstance(model, onnx.ModelProto) and model.graph.name == "mlp"


def test_modify_outputs_marks_chosen_tensor_with_its_type(mlp):
    model = ModifyOutputs(OnnxFromPath(mlp), outputs=["h_relu"])()
    names = [o.name for o in model.graph.output]
    assert names == ["logits", "probs", "h_relu"]
    assert model.graph.output[-1].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_modify_outputs_mark_all_adds_every_node_output(mlp):
    model = ModifyOutputs(mlp, outputs=MARK_ALL)()
    assert {o.name for o in model.graph.output} == {"h", "h_relu", "logits", "probs"}


def test_modify_outputs_rejects_unknown_tensor(mlp):
    with pytest.raises(UsageError):
        ModifyOutputs(mlp, outputs=["nope"])()


def test_modify_outputs_can_exclude_outputs(mlp):
    model = ModifyOutputs(mlp, exclude_outputs=["probs"])()
    assert [o.name for o in model.graph.output] == ["logits"]


def test_save_onnx_writes_loadable_model(mlp, tmp_path):
    out = tmp_path / "copy.onnx"
    SaveOnnx(OnnxFromPath(mlp), out)()
    assert onnx.load(str(out)).graph.name == "mlp"


def test_save_onnx_external_data_writes_data_file(mlp, tmp_path):
    out = tmp_path / "ext.onnx"
    SaveOnnx(mlp, out, external_data=True)()
    assert (tmp_path / "ext.onnx.data").is_file()
    assert len(OnnxFromPath(out)().graph.initializer) == 4


def test_fold_constants_folds_a_constant_subgraph(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    c = numpy_helper.from_array(np.array([1.0, 2.0], dtype=np.float32), "c")
    nodes = [helper.make_node("Add", ["c", "c"], ["cc"], name="fold_me"), helper.make_node("Add", ["x", "cc"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [c])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    folded = FoldConstants(model)()
    assert [n.op_type for n in folded.graph.node] == ["Add"]
    assert "fold_me" not in [n.name for n in folded.graph.node]


def test_graph_from_onnx_imports_to_polykit_ir(mlp):
    graph = GraphFromOnnx(OnnxFromPath(mlp))()
    assert graph.inputs == ["x"] and graph.outputs == ["logits", "probs"]


def test_engine_from_onnx_builds_engine_with_model_io(mlp):
    engine = EngineFromOnnx(mlp, config=CPU)()
    assert list(engine.input_metadata) == ["x"]
    assert engine.target == "cpu"


def test_save_engine_then_engine_from_path_round_trips(mlp, tmp_path):
    path = tmp_path / "mlp.plan"
    plan = SaveEngine(PlanFromOnnx(OnnxFromPath(mlp), CPU), path)()
    assert EngineBytesFromPath(path)() == plan.serialize()
    engine = EngineFromPath(path)()
    x = np.random.default_rng(0).random((1, 16), dtype=np.float32)
    direct = EngineFromPlan(plan)().create_execution_context().execute({"x": x})
    loaded = engine.create_execution_context().execute({"x": x})
    np.testing.assert_array_equal(direct["probs"], loaded["probs"])


def test_save_engine_accepts_an_engine_loader(mlp, tmp_path):
    path = tmp_path / "e.plan"
    SaveEngine(EngineFromOnnx(mlp, config=CPU), path)()
    assert path.read_bytes()[:8] == b"PLYKPLAN"


def test_engine_from_path_missing_file_is_plan_error(tmp_path):
    with pytest.raises(PlanError):
        EngineFromPath(tmp_path / "none.plan")()


def test_loaders_repr_names_arguments(mlp):
    assert "OnnxFromPath" in repr(OnnxFromPath(mlp)) and "mlp.onnx" in repr(OnnxFromPath(mlp))
