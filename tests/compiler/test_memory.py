"""Memory planning: lifetimes, arena reuse, alignment, no overlap between live tensors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polykit.compiler.plan.memory import ALIGNMENT, MemoryPlan, align, compute_lifetimes, plan_memory


def _chain(n: int):
    """x -> t0 -> t1 -> ... -> y, one layer each."""
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["y"]
    return [((names[i],), (names[i + 1],)) for i in range(n)], names


def _overlaps(plan: MemoryPlan, sizes) -> list[tuple[str, str]]:
    bad = []
    items = [(n, plan.offsets[n], align(sizes[n]), *plan.lifetimes[n]) for n in plan.lifetimes if sizes[n]]
    for i, (a, oa, sa, fa, la) in enumerate(items):
        for b, ob, sb, fb, lb in items[i + 1:]:
            live_together = not (la < fb or lb < fa)
            share_bytes = oa < ob + sb and ob < oa + sa
            if live_together and share_bytes:
                bad.append((a, b))
    return bad


def test_chain_lifetimes_span_producer_to_last_reader():
    layers, names = _chain(4)
    life = compute_lifetimes(layers, ["x"], ["y"])
    assert life["x"] == (-1, 4) and life["y"] == (3, 4)
    assert life["t0"] == (0, 1) and life["t2"] == (2, 3)


def test_weights_are_left_out_of_lifetimes():
    life = compute_lifetimes([(("x", "w"), ("y",))], ["x"], ["y"], skip=["w"])
    assert "w" not in life


def test_a_chain_reuses_memory_so_peak_is_below_the_no_reuse_sum():
    layers, names = _chain(8)
    sizes = {n: 1000 for n in names}
    life = compute_lifetimes(layers, ["x"], ["y"])
    plan = plan_memory(sizes, life, io_names=["x", "y"])
    assert plan.peak_bytes < plan.no_reuse_bytes
    assert plan.arena_bytes < plan.no_reuse_bytes
    assert plan.arena_bytes == 4 * align(1000)  # x, y, and two ping-pong activations


def test_offsets_are_256_byte_aligned():
    layers, names = _chain(5)
    sizes = {n: 17 * (i + 1) for i, n in enumerate(names)}
    plan = plan_memory(sizes, compute_lifetimes(layers, ["x"], ["y"]), io_names=["x", "y"])
    assert all(o % ALIGNMENT == 0 for o in plan.offsets.values())


def test_inputs_and_outputs_get_their_own_leading_slots():
    layers, names = _chain(5)
    sizes = {n: 300 for n in names}
    plan = plan_memory(sizes, compute_lifetimes(layers, ["x"], ["y"]), io_names=["x", "y"])
    assert plan.offsets["x"] == 0 and plan.offsets["y"] == align(300)
    assert all(plan.offsets[n] >= 2 * align(300) for n in names[1:-1])


def test_no_reuse_strategy_gives_every_tensor_a_distinct_slot():
    layers, names = _chain(6)
    sizes = {n: 100 for n in names}
    plan = plan_memory(sizes, compute_lifetimes(layers, ["x"], ["y"]), io_names=["x", "y"], strategy="none")
    assert plan.arena_bytes == plan.no_reuse_bytes
    assert len(set(plan.offsets.values())) == len(names)


def test_best_fit_picks_the_tightest_gap():
    # a (big) and b (small) die before c is born; c (small) should land in b's hole, not a's.
    sizes = {"a": 4096, "b": 256, "keep": 256, "c": 256}
    life = {"a": (0, 1), "keep": (0, 5), "b": (0, 1), "c": (2, 3)}
    best = plan_memory(sizes, life, strategy="best-fit")
    assert best.arena_bytes == 4096 + 512
    assert not _overlaps(best, sizes)


def test_plan_is_deterministic():
    layers, names = _chain(7)
    sizes = {n: 64 * (i % 3 + 1) for i, n in enumerate(names)}
    life = compute_lifetimes(layers, ["x"], ["y"])
    assert plan_memory(sizes, life, ["x", "y"]) == plan_memory(sizes, life, ["x", "y"])


def test_memory_plan_json_round_trip():
    layers, names = _chain(3)
    plan = plan_memory({n: 10 for n in names}, compute_lifetimes(layers, ["x"], ["y"]), ["x", "y"])
    assert MemoryPlan.from_json(plan.to_json()) == plan


@st.composite
def _random_dag(draw):
    n_layers = draw(st.integers(1, 14))
    tensors = ["in0", "in1"]
    layers = []
    for i in range(n_layers):
        k = draw(st.integers(1, min(3, len(tensors))))
        ins = tuple(draw(st.lists(st.sampled_from(tensors), min_size=k, max_size=k)))
        outs = tuple(f"l{i}o{j}" for j in range(draw(st.integers(1, 2))))
        tensors += outs
        layers.append((ins, outs))
    outputs = draw(st.lists(st.sampled_from(tensors[2:]), min_size=1, max_size=3, unique=True))
    sizes = {t: draw(st.integers(0, 3000)) for t in tensors}
    return layers, outputs, sizes


@settings(max_examples=100, deadline=None)
@given(_random_dag(), st.sampled_from(["best-fit", "first-fit"]))
def test_reuse_never_overlaps_live_tensors(dag, strategy):
    layers, outputs, sizes = dag
    life = compute_lifetimes(layers, ["in0", "in1"], outputs)
    plan = plan_memory(sizes, life, io_names=["in0", "in1", *outputs], strategy=strategy)
    assert not _overlaps(plan, sizes)
    assert plan.peak_bytes <= plan.arena_bytes <= plan.no_reuse_bytes
    steps = range(-1, len(layers) + 1)
    brute = max(sum(align(sizes[n]) for n, (f, l) in life.items() if f <= s <= l) for s in steps)
    assert plan.peak_bytes == brute


@pytest.mark.parametrize("strategy", ["best-fit", "first-fit"])
def test_io_slots_never_share_bytes_with_activations(strategy):
    layers, names = _chain(4)
    sizes = {n: 512 for n in names}
    plan = plan_memory(sizes, compute_lifetimes(layers, ["x"], ["y"]), io_names=["x", "y"], strategy=strategy)
    io_end = 2 * 512
    assert all(plan.offsets[n] >= io_end for n in names[1:-1])


def test_a_view_shares_its_source_slot_and_keeps_it_reserved_until_its_last_reader():
    # x -> a -> (view) v ; a's slot must survive until v's reader (layer 3), so b and c get other bytes
    layers = [(("x",), ("a",)), (("a",), ("v",)), (("x",), ("b",)), (("v", "b"), ("c",)), (("c",), ("y",))]
    sizes = {n: 1024 for n in ("x", "a", "v", "b", "c", "y")}
    life = compute_lifetimes(layers, ["x"], ["y"])
    plan = plan_memory(sizes, life, io_names=["x", "y"], aliases={"v": "a"})
    assert plan.offsets["v"] == plan.offsets["a"]
    assert plan.aliases == {"v": "a"}
    assert plan.lifetimes == life  # the recorded lifetimes stay the tensors' own
    without_view = {n: life[n] for n in life if n != "v"}
    without_view["a"] = (life["a"][0], life["v"][1])
    view_free = MemoryPlan(offsets={n: plan.offsets[n] for n in without_view}, lifetimes=without_view)
    assert not _overlaps(view_free, sizes)
    assert MemoryPlan.from_json(plan.to_json()) == plan


def _view_model():
    """x -> Relu -> r -> Reshape -> v (a view) -> Sigmoid -> y."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["v"]),
             helper.make_node("Sigmoid", ["v"], ["y"])]
    graph = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor("shape", TensorProto.INT64, [2], [3, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_reshape_outputs_of_a_built_plan_are_views_and_the_cpu_target_still_agrees():
    import numpy as np

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Engine

    plan = build_plan(_view_model(), BuilderConfig(target="cpu", fuse=False))
    assert plan.memory.aliases == {"v": "r"}
    assert plan.tensors["v"].offset == plan.tensors["r"].offset
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        y = ctx.execute({"x": x})["y"]
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-np.maximum(x, 0).reshape(3, 4))), rtol=1e-6)


def _output_view_model():
    """x -> Relu -> r -> Reshape -> y (an engine output); r read by Neg -> z after the view too."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="view"),
             helper.make_node("Neg", ["r"], ["z"], name="neg")]
    graph = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor("shape", TensorProto.INT64, [2], [3, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_source_of_a_view_that_is_an_engine_output_shares_the_outputs_slot():
    """The output keeps its own slot; the Relu writes it there and the Reshape copies nothing. The
    cpu target agrees, run from its own memory and with the outputs bound in the caller's."""
    import numpy as np

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Engine

    plan = build_plan(_output_view_model(), BuilderConfig(target="cpu", fuse=False))
    assert plan.memory.aliases == {"r": "y"}
    assert plan.tensors["r"].offset == plan.tensors["y"].offset != plan.tensors["z"].offset
    x = np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32)
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute({"x": x})
        y, z = np.zeros((3, 4), np.float32), np.zeros((2, 6), np.float32)
        for name, array in (("x", x), ("y", y), ("z", z)):
            ctx.set_tensor_address(name, array)
        ctx.enqueue()
    for out in (got["y"], y):
        np.testing.assert_array_equal(out, np.maximum(x, 0).reshape(3, 4))
    for out in (got["z"], z):
        np.testing.assert_array_equal(out, -np.maximum(x, 0))


def test_a_source_an_engine_input_or_two_outputs_share_keeps_its_own_slot():
    """A view's source that is an engine input, or one that a second output views too: only the
    first output takes the source, the second Reshape copies it."""
    from onnx import TensorProto, helper

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    nodes = [helper.make_node("Reshape", ["x", "shape"], ["a"], name="view_x"),
             helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["b"], name="view_r"),
             helper.make_node("Flatten", ["r"], ["c"], name="flat_r", axis=0)]
    graph = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"],
                              [helper.make_tensor("shape", TensorProto.INT64, [2], [3, 4])])
    plan = build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                      BuilderConfig(target="cpu", fuse=False))
    assert plan.memory.aliases == {"r": "b"}


def test_a_view_of_a_source_that_an_output_took_does_not_take_it_for_a_second_output():
    """r -> Flatten -> f (an activation, a view of r), r -> Reshape -> y1, f -> Reshape -> y2: r
    takes y1's slot, so f is y1's bytes too and y2's Reshape copies them."""
    from onnx import TensorProto, helper

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat_r", axis=0),
             helper.make_node("Reshape", ["r", "shape"], ["y1"], name="view_r"),
             helper.make_node("Reshape", ["f", "shape"], ["y2"], name="view_f"),
             helper.make_node("Neg", ["f"], ["z"], name="neg")]
    graph = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2", "z")],
                              [helper.make_tensor("shape", TensorProto.INT64, [2], [3, 4])])
    plan = build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                      BuilderConfig(target="cpu", fuse=False))
    assert plan.memory.aliases == {"r": "y1", "f": "y1"}
