"""Loops whose body has no static shapes (a growing carried value, a slice at the iteration
number) are unrolled at build time when the build knows their trip count."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.evaluator import evaluate_model
from polykit.runtime.engine import Engine
from tests.compiler.control_flow.models import DIM, STEPS, growing_decode

RNG = np.random.default_rng(11)


def _feeds() -> dict:
    return {"start": np.array([3], np.int64), "state": RNG.standard_normal((1, DIM)).astype(np.float32)}


def _onnxrt(model: onnx.ModelProto, feeds: dict) -> dict:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _run(plan, feeds: dict) -> dict:
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        return ctx.execute(feeds)


def _sliced_accumulator() -> onnx.ModelProto:
    """ONNX's test_loop11: y += x[i:i+1] for i < 5, the slice bounds read from the iteration number."""
    x = numpy_helper.from_array(np.arange(1, 6, dtype=np.float32), "x")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    zero = numpy_helper.from_array(np.array([0], np.int64), "zero")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "zero"], ["start"]), helper.make_node("Unsqueeze", ["end", "zero"], ["stop"]),
         helper.make_node("Slice", ["x", "start", "stop"], ["piece"]), helper.make_node("Add", ["y_in", "piece"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("y_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1])], [x, one, zero])
    graph = helper.make_graph([helper.make_node("Loop", ["n", "c", "y"], ["res", "res_scan"], body=body, name="acc")],
                              "sliced", [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                                         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("res", TensorProto.FLOAT, [1]),
                               helper.make_tensor_value_info("res_scan", TensorProto.FLOAT, [5, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_a_growing_carried_value_is_unrolled_into_a_plan_without_a_loop_layer():
    model, feeds = growing_decode(), _feeds()
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert not any(layer.kind == "Loop" for layer in plan.layers)
    assert plan.tensors["tokens"].shape == (STEPS + 1,)
    got, want = _run(plan, feeds), _onnxrt(model, feeds)
    np.testing.assert_array_equal(got["tokens"], want["tokens"])
    np.testing.assert_allclose(got["final_state"], want["final_state"], rtol=1e-5, atol=1e-6)


def test_slice_bounds_from_the_iteration_number_unroll_with_input_values():
    model = _sliced_accumulator()
    known = {"n": np.array(5, np.int64), "c": np.array(True)}
    feeds = {**known, "y": np.array([-2.0], np.float32)}
    plan = build_plan(model, BuilderConfig(target="cpu", input_values=known))
    got = _run(plan, feeds)
    np.testing.assert_array_equal(got["res"], [13.0])
    np.testing.assert_array_equal(got["res_scan"], [[-1.0], [1.0], [4.0], [8.0], [13.0]])
    np.testing.assert_array_equal(evaluate_model(model, feeds)["res_scan"], got["res_scan"])


def test_a_growing_loop_whose_trip_count_is_unknown_at_build_time_runs_every_count_from_one_plan():
    # not unrolled: the body plan is built for a profile (its growing dim a symbol: compiler/builder/bodies.py)
    model = growing_decode(trip_as_input=True)
    plan = build_plan(model, BuilderConfig(target="cpu"))
    for n in (0, 1, 2, 6):
        feeds = {**_feeds(), "n": np.array(n, np.int64)}
        got, want = _run(plan, feeds), evaluate_model(model, feeds)
        np.testing.assert_array_equal(got["tokens"], want["tokens"], err_msg=f"n={n}")
        np.testing.assert_allclose(got["final_state"], want["final_state"], rtol=1e-6, atol=1e-6, err_msg=f"n={n}")
    assert got["tokens"].shape == (7,)


def test_the_growing_decode_passes_polykit_run_against_onnxruntime(tmp_path):
    from polykit.tools.cli.app import main

    path = tmp_path / "grow.onnx"
    onnx.save(growing_decode(), str(path))
    assert main(["run", str(path), "--trt", "--onnxrt", "--target", "cpu", "-q"]) == 0


@pytest.mark.gpu
def test_the_unrolled_growing_decode_matches_onnxruntime_on_cuda(tmp_path):
    from polykit.tools.cli.app import main

    model, feeds = growing_decode(), _feeds()
    got, want = _run(build_plan(model, BuilderConfig(target="cuda")), feeds), _onnxrt(model, feeds)
    np.testing.assert_array_equal(got["tokens"], want["tokens"])
    np.testing.assert_allclose(got["final_state"], want["final_state"], rtol=1e-4, atol=1e-5)
    path = tmp_path / "grow.onnx"
    onnx.save(model, str(path))
    assert main(["run", str(path), "--trt", "--onnxrt", "--target", "cuda", "-q"]) == 0
