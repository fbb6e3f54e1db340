"""`polykit` as a user invokes it: exit codes, reports, files written and read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.tools.cli.app import main
from tests.cli_models import fresh_plugins  # noqa: F401  (pytest fixture)

REPO = Path(__file__).resolve().parents[1]
MLP = str(REPO / "examples" / "models" / "mlp.onnx")
ADD_MUL = str(REPO / "examples" / "models" / "add_mul.onnx")


pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture
def bad_mlp(tmp_path):
    model = onnx.load(MLP)
    for t in model.graph.initializer:
        if t.name == "w2":
            arr = numpy_helper.to_array(t).copy()
            arr[3, 4] += 0.5
            t.CopyFrom(numpy_helper.from_array(arr, "w2"))
    path = tmp_path / "mlp_bad.onnx"
    onnx.save_model(model, str(path))
    return str(path)


@pytest.fixture
def reference(tmp_path):
    """Inputs and onnxrt outputs of the original MLP, as --load-* arguments."""
    inputs, outputs = str(tmp_path / "ref_in.npz"), str(tmp_path / "ref_out.npz")
    assert main(["run", MLP, "--onnxrt", "--save-inputs", inputs, "--save-outputs", outputs, "-q"]) == 0
    return ["--load-inputs", inputs, "--load-outputs", outputs]


def _model(tmp_path, name, nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path = tmp_path / f"{name}.onnx"
    onnx.save_model(model, str(path))
    return str(path)


def cli(*args: str) -> int:
    return main(list(args))


def test_run_trt_onnxrt_passes_with_exit_0(capsys):
    assert cli("run", MLP, "--trt", "--onnxrt", "--target", "cpu") == 0
    out = capsys.readouterr().out
    assert "onnxrt vs trt" in out and "PASSED" in out


def test_perturbed_weight_fails_with_exit_1_naming_output_and_worst_element(bad_mlp, reference):
    proc = subprocess.run([sys.executable, "-m", "polykit.tools.cli.app", "run", bad_mlp, "--trt", "--target", "cpu", *reference],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    assert "logits: FAILED" in proc.stdout
    assert "worst element [0, 4]" in proc.stdout
    assert "FAILED | 2 output comparison(s) failed: logits (trt vs onnxrt), probs (trt vs onnxrt)" in proc.stdout


def test_polykit_alias_selects_the_engine(capsys):
    assert cli("run", ADD_MUL, "--onnxrt", "--polykit", "--target", "cpu") == 0
    assert "trt vs onnxrt" in capsys.readouterr().out


def test_missing_model_exits_2_without_traceback(capsys, tmp_path):
    assert cli("run", str(tmp_path / "nope.onnx"), "--onnxrt") == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err


def test_verbose_error_prints_traceback(capsys, tmp_path):
    assert cli("run", str(tmp_path / "nope.onnx"), "--onnxrt", "-v") == 2
    assert "Traceback" in capsys.readouterr().err


def test_no_runner_is_usage_error(capsys):
    assert cli("run", MLP) == 2
    assert "no runner selected" in capsys.readouterr().err


def test_unknown_flag_exits_2(capsys):
    assert cli("run", MLP, "--bogus") == 2


def test_version_prints_and_exits_0(capsys):
    import polykit

    assert cli("--version") == 0
    assert polykit.__version__ in capsys.readouterr().out


def test_json_report_is_machine_readable(capsys, bad_mlp, reference):
    capsys.readouterr()
    assert cli("run", bad_mlp, "--trt", "--target", "cpu", "--json", *reference) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is False
    failed = {o["name"] for c in doc["comparisons"] for o in c["outputs"] if not o["passed"]}
    assert failed == {"logits", "probs"}


def test_profile_lists_every_engine_layer_with_its_tactic(capsys):
    assert cli("run", MLP, "--trt", "--onnxrt", "--target", "cpu", "--profile", "--iterations", "3",
               "--builder-optimization-level", "0") == 0  # the heuristic: every layer's first tactic
    out = capsys.readouterr().out
    assert "trt per-layer profile" in out and "median of 3 run(s)" in out
    for layer, kind in (("fc1", "Gemm"), ("fc2", "Gemm"), ("softmax", "Softmax")):
        assert any(layer in line and kind in line and "cpu.reference" in line for line in out.splitlines()), layer


def test_profile_json_has_per_layer_medians_and_tactic_totals(capsys):
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    assert cli("run", MLP, "--trt", "--target", "cpu", "--profile", "--iterations", "2", "--warm-up", "1", "--json",
               "--builder-optimization-level", "0") == 0  # one tactic for every layer: cpu.reference
    prof = json.loads(capsys.readouterr().out)["profile"]["trt"]
    names = {layer.name for layer in build_plan(MLP, BuilderConfig(target="cpu")).layers}
    assert {row["name"] for row in prof["layers"]} == names
    assert prof["runs"] == 3  # the warm-up run is profiled too
    assert [row["ms"] for row in prof["layers"]] == sorted((row["ms"] for row in prof["layers"]), reverse=True)
    assert abs(sum(row["share"] for row in prof["layers"]) - 1.0) < 1e-9
    assert prof["tactics"][0]["layers"] == len(names) and prof["tactics"][0]["ms"] == pytest.approx(prof["total_ms"])


def test_profile_without_the_engine_says_so(capsys):
    assert cli("run", MLP, "--onnxrt", "--profile") == 0
    assert "no polykit engine ran" in capsys.readouterr().out


def test_global_atol_makes_perturbed_model_pass(bad_mlp, reference):
    assert cli("run", bad_mlp, "--trt", "--target", "cpu", "--atol", "0.5", *reference) == 0


def test_per_output_atol_applies_only_to_that_output(capsys, bad_mlp, reference):
    assert cli("run", bad_mlp, "--trt", "--target", "cpu", "--atol", "1e-5", "logits:0.5", *reference) == 1
    out = capsys.readouterr().out
    assert "logits: PASSED" in out and "probs: FAILED" in out


def test_median_error_stat_tolerates_one_bad_element(bad_mlp, reference):
    assert cli("run", bad_mlp, "--trt", "--target", "cpu", "--check-error-stat", "logits:median",
               "--atol", "probs:0.01", *reference) == 0


@pytest.mark.parametrize("func", ["l2", "cosine", "snr"])
def test_metric_compare_funcs_pass_matching_runners(func):
    assert cli("run", MLP, "--onnxrt", "--trt", "--target", "cpu", "--compare", func, "--l2-tol", "1e-5") == 0


def test_save_and_load_outputs_compares_against_saved_run(tmp_path, bad_mlp, capsys):
    inputs, outputs = str(tmp_path / "in.npz"), str(tmp_path / "out.npz")
    assert cli("run", MLP, "--onnxrt", "--save-inputs", inputs, "--save-outputs", outputs) == 0
    assert cli("run", MLP, "--trt", "--target", "cpu", "--load-inputs", inputs, "--load-outputs", outputs) == 0
    assert cli("run", bad_mlp, "--trt", "--target", "cpu", "--load-inputs", inputs, "--load-outputs", outputs) == 1
    assert "trt vs onnxrt" in capsys.readouterr().out


def test_saved_inputs_are_what_runners_saw(tmp_path):
    path = tmp_path / "in.npz"
    assert cli("run", MLP, "--onnxrt", "--save-inputs", str(path), "--val-range", "x:[5,6]", "--iterations", "2") == 0
    with np.load(path) as data:
        assert sorted(data.files) == ["0/x", "1/x"]
        assert data["0/x"].min() >= 5


def test_validate_fails_on_nan(tmp_path, capsys):
    path = _model(tmp_path, "nan", [helper.make_node("Log", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    assert cli("run", path, "--onnxrt", "--val-range", "[-2,-1]") == 0
    assert cli("run", path, "--onnxrt", "--val-range", "[-2,-1]", "--validate") == 1
    assert "NaN" in capsys.readouterr().out


def test_input_shapes_reach_both_runners_for_dynamic_model(tmp_path, capsys):
    path = _model(tmp_path, "dyn", [helper.make_node("Relu", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    assert cli("run", path, "--trt", "--onnxrt", "--target", "cpu", "--input-shapes", "x:[3,4]", "--json") == 0
    assert json.loads(capsys.readouterr().out)["comparisons"][0]["outputs"][0]["shape"] == [3, 4]


def test_data_loader_script_feeds_the_runners(tmp_path, capsys):
    script = tmp_path / "data.py"
    script.write_text("import numpy as np\ndef load_data():\n    yield {'a': np.ones((2,3,4), np.float32), 'b': np.ones((2,3,4), np.float32)}\n")
    assert cli("run", ADD_MUL, "--trt", "--onnxrt", "--target", "cpu", "--data-loader-script", str(script), "--json") == 0
    out = json.loads(capsys.readouterr().out)["comparisons"][0]["outputs"][0]
    assert out["worst_reference"] == 1.0  # (1 + 1) * 1 - 1


def test_mark_all_compares_intermediate_tensors(capsys):
    assert cli("run", MLP, "--trt", "--onnxrt", "--target", "cpu", "--mark-all", "-v") == 0
    assert "h_relu: PASSED" in capsys.readouterr().out


def test_default_target_notice_without_gpu(capsys):
    from polykit.runtime.target import default_target

    if default_target() != "cpu":
        pytest.skip("a GPU is usable here")
    assert cli("run", ADD_MUL, "--trt", "--onnxrt") == 0
    assert "notice: no usable CUDA GPU" in capsys.readouterr().err


def test_unsupported_op_is_reported_with_exit_2(tmp_path, capsys):
    path = _model(tmp_path, "unsup", [helper.make_node("NoSuchOp", ["x"], ["y"], domain="example.custom")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = onnx.load(path)
    model.opset_import.append(helper.make_opsetid("example.custom", 1))
    onnx.save_model(model, path)
    assert cli("run", path, "--trt", "--target", "cpu") == 2
    assert "NoSuchOp" in capsys.readouterr().err


def test_convert_then_inspect_plan_shows_layers_tactics_precision(tmp_path, capsys):
    plan = str(tmp_path / "mlp.plan")
    assert cli("convert", MLP, "-o", plan, "--target", "cpu") == 0
    assert cli("inspect", "model", plan, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "plan" and info["target"] == "cpu"
    assert all(layer["tactic"] and layer["precision"] for layer in info["layers"])
    assert {"fc1", "fc2"} <= {n for layer in info["layers"] for n in layer["fused_nodes"]}


def _resnet(tmp_path, **kw) -> str:
    from tests.conv_models import resnet

    path = str(tmp_path / "resnet.onnx")
    onnx.save_model(resnet(**kw), path)
    return path


def test_convert_with_channels_last_writes_nhwc_layers(tmp_path, capsys):
    model, plan = _resnet(tmp_path, depths=(1,)), str(tmp_path / "resnet.plan")
    assert cli("convert", model, "-o", plan, "--target", "cpu", "--channels-last") == 0
    assert cli("inspect", "model", plan, "--json") == 0
    kinds = [layer["kind"] for layer in json.loads(capsys.readouterr().out)["layers"]]
    assert "ConvNHWC" in kinds and "Conv" not in kinds


@pytest.mark.parametrize("flag", ["--channels-last", "--no-channels-last"])
def test_run_matches_onnxrt_with_either_layout(tmp_path, flag):
    assert cli("run", _resnet(tmp_path, depths=(1, 1)), "--trt", "--onnxrt", "--target", "cpu", flag) == 0


def test_run_with_saved_engine_then_inspect_as_table(tmp_path, capsys):
    plan = str(tmp_path / "m.plan")
    assert cli("run", ADD_MUL, "--trt", "--target", "cpu", "--save-engine", plan) == 0
    assert cli("inspect", "model", plan) == 0
    assert "layers" in capsys.readouterr().out


def test_inspect_onnx_shows_io_and_op_histogram(capsys):
    assert cli("inspect", "model", MLP, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ops"] == {"Gemm": 2, "Relu": 1, "Softmax": 1}
    assert info["inputs"] == [{"name": "x", "dtype": "float", "shape": [1, 16]}]


def test_inspect_table_output_lists_ops(capsys):
    assert cli("inspect", "model", MLP) == 0
    assert "Gemm" in capsys.readouterr().out


def test_surgeon_sanitize_folds_constants(tmp_path):
    c = numpy_helper.from_array(np.array([1.0, 2.0], dtype=np.float32), "c")
    path = _model(tmp_path, "foldable",
                  [helper.make_node("Mul", ["c", "c"], ["cc"], name="const_mul"), helper.make_node("Add", ["x", "cc"], ["y"], name="add")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [c])
    out = tmp_path / "folded.onnx"
    assert cli("surgeon", "sanitize", path, "-o", str(out), "--fold-constants") == 0
    assert [n.name for n in onnx.load(str(out)).graph.node] == ["add"]
    assert cli("run", str(out), "--trt", "--onnxrt", "--target", "cpu") == 0


def test_help_lists_runner_flags(capsys):
    cli("run", "--help")
    out = capsys.readouterr().out
    assert "--trt, --polykit" in out and "--onnxrt" in out


def test_console_script_points_at_main():
    """The script's entry checks the toolkit is installed (polykit.tools.cli.main), then runs app.main."""
    text = (REPO / "pyproject.toml").read_text()
    assert 'polykit = "polykit.tools.cli:main"' in text


def test_run_onnxrt_imports_no_heavy_modules_it_does_not_need(tmp_path):
    """Start-up budget: `polykit run m.onnx --onnxrt` loads neither pydantic, onnx, torch nor the compiler."""
    code = ("import sys; from polykit.tools.cli.app import main; rc = main(['run', %r, '--onnxrt', '-q']); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'onnx', 'torch') "
            "or m.startswith('polykit.compiler')); print(rc, heavy)") % MLP
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout + proc.stderr


def test_cli_and_python_api_do_the_same_thing(tmp_path):
    """The CLI only assembles loaders and runners: a short script gets the very same outputs
    (both at builder optimization level 0: timed tactic choices could differ between the builds)."""
    from polykit.backends.loaders import EngineFromOnnx, OnnxFromPath
    from polykit.backends.polykit_runner import PolykitRunner
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.tools.compare.comparator import Comparator
    from polykit.tools.data.loaders import DataLoader, DataLoaderOptions
    from polykit.tools.data.results_io import load_outputs

    saved = tmp_path / "cli.npz"
    assert cli("run", MLP, "--trt", "--target", "cpu", "--builder-optimization-level", "0", "--seed", "4",
               "--iterations", "2", "--save-outputs", str(saved)) == 0
    runner = PolykitRunner(EngineFromOnnx(OnnxFromPath(MLP), config=BuilderConfig(target="cpu", builder_optimization_level=0)))
    results = Comparator.run([runner], DataLoader(DataLoaderOptions(seed=4, iterations=2)))
    from_cli = load_outputs(saved)["trt"]
    for cli_out, api_out in zip(from_cli, results.outputs["trt"]):
        for name in ("logits", "probs"):
            np.testing.assert_array_equal(cli_out[name], api_out[name])


@pytest.mark.parametrize("flags", [["-q"], ["-vv"], []])
def test_a_command_run_in_process_leaves_the_logging_as_it_found_it(flags, caplog):
    """main() and the typer app set the polykit logger's level and handler for -v/-q and put them
    back: a -q left behind silenced the warnings later tests in the same process look for."""
    import logging

    from typer.testing import CliRunner

    from polykit.plugins import create_plugin_manager
    from polykit.tools.cli.app import build_app

    logger = logging.getLogger("polykit")
    before = (logger.level, logger.propagate, list(logger.handlers))
    assert main([*flags, "--version"]) == 0
    assert CliRunner().invoke(build_app(), [*flags, "inspect", "model", "--help"]).exit_code == 0
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    create_plugin_manager(env={"POLYKIT_PLUGINS": "no_such_polykit_plugin"})
    assert "plugin 'no_such_polykit_plugin' cannot be loaded" in caplog.text
