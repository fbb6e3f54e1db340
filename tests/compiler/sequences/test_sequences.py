"""Sequences and optionals: import, shape rules, the graph evaluator and cpu plans against
onnxruntime on real data, the build-time resolution's limits and the engine's checks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.evaluator import evaluate_model
from polykit.compiler.ir.graph import OPTIONAL, SEQUENCE
from polykit.compiler.graph.onnx_export import to_onnx
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import BuildError, PlanError, RuntimeInputError
from polykit.runtime.engine import Runtime
from polykit.runtime.sequences import flatten_value
from tests.compiler.sequences import models

CASES = sorted(models.MODELS)


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict) -> dict:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def assert_same(got, want, what: str) -> None:
    if isinstance(want, list):
        assert isinstance(got, list), f"{what}: {type(got).__name__}, onnxruntime gives a sequence"
        assert len(got) == len(want), f"{what}: {len(got)} elements, onnxruntime gives {len(want)}"
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{what}[{k}]")
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=what)


def cpu_engine(model: onnx.ModelProto, feeds: dict):
    graph = load_onnx(model)
    shapes = {}
    for name, value in feeds.items():
        shapes.update({k: np.shape(v) for k, v in flatten_value(name, graph.value(name).wrap, value).items()})
    plan = build_plan(graph, BuilderConfig(target="cpu", input_shapes=shapes))
    return Runtime("cpu").deserialize_engine(plan.serialize())


def test_sequence_and_optional_types_import_with_their_element_type():
    g = load_onnx(models.map_with_capture())
    xs, ys = g.value("xs"), g.value("ys")
    assert (xs.wrap, xs.dtype, xs.shape) == ((SEQUENCE,), np.dtype(np.float32), ("N",))
    assert ys.wrap == (SEQUENCE,)
    o = load_onnx(models.optional_tensor()).value("o")
    assert (o.wrap, o.shape) == ((OPTIONAL,), (4,))


def test_export_writes_sequence_types_back():
    model = to_onnx(load_onnx(models.map_with_capture()))
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.WhichOneof("value") == "sequence_type"
    assert {o.name: o.type.WhichOneof("value") for o in model.graph.output} == {"ys": "sequence_type",
                                                                              "shapes": "sequence_type"}


def test_shape_rules_track_each_element_while_the_length_is_known():
    g = load_onnx(models.edit_sequence())
    assert g.value("s2").elements == ((2, 5), (2, 3))
    assert g.value("second").shape == (2, 3)
    assert g.value("cat").shape == (2, 8)
    s = load_onnx(models.split_and_stack())
    assert s.value("rows").elements == ((2, 4), (4, 4))
    assert s.value("stacked").shape == (4, 6)


@pytest.mark.parametrize("case", CASES)
def test_graph_evaluator_matches_onnxruntime(case):
    model, feeds = models.MODELS[case](), models.feeds_of()[case]
    want = onnxruntime_outputs(model, feeds)
    got = evaluate_model(model, feeds)
    for name in want:
        assert_same(got[name], want[name], f"{case}: {name}")


@pytest.mark.parametrize("case", CASES)
def test_cpu_plan_matches_onnxruntime_with_sequences_resolved_at_build_time(case):
    model, feeds = models.MODELS[case](), models.feeds_of()[case]
    want = onnxruntime_outputs(model, feeds)
    with cpu_engine(model, feeds) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute(feeds)
        assert not any(isinstance(v, list) for v in engine.plan.tensors.values())
    for name in want:
        assert_same(got[name], want[name], f"{case}: {name}")


def test_a_sequence_output_is_flattened_in_the_plan_and_packed_by_the_engine():
    model, feeds = models.loop_grows_sequence(steps=3), models.feeds_of()["loop_grows_sequence"]
    with cpu_engine(model, feeds) as engine, engine.create_execution_context() as ctx:
        assert [o for o in engine.plan.outputs if o.startswith("grown/")] == ["grown/0", "grown/1", "grown/2"]
        out = ctx.execute(feeds)
    assert [e.tolist() for e in out["grown"]] == [(feeds["x"] * k).tolist() for k in (1, 2, 3)]


def test_an_empty_optional_feed_runs_in_the_evaluator_and_reports_no_element():
    out = evaluate_model(models.optional_tensor(get=False), {"o": None})
    assert out["has"].item() is False


def test_a_sequence_feed_of_another_length_is_refused_naming_the_input():
    model = models.map_with_capture()
    feeds = models.feeds_of()["map_with_capture"]
    with cpu_engine(model, feeds) as engine, engine.create_execution_context() as ctx:
        with pytest.raises(RuntimeInputError, match="'xs' has 2 element") as err:
            ctx.execute({"xs": feeds["xs"][:2]})
    assert "rebuild" in err.value.hint


def test_a_position_known_only_at_run_time_selects_in_one_plan_as_the_evaluator_does():
    model = models.sequence_at_input_position()
    xs = [np.full(3, k + 1, np.float32) for k in range(4)]
    plan = build_plan(model, BuilderConfig(target="cpu", input_shapes={f"xs/{k}": (3,) for k in range(4)}))
    with Runtime("cpu").deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        for pos in range(-4, 4):
            feeds = {"xs": xs, "pos": np.array(pos, np.int64)}
            assert ctx.execute(feeds)["y"].tolist() == evaluate_model(model, feeds)["y"].tolist() == [xs[pos][0]] * 3
        with pytest.raises(RuntimeInputError, match=r"input 'pos'.* is 4, outside its range \[-4, 3\]"):
            ctx.execute({"xs": xs, "pos": np.array(4, np.int64)})


def test_a_sequence_feed_with_a_wrong_element_dtype_is_refused():
    with pytest.raises(RuntimeInputError, match="element 1 of input 'xs' has dtype float64"):
        evaluate_model(models.map_with_capture(), {"xs": [np.ones(2, np.float32), np.ones(2)]})


def test_a_plan_whose_sequence_layout_names_a_missing_tensor_is_refused():
    model, feeds = models.map_with_capture(), models.feeds_of()["map_with_capture"]
    with cpu_engine(model, feeds) as engine:
        plan = engine.plan
    plan.metadata["sequence_io"]["outputs"]["ys"][0] = "nowhere"
    with pytest.raises(PlanError, match="sequence_io.outputs"):
        Runtime("cpu").deserialize_engine(plan.serialize())


@pytest.mark.parametrize("layout", [{"present": 3, "item": "ys/0"}, {"length": "ys/0", "items": "ys/1"},
                                    {"present": "ys/0", "item": "ys/1", "extra": 1}, {"length": "nowhere", "items": []}])
def test_a_plan_whose_run_sized_sequence_layout_is_malformed_is_refused(layout):
    # the {"present", "item"} and {"length", "items"} layouts are checked for their keys and types
    model, feeds = models.map_with_capture(), models.feeds_of()["map_with_capture"]
    with cpu_engine(model, feeds) as engine:
        plan = engine.plan
    plan.metadata["sequence_io"]["outputs"]["ys"] = layout
    with pytest.raises(PlanError, match="sequence"):
        Runtime("cpu").deserialize_engine(plan.serialize())


@pytest.mark.gpu
def test_cuda_plan_of_a_loop_growing_a_sequence_and_concat_from_sequence_matches_onnxruntime():
    from polykit.runtime.target import get_target

    if not get_target("cuda").available():
        pytest.skip("no CUDA device")
    model, feeds = models.loop_grows_sequence(steps=5), models.feeds_of(3)["loop_grows_sequence"]
    want = onnxruntime_outputs(model, feeds)
    plan = build_plan(model, BuilderConfig(target="cuda"))
    assert plan.target == "cuda" and "Loop" not in {layer.kind for layer in plan.layers}, \
        "the loop over a sequence should have been unrolled at build time"
    with Runtime("cuda").deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute(feeds)
    for name in want:
        assert_same(got[name], want[name], f"cuda: {name}")


def test_optional_get_element_of_a_plain_tensor_lowers_to_an_identity_for_every_target():
    from onnx import TensorProto, helper

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    graph = helper.make_graph([helper.make_node("OptionalGetElement", ["x"], ["y"], name="get")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert [layer.kind for layer in plan.layers] == ["Identity"]  # a kind the cuda target runs too
