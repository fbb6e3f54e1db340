"""The cpu target: runs plan layers with its tactics through the engine's loop, frees dead tensors, profiles."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import PlanError, PolykitError
from polykit.runtime.cpu import CpuEngine, CpuTarget
from polykit.runtime.engine import Engine
from polykit.runtime.target import get_target


def _plan(**cfg):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["t0"], name="mul"),
        helper.make_node("Sqrt", ["t0"], ["t1"], name="sqrt"),
        helper.make_node("Add", ["t1", "x"], ["t2"], name="add"),
        helper.make_node("Neg", ["t2"], ["y"], name="neg"),
    ]
    model = helper.make_model(helper.make_graph(nodes, "cpu_test", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 21)])
    return build_plan(model, BuilderConfig(target="cpu", fuse=False, **cfg))


def test_cpu_target_is_registered_and_available():
    target = get_target("cpu")
    assert isinstance(target, CpuTarget) and target.name == "cpu" and target.available()


def test_context_runs_layers_in_order():
    x = np.abs(np.random.default_rng(0).standard_normal((2, 3))).astype(np.float32) + 0.1
    want = -(np.sqrt(x * np.array([1.0, 2.0, 3.0], np.float32)) + x)
    out = Engine(_plan()).create_execution_context().execute({"x": x})
    np.testing.assert_allclose(out["y"], want, rtol=1e-6)


def test_tensors_are_freed_after_their_last_reader():
    plan = _plan()
    engine = CpuEngine(plan)
    freed = {name: idx for idx, names in enumerate(engine.free_after) for name in names}
    assert freed == {"t0": 1, "t1": 2, "t2": 3}
    assert "y" not in freed and "x" not in freed


def test_profile_records_every_layer():
    plan = _plan()
    ctx = Engine(plan).create_execution_context(profile=True)
    ctx.execute({"x": np.ones((2, 3), np.float32)})
    assert [name for name, _ in ctx.profile] == [l.name for l in plan.layers]
    assert all(ms >= 0 for _, ms in ctx.profile)


def test_plan_with_a_foreign_tactic_is_refused():
    plan = _plan()
    plan.layers[0] = replace(plan.layers[0], tactic="cuda.pointwise")
    with pytest.raises(PlanError, match="cuda.pointwise"):
        CpuTarget().load(plan)


def test_kernel_output_that_disagrees_with_the_plan_is_reported():
    plan = _plan()
    plan.tensors["t0"] = replace(plan.tensors["t0"], shape=(3, 2))
    with pytest.raises(PolykitError, match="layer produced 't0'"):
        Engine(plan).create_execution_context().execute({"x": np.ones((2, 3), np.float32)})
