"""`polykit convert --refittable` and `polykit refit PLAN --weights new.onnx|weights.npz -o PLAN2`
(cpu target): the refitted plan computes what a plan built from the new model computes; bad
refits exit 2 with a message naming the weight."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.file import Plan
from polykit.runtime.engine import Engine
from polykit.tools.cli.app import main
from tests.compiler import refit_models as models

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def run(path, feeds) -> dict:
    with Engine(Plan.load(path)).create_execution_context() as ctx:
        return ctx.execute(feeds)


@pytest.fixture
def plans(tmp_path):
    """model A and B (same structure, other weights), A's refittable plan and its tactics."""
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(models.conv_bn(0), str(a))
    onnx.save(models.conv_bn(1), str(b))
    plan = tmp_path / "a.plan"
    tactics = tmp_path / "a.tactics.json"
    assert main(["convert", str(a), "--target", "cpu", "--refittable", "-o", str(plan),
                 "--save-tactics", str(tactics)]) == 0
    return a, b, plan, tactics


def built_from(model, tactics, tmp_path) -> dict:
    path = tmp_path / "b.plan"
    assert main(["convert", str(model), "--target", "cpu", "--load-tactics", str(tactics), "-o", str(path)]) == 0
    return run(path, models.feeds(models.conv_bn(0)))


def test_refit_from_the_new_model_gives_the_outputs_of_a_plan_built_from_it(plans, tmp_path, capsys):
    a, b, plan, tactics = plans
    out = tmp_path / "refitted.plan"
    assert main(["refit", str(plan), "--weights", str(b), "-o", str(out)]) == 0
    assert "20 of 20 plan weights changed" in capsys.readouterr().err
    refitted, expected = run(out, models.feeds(models.conv_bn(0))), built_from(b, tactics, tmp_path)
    assert refitted["logits"].tobytes() == expected["logits"].tobytes()
    assert run(plan, models.feeds(models.conv_bn(0)))["logits"].tobytes() != expected["logits"].tobytes()


def test_refit_from_a_npz_of_the_weights(plans, tmp_path):
    a, b, plan, tactics = plans
    weights = tmp_path / "b.npz"
    np.savez(weights, **{n: w for n, w in load_onnx(str(b)).initializers.items() if w.dtype == np.float32})
    out = tmp_path / "refitted.plan"
    assert main(["refit", str(plan), "--weights", str(weights), "-o", str(out)]) == 0
    assert run(out, models.feeds(models.conv_bn(0)))["logits"].tobytes() == \
        built_from(b, tactics, tmp_path)["logits"].tobytes()


def test_a_weight_of_another_shape_exits_2_naming_it(plans, tmp_path, capsys):
    a, b, plan, tactics = plans
    weights = tmp_path / "bad.npz"
    np.savez(weights, w1=np.zeros((3, 3), np.float32))
    assert main(["refit", str(plan), "--weights", str(weights), "-o", str(tmp_path / "x.plan")]) == 2
    err = capsys.readouterr().err
    assert "'w1' is float32[3, 3]" in err and "Traceback" not in err
    assert not (tmp_path / "x.plan").exists()


def test_an_unknown_weight_name_exits_2(plans, tmp_path, capsys):
    a, b, plan, tactics = plans
    weights = tmp_path / "bad.npz"
    np.savez(weights, **{"encoder.weight": np.zeros(3, np.float32)})
    assert main(["refit", str(plan), "--weights", str(weights), "-o", str(tmp_path / "x.plan")]) == 2
    assert "'encoder.weight' is not a refittable weight" in capsys.readouterr().err


def test_a_plan_built_without_refittable_exits_2_with_the_hint(tmp_path, capsys):
    model, plan = tmp_path / "m.onnx", tmp_path / "m.plan"
    onnx.save(models.mlp(0), str(model))
    assert main(["convert", str(model), "--target", "cpu", "-o", str(plan)]) == 0
    assert main(["refit", str(plan), "--weights", str(model), "-o", str(tmp_path / "x.plan")]) == 2
    err = capsys.readouterr().err
    assert "not built refittable" in err and "--refittable" in err


def test_a_model_with_other_structure_constants_exits_2(plans, tmp_path, capsys):
    a, b, plan, tactics = plans
    other = tmp_path / "other.onnx"
    onnx.save(models.folded_chain(1), str(other))  # another model altogether
    assert main(["refit", str(plan), "--weights", str(other), "-o", str(tmp_path / "x.plan")]) == 2
    assert "not in the model the plan was built from" in capsys.readouterr().err
