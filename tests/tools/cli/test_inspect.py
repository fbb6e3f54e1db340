"""`polykit inspect model PLAN` (the engine inspector), `inspect tactics FILE`, and the tactic
flags of convert and run."""

from __future__ import annotations

import dataclasses
import json

import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.records import LayerDesc
from polykit.tools.cli.app import main
from polykit.tools.cli.inspect import describe_plan


pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture
def plan_file(mlp, tmp_path):
    path = str(tmp_path / "m.plan")  # level 0: priorities choose, so every layer is cpu.reference
    assert main(["convert", mlp, "-o", path, "--target", "cpu", "--builder-optimization-level", "0"]) == 0
    return path


def test_inspect_plan_shows_layer_formats_and_fused_nodes(plan_file, capsys):
    capsys.readouterr()
    assert main(["inspect", "model", plan_file]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "│ fc1 " in line)
    assert "Gemm" in row and "cpu.reference" in row and "fp32" in row
    assert "float32[1,16]" in row and "float32[1,32]" in row and "fc1, relu1" in row
    header = next(line for line in out.splitlines() if "precision" in line and "fused nodes" in line)
    assert " ms " not in header  # no time column without --profile


def test_inspect_plan_json_lists_every_io_tensor_of_a_layer(plan_file, capsys):
    capsys.readouterr()
    assert main(["inspect", "model", plan_file, "--json"]) == 0
    fc1 = json.loads(capsys.readouterr().out)["layers"][0]
    assert [t["name"] for t in fc1["inputs"]] == ["x", "w1", "b1"]
    assert [t["kind"] for t in fc1["inputs"]] == ["input", "weight", "weight"]
    assert fc1["outputs"][0]["shape"] == [1, 32] and "ms" not in fc1


def test_inspect_plan_profile_times_every_layer(plan_file, capsys):
    capsys.readouterr()
    assert main(["inspect", "model", plan_file, "--profile", "--iterations", "3", "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    assert [l["name"] for l in layers] == ["fc1", "fc2", "softmax"] and all(l["ms"] > 0 for l in layers)
    assert main(["inspect", "model", plan_file, "--profile", "--iterations", "2"]) == 0
    assert "profiled:" in capsys.readouterr().out


def test_inspect_profile_of_an_onnx_model_is_a_usage_error(mlp, capsys):
    assert main(["inspect", "model", mlp, "--profile"]) == 2
    assert "--profile times the layers of a plan" in capsys.readouterr().err


def test_layer_workspace_is_shown_when_the_plan_records_it(mlp):
    """Plans whose tactics declare workspace record it per layer (LayerDesc.workspace_bytes)."""
    plan = build_plan(mlp, BuilderConfig(target="cpu"))
    with_ws = dataclasses.make_dataclass("LayerWithWorkspace", [("workspace_bytes", int, 0)], bases=(LayerDesc,),
                                         frozen=True)
    plan.layers = [with_ws(**{f.name: getattr(l, f.name) for f in dataclasses.fields(l)}, workspace_bytes=4096 * i)
                   for i, l in enumerate(plan.layers)]
    assert [l["workspace_bytes"] for l in describe_plan(plan)["layers"]] == [0, 4096, 8192]
    assert all("workspace_bytes" not in l for l in describe_plan(build_plan(mlp, BuilderConfig(target="cpu")))["layers"])


def test_inspect_tactics_prints_the_replay_table(mlp, tmp_path, capsys):
    tactics = str(tmp_path / "t.json")
    assert main(["convert", mlp, "-o", str(tmp_path / "m.plan"), "--target", "cpu", "--save-tactics", tactics,
                 "--builder-optimization-level", "0"]) == 0
    capsys.readouterr()
    assert main(["inspect", "tactics", tactics]) == 0
    out = capsys.readouterr().out
    assert "3 layer(s), cpu.reference x3" in out
    assert any("softmax" in line and "cpu.reference" in line and "float32" in line for line in out.splitlines())
    assert main(["inspect", "tactics", tactics, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(open(tactics).read())


def test_inspect_tactics_of_a_malformed_file_exits_2_naming_the_field(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "layers": {"fc1": {"tactic": 3, "inputs": [], "outputs": []}}}))
    assert main(["inspect", "tactics", str(path)]) == 2
    assert "layers['fc1'].tactic" in capsys.readouterr().err


def test_convert_old_tactic_replay_flag_is_a_hidden_alias_of_load_tactics(mlp, tmp_path, capsys):
    tactics, first, second = (str(tmp_path / n) for n in ("t.json", "a.plan", "b.plan"))
    assert main(["convert", mlp, "-o", first, "--target", "cpu", "--save-tactics", tactics]) == 0
    assert main(["convert", mlp, "-o", second, "--target", "cpu", "--tactic-replay", tactics]) == 0
    assert open(first, "rb").read() == open(second, "rb").read()
    capsys.readouterr()
    assert main(["convert", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "--load-tactics" in help_text and "--tactic-replay" not in help_text


def test_convert_with_a_replay_naming_an_unknown_layer_exits_2(mlp, tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "layers": {"fc9": {"tactic": "cpu.reference", "inputs": ["float32"],
                                                                  "outputs": ["float32"]}}}))
    assert main(["convert", mlp, "-o", str(tmp_path / "m.plan"), "--target", "cpu", "--load-tactics", str(path)]) == 2
    err = capsys.readouterr().err
    assert "'fc9'" in err and "cpu.reference" in err


def test_run_saves_and_loads_tactics(mlp, tmp_path, capsys):
    tactics = str(tmp_path / "t.json")
    assert main(["run", mlp, "--trt", "--onnxrt", "--target", "cpu", "--save-tactics", tactics]) == 0
    assert set(json.loads(open(tactics).read())["layers"]) == {"fc1", "fc2", "softmax"}
    assert main(["run", mlp, "--trt", "--onnxrt", "--target", "cpu", "--load-tactics", tactics]) == 0


def test_run_a_plan_with_trt(plan_file, capsys):
    capsys.readouterr()
    assert main(["run", plan_file, "--trt", "--iterations", "2"]) == 0
    assert "trt: 2 iteration(s)" in capsys.readouterr().out


def test_run_a_plan_against_saved_onnxrt_outputs(mlp, plan_file, tmp_path, capsys):
    inputs, outputs = str(tmp_path / "in.npz"), str(tmp_path / "out.npz")
    assert main(["run", mlp, "--onnxrt", "--save-inputs", inputs, "--save-outputs", outputs]) == 0
    assert main(["run", plan_file, "--trt", "--load-inputs", inputs, "--load-outputs", outputs]) == 0
    assert "PASSED" in capsys.readouterr().out


def test_run_a_plan_with_onnxrt_is_a_usage_error(plan_file, capsys):
    assert main(["run", plan_file, "--trt", "--onnxrt"]) == 2
    assert "onnxrt runner cannot run" in capsys.readouterr().err


def test_show_layers_lists_every_onnx_node_with_its_tensors(mlp, capsys):
    capsys.readouterr()
    assert main(["inspect", "model", mlp, "--show", "layers", "--format", "table"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "│ fc1 " in line)
    assert "Gemm" in row and "x: float32[1, 16]" in row and "h: float32[1, 32]" in row
    assert "w1: float32[16, 32] (weight)" in out and "probs: float32[1, 10]" in out
    assert "I/O" not in out  # --show names the sections


def test_show_layers_json_carries_names_dtypes_shapes_and_attrs(mlp, capsys):
    capsys.readouterr()
    assert main(["inspect", "model", mlp, "--show", "io", "layers", "attrs", "weights", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    softmax = doc["layers"][-1]
    assert softmax["op"] == "Softmax" and softmax["attrs"] == {"axis": -1}
    assert softmax["inputs"] == [{"name": "logits", "kind": "activation", "dtype": "float32", "shape": [1, 10]}]
    assert {"name": "w2", "dtype": "float32", "shape": [32, 10]} in doc["weights"] and doc["inputs"][0]["name"] == "x"


def test_show_layers_of_a_model_polykit_cannot_import_lists_nodes_without_shapes(tmp_path, capsys, caplog, monkeypatch):
    import logging

    from polykit.tools.cli.inspect import describe_onnx

    from onnx import TensorProto, helper

    from tests.cli_models import save

    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Concat", ["y", "y"], ["s"], name="cat")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])])
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "no_axis.onnx")
    capsys.readouterr()
    assert main(["inspect", "model", path, "--show", "layers", "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    assert [l["name"] for l in layers] == ["relu", "cat"] and layers[1]["inputs"][0]["shape"] is None
    monkeypatch.setattr(logging.getLogger("polykit"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="polykit")
    assert describe_onnx(path, ("layers",))["layers"][0]["outputs"][0]["dtype"] is None
    assert "shapes unknown: polykit cannot import the model" in caplog.text and "'axis' is missing" in caplog.text


def test_plan_show_weights_and_attrs(plan_file, capsys):
    capsys.readouterr()
    assert main(["inspect", "model", plan_file, "--show", "weights", "attrs", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {w["name"] for w in doc["weights"]} == {"w1", "b1", "w2", "b2"}
    assert main(["inspect", "model", plan_file, "--show", "layers", "attrs"]) == 0
    assert "tactic parameters" in capsys.readouterr().out


def test_an_unknown_show_value_is_a_usage_error(mlp, capsys):
    assert main(["inspect", "model", mlp, "--show", "tensors"]) == 2
    assert "--show 'tensors' is not one of io, ops, layers, attrs, weights" in capsys.readouterr().err


def test_a_name_the_terminal_cannot_encode_is_printed_escaped(tmp_path):
    # a lone UTF-16 surrogate is valid JSON but no encoding can write it: printing it raised
    # UnicodeEncodeError (exit 3) when stdout was a pipe (found by the fresh hostile corpus)
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "surrogate.json"
    path.write_text('[{"\\ud800": {"dtype": "float32", "data": [1.0]}}]')
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-m", "polykit.tools.cli.app", "inspect", "data", str(path)],
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(root), "PYTHONIOENCODING": "utf-8"},
                          timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"\\ud800" in proc.stdout
