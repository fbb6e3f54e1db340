"""The cuda target asks each layer's tactic whether it accepts the layer when it loads a plan
(the plan check only knows the tactic exists: acceptance may depend on the GPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import PlanError
from polykit.kernels.cuda.base import CudaTactic
from polykit.kernels.tactics import tactic_table
from polykit.plugins import reset_plugin_manager
from polykit.runtime.cuda.target import _accepts


def _never(layer):
    return False


def _raises(layer):
    raise KeyError("axis")


@pytest.mark.parametrize("predicate, accepted", [(lambda layer: True, True), (_never, False), (_raises, False)])
def test_a_tactic_accepts_a_layer_only_when_its_predicate_says_so(predicate, accepted):
    tactic = CudaTactic("cuda", "Abs", "test.accepts", supports=predicate)
    assert _accepts(tactic, object()) is accepted


@pytest.fixture
def refusing_abs_tactic():
    table = tactic_table("cuda")
    real = next(t for t in table.of_kind("cuda", "", "Abs") if t.name.startswith("cuda."))
    tactic = table.register(replace(real, name="test.refuses", supports=_never))
    yield tactic
    reset_plugin_manager()  # the next lookup builds a fresh table without it


@pytest.mark.gpu
def test_loading_a_plan_whose_tactic_refuses_its_layer_is_a_plan_error(refusing_abs_tactic):
    from polykit.runtime.engine import Runtime

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    model = helper.make_model(helper.make_graph([helper.make_node("Abs", ["x"], ["y"], name="abs")], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 21)])
    plan = build_plan(model, BuilderConfig(target="cuda"))
    plan.layers[0] = replace(plan.layers[0], tactic="test.refuses")
    # the plan-load check (runtime/tactic_check.py) refuses it before the cuda target's own check would
    with pytest.raises(PlanError, match="tactic 'test.refuses' does not generate kernels for this Abs layer"):
        Runtime("cuda").deserialize_engine(plan)
