"""Tensor-parallel builds (BuilderConfig(ranks=N)): each rank's plan, run on simulated cpu ranks,
matches the unsplit plan; collectives imported from onnxruntime's com.microsoft ops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.distributed import build_rank_plans, partition
from polykit.compiler.graph.onnx_export import to_onnx
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.file import Plan
from polykit.errors import PlanError, ShapeError, UsageError
from polykit.runtime.collectives import run_simulated_ranks
from polykit.runtime.engine import Engine
from tests.dynamic_models import encoder

TORCH = Path(__file__).resolve().parents[1] / "data" / "torch"
SHAPES = {"x": (2, 5, 32), "mask": (2, 5)}


def encoder_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.where(rng.random((2, 5)) < 0.3, -1e4, 0).astype(np.float32)
    return {"x": rng.standard_normal((2, 5, 32)).astype(np.float32), "mask": mask}


def run_unsplit(model, shapes, feeds):
    with Engine(build_plan(model, BuilderConfig(target="cpu", input_shapes=shapes))).create_execution_context() as c:
        return c.execute(feeds)


def run_split(model, shapes, feeds, ranks):
    plans = build_rank_plans(model, BuilderConfig(target="cpu", input_shapes=shapes, ranks=ranks))
    return plans, run_simulated_ranks([Engine(p) for p in plans], [feeds] * ranks, timeout_s=60)


def collectives(plan: Plan) -> list[str]:
    return [layer.attrs["op"] for layer in plan.layers if layer.kind == "DistCollective"]


@pytest.mark.parametrize("ranks", [2, 4])
def test_encoder_split_matches_unsplit_plan_on_every_rank(ranks):
    model, feeds = encoder(layers=2, d=32, heads=4), encoder_feeds()
    want = run_unsplit(model, SHAPES, feeds)["y"]
    plans, outs = run_split(model, SHAPES, feeds, ranks)
    for rank, out in enumerate(outs):
        np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank} of {ranks}")
    # attention (Q/K/V column-split by heads, output row-split) and MLP pairs: one all_reduce each
    assert [collectives(p) for p in plans] == [["all_reduce"] * 4] * ranks
    assert [(p.metadata["rank"], p.metadata["ranks"]) for p in plans] == [(r, ranks) for r in range(ranks)]


@pytest.mark.parametrize("ranks", [2, 4])
def test_rank_plans_hold_only_their_weight_shards(ranks):
    model = encoder(layers=2, d=32, heads=4)
    whole = build_plan(model, BuilderConfig(target="cpu", input_shapes=SHAPES)).weight_bytes
    plans = build_rank_plans(model, BuilderConfig(target="cpu", input_shapes=SHAPES, ranks=ranks))
    split = sum(np.prod(s["full"]) * 4 for s in plans[0].metadata["partition"]["split_weights"].values())
    for plan in plans:
        replicated = whole - split  # layer norms and the row-parallel biases, added once after the all_reduce
        assert plan.weight_bytes == pytest.approx(split / ranks + replicated, rel=0.02, abs=2048)
        assert plan.weight_bytes < whole * (0.6 if ranks == 2 else 0.35)


def test_head_count_in_reshape_constants_is_divided_by_the_ranks():
    graph = load_onnx(encoder(layers=1, d=32, heads=4))
    from polykit.compiler.builder.builder import apply_input_shapes
    from polykit.compiler.graph.infer import infer_shapes
    from polykit.compiler.passes import fold_constants, run_passes

    apply_input_shapes(graph, SHAPES)
    infer_shapes(graph)
    run_passes(graph, [fold_constants])
    local, summary = partition(graph, 2, 1)
    shapes = [local.initializers[n.inputs[1]].tolist() for n in local.nodes if n.op_type == "Reshape"]
    assert shapes == [[2, 5, 2, 8]] * 3 + [[2, 5, 16]]  # q, k, v to 2 of 4 heads; the merge back to 16 of 32
    assert {s["op"] for s in summary.metadata()["partition"]["collectives"]} == {"all_reduce"}


@pytest.mark.parametrize("name, ranks", [("bert_tiny_ts", 2), ("bert_tiny_ts", 4), ("bert_tiny_dynamo", 2),
                                         ("gpt2_tiny_ts", 2), ("vit_tiny_ts", 4)])
def test_exported_transformers_split_match_unsplit(name, ranks):
    import onnxruntime as ort

    path = TORCH / f"{name}.onnx"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    rng = np.random.default_rng(3)
    shapes, feeds = {}, {}
    for i in ort.InferenceSession(str(path)).get_inputs():
        shapes[i.name] = tuple(d if isinstance(d, int) else 4 for d in i.shape)
        feeds[i.name] = (rng.integers(0, 50, shapes[i.name]) if "int64" in i.type
                         else rng.standard_normal(shapes[i.name])).astype(np.int64 if "int64" in i.type else np.float32)
    want = run_unsplit(str(path), shapes, feeds)
    plans, outs = run_split(str(path), shapes, feeds, ranks)
    for rank, out in enumerate(outs):
        for key in want:
            np.testing.assert_allclose(out[key], want[key], rtol=1e-5, atol=1e-5, err_msg=f"{name} {key} rank {rank}")
    assert "all_reduce" in collectives(plans[0])
    assert plans[0].weight_bytes < 0.8 * build_plan(str(path), BuilderConfig(target="cpu", input_shapes=shapes)).weight_bytes


def test_heads_the_ranks_do_not_divide_leave_attention_replicated():
    model = encoder(layers=1, d=24, heads=3)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 5, 24)).astype(np.float32), "mask": np.zeros((2, 5), np.float32)}
    shapes = {"x": (2, 5, 24), "mask": (2, 5)}
    want = run_unsplit(model, shapes, feeds)["y"]
    plans, outs = run_split(model, shapes, feeds, 2)
    for out in outs:
        np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5)
    assert collectives(plans[0]) == ["all_reduce"]  # the MLP pair only: no all_gather of split heads
    split = plans[0].metadata["partition"]["split_weights"].values()
    assert sorted(tuple(s["full"]) for s in split) == [(24, 48), (48,), (48, 24)]  # W1, b1, W2: not Q/K/V/O


def test_rank_build_options_are_checked():
    with pytest.raises(UsageError, match="ranks 0 is not an integer >= 1"):
        BuilderConfig(ranks=0)
    with pytest.raises(UsageError, match=r"rank 2 is not in 0..1"):
        BuilderConfig(ranks=2, rank=2)
    with pytest.raises(UsageError, match="no profiles, INT8 or marked outputs"):
        BuilderConfig(ranks=2, mark_all=True)


# ---- onnxruntime's com.microsoft collectives ----------------------------------------------------
def ms_model(ranks: int) -> onnx.ModelProto:
    nodes = [helper.make_node("AllReduce", ["x"], ["summed"], domain="com.microsoft", name="ar"),
             helper.make_node("AllGather", ["summed"], ["gathered"], domain="com.microsoft", name="ag",
                              group_size=ranks, axis=1),
             helper.make_node("AllToAll", ["gathered"], ["y"], domain="com.microsoft", name="a2a", group_size=ranks)]
    graph = helper.make_graph(nodes, "ms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


@pytest.mark.parametrize("ranks", [2, 4])
def test_onnxruntime_collectives_build_per_rank_and_match_numpy(ranks):
    rng = np.random.default_rng(ranks)
    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(ranks)]
    plans = build_rank_plans(ms_model(ranks), BuilderConfig(target="cpu", ranks=ranks))
    outs = run_simulated_ranks([Engine(p) for p in plans], [{"x": x} for x in xs], timeout_s=30)
    gathered = np.concatenate([np.sum(xs, axis=0)] * ranks, axis=1)  # every rank holds the same sum
    chunk = 4 // ranks
    for i, out in enumerate(outs):
        want = np.concatenate([gathered[i * chunk:(i + 1) * chunk]] * ranks, axis=0)
        np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5, err_msg=f"rank {i}")
    assert [l.attrs["ranks"] for l in plans[0].layers if l.kind == "DistCollective"] == [ranks] * 3


def test_collectives_export_back_to_onnxruntime_ops():
    graph = load_onnx(ms_model(2))
    assert [(n.op_type, n.attrs["op"]) for n in graph.nodes] == [
        ("DistCollective", "all_reduce"), ("DistCollective", "all_gather"), ("DistCollective", "all_to_all")]
    model = to_onnx(graph)
    assert [(n.op_type, n.domain) for n in model.graph.node] == [("AllReduce", "com.microsoft"),
                                                                  ("AllGather", "com.microsoft"),
                                                                  ("AllToAll", "com.microsoft")]
    assert {a.name: a.i for a in model.graph.node[1].attribute} == {"axis": 1, "group_size": 2}
    assert [n.attrs for n in load_onnx(model).nodes] == [n.attrs for n in graph.nodes]


def test_polykit_only_collectives_export_in_the_polykit_domain():
    graph = load_onnx(ms_model(2))
    graph.nodes[1].attrs.update(op="reduce_scatter", reduce="max", axis=0)
    graph.nodes[1].attrs.pop("axis")
    graph.nodes[1].attrs["axis"] = 0
    proto = to_onnx(graph).graph.node[1]
    assert (proto.op_type, proto.domain) == ("DistCollective", "ai.polykit")
    assert load_onnx(to_onnx(graph)).nodes[1].attrs == graph.nodes[1].attrs


def test_split_that_does_not_divide_is_a_build_error_naming_the_node():
    graph = load_onnx(ms_model(2))
    graph.nodes[2].attrs.update(op="reduce_scatter", reduce="sum", axis=1, ranks=4, group=[0, 1, 2, 3])
    with pytest.raises(ShapeError, match=r"node 'a2a'.*reduce_scatter splits dim 1 \(6\) into 4 chunks"):
        build_plan(graph, BuilderConfig(target="cpu", ranks=4))


@pytest.mark.parametrize("attrs, problem", [
    ({"ranks": 3}, "group .* is not 3 distinct non-negative ranks"),
    ({"group": [0, 0]}, r"group \[0, 0\] is not 2 distinct"),
    ({"reduce": "median"}, "reduce 'median' is not one of"),
    ({"op": "broadcast", "root": 2}, "root 2 is not a member index"),
    ({"op": "all_gather", "axis": 2}, "axis 2 is not a dim of the rank-2 input"),
    ({"group": [0, 5]}, r"group \[0, 5\] names ranks the plan's 2 do not have"),
])
def test_plan_check_refuses_bad_collective_attributes(attrs, problem):
    plan = build_rank_plans(ms_model(2), BuilderConfig(target="cpu", ranks=2))[0]
    layer = next(l for l in plan.layers if l.kind == "DistCollective")
    layer.attrs.update(attrs)
    with pytest.raises(PlanError, match=problem):
        Plan.deserialize(plan.serialize())
