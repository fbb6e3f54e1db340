"""`polykit surgeon sanitize` keeps the model's opset and IR version unless --upgrade-opset, and
--external-data always writes the data file; `polykit surgeon extract` and
polykit.tools.model.subgraph cut subgraphs that pass onnx.checker and run in onnxruntime on the
values the full model gives their inputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.backends.loaders import MARK_ALL, ModifyOutputs
from polykit.errors import UsageError
from polykit.tools.cli.app import main
from polykit.tools.model.subgraph import TensorSpec, extract, parse_input_spec, parse_output_spec
from tests.cli_models import REPO, dynamic_model

CONVNET = str(REPO / "tests" / "data" / "torch" / "convnet_ts.onnx")
BLOCK_IN, BLOCK_OUT = "/stem/stem.2/Relu_output_0", "/blocks/blocks.0/Add_output_0"

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def _session(model) -> ort.InferenceSession:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _all_values(model, feeds: dict) -> dict[str, np.ndarray]:
    """Every tensor of `model` on `feeds`, from onnxruntime with every node output marked."""
    marked = ModifyOutputs(model, outputs=MARK_ALL)()
    sess = _session(marked)
    names = [o.name for o in sess.get_outputs()]
    return {**feeds, **dict(zip(names, sess.run(names, feeds)))}


def _image(seed: int = 0) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(seed).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)}


def _opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _reduce_mean_model(path) -> str:
    """opset 13, IR 7: ReduceMean with its axes as an attribute (an input since opset 18)."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=[1], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["y"], name="center")]
    graph = helper.make_graph(nodes, "rm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.save_model(model, str(path))
    return str(path)


# ---- sanitize -------------------------------------------------------------------------------
def test_sanitize_keeps_opset_17_and_ir_8_and_the_model_computes_the_same(tmp_path):
    out = tmp_path / "clean.onnx"
    assert main(["surgeon", "sanitize", CONVNET, "-o", str(out), "--fold-constants"]) == 0
    clean = onnx.load(str(out))
    assert (_opset(clean), clean.ir_version) == (17, 8)
    onnx.checker.check_model(clean, full_check=True)
    feeds = _image()
    np.testing.assert_allclose(_session(clean).run(None, feeds)[0], _session(CONVNET).run(None, feeds)[0], rtol=1e-5,
                               atol=1e-6)


def test_sanitize_converts_canonical_nodes_back_to_the_models_opset(tmp_path):
    out = tmp_path / "clean.onnx"
    assert main(["surgeon", "sanitize", _reduce_mean_model(tmp_path / "rm.onnx"), "-o", str(out)]) == 0
    clean = onnx.load(str(out))
    assert (_opset(clean), clean.ir_version) == (13, 7)
    onnx.checker.check_model(clean, full_check=True)
    mean = next(n for n in clean.graph.node if n.op_type == "ReduceMean")
    assert [a.name for a in mean.attribute if a.name == "axes"] == ["axes"] and list(mean.input) == ["x"]
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(_session(clean).run(None, {"x": x})[0], x - x.mean(axis=1, keepdims=True), rtol=1e-5,
                               atol=1e-6)


def test_upgrade_opset_writes_that_opset_with_its_ir_version(tmp_path):
    out = tmp_path / "up.onnx"
    assert main(["surgeon", "sanitize", CONVNET, "-o", str(out), "--upgrade-opset", "21"]) == 0
    up = onnx.load(str(out))
    assert (_opset(up), up.ir_version) == (21, 10)
    onnx.checker.check_model(up, full_check=True)


def test_upgrade_opset_converts_the_models_own_nodes_with_onnxs_converter(tmp_path):
    out = tmp_path / "up.onnx"
    assert main(["surgeon", "sanitize", _reduce_mean_model(tmp_path / "rm.onnx"), "-o", str(out),
                 "--upgrade-opset", "18"]) == 0
    up = onnx.load(str(out))
    assert (_opset(up), up.ir_version) == (18, 8)
    onnx.checker.check_model(up, full_check=True)
    mean = next(n for n in up.graph.node if n.op_type == "ReduceMean")
    assert len(mean.input) == 2 and not [a for a in mean.attribute if a.name == "axes"]
    x = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(_session(up).run(None, {"x": x})[0], x - x.mean(axis=1, keepdims=True), rtol=1e-5,
                               atol=1e-6)


def test_upgrade_opset_below_the_models_is_a_usage_error(tmp_path, capsys):
    assert main(["surgeon", "sanitize", CONVNET, "-o", str(tmp_path / "x.onnx"), "--upgrade-opset", "13"]) == 2
    assert "--upgrade-opset 13 is below the model's opset 17" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


def test_external_data_writes_the_data_file_even_when_every_tensor_is_small(tmp_path):
    small = str(REPO / "examples" / "models" / "add_mul.onnx")
    out = tmp_path / "ext.onnx"
    assert main(["surgeon", "sanitize", small, "-o", str(out), "--external-data"]) == 0
    assert (tmp_path / "ext.onnx.data").is_file()
    assert main(["run", str(out), "--trt", "--onnxrt", "--target", "cpu"]) == 0


def test_external_data_threshold_moves_the_tensors_of_that_size_and_more(tmp_path):
    out = tmp_path / "ext.onnx"
    assert main(["surgeon", "sanitize", CONVNET, "-o", str(out), "--external-data",
                 "--external-data-threshold", "4096"]) == 0
    proto = onnx.load(str(out), load_external_data=False)
    outside = {t.name for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    sizes = {t.name: numpy_helper.to_array(t).nbytes for t in onnx.load(CONVNET).graph.initializer}
    assert outside == {name for name, size in sizes.items() if size >= 4096} and outside != set(sizes)
    data = tmp_path / "ext.onnx.data"
    assert data.stat().st_size >= sum(sizes[n] for n in outside)
    feeds = _image(3)
    np.testing.assert_allclose(_session(out).run(None, feeds)[0], _session(CONVNET).run(None, feeds)[0], rtol=1e-5,
                               atol=1e-6)


def test_sanitize_twice_into_one_file_does_not_grow_the_data_file(tmp_path):
    out = tmp_path / "ext.onnx"
    args = ["surgeon", "sanitize", CONVNET, "-o", str(out), "--external-data", "--external-data-threshold", "0"]
    assert main(args) == 0
    size = (tmp_path / "ext.onnx.data").stat().st_size
    assert main(args) == 0
    assert (tmp_path / "ext.onnx.data").stat().st_size == size


# ---- extract --------------------------------------------------------------------------------
def test_an_extracted_block_passes_the_checker_and_computes_what_it_computes_in_the_model():
    sub = extract(CONVNET, [BLOCK_IN], [BLOCK_OUT])
    onnx.checker.check_model(sub, full_check=True)
    assert [n.name for n in sub.graph.node] == ["/blocks/blocks.0/c1/Conv", "/blocks/blocks.0/Relu",
                                                "/blocks/blocks.0/c2/Conv", "/blocks/blocks.0/Add"]
    assert (_opset(sub), sub.ir_version) == (17, 8)
    values = _all_values(onnx.load(CONVNET), _image(2))
    (got,) = _session(sub).run([BLOCK_OUT], {BLOCK_IN: values[BLOCK_IN]})
    np.testing.assert_allclose(got, values[BLOCK_OUT], rtol=1e-5, atol=1e-5)


def test_auto_shapes_and_dtypes_come_from_polykits_shape_inference():
    sub = extract(CONVNET, [TensorSpec(BLOCK_IN)], [TensorSpec("/pool/GlobalAveragePool_output_0")])
    (inp,), (out,) = sub.graph.input, sub.graph.output
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [2, 16, 16, 16]
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [2, 32, 1, 1]
    assert inp.type.tensor_type.elem_type == out.type.tensor_type.elem_type == TensorProto.FLOAT
    assert {t.name for t in sub.graph.initializer} <= {t.name for t in onnx.load(CONVNET).graph.initializer}


def test_a_symbolic_dim_stays_symbolic_and_a_given_shape_wins(tmp_path):
    model = dynamic_model(tmp_path / "dyn.onnx")
    auto = extract(model, ["r"], ["y"])
    assert [d.dim_param or d.dim_value for d in auto.graph.input[0].type.tensor_type.shape.dim] == ["N", 4]
    given = extract(model, [parse_input_spec("r:[3,4]:float32")], [parse_output_spec("y:auto")])
    assert [d.dim_value for d in given.graph.input[0].type.tensor_type.shape.dim] == [3, 4]
    r = np.random.default_rng(0).uniform(0, 1, (3, 4)).astype(np.float32)
    np.testing.assert_allclose(_session(given).run(None, {"r": r})[0], r * 2)


def test_the_cli_writes_the_subgraph_and_reports_it_as_json(tmp_path, capsys):
    out = tmp_path / "sub.onnx"
    assert main(["surgeon", "extract", CONVNET, "--inputs", f"{BLOCK_IN}:auto:auto", "--outputs",
                 f"{BLOCK_OUT}:float32", "logits:auto", "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"] == [{"name": BLOCK_IN, "dtype": "float32", "shape": [2, 16, 16, 16]}]
    assert [o["name"] for o in doc["outputs"]] == [BLOCK_OUT, "logits"] and len(doc["nodes"]) == 14
    sub = onnx.load(str(out))
    onnx.checker.check_model(sub, full_check=True)
    values = _all_values(onnx.load(CONVNET), _image(4))
    got = _session(sub).run(None, {BLOCK_IN: values[BLOCK_IN]})
    np.testing.assert_allclose(got[1], values["logits"], rtol=1e-4, atol=1e-5)
    assert main(["run", str(out), "--trt", "--onnxrt", "--target", "cpu", "--atol", "1e-4", "--rtol", "1e-4"]) == 0


def test_left_out_inputs_or_outputs_default_to_the_models(tmp_path, capsys):
    out = tmp_path / "head.onnx"
    assert main(["surgeon", "extract", CONVNET, "--outputs", BLOCK_OUT, "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [i["name"] for i in doc["inputs"]] == ["image"] and len(doc["nodes"]) == 6
    assert main(["surgeon", "extract", CONVNET, "--inputs", BLOCK_IN, "-o", str(out), "--json"]) == 0
    assert [o["name"] for o in json.loads(capsys.readouterr().out)["outputs"]] == ["logits"]
    assert main(["surgeon", "extract", CONVNET, "-o", str(out)]) == 2
    assert "give the subgraph's --inputs, its --outputs or both" in capsys.readouterr().err


def test_constants_stop_the_walk_and_become_initializers():
    value = np.random.default_rng(5).uniform(0, 1, (2, 16, 16, 16)).astype(np.float32)
    sub = extract(CONVNET, [], [BLOCK_OUT], constants={BLOCK_IN: value})
    assert not sub.graph.input and len(sub.graph.node) == 4
    onnx.checker.check_model(sub, full_check=True)
    (got,) = _session(sub).run(None, {})
    (want,) = _session(extract(CONVNET, [BLOCK_IN], [BLOCK_OUT])).run(None, {BLOCK_IN: value})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # onnxruntime folds the constant part its own way


def test_a_graph_input_the_outputs_need_must_be_among_the_inputs(tmp_path):
    with pytest.raises(UsageError, match="needs the graph input 'image'") as info:
        extract(CONVNET, [BLOCK_IN], ["/blocks/blocks.0/c2/Conv_output_0", "/stem/stem.0/Conv_output_0"])
    assert "--inputs image:auto:auto" in info.value.hint


@pytest.mark.parametrize("inputs, outputs, message", [
    (["nope"], [BLOCK_OUT], "--inputs names no tensor of the model: 'nope'"),
    ([BLOCK_IN], ["logits", "logits"], "--outputs names twice: 'logits'"),
])
def test_bad_tensor_names_are_usage_errors(inputs, outputs, message, tmp_path, capsys):
    with pytest.raises(UsageError, match=message):
        extract(CONVNET, inputs, outputs)
    assert main(["surgeon", "extract", CONVNET, "--inputs", *inputs, "--outputs", *outputs,
                 "-o", str(tmp_path / "s.onnx")]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("text, spec", [
    ("x:[1,3,224,224]:float32", TensorSpec("x", (1, 3, 224, 224), np.dtype("float32"))),
    ("x:auto:auto", TensorSpec("x")),
    ("onnx::Conv_58:[batch,?,8]:int64", TensorSpec("onnx::Conv_58", ("batch", None, 8), np.dtype("int64"))),
    ("plain", TensorSpec("plain")),
])
def test_input_specs_follow_polygraphys_syntax(text, spec):
    assert parse_input_spec(text) == spec


@pytest.mark.parametrize("text, spec", [
    ("logits:float16", TensorSpec("logits", None, np.dtype("float16"))),
    ("y:auto", TensorSpec("y")),
    ("onnx::Conv_58", TensorSpec("onnx::Conv_58")),
])
def test_output_specs_take_a_dtype_only_when_the_last_part_is_one(text, spec):
    assert parse_output_spec(text) == spec


def test_a_bad_dtype_or_dim_is_a_usage_error():
    with pytest.raises(UsageError, match="'float99' is not a dtype"):
        parse_input_spec("x:auto:float99")
    with pytest.raises(UsageError, match="has a dim that is not a number"):
        parse_input_spec("x:[1,-3]:auto")
