"""--pdl / --no-pdl on the builder commands (convert, run, bench): on, the plan records it and loads
with it (the cuda runtime's Programmatic Dependent Launch; the cpu target runs as ever); off (the
default) the plan records nothing new; with a plan file it is a build option, refused."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from polykit.compiler.plan.file import Plan
from polykit.tools.cli.app import main

pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture
def relu(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.mark.parametrize("flags,recorded", [([], None), (["--no-pdl"], None), (["--pdl"], True)])
def test_convert_records_pdl_only_when_on(relu, tmp_path, flags, recorded):
    out = tmp_path / "relu.plan"
    assert main(["convert", relu, "-o", str(out), "--target", "cpu", *flags]) == 0
    assert Plan.load(out).metadata["builder_config"].get("pdl") is recorded


@pytest.mark.parametrize("command", [["run", "--polykit", "--onnxrt"], ["bench", "--iterations", "2", "--duration", "0"]])
def test_run_and_bench_build_and_run_with_pdl(relu, command):
    assert main([command[0], relu, *command[1:], "--target", "cpu", "--pdl"]) == 0


def test_pdl_with_a_plan_file_is_refused_as_a_build_option(relu, tmp_path, capsys):
    out = tmp_path / "relu.plan"
    assert main(["convert", relu, "-o", str(out), "--target", "cpu"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--polykit", "--pdl"]) != 0
    assert "--pdl" in capsys.readouterr().err
