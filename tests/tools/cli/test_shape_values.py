"""convert/run derive shape-tensor inputs' ranges from the model (BuilderConfig.shape_values):
given only opt values (--trt-opt-shape-values, a --load-inputs file or a --data-loader-script's
first feed), one plan serves every value the model's ops allow; with no value at all, exit 2
naming the input and the flag."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.compiler.plan.file import Plan
from polykit.runtime.engine import Runtime
from polykit.tools.cli.app import main
from polykit.tools.data.results_io import save_feeds
from tests.cli_models import fresh_plugins  # noqa: F401  (pytest fixture)

pytestmark = pytest.mark.usefixtures("fresh_plugins")

X = np.random.default_rng(7).standard_normal((2, 3, 4)).astype(np.float32)
#: (shape, k) values of the Reshape -> TopK model: the first is what the plans are built at
VALUES = [([4, 6], [2]), ([-1, 2], [1]), ([24, 1], [1]), ([3, 8], [5]), ([0, 12], [12])]


def _reshape_topk():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("TopK", ["r", "k"], ["v", "i"], axis=-1)]
    g = helper.make_graph(nodes, "shape_values",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
                           helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


def _resize():
    g = helper.make_graph([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")], "scales",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 6]),
                           helper.make_tensor_value_info("scales", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 19)])


def _feeds(values=VALUES):
    return [{"x": X, "shape": np.array(s, np.int64), "k": np.array(k, np.int64)} for s, k in values]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("sv") / "reshape_topk.onnx"
    onnx.save_model(_reshape_topk(), str(path))
    return str(path)


def _serves_like_onnxruntime(plan_path, model_proto, feeds):
    plan = Plan.load(plan_path)
    assert plan.profiles is not None and plan.profiles.rules, "the plan bakes the values: no shape rule recorded"
    session = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    with Runtime("cpu").deserialize_engine(plan) as engine:
        for feed in feeds:
            with engine.create_execution_context() as ctx:
                got = ctx.execute(feed)
            for out, want in zip(model_proto.graph.output, session.run(None, feed)):
                np.testing.assert_array_equal(got[out.name], want, err_msg=f"{out.name} at {feed}")


def test_convert_with_opt_shape_values_only_builds_one_plan_for_every_value(model, tmp_path):
    plan = str(tmp_path / "m.plan")
    assert main(["convert", model, "-o", plan, "--target", "cpu",
                 "--trt-opt-shape-values", "shape:[4,6]", "k:[2]"]) == 0
    assert Plan.load(plan).profiles.ruled == {"value(shape)[0]", "value(shape)[1]", "value(k)[0]"}
    _serves_like_onnxruntime(plan, _reshape_topk(), _feeds())


def test_convert_takes_opt_values_from_an_inputs_file(model, tmp_path):
    feeds, plan = tmp_path / "feeds.npz", str(tmp_path / "m.plan")
    save_feeds(feeds, _feeds(VALUES[3:4]))
    assert main(["convert", model, "-o", plan, "--target", "cpu", "--load-inputs", str(feeds)]) == 0
    assert Plan.load(plan).metadata["builder_config"]["shape_values"]["shape"]["values"] == [3, 8]
    _serves_like_onnxruntime(plan, _reshape_topk(), _feeds())


def test_convert_reads_float_opt_values_for_resize_scales(tmp_path):
    path, plan = str(tmp_path / "resize.onnx"), str(tmp_path / "resize.plan")
    onnx.save_model(_resize(), path)
    assert main(["convert", path, "-o", plan, "--target", "cpu", "--trt-opt-shape-values", "scales:[1,1,2.0,1.5]"]) == 0
    x = np.random.default_rng(8).standard_normal((1, 1, 4, 6)).astype(np.float32)
    _serves_like_onnxruntime(plan, _resize(), [{"x": x, "scales": np.array(s, np.float32)}
                                               for s in ([1, 1, 2, 1.5], [1, 1, 0.5, 0.5], [1, 1, 3, 1])])


def test_run_with_loaded_inputs_runs_every_value_through_one_ruled_engine(model, tmp_path, capsys):
    feeds, plan = tmp_path / "feeds.npz", str(tmp_path / "saved.plan")
    save_feeds(feeds, _feeds())
    assert main(["run", model, "--trt", "--onnxrt", "--target", "cpu", "--load-inputs", str(feeds),
                 "--save-engine", plan, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and len(report["comparisons"]) == len(VALUES), report
    assert Plan.load(plan).profiles.ruled  # one plan, built at the first feed, served all five


def test_run_with_a_data_loader_script_takes_its_first_feed_as_opt(model, tmp_path, capsys):
    script = tmp_path / "data.py"
    script.write_text("import numpy as np\n\ndef load_data():\n"
                      f"    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)\n"
                      f"    for s, k in {VALUES!r}:\n"
                      "        yield {'x': x, 'shape': np.array(s, np.int64), 'k': np.array(k, np.int64)}\n")
    assert main(["run", model, "--trt", "--onnxrt", "--target", "cpu", "--data-loader-script", str(script)]) == 0
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["convert", "-o", "PLAN"], ["run", "--trt", "--onnxrt"]])
def test_a_shape_tensor_input_without_values_exits_2_naming_the_flag(model, tmp_path, capsys, command):
    args = [command[0], model, *[str(tmp_path / "m.plan") if a == "PLAN" else a for a in command[1:]]]
    assert main([*args, "--target", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "input 'k' is a shape-tensor input" in err or "input 'shape' is a shape-tensor input" in err, err
    assert "--trt-opt-shape-values" in err and "--load-inputs" in err, err


def test_an_opt_value_the_model_does_not_allow_exits_2_with_the_range(model, tmp_path, capsys):
    assert main(["convert", model, "-o", str(tmp_path / "m.plan"), "--target", "cpu",
                 "--trt-opt-shape-values", "shape:[30,1]", "k:[1]"]) == 2
    err = capsys.readouterr().err
    assert "opt values [30, 1] of shape-tensor input 'shape' give element 0 = 30, outside [-1, 24]" in err, err


def test_opt_shape_values_with_a_shape_profile_are_refused_saying_what_to_give(tmp_path, capsys):
    g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "dyn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 12]),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = str(tmp_path / "dyn.onnx")
    onnx.save_model(helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)]), path)
    assert main(["convert", path, "-o", str(tmp_path / "m.plan"), "--target", "cpu", "--trt-min-shapes", "x:[1,12]",
                 "--trt-opt-shapes", "x:[2,12]", "--trt-max-shapes", "x:[4,12]",
                 "--trt-opt-shape-values", "shape:[-1,6]"]) == 2
    assert "varies the shape of input 'x'" in capsys.readouterr().err


def test_the_generated_script_passes_the_opt_values_to_the_builder(model, tmp_path):
    import subprocess
    import sys

    feeds, script = tmp_path / "feeds.npz", tmp_path / "run.py"
    save_feeds(feeds, _feeds())
    assert main(["run", model, "--trt", "--onnxrt", "--target", "cpu", "--load-inputs", str(feeds),
                 "--gen-script", str(script)]) == 0
    text = script.read_text()
    assert "shape_values={'shape': array([4, 6], dtype='int64'), 'k': array([2], dtype='int64')}" in text, text
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
