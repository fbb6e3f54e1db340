"""GPU twins of test_loop_body_shapes: a Loop body whose shapes change across iterations runs on the cuda
Loop tactic from one engine for every trip count (the body plan built for a profile, bound per
iteration; the outputs the run sizes allocated by the layer). Every buffer the layer allocates for its
sized outputs, and every run-time-sized region, starts as NaN bytes (poisoned), so a row the loop
failed to write shows."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.errors import RuntimeInputError
from polykit.runtime.engine import Engine
from tests.backends.test_loop_body_shapes import _feed, _sliding_sum_model, check_every_trip_count, check_outputs
from tests.kernels.cuda.test_control_flow_body_shapes import _history_model

pytestmark = pytest.mark.gpu

SHAPES = {"n": (), "cond": (), "y": (1,)}


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Device buffers of layer-sized outputs and run-time-sized regions filled with 0xFF (NaN) bytes."""
    from polykit.runtime.cuda import driver, layer_outputs, sized
    from polykit.runtime.cuda.memory import DeviceBuffer

    class Poisoned(DeviceBuffer):
        def __init__(self, nbytes, **kw):
            super().__init__(nbytes, **kw)
            if self.nbytes:
                driver.call("cuMemsetD8", self.ptr, 0xFF, self.nbytes, what="poison")

    monkeypatch.setattr(layer_outputs, "DeviceBuffer", Poisoned)
    monkeypatch.setattr(sized, "DeviceBuffer", Poisoned)


def _cuda_loop(engine) -> None:
    (layer,) = [lay for lay in engine.plan.layers if lay.kind == "Loop"]
    assert engine.plan.target == "cuda" and layer.tactic == "cuda.control_flow", (engine.plan.target, layer.tactic)
    assert layer.attrs["body"].profiles is not None, "the body plan should be built for a profile"


def test_cuda_loop_whose_carried_shape_changes_builds_once_for_every_trip_count():
    _cuda_loop(next(iter(check_every_trip_count("CUDA")._engines.values())))


def test_cuda_loop_refuses_a_scan_of_two_shapes_and_serves_a_valid_count_after():
    plan = build_plan(_sliding_sum_model(), BuilderConfig(target="cuda", input_shapes=SHAPES))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        _cuda_loop(engine)
        for n in (6, 7):  # iterations 5.. give y_out [0] (x[5:6] is empty), iterations before it [1]
            with pytest.raises(RuntimeInputError, match=r"iteration 5 gives scan output 2 the shape \(0,\)"):
                ctx.execute(_feed(n))
        feed = _feed(5)
        out = ctx.execute(dict(feed))
    want = ort.InferenceSession(_sliding_sum_model().SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feed)
    check_outputs([out["res_y"], out["res_scan"]], want, "n=5 after the refused counts")


def test_cuda_body_plan_of_run_time_shapes_survives_the_plan_file():
    plan = build_plan(_sliding_sum_model(), BuilderConfig(target="cuda", input_shapes=SHAPES))
    loaded = Plan.deserialize(plan.serialize())
    feed = _feed(4)
    with Engine(plan) as a, a.create_execution_context() as ca, Engine(loaded) as b, b.create_execution_context() as cb:
        _cuda_loop(b)
        want, got = ca.execute(dict(feed)), cb.execute(dict(feed))
    for name in ("res_y", "res_scan"):
        assert got[name].shape == want[name].shape == ((1,) if name == "res_y" else (4, 1)), (name, got[name].shape)
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_cuda_loop_carrying_a_growing_history_matches_onnxruntime_across_runs():
    model = _history_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(21)
    plan = build_plan(model, BuilderConfig(target="cuda", input_shapes={"n": (), "go": (), "h": (2, 3), "w": (3,)}))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        _cuda_loop(engine)
        for n in (40, 3, 0, 70):  # growing past the first buffers, then shorter runs reusing them
            feed = {"n": np.array(n), "go": np.array(True), "h": rng.standard_normal((2, 3)).astype(np.float32),
                    "w": rng.standard_normal(3).astype(np.float32)}
            out = ctx.execute(dict(feed))
            check_outputs([out["hist"], out["rows"]], session.run(None, feed), f"n={n}")
