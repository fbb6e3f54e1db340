"""Loop bodies whose shapes change across iterations (issue 13): the body plan is built for a profile
(the changing dims symbols, the iteration number a ruled value: polykit.compiler.builder.bodies), so one engine
serves every trip count; the Loop's outputs of those shapes are sized at run time."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import polykit.backends.onnx_backend as backend
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.errors import RuntimeInputError
from polykit.runtime.engine import Engine

RNG = np.random.default_rng(13)
X = RNG.uniform(0.5, 2.0, 5).astype(np.float32)
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _sliding_sum_model():
    """test_loop11's form with random numbers: y_out = y_in + x[i:i+1], y and a scan of it out. y is
    [1] while i < 5 and [0] from i = 5 on (x has 5 elements), so y_in has an unknown dim at build time."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "axes"], ["start"]),
         helper.make_node("Unsqueeze", ["end", "axes"], ["stop"]),
         helper.make_node("Slice", ["x", "start", "stop"], ["piece"]),
         helper.make_node("Add", ["y_in", "piece"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
                 helper.make_tensor_value_info("y_in", F, [1])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("y_out", F, [1]),
         helper.make_tensor_value_info("scan_out", F, [1])],
        [numpy_helper.from_array(X, "x"), numpy_helper.from_array(np.array(1, np.int64), "one"),
         numpy_helper.from_array(np.array([0], np.int64), "axes")])
    g = helper.make_graph([helper.make_node("Loop", ["n", "cond", "y"], ["res_y", "res_scan"], body=body)], "m",
                          [helper.make_tensor_value_info("n", I64, []), helper.make_tensor_value_info("cond", B, []),
                           helper.make_tensor_value_info("y", F, [1])],
                          [helper.make_tensor_value_info("res_y", F, None),
                           helper.make_tensor_value_info("res_scan", F, None)])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 13)])


def _feed(n: int) -> dict:
    return {"n": np.array(n, np.int64), "cond": np.array(True), "y": RNG.standard_normal(1).astype(np.float32)}


def check_outputs(got, want, what: str) -> None:
    for g, w in zip(got, want):
        assert g.shape == w.shape, f"{what}: shape {g.shape}, onnxruntime {w.shape}"
        assert not np.isnan(g).any(), f"{what}: unwritten (NaN) elements {g}"
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=what)


def check_every_trip_count(device: str):
    """Trip counts 0, 1, 3, 5, 2 through one rep for `device` against onnxruntime, one engine built;
    the rep."""
    model = _sliding_sum_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rep = backend.prepare(model, device)
    for n in (0, 1, 3, 5, 2):
        feed = _feed(n)
        check_outputs(rep.run(dict(feed)), session.run(None, feed), f"n={n}")
    assert rep.builds == 1, f"{rep.builds} engines built for 5 trip counts (one expected)"
    return rep


def test_a_loop_whose_carried_shape_changes_with_the_iteration_builds_once_for_every_trip_count():
    check_every_trip_count("CPU")


def test_past_the_slices_end_the_carried_value_goes_empty_and_a_scan_of_two_shapes_is_refused():
    model = _sliding_sum_model()
    plan = build_plan(model, BuilderConfig(target="cpu", input_shapes={"n": (), "cond": (), "y": (1,)}))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        for n in (6, 7):  # iterations 5.. give y_out [0] (x[5:6] is empty), iterations before it [1]
            with pytest.raises(RuntimeInputError, match="iteration 5 gives scan output 2 the shape \\(0,\\)"):
                ctx.execute(_feed(n))
        out = ctx.execute(_feed(5))  # the context still serves a valid count afterwards
    assert out["res_scan"].shape == (5, 1)


def test_the_body_plan_of_run_time_shapes_survives_the_plan_file_and_inspect(tmp_path):
    from polykit.tools.cli.app import main

    model = _sliding_sum_model()
    plan = build_plan(model, BuilderConfig(target="cpu", input_shapes={"n": (), "cond": (), "y": (1,)}))
    body = next(layer for layer in plan.layers if layer.kind == "Loop").attrs["body"]
    assert body.profiles is not None and body.profiles.rules, "the body plan should carry its shape rules"
    loaded = Plan.deserialize(plan.serialize())
    feed = _feed(4)
    with Engine(plan) as a, a.create_execution_context() as ca, Engine(loaded) as b, b.create_execution_context() as cb:
        want, got = ca.execute(dict(feed)), cb.execute(dict(feed))
    for name in ("res_y", "res_scan"):
        np.testing.assert_array_equal(got[name], want[name])
    path = tmp_path / "loop.plan"
    path.write_bytes(plan.serialize())
    assert main(["inspect", "model", str(path), "-q"]) == 0


def test_a_sized_scan_output_renamed_by_identity_removal_keeps_its_bound_symbol():
    # remove_identity gives the Loop's output the graph output's name; re-inference keeps the symbol the
    # build's profiles bound (a fresh data(final)[0] would be unbound at the corners: a BuildError)
    model = _sliding_sum_model()
    model.graph.node.append(helper.make_node("Identity", ["res_scan"], ["final"]))
    del model.graph.output[1]
    model.graph.output.append(helper.make_tensor_value_info("final", F, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    plan = build_plan(model, BuilderConfig(target="cpu", input_shapes={"n": (), "cond": (), "y": (1,)}))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        for n in (0, 3, 5):
            feed = _feed(n)
            got, (_, want) = ctx.execute(dict(feed))["final"], session.run(None, feed)
            assert got.shape == want.shape, f"n={n}: shape {got.shape}, onnxruntime {want.shape}"
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"n={n}")
