"""Issue 9's cases as a user meets them: every bad file or value is exit 2 with a message
naming the file and the field or value; 0-d outputs compare; anything else is exit 3."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from polykit.compiler.plan.file import decode_plan, encode_plan
from polykit.tools.cli.app import EXIT_INTERNAL, main
from tests import cli_models
from tests.cli_models import fresh_plugins  # noqa: F401  (pytest fixture)

MLP = str(cli_models.MLP)
pytestmark = pytest.mark.usefixtures("fresh_plugins")


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def scalar_output_model(path: Path) -> str:
    """s = ReduceSum(Relu(x), keepdims=0): a 0-d output."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("ReduceSum", ["r"], ["s"], name="sum", keepdims=0)]
    graph = helper.make_graph(nodes, "scalar", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])])
    return cli_models.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)


def scalar_intermediate_model(path: Path) -> str:
    """y = x + ReduceSum(x, keepdims=0): a 0-d intermediate tensor."""
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Add", ["x", "s"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "scalar_mid", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return cli_models.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)


# ---- 0-d tensors in every comparison path ----------------------------------------------------
def test_a_scalar_output_compares_between_runners(capsys, tmp_path):
    code, out, _ = run(capsys, "run", scalar_output_model(tmp_path / "s.onnx"), "--trt", "--onnxrt", "--target", "cpu")
    assert code == 0 and "s: PASSED" in out and "worst element []" in out


def test_mark_all_compares_a_scalar_intermediate(capsys, tmp_path):
    code, out, _ = run(capsys, "run", scalar_intermediate_model(tmp_path / "m.onnx"), "--trt", "--onnxrt",
                       "--target", "cpu", "--mark-all", "-v")
    assert code == 0 and "s: PASSED" in out and "y: PASSED" in out


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_saved_scalar_outputs_load_and_compare(capsys, tmp_path, suffix):
    model = scalar_output_model(tmp_path / "s.onnx")
    saved = str(tmp_path / f"out{suffix}")
    inputs = str(tmp_path / f"in{suffix}")
    assert run(capsys, "run", model, "--onnxrt", "--save-outputs", saved, "--save-inputs", inputs)[0] == 0
    code, out, _ = run(capsys, "run", model, "--trt", "--target", "cpu", "--load-outputs", saved, "--load-inputs", inputs)
    assert code == 0 and "s: PASSED" in out


def test_assert_accuracy_handles_a_scalar_output(tmp_path):
    from polykit.testing import assert_accuracy

    report = assert_accuracy(scalar_output_model(tmp_path / "s.onnx"), target="cpu")
    assert report.passed and report.pairs[0].outputs[0].shape == ()


# ---- models -----------------------------------------------------------------------------------
@pytest.mark.parametrize("content, message", [(b"", "ir_version"), (b"\x08\x07", "opset_import")])
def test_an_empty_or_tiny_model_is_rejected_and_convert_writes_nothing(capsys, tmp_path, content, message):
    model = tmp_path / "tiny.onnx"
    model.write_bytes(content)
    code, _, err = run(capsys, "run", str(model), "--trt", "--target", "cpu")
    assert code == 2 and "tiny.onnx: the model is not valid ONNX" in err and message in err
    code, _, err = run(capsys, "convert", str(model), "-o", str(tmp_path / "tiny.plan"), "--target", "cpu")
    assert code == 2 and not (tmp_path / "tiny.plan").exists()


def test_a_directory_given_as_the_model_says_so(capsys, tmp_path):
    for args in (["run", str(tmp_path), "--trt", "--target", "cpu"], ["run", str(tmp_path), "--onnxrt"],
                 ["inspect", "model", str(tmp_path)]):
        code, _, err = run(capsys, *args)
        assert code == 2 and "is a directory, not a file" in err, args


def test_random_bytes_named_plan_are_not_a_plan(capsys, tmp_path):
    path = tmp_path / "random.plan"
    path.write_bytes(np.random.default_rng(0).bytes(300))
    code, _, err = run(capsys, "inspect", "model", str(path))
    assert code == 2 and "random.plan: the data is not a polykit plan" in err and "protobuf" not in err


def test_inspect_of_a_plan_with_a_deleted_lifetime_names_the_field(capsys, tmp_path):
    plan = tmp_path / "m.plan"
    assert run(capsys, "convert", MLP, "-o", str(plan), "--target", "cpu")[0] == 0
    header, doc, blob = decode_plan(plan.read_bytes())
    doc = copy.deepcopy(doc)
    doc["memory"]["lifetimes"].pop(sorted(doc["memory"]["lifetimes"])[0])
    plan.write_bytes(encode_plan(doc, bytes(blob), header["target"], header["gpu_arch"]))
    code, _, err = run(capsys, "inspect", "model", str(plan))
    assert code == 2 and "m.plan: invalid plan field memory.lifetimes[" in err and "is missing" in err


def test_convert_checks_its_output_paths_before_building(capsys, tmp_path):
    code, _, err = run(capsys, "convert", MLP, "-o", str(tmp_path / "m.plan"), "--target", "cpu",
                       "--save-tactics", str(tmp_path / "nodir" / "t.json"))
    assert code == 2 and "--save-tactics" in err and "does not exist" in err and not (tmp_path / "m.plan").exists()


def test_target_cuda_without_a_driver_is_a_device_error(capsys, monkeypatch):
    from polykit.runtime.cuda import driver

    class NoDriver:
        def cuInit(self, flags):
            raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search')

    monkeypatch.setattr(driver, "drv", lambda: NoDriver())
    monkeypatch.setattr(driver, "_primary", {})
    code, _, err = run(capsys, "run", MLP, "--trt", "--target", "cuda")
    assert code == 2 and "no usable NVIDIA driver: RuntimeError" in err and "--target cpu" in err


# ---- data files and values --------------------------------------------------------------------
def test_a_truncated_npz_names_the_file(capsys, tmp_path):
    inputs = tmp_path / "in.npz"
    assert run(capsys, "run", MLP, "--onnxrt", "--save-inputs", str(inputs))[0] == 0
    data = inputs.read_bytes()
    inputs.write_bytes(data[: len(data) - 40])
    code, _, err = run(capsys, "run", MLP, "--onnxrt", "--load-inputs", str(inputs))
    assert code == 2 and "in.npz:" in err and "cannot be read" in err


def test_an_npy_given_to_load_inputs_says_what_it_is(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 16), np.float32))
    code, _, err = run(capsys, "run", MLP, "--onnxrt", "--load-inputs", str(tmp_path / "x.npy"))
    assert code == 2 and "x.npy: the file is a single .npy array" in err


def test_a_text_file_named_npz_is_not_called_a_pickle(capsys, tmp_path):
    (tmp_path / "notes.npz").write_text("hello\n")
    code, _, err = run(capsys, "run", MLP, "--onnxrt", "--load-inputs", str(tmp_path / "notes.npz"))
    assert code == 2 and "notes.npz: the file is not an .npz (zip) archive" in err and "pickle" not in err


def test_polygraphy_json_inputs_feed_a_run(capsys, tmp_path):
    import base64
    import io

    x = np.random.default_rng(5).random((1, 16), dtype=np.float32)
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=False)
    feeds = [{"x": {"array": base64.b64encode(buf.getvalue()).decode(), "polygraphy_class": "ndarray"}}]
    (tmp_path / "inputs.json").write_text(json.dumps(feeds))
    saved = tmp_path / "seen.npz"
    code, _, _ = run(capsys, "run", MLP, "--onnxrt", "--load-inputs", str(tmp_path / "inputs.json"),
                     "--save-inputs", str(saved))
    assert code == 0
    np.testing.assert_array_equal(np.load(saved)["0/x"], x)


def test_a_data_loader_script_that_raises_names_script_line_and_exception(capsys, tmp_path):
    script = tmp_path / "loader.py"
    script.write_text("import numpy as np\n\n\ndef load_data():\n    raise ValueError('no data today')\n")
    code, _, err = run(capsys, "run", MLP, "--onnxrt", "--data-loader-script", str(script))
    assert code == 2 and f"{script}:5: the data loader script raised ValueError: no data today" in err


@pytest.mark.parametrize("args, message", [
    (["--onnxrt", "--onnxrt", "--check-error-stat", "quantile", "--error-quantile", "2"], "--error-quantile 2.0 is not in [0, 1]"),
    (["--onnxrt", "--seed", "-1"], "--seed -1 is not a non-negative integer"),
    (["--onnxrt", "--save-inputs", "nodir/x.json"], "--save-inputs 'nodir/x.json': the folder 'nodir' does not exist"),
    (["--onnxrt", "--onnxrt", "--atol", "nosuch:1e-3"], "--atol nosuch:0.001 names no output of the model"),
    (["--onnxrt", "--onnxrt", "--atol", "logits:1e-3:2"], "--atol logits:1e-3:2.0 names no output of the model"),
    (["--onnxrt", "--onnxrt", "--rtol", "nosuch:1e-3"], "outputs are: logits, probs"),
    (["--onnxrt", "--onnxrt", "--check-error-stat", "probs:p99"], "--check-error-stat"),
])
def test_bad_values_exit_2_naming_the_value(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "run", MLP, *args)
    assert code == 2 and message in err, err


# ---- exit codes ---------------------------------------------------------------------------------
def test_an_unexpected_exception_is_exit_3_with_one_line_asking_for_a_report(capsys, monkeypatch):
    from polykit.tools.compare import accuracy

    monkeypatch.setattr(accuracy.Comparator, "compare_accuracy", lambda *a, **k: {}["boom"])
    code, _, err = run(capsys, "run", MLP, "--onnxrt")
    assert code == EXIT_INTERNAL == 3
    assert "internal error: KeyError: 'boom'" in err and "please report it" in err and "Traceback" not in err


def test_an_unexpected_exception_with_v_prints_the_traceback(capsys, monkeypatch):
    from polykit.tools.compare import accuracy

    monkeypatch.setattr(accuracy.Comparator, "compare_accuracy", lambda *a, **k: {}["boom"])
    code, _, err = run(capsys, "run", MLP, "--onnxrt", "-v")
    assert code == 3 and "Traceback" in err and "internal error: KeyError" in err
