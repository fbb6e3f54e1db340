"""Polygraphy's spellings on polykit's commands (docs/POLYGRAPHY.md): each form as a Polygraphy
user writes it, on the cpu target."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polykit.tools.cli.app import main
from polykit.tools.data import polygraphy_json
from tests.cli_models import ADD_MUL

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def test_json_data_is_saved_in_polygraphys_format_and_read_back(tmp_path):
    inputs, outputs = tmp_path / "inputs.json", tmp_path / "run_0_outputs.json"
    assert main(["run", str(ADD_MUL), "--onnxrt", "--save-inputs", str(inputs), "--save-outputs", str(outputs)]) == 0
    feeds, results = json.loads(inputs.read_text()), json.loads(outputs.read_text())
    assert polygraphy_json.polygraphy_class(next(iter(feeds[0].values()))) == "ndarray"
    assert results["polygraphy_class"] == "RunResults" and results["lst"][0][0] == "onnxrt"
    assert main(["run", str(ADD_MUL), "--onnxrt", "--load-inputs", str(inputs), "--load-outputs", str(outputs)]) == 0


def test_format_polykit_keeps_polykits_json(tmp_path):
    inputs = tmp_path / "inputs.json"
    assert main(["run", str(ADD_MUL), "--onnxrt", "--save-inputs", str(inputs), "--format", "polykit"]) == 0
    feed = json.loads(inputs.read_text())[0]
    assert all(set(v) == {"dtype", "data"} for v in feed.values())


# ---- models -------------------------------------------------------------------------------
def _save(tmp_path, name, nodes, inputs, outputs, initializers=(), opset=17):
    from onnx import helper

    from tests.cli_models import save

    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), tmp_path / f"{name}.onnx")


def _identity(tmp_path, shape=(1, 1, 2, 2)):
    from onnx import TensorProto, helper

    return _save(tmp_path, "identity", [helper.make_node("Identity", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])


def _range_model(tmp_path):
    """Polygraphy's surgeon/04 shape: y = Range(0, Cast(ReduceMax(x)), 1): its size is data-dependent."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0, name="max"),
             helper.make_node("Cast", ["m"], ["limit"], to=TensorProto.INT64, name="cast"),
             helper.make_node("Range", ["zero", "limit", "one"], ["y"], name="range")]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one")]
    return _save(tmp_path, "ranged", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                 [helper.make_tensor_value_info("y", TensorProto.INT64, ["n"])], inits)


# ---- surgeon / inspect ----------------------------------------------------------------------
def test_sanitize_override_input_shapes_makes_a_dim_dynamic(tmp_path):
    import onnx

    out = tmp_path / "dynamic_identity.onnx"
    assert main(["surgeon", "sanitize", _identity(tmp_path), "--override-input-shapes", "x:['batch',1,2,2]",
                 "-o", str(out)]) == 0
    model = onnx.load(str(out))
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 1, 2, 2]
    assert main(["run", str(out), "--onnxrt", "--input-shapes", "x:[3,1,2,2]"]) == 0


def test_unbounded_dds_are_listed_then_bounded_by_a_min_node(tmp_path, capsys):
    import onnx

    model = _range_model(tmp_path)
    assert main(["inspect", "model", model, "--list-unbounded-dds"]) == 0
    assert "Found tensors with unbounded DDS: ['limit']" in capsys.readouterr().out
    bounded = tmp_path / "bounded.onnx"
    assert main(["surgeon", "sanitize", model, "--set-unbounded-dds-upper-bound", "3", "-o", str(bounded)]) == 0
    assert [n.op_type for n in onnx.load(str(bounded)).graph.node].count("Min") == 1
    assert main(["inspect", "model", str(bounded), "--list-unbounded-dds"]) == 0
    assert "No tensors with unbounded DDS" in capsys.readouterr().out
    feeds = tmp_path / "x.npz"
    np.savez(feeds, x=np.array([1.0, 7.5, 2.0, 0.0], np.float32))
    out = tmp_path / "y.npz"
    assert main(["run", str(bounded), "--onnxrt", "--load-inputs", str(feeds), "--save-outputs", str(out)]) == 0
    assert np.load(out)["onnxrt/0/y"].tolist() == [0, 1, 2]  # Range(0, min(7, 3))


def test_inspect_model_format_text_prints_polygraphys_op_lines(capsys):
    assert main(["inspect", "model", str(ADD_MUL), "--format", "text", "--show", "layers"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("==== ONNX Model ====") and "---- 2 Graph Input(s) ----" in text
    assert "[Op: Mul]" in text and "[Op: Add]" in text
    assert "{a [dtype=float32, shape=(2, 3, 4)], b [dtype=float32, shape=(2, 3, 4)]}" in text


def test_capability_with_partitioning_writes_the_partitions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "capability", str(ADD_MUL), "--target", "cpu", "--with-partitioning"]) == 0
    assert sorted(p.name for p in (tmp_path / "polykit_capability_dumps").iterdir()) == ["partition_0.onnx"]


# ---- convert -------------------------------------------------------------------------------
def test_convert_fp_to_fp16_writes_an_fp16_onnx_model_onnxruntime_runs(tmp_path):
    import onnx

    from tests.cli_models import MLP

    out = tmp_path / "mlp_fp16.onnx"
    assert main(["convert", "--fp-to-fp16", "-o", str(out), str(MLP)]) == 0
    model = onnx.load(str(out))
    assert {t.data_type for t in model.graph.initializer} == {onnx.TensorProto.FLOAT16}
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    inputs, outputs = tmp_path / "in.json", tmp_path / "out.json"
    assert main(["run", str(MLP), "--onnxrt", "--save-inputs", str(inputs), "--save-outputs", str(outputs)]) == 0
    assert main(["run", str(out), "--onnxrt", "--load-inputs", str(inputs), "--load-outputs", str(outputs),
                 "--atol", "0.01", "--rtol", "0.01"]) == 0


def test_convert_data_loader_script_calibrates_int8(tmp_path):
    from tests.cli_models import MLP

    script = tmp_path / "data_loader.py"
    script.write_text("import numpy as np\n"
                      "def load_data():\n"
                      "    for i in range(3):\n"
                      "        yield {'x': np.random.default_rng(i).random((1, 16), dtype=np.float32)}\n")
    cache = tmp_path / "mlp.cache"
    assert main(["convert", str(MLP), "--int8", "--data-loader-script", str(script), "--calibration-cache", str(cache),
                 "--target", "cpu", "-o", str(tmp_path / "mlp.plan")]) == 0
    assert cache.exists() and cache.stat().st_size > 0


# ---- run -----------------------------------------------------------------------------------
def test_save_results_and_load_input_data_are_polygraphys_names(tmp_path):
    inputs, results = tmp_path / "inputs.json", tmp_path / "results.json"
    assert main(["run", str(ADD_MUL), "--onnxrt", "--save-inputs", str(inputs), "--save-results", str(results)]) == 0
    assert json.loads(results.read_text())["polygraphy_class"] == "RunResults"
    assert main(["run", str(ADD_MUL), "--trt", "--target", "cpu", "--load-input-data", str(inputs),
                 "--load-outputs", str(results)]) == 0


def test_optimization_profile_runs_the_chosen_profile(tmp_path):
    from tests.cli_models import dynamic_model

    model = dynamic_model(tmp_path / "dyn.onnx")
    feeds = tmp_path / "in.npz"
    profiles = ["--trt-min-shapes", "x:[1,4]", "x:[8,4]", "--trt-opt-shapes", "x:[2,4]", "x:[12,4]",
                "--trt-max-shapes", "x:[4,4]", "x:[16,4]"]
    assert main(["run", model, "--trt", "--onnxrt", "--target", "cpu", *profiles, "--optimization-profile", "1",
                 "--save-inputs", str(feeds)]) == 0
    assert np.load(feeds)["0/x"].shape == (12, 4)
    assert main(["run", model, "--trt", "--target", "cpu", *profiles, "--optimization-profile", "2"]) == 2


def test_model_type_is_checked_against_the_file(tmp_path, capsys):
    plan = tmp_path / "add_mul.plan"
    assert main(["convert", str(ADD_MUL), "--target", "cpu", "-o", str(plan)]) == 0
    assert main(["run", "--trt", str(plan), "--model-type=engine"]) == 0
    assert main(["run", "--onnxrt", str(ADD_MUL), "--model-type", "onnx"]) == 0
    assert main(["run", "--trt", str(ADD_MUL), "--model-type=engine"]) == 2
    assert "polykit convert" in capsys.readouterr().err
    assert main(["run", "--trt", str(ADD_MUL), "--model-type", "frozen"]) == 2
    assert "TensorFlow" in capsys.readouterr().err


def test_log_file_gets_the_log_messages(tmp_path, dyn_model):
    log = tmp_path / "run.log"
    assert main(["run", dyn_model, "--onnxrt", "--log-file", str(log)]) == 0
    assert "dynamic dim(s) 'N'; using 1" in log.read_text()


@pytest.mark.parametrize("name", ["float16", "fp16", "half"])
def test_layer_precisions_take_polygraphys_precision_names(tmp_path, name):
    from tests.cli_models import MLP

    plan = tmp_path / "mlp.plan"
    assert main(["convert", str(MLP), "--target", "cpu", "--fp16", "--precision-constraints", "obey",
                 "--layer-precisions", f"fc1:{name}", "fc2:float32", "-o", str(plan)]) == 0
    from polykit.compiler.plan.file import Plan

    fused = {n: layer.precision for layer in Plan.load(plan).layers for n in layer.fused_nodes}
    assert fused["fc1"] == "fp16" and fused["fc2"] == "fp32"


def test_an_unknown_precision_name_says_which_names_work(capsys):
    from tests.cli_models import MLP

    assert main(["convert", str(MLP), "--layer-precisions", "fc1:int4", "-o", "x.plan"]) == 2
    assert "float32|float16|bfloat16" in capsys.readouterr().err


# ---- --int8 and data loader scripts ------------------------------------------------------------
def test_int8_with_nothing_to_quantize_still_writes_the_calibration_cache(tmp_path):
    cache = tmp_path / "identity_calib.cache"
    assert main(["convert", _identity(tmp_path), "--int8", "--calibration-cache", str(cache), "--target", "cpu",
                 "-o", str(tmp_path / "identity.plan")]) == 0
    assert cache.read_text().startswith("polykit-calibration-cache 1")
    assert main(["convert", _identity(tmp_path), "--int8", "--calibration-cache", str(cache), "--target", "cpu",
                 "-o", str(tmp_path / "again.plan")]) == 0


def test_a_data_loader_script_runs_once_with_trt(tmp_path):
    from tests.cli_models import MLP

    runs = tmp_path / "runs.txt"
    script = tmp_path / "data_loader.py"
    script.write_text("import numpy as np\n"
                      f"open({str(runs)!r}, 'a').write('x')\n"
                      "def load_data():\n"
                      "    for i in range(2):\n"
                      "        yield {'X': np.random.default_rng(i).random((1, 16), dtype=np.float32)}\n")
    assert main(["run", str(MLP), "--trt", "--onnxrt", "--target", "cpu", "--int8", "--data-loader-script",
                 str(script), "--atol", "1", "--rtol", "1"]) == 0
    assert runs.read_text() == "x"
