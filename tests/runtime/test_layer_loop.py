"""The engine's one layer loop over the target protocol: error wrapping, timed passes, and
a target without graph capture replaying eagerly."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import PolykitError
from polykit.runtime.engine import Engine, run_layers, timed_pass


def _plan():
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="neg"), helper.make_node("Exp", ["a"], ["y"], name="exp")]
    graph = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return build_plan(model, BuilderConfig(target="cpu", fuse=False))


class Recorder:
    """A target context that records launches and hands out numbered marks."""

    stream = "s"

    def __init__(self, fail_at: int = -1, idle: frozenset = frozenset()):
        self.launched, self.fail_at, self.clock, self.idle, self.released = [], fail_at, 0.0, idle, []

    def launch(self, index, stream):
        if index == self.fail_at:
            raise ZeroDivisionError("bad input")
        if index in self.idle:
            return False
        self.launched.append(index)

    def timer(self):
        ctx = self

        class Clock:
            def begin(self, stream, launches):
                pass

            def mark(self, stream):
                ctx.clock += 1.0
                return ctx.clock

            def end(self, stream):
                return True

            def elapsed_ms(self, a, b):
                return (b - a) * 1e3

            def release(self, marks):
                ctx.released += marks

        return Clock()


def test_run_layers_launches_in_order_or_the_given_indices():
    plan, ctx = _plan(), Recorder()
    run_layers(ctx, plan.layers, ctx.stream)
    run_layers(ctx, plan.layers, ctx.stream, indices=[1, 1, 0])
    assert ctx.launched == [0, 1, 1, 1, 0]


def test_a_failing_launch_is_reported_with_the_layer_and_its_tactic():
    plan = _plan()
    with pytest.raises(PolykitError, match="tactic 'cpu.reference' failed: ZeroDivisionError: bad input") as info:
        run_layers(Recorder(fail_at=1), plan.layers, "s")
    assert info.value.where == "layer 'exp' (Exp)"


def test_timed_pass_returns_each_launch_with_its_time():
    plan = _plan()
    assert timed_pass(Recorder(), plan.layers, "s", [0, 1, 0]) == [("neg", 1000.0), ("exp", 1000.0), ("neg", 1000.0)]


def test_timed_pass_charges_no_time_to_a_layer_the_target_launched_nothing_for():
    """A view of its input's bytes (the cuda target's Reshape family) launches nothing: its one
    mark is its before and after, released once, and the next layer is timed as before."""
    plan, ctx = _plan(), Recorder(idle=frozenset({0}))
    assert timed_pass(ctx, plan.layers, "s") == [("neg", 0.0), ("exp", 1000.0)]
    assert ctx.launched == [1] and ctx.released == [1.0, 2.0, 3.0]


def test_cpu_execute_twice_runs_eagerly_without_a_replay():
    plan = _plan()
    x = np.array([0.5, -1.0, 2.0], np.float32)
    with Engine(plan) as engine, engine.create_execution_context(cuda_graph=True) as ctx:
        first, second = ctx.execute({"x": x}), ctx.execute({"x": -x})
    np.testing.assert_allclose(first["y"], np.exp(-x), rtol=1e-6)
    np.testing.assert_allclose(second["y"], np.exp(x), rtol=1e-6)


def test_profile_comes_from_the_engine_for_every_layer():
    plan = _plan()
    with Engine(plan) as engine, engine.create_execution_context(profile=True) as ctx:
        ctx.execute({"x": np.ones(3, np.float32)})
        assert [name for name, _ in ctx.profile] == ["neg", "exp"] and all(ms >= 0 for _, ms in ctx.profile)


def test_enqueue_on_the_cpu_target_refuses_null_addresses_naming_the_tensor():
    from polykit.errors import RuntimeInputError

    with Engine(_plan()) as engine, engine.create_execution_context() as ctx:
        with pytest.raises(RuntimeInputError, match="'x'"):
            ctx.enqueue({"x": 0, "y": 0})


def test_a_plan_whose_tactic_cannot_run_its_layer_is_refused_at_load():
    from polykit.errors import PlanError

    plan = _plan()
    plan.layers[0] = replace(plan.layers[0], tactic="cpu.conv.winograd")
    with pytest.raises(PlanError, match="cpu.conv.winograd"):
        Engine(plan)
