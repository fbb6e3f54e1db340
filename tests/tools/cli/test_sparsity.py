"""--sparsity on the builder commands (convert, run, bench): the mode reaches the plan, and a bad
value is a usage error (exit 2, no traceback)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.sparse24 import prune
from polykit.tools.cli.app import main

pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture
def pruned_mlp(tmp_path):
    w = prune(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32), axis=0)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
                              [numpy_helper.from_array(w, "W")])
    path = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.mark.parametrize("command", [["convert"], ["run"], ["bench"]])
def test_a_bad_sparsity_value_exits_2_with_the_modes(command, pruned_mlp, tmp_path, capsys):
    extra = {"convert": ["-o", str(tmp_path / "x.plan")], "run": ["--polykit"], "bench": []}[command[0]]
    assert main([*command, pruned_mlp, *extra, "--target", "cpu", "--sparsity", "sometimes"]) == 2
    err = capsys.readouterr().err
    assert "unknown sparsity mode 'sometimes'" in err and "disable, enable, force" in err and "Traceback" not in err


def test_convert_records_the_mode_and_the_eligible_layer(pruned_mlp, tmp_path, capsys):
    out = tmp_path / "mm.plan"
    assert main(["convert", pruned_mlp, "-o", str(out), "--target", "cpu", "--sparsity", "enable", "-v"]) == 0
    assert "Layers eligible for sparse math: mm" in capsys.readouterr().err
    assert Plan.load(out).metadata["builder_config"]["sparsity"] == "enable"


def test_run_with_force_compares_against_the_pruned_model_and_passes(pruned_mlp, capsys):
    """The model's weight already has the pattern, so force prunes nothing and outputs match onnxruntime."""
    assert main(["run", pruned_mlp, "--onnxrt", "--polykit", "--target", "cpu", "--sparsity", "force"]) == 0
    assert "pruned" not in capsys.readouterr().err
