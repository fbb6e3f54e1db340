"""The tuner on the cpu target: times the candidates of layers with several, keeps the
fastest, honours levels, replays and the timing cache, says what it did."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder import tuner as tuner_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.layer_timing import Measured
from polykit.errors import BuildError, UsageError
from polykit.runtime.engine import Engine

rng = np.random.default_rng(11)
W = rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2
FC = rng.standard_normal((16 * 6 * 6, 5)).astype(np.float32) * 0.1


def _model():
    """conv (4 cpu candidates) -> relu -> flatten -> matmul (2) -> gather of an int input (not timeable)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc"),
             helper.make_node("Gather", ["y", "i"], ["g"], axis=1, name="pick")]
    graph = helper.make_graph(nodes, "tuned", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 6]),
                                               helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5]),
                               helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 2])],
                              [numpy_helper.from_array(W, "w"), numpy_helper.from_array(FC, "fc")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _feeds():
    return {"x": rng.standard_normal((1, 16, 6, 6)).astype(np.float32), "i": np.array([4, 0], np.int64)}


def _build(**cfg):
    return build_plan(_model(), BuilderConfig(target="cpu", **cfg))


def test_level_0_takes_the_first_candidate_by_priority_and_times_nothing():
    plan = _build(builder_optimization_level=0)
    assert {l.tactic for l in plan.layers} == {"cpu.reference"}
    assert plan.metadata["tuning"]["timed_tactics"] == 0


def test_default_level_times_layers_with_several_candidates_and_keeps_the_fastest(monkeypatch):
    seen = {}

    def fake_time(target, layer, pairs, tensors, weights, runs, device=None):
        names = [t.name for _, t in pairs]
        seen[layer.name] = names
        return Measured([10.0 - i for i in range(len(names))], [""] * len(names))  # the last is fastest

    monkeypatch.setattr(tuner_module, "time_candidates", fake_time)
    plan = _build()
    conv = next(l for l in plan.layers if l.kind == "Conv")
    assert seen[conv.name] == ["cpu.reference", "cpu.conv.winograd"]  # level 3 on cpu: the best 2 by priority
    assert conv.tactic == "cpu.conv.winograd"
    assert plan.layer("fc").tactic == "cpu.gemm.blocked"
    assert plan.metadata["tuning"]["timed_layers"] == len(seen) == 2


def test_a_timed_build_computes_the_model():
    feeds = _feeds()
    want = Engine(_build(builder_optimization_level=0)).create_execution_context().execute(feeds)
    plan = _build(builder_optimization_level=5)
    assert plan.metadata["tuning"]["timed_layers"] >= 3
    got = Engine(plan).create_execution_context().execute(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_level_5_times_every_candidate_of_every_layer(monkeypatch):
    timed = {}
    monkeypatch.setattr(tuner_module, "time_candidates", lambda target, layer, pairs, *a: (
        timed.setdefault(layer.name, len(pairs)), Measured([1.0] * len(pairs), [""] * len(pairs)))[1])
    plan = _build(builder_optimization_level=5)
    conv = next(l for l in plan.layers if l.kind == "Conv")
    assert timed[conv.name] == 4 and timed["fc"] == 2
    assert plan.metadata["tuning"]["untimeable_layers"] == 1  # the Gather reads int64 indices
    assert "pick" not in timed and len(timed) == len(plan.layers) - 1


def test_layers_with_integer_inputs_take_their_first_candidate_and_the_log_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="polykit"):
        plan = _build(builder_optimization_level=5)
    assert plan.layer("pick").tactic == "cpu.reference"
    assert "layer 'pick': not timed (integer inputs)" in caplog.text
    assert "compiling took" in caplog.text and "timing" in caplog.text


def test_a_replay_forces_its_tactic_over_timing(tmp_path, monkeypatch):
    plan = _build(builder_optimization_level=0)
    conv = next(l for l in plan.layers if l.kind == "Conv")
    replay = {conv.name: "cpu.conv.direct"}
    monkeypatch.setattr(tuner_module, "time_candidates", lambda target, layer, pairs, *a: Measured(
        [0.0 if t.name == "cpu.reference" else 1.0 for _, t in pairs], [""] * len(pairs)))
    forced = _build(tactic_replay=replay)
    assert forced.layer(conv.name).tactic == "cpu.conv.direct"
    assert forced.layer("fc").tactic == "cpu.reference"


def test_a_replayed_tactic_that_cannot_run_the_layer_is_a_build_error(tmp_path):
    replay = {"fc": "cpu.conv.winograd"}
    with pytest.raises(BuildError, match="cpu.conv.winograd"):
        _build(tactic_replay=replay)


def test_a_candidate_that_fails_while_timing_is_passed_over(monkeypatch, caplog):
    monkeypatch.setattr(tuner_module, "time_candidates", lambda target, layer, pairs, *a: Measured(
        [float("inf")] + [2.0] * (len(pairs) - 1), ["boom"] + [""] * (len(pairs) - 1)))
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = _build()
    assert plan.layer("fc").tactic == "cpu.gemm.blocked"
    assert "tactic cpu.reference failed while timing: boom" in caplog.text


def test_a_second_build_with_a_warm_timing_cache_times_nothing(tmp_path, caplog):
    cache = tmp_path / "timing.json"
    first = _build(save_timing_cache=cache)
    assert first.metadata["tuning"]["cache_misses"] > 0 and first.metadata["tuning"]["timed_tactics"] > 0
    with caplog.at_level(logging.INFO, logger="polykit"):
        second = _build(load_timing_cache=cache, error_on_timing_cache_miss=True)
    tuning = second.metadata["tuning"]
    assert tuning["timed_tactics"] == 0 and tuning["cache_misses"] == 0
    assert tuning["cache_hits"] == first.metadata["tuning"]["cache_misses"]
    assert "nothing timed" in caplog.text
    assert [l.tactic for l in second.layers] == [l.tactic for l in first.layers]
    assert second.serialize() == first.serialize()  # cache switches and the build report stay out of the bytes


def test_a_timing_cache_miss_is_an_error_when_asked(tmp_path):
    cache = tmp_path / "timing.json"
    _build(save_timing_cache=cache, builder_optimization_level=1)
    with pytest.raises(BuildError, match="timing cache has no time"):
        _build(load_timing_cache=cache, builder_optimization_level=5, error_on_timing_cache_miss=True)


def test_the_timing_cache_is_keyed_by_device_and_tactic_source(tmp_path, monkeypatch):
    cache = tmp_path / "timing.json"
    _build(save_timing_cache=cache)
    from polykit.runtime.cpu import CpuDevice, CpuTarget

    monkeypatch.setattr(CpuTarget, "device", lambda self: CpuDevice("another cpu", "x86_64", 4))
    again = _build(load_timing_cache=cache)
    assert again.metadata["tuning"]["cache_hits"] == 0 and again.metadata["tuning"]["timed_tactics"] > 0


def test_an_unreadable_timing_cache_is_a_usage_error_naming_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(UsageError, match="bad.json"):
        _build(load_timing_cache=bad)


def test_optimization_levels_outside_0_to_5_are_usage_errors():
    for level in (-1, 6, True, 2.5):
        with pytest.raises(UsageError, match="optimization level"):
            BuilderConfig(builder_optimization_level=level)


def test_thorough_cpu_timing_relaunches_every_candidate_without_failures(caplog):
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = _build(builder_optimization_level=5)
    assert "failed while timing" not in caplog.text
    assert plan.metadata["tuning"]["timed_tactics"] >= 7


def test_a_layer_no_candidate_of_which_can_be_timed_keeps_the_first(monkeypatch, caplog):
    monkeypatch.setattr(tuner_module, "time_candidates", lambda target, layer, pairs, *a: Measured(
        [float("inf")] * len(pairs), ["boom"] * len(pairs)))
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = _build()
    assert plan.layer("fc").tactic == "cpu.reference"
    assert "layer 'fc': no candidate could be timed; took cpu.reference" in caplog.text


def test_priority_orders_candidates_and_cost_estimates_order_those_of_one_priority():
    from polykit.compiler.builder.tuner import by_estimate
    from polykit.kernels.tactics import Tactic

    def tactic(name, cost, priority=0):
        return Tactic("cpu", "MatMul", name, priority=priority,
                      estimate_fn=None if cost is None else (lambda layer, sms: cost))

    pairs = [(None, tactic("a", None)), (None, tactic("b", 5.0)), (None, tactic("c", 2.0)), (None, tactic("d", None)),
             (None, tactic("plugin", None, priority=1000)), (None, tactic("e", 1.0, priority=-1))]
    assert [t.name for _, t in by_estimate(pairs, 132)] == ["plugin", "c", "b", "a", "d", "e"]


def test_sm90_tiles_predict_big_tiles_for_big_products_and_small_ones_for_small():
    from polykit.kernels.cuda.gemm.gemm_sm90 import TILES, predicted_us

    def best(M, N, K):
        return min(TILES, key=lambda t: predicted_us(t, M, N, K, 1, 132)).label

    assert best(4096, 4096, 4096) == "128x256"
    assert best(128, 768, 3072) == "64x64"


def test_build_progress_bar_shows_with_v_but_not_inside_another_progress_display(monkeypatch):
    made = []

    class Recorder:
        def __init__(self, *columns, **kwargs):
            made.append(kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def add_task(self, *args, **kwargs):
            return 0

        def update(self, *args, **kwargs):
            pass

    monkeypatch.setattr("rich.progress.Progress", Recorder)
    level = tuner_module.log.level
    tuner_module.log.setLevel(logging.INFO)
    try:
        with tuner_module.progress_bar(2, "building") as advance:
            advance("conv")
        assert len(made) == 1
        token = tuner_module.SHOW_BUILD_PROGRESS.set(False)
        try:
            with tuner_module.progress_bar(2, "building") as advance:
                advance("conv")
        finally:
            tuner_module.SHOW_BUILD_PROGRESS.reset(token)
        assert len(made) == 1
    finally:
        tuner_module.log.setLevel(level)


def test_a_layer_with_dynamic_dims_no_tactic_runs_names_its_dims(monkeypatch):
    """The refusal names each dynamic tensor of the layer with its dims (data symbols included) and
    says why no tactic serves it (it said "for dynamic shapes ()" when no tactic was even a candidate)."""
    from tests.compiler.test_data_dependent_dims import boxes_and_offsets

    found = tuner_module.candidates
    monkeypatch.setattr(tuner_module, "candidates",
                        lambda target, kind, layer, arch=None: [] if kind == "If" else found(target, kind, layer, arch=arch))
    with pytest.raises(BuildError) as info:
        build_plan(boxes_and_offsets(True), BuilderConfig(target="cpu"))
    what = info.value.what
    assert "no cpu tactic can run this If layer with dynamic dims" in what, what
    assert "kept_boxes (data(s_nz)[1], 4)" in what and "keep_if (data(keep_if)[0],)" in what, what
    assert what.endswith("no cpu tactic supports this layer's attributes at these shapes"), what


def test_tactic_families_strip_only_a_tile_word():
    from polykit.compiler.builder.tuner import family

    assert family("cuda.conv_nhwc.sm90_64x128x2") == family("cuda.conv_nhwc.sm90_128x128") == "cuda.conv_nhwc.sm90"
    assert family("cuda.conv_nhwc.skinny_128x32") == "cuda.conv_nhwc.skinny"
    assert family("cuda.gemm.sm90_128x128_sk2") == family("cuda.gemm.sm90_64x64") == "cuda.gemm.sm90"  # split-K: one kernel
    assert family("cuda.gemm.sm90_128x128_streamk") == "cuda.gemm.sm90_128x128_streamk"
    assert family("cuda.conv.igemm_simt_wide") == "cuda.conv.igemm_simt_wide"
    assert family("cuda.weight_only.m4") == "cuda.weight_only.m4"
    assert family("cpu.gemm") == "cpu.gemm"


def test_a_capped_level_also_times_the_best_of_each_family_the_cap_left_out():
    """Four tiles of one kernel ranked first by the estimate do not keep the other kernels untimed:
    the best of up to two left-out families is timed too, and nothing is dropped that the cap kept."""
    from types import SimpleNamespace

    from polykit.compiler.builder.tuner import EXTRA_FAMILIES, capped

    layer = SimpleNamespace(attrs={}, precision="fp16")
    names = ["k.skinny_64x16", "k.skinny_64x32", "k.skinny_128x16", "k.skinny_128x32", "k.skinny_128x64",
             "k.sm90_128x128", "k.sm90_64x64x2", "k.simt", "k.direct"]
    pairs = [(layer, SimpleNamespace(name=n)) for n in names]
    got = [t.name for _, t in capped(pairs, 4)]
    assert got == names[:4] + ["k.sm90_128x128", "k.simt"] and EXTRA_FAMILIES == 2
    assert [t.name for _, t in capped(pairs, None)] == names
    mixed = [pairs[5], pairs[0], pairs[7], pairs[8]]  # every family already inside the cap: nothing added
    assert capped(mixed, 4) == mixed


def test_a_capped_level_times_a_variant_beside_its_twin_when_its_twin_leads_its_family():
    """A variant (Tactic.variant_of: the same tile compiled another way) is timed after what the cap chose when its
    twin is the first of its family there, never in a slot of the cap or of a left-out family; level 0 and the
    uncapped level keep the order."""
    from types import SimpleNamespace

    from polykit.compiler.builder.tuner import capped

    layer = SimpleNamespace(attrs={}, precision="fp16")

    def t(name, twin=None):
        return SimpleNamespace(name=name, variant_of=twin)

    tactics = [t("k.sm90_128x192"), t("k.sm90_128x256"), t("k.sm90_rolled_128x192", "k.sm90_128x192"),
               t("k.sm90_rolled_128x256", "k.sm90_128x256"), t("k.sm90_128x128"), t("k.simt"), t("k.direct")]
    pairs = [(layer, x) for x in tactics]
    got = [x.name for _, x in capped(pairs, 2)]
    # the cap: two tiles of k.sm90; the one slot it spent on a family's second tile: k.simt (the next family that is
    # no variant's); then the variant of k.sm90's first tile only
    assert got == ["k.sm90_128x192", "k.sm90_128x256", "k.simt", "k.sm90_rolled_128x192"]
    assert capped(pairs, None) == pairs and capped(pairs, 0) == pairs
    alone = [pairs[1], pairs[2]]  # the variant's twin is not chosen: the variant is not timed
    assert [x.name for _, x in capped(alone, 1)] == ["k.sm90_128x256"]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_timing_inputs_are_non_zero_values_in_range_that_differ_between_draws(dtype):
    from polykit.compiler.builder.layer_timing import POOL_ELEMENTS, random_input
    from polykit.compiler.plan.records import TensorDesc

    rng = np.random.default_rng(3)
    for shape in [(3, 5), (2, POOL_ELEMENTS // 2 + 7), (1, 1, 1)]:
        desc = TensorDesc("x", dtype, shape, "input")
        a, b = random_input(desc, rng), random_input(desc, rng)
        assert a.shape == shape and a.dtype == desc.np_dtype and a.flags.writeable
        wide = a.astype(np.float64)
        assert wide.min() >= 0.5 and wide.max() <= 1.5
        if a.size > 1:
            assert not np.array_equal(a, b)  # replicas read different data
    again = random_input(TensorDesc("x", dtype, (3, 5), "input"), np.random.default_rng(3))
    first = random_input(TensorDesc("x", dtype, (3, 5), "input"), np.random.default_rng(3))
    assert np.array_equal(again.astype(np.float64), first.astype(np.float64))  # one seed, one draw
