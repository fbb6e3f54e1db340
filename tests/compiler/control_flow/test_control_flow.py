"""If / Loop / Scan: import with captured outer reads, export, reference, plans with nested body plans."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.evaluator import evaluate_model
from polykit.compiler.ir.graph import Graph
from polykit.compiler.graph.onnx_export import to_onnx
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.file import Plan, decode_plan, encode_plan
from polykit.errors import PlanError
from polykit.runtime.engine import Engine
from tests.compiler.control_flow.models import DIM, STEPS, branchy, cumulative, greedy_decode

RNG = np.random.default_rng(7)


def _onnxrt(model: onnx.ModelProto, feeds: dict) -> dict:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _decode_feeds() -> dict:
    return {"start": np.array([3], np.int64), "state": RNG.standard_normal((1, DIM)).astype(np.float32)}


def _scan_feeds(axis: int) -> dict:
    slice_shape = [d for i, d in enumerate((4, 5, 3)) if i != axis]
    return {"acc0": RNG.standard_normal(slice_shape).astype(np.float32),
            "mx0": RNG.standard_normal(slice_shape).astype(np.float32),
            "x": RNG.standard_normal((4, 5, 3)).astype(np.float32)}


CASES = {
    "greedy_decode": (greedy_decode, _decode_feeds),
    "if_then": (branchy, lambda: {"x": np.abs(RNG.standard_normal((2, 3))).astype(np.float32) + 0.1}),
    "if_else": (branchy, lambda: {"x": -np.abs(RNG.standard_normal((2, 3))).astype(np.float32) - 0.1}),
    "scan_axis0": (lambda: cumulative(0, 0), lambda: _scan_feeds(0)),
    "scan_axis1_reverse": (lambda: cumulative(1, 1), lambda: _scan_feeds(1)),
    "scan_axis2": (lambda: cumulative(2, 0), lambda: _scan_feeds(2)),
}


def test_import_turns_outer_reads_into_node_inputs_bound_to_body_inputs():
    graph = load_onnx(branchy())
    node = next(n for n in graph.nodes if n.op_type == "If")
    assert isinstance(node.attrs["then_branch"], Graph)
    assert node.inputs[1:] == ["x", "w"] and node.attrs["polykit_captures"] == 2
    for key in ("then_branch", "else_branch"):
        assert node.attrs[key].inputs == ["x", "w"]
    assert graph.value("y").shape == (2, 3)


def test_loop_scan_output_has_the_constant_trip_count_as_its_first_dim():
    graph = load_onnx(greedy_decode())
    assert graph.value("gen").shape == (STEPS, 1)
    assert graph.value("tokens").shape == (STEPS + 1,)


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_round_trips_through_the_checker_and_onnxruntime(case):
    make, feeds_of = CASES[case]
    model, feeds = make(), feeds_of()
    exported = to_onnx(load_onnx(model))
    onnx.checker.check_model(exported, full_check=True)
    got, want = _onnxrt(exported, feeds), _onnxrt(model, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_evaluation_matches_onnxruntime(case):
    make, feeds_of = CASES[case]
    model, feeds = make(), feeds_of()
    got, want = evaluate_model(model, feeds), _onnxrt(model, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_plan_with_body_plans_round_trips_and_matches_onnxruntime(case):
    make, feeds_of = CASES[case]
    model, feeds = make(), feeds_of()
    plan = build_plan(model, BuilderConfig(target="cpu"))
    data = plan.serialize()
    loaded = Plan.deserialize(data, expect_target="cpu")
    assert loaded.serialize() == data
    assert any(isinstance(v, Plan) for layer in loaded.layers for v in layer.attrs.values())
    with Engine(loaded) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute(feeds)
    want = _onnxrt(model, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_body_weights_live_in_the_plan_files_one_weight_blob():
    plan = build_plan(greedy_decode(), BuilderConfig(target="cpu"))
    header, doc, blob = decode_plan(plan.serialize())
    loop = next(layer for layer in doc["layers"] if layer["kind"] == "Loop")
    body = loop["attrs"]["body"]["__plan__"]
    assert body["metadata"]["body_outputs"] == ["cond_out", "tok_out", "h", "tok_scan"]
    assert all(w["offset"] + w["nbytes"] <= len(blob) for w in body["weights"].values())


def test_a_nested_plan_with_an_impossible_field_is_refused_naming_it():
    plan = build_plan(branchy(), BuilderConfig(target="cpu"))
    header, doc, blob = decode_plan(plan.serialize())
    layer = next(layer for layer in doc["layers"] if layer["kind"] == "If")
    layer["attrs"]["then_branch"]["__plan__"]["metadata"]["body_outputs"] = ["nowhere"]
    data = encode_plan(doc, bytes(blob), header["target"], header["gpu_arch"])
    with pytest.raises(PlanError, match=r"then_branch.*body_outputs\[0\]"):
        Plan.deserialize(data)


def test_a_plan_tag_beside_other_keys_is_refused():
    plan = build_plan(branchy(), BuilderConfig(target="cpu"))
    header, doc, blob = decode_plan(plan.serialize())
    layer = next(layer for layer in doc["layers"] if layer["kind"] == "If")
    layer["attrs"]["then_branch"]["extra"] = 1
    data = encode_plan(doc, bytes(blob), header["target"], header["gpu_arch"])
    with pytest.raises(PlanError, match="plan tag"):
        Plan.deserialize(data)


def test_passes_recurse_into_bodies_and_fold_their_constants():
    from polykit.compiler.passes import optimize

    model = greedy_decode()
    body = model.graph.node[0].attribute[0].g
    body.node.insert(0, onnx.helper.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(
        np.full((1, DIM), 2.0, np.float32))))
    body.node.insert(1, onnx.helper.make_node("Mul", ["k", "k"], ["k2"]))
    body.node[3].input[1] = "k2"  # Add(e, k2) instead of Add(e, state_in)
    optimized = optimize(load_onnx(model))
    inner = next(n for n in optimized.nodes if n.op_type == "Loop").attrs["body"]
    assert not any(n.op_type in ("Constant", "Mul") for n in inner.nodes)
    np.testing.assert_array_equal(next(a for a in inner.initializers.values() if a.shape == (1, DIM)), 4.0)


def test_a_loop_state_that_changes_shape_with_a_constant_trip_count_builds_unrolled():
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Concat", ["seq", "one"], ["grown"], axis=0)],
        "grow", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("seq", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("grown", TensorProto.FLOAT, None)])
    graph = helper.make_graph([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="grower")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(np.array(3, np.int64), "n"),
                               onnx.numpy_helper.from_array(np.ones(1, np.float32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    np.testing.assert_array_equal(evaluate_model(model, {"x": np.zeros(1, np.float32)})["y"], [0, 1, 1, 1])
    plan = build_plan(model, BuilderConfig(target="cpu"))  # unrolled: tests/compiler/control_flow/test_unroll_loops.py
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        np.testing.assert_array_equal(ctx.execute({"x": np.zeros(1, np.float32)})["y"], [0, 1, 1, 1])


def test_polykit_run_compares_the_greedy_decode_loop_with_onnxruntime(tmp_path):
    from polykit.tools.cli.app import main

    path = tmp_path / "decode.onnx"
    onnx.save(greedy_decode(), str(path))
    assert main(["run", str(path), "--trt", "--onnxrt", "--target", "cpu", "-q"]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_plan_runs_bodies_on_the_device_and_matches_onnxruntime(case):
    make, feeds_of = CASES[case]
    model, feeds = make(), feeds_of()
    plan = Plan.deserialize(build_plan(model, BuilderConfig(target="cuda")).serialize())
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        first, second = ctx.execute(feeds), ctx.execute(feeds)
    want = _onnxrt(model, feeds)
    for name in want:
        np.testing.assert_allclose(first[name], want[name], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(second[name], first[name])


@pytest.mark.gpu
def test_polykit_run_compares_the_greedy_decode_loop_on_cuda(tmp_path):
    from polykit.tools.cli.app import main

    path = tmp_path / "decode.onnx"
    onnx.save(greedy_decode(), str(path))
    assert main(["run", str(path), "--trt", "--onnxrt", "--target", "cuda", "-q"]) == 0


def test_a_body_whose_type_no_layer_serves_is_a_polykit_error_naming_the_type():
    from polykit.compiler.ops.control.bodies import annotate, body_runner
    from polykit.errors import PolykitError

    with pytest.raises(PolykitError, match="nothing runs a control-flow body of type dict"):
        body_runner({})
    with pytest.raises(PolykitError, match="nothing infers a control-flow body of type dict"):
        annotate({}, [])
