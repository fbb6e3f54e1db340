"""Weight streaming on the cpu target: a plan built --weight-streaming runs at every budget from 0
(every weight streams through the scratch ring) to all-resident with outputs bit-identical to the
plan built without the flag; the cpu target copies into an emulated device buffer, so the tests
exercise the real schedule (slots, evictions, reuse, weights spanning several slots)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.errors import PlanError, UsageError
from polykit.runtime.engine import Engine
from polykit.runtime.weight_streaming import RECORD_KEY, schedule_streaming
from tests.compiler import refit_models


def transformer_block(seed: int = 0) -> onnx.ModelProto:
    """LayerNorm, single-head attention, an MLP, and an output projection tied to the attention's
    (one weight read by two layers: the ring may reuse it)."""
    rng = np.random.default_rng(seed)
    d, f = 16, 64
    inits = {"ln.scale": rng.uniform(0.5, 1.5, d).astype(np.float32), "ln.bias": rng.standard_normal(d).astype(np.float32),
             "wq": rng.standard_normal((d, d)).astype(np.float32) * 0.3,
             "wk": rng.standard_normal((d, d)).astype(np.float32) * 0.3,
             "wv": rng.standard_normal((d, d)).astype(np.float32) * 0.3,
             "wo": rng.standard_normal((d, d)).astype(np.float32) * 0.3,
             "w1": rng.standard_normal((d, f)).astype(np.float32) * 0.2, "b1": rng.standard_normal(f).astype(np.float32),
             "w2": rng.standard_normal((f, d)).astype(np.float32) * 0.2}
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "ln.scale", "ln.bias"], ["ln"], name="ln", axis=-1),
             n("MatMul", ["ln", "wq"], ["q"], name="q"), n("MatMul", ["ln", "wk"], ["k"], name="k"),
             n("MatMul", ["ln", "wv"], ["v"], name="v"),
             n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
             n("MatMul", ["q", "kt"], ["s"], name="scores"), n("Softmax", ["s"], ["p"], name="softmax", axis=-1),
             n("MatMul", ["p", "v"], ["a"], name="attend"), n("MatMul", ["a", "wo"], ["o"], name="out_proj"),
             n("Add", ["x", "o"], ["r"], name="residual"),
             n("MatMul", ["r", "w1"], ["h"], name="fc1"), n("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
             n("Relu", ["hb"], ["g"], name="relu"), n("MatMul", ["g", "w2"], ["m"], name="fc2"),
             n("MatMul", ["m", "wo"], ["y"], name="tied_proj")]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, d])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


MODELS = {"mlp": refit_models.mlp(0), "conv": refit_models.conv_bn(0), "transformer": transformer_block()}


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return refit_models.feeds(model, seed=3)


@pytest.fixture(scope="module")
def built():
    """Each model's plan built with and without --weight-streaming, and the latter's outputs."""
    out = {}
    for name, model in MODELS.items():
        plain = build_plan(model, BuilderConfig(target="cpu", fuse=name != "transformer"))
        streaming = build_plan(model, BuilderConfig(target="cpu", fuse=name != "transformer", weight_streaming=True))
        with Engine(plain) as engine, engine.create_execution_context() as ctx:
            expected = ctx.execute(_feeds(model))
        out[name] = (streaming, expected)
    return out


def _run(plan: Plan, budget: int, feeds: dict[str, np.ndarray], runs: int = 2):
    """Outputs of `runs` runs of one context at `budget`, and the context's streamer."""
    engine = Engine(plan)
    engine.set_weight_streaming_budget(budget)
    with engine.create_execution_context() as ctx:
        outs = [ctx.execute(feeds) for _ in range(runs)]
        return outs, ctx._ctx.streamer, engine


def _budgets(engine: Engine) -> dict[str, int]:
    smallest = min(engine._streaming.sizes[n] for n in engine._streaming.streamable)
    total = engine.streamable_weights_size
    return {"zero": 0, "one_weight": smallest, "half": total // 2, "all": total}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("budget", ["zero", "one_weight", "half", "all"])
def test_outputs_at_every_budget_are_bit_identical_to_the_plan_without_streaming(built, model, budget):
    plan, expected = built[model]
    nbytes = _budgets(Engine(plan))[budget]
    outs, streamer, engine = _run(plan, nbytes, _feeds(MODELS[model]))
    for out in outs:  # the second run reuses the slots the first one filled
        assert out.keys() == expected.keys()
        for name in expected:
            assert out[name].tobytes() == expected[name].tobytes(), name
    assert (streamer is None) == (budget == "all")
    assert engine._streaming.resident_bytes() - (engine._streaming.total_bytes - engine.streamable_weights_size) \
        <= nbytes


def test_a_model_whose_weights_are_four_times_the_budget_runs(built):
    plan, expected = built["transformer"]
    budget = Engine(plan).streamable_weights_size // 4
    outs, streamer, engine = _run(plan, budget, _feeds(MODELS["transformer"]))
    assert engine._streaming.resident_bytes() <= budget
    assert engine._streaming.resident_bytes() + streamer.nbytes < engine._streaming.total_bytes
    assert outs[0]["y"].tobytes() == expected["y"].tobytes()


@pytest.mark.parametrize("model", sorted(MODELS))
def test_scratch_memory_size_is_what_a_context_allocates_and_every_copy_fits_in_it(built, model):
    plan, _ = built[model]
    engine = Engine(plan)
    for budget in _budgets(engine).values():
        engine.set_weight_streaming_budget(budget)
        with engine.create_execution_context() as ctx:
            streamer = ctx._ctx.streamer
            allocated = 0 if streamer is None else streamer.nbytes
            assert engine.weight_streaming_scratch_memory_size == allocated
            if streamer is not None:
                assert allocated % streamer.schedule.slot_bytes == 0
                assert all(c.offset + c.nbytes <= allocated for c in streamer.schedule.copies)


def test_the_ring_evicts_reuses_and_spans_slots_at_budget_zero(built):
    plan, _ = built["transformer"]
    engine = Engine(plan)
    engine.set_weight_streaming_budget(0)
    schedule = engine._streaming.schedule()
    assert any(c.nbytes > schedule.slot_bytes for c in schedule.copies)  # a weight larger than one slot
    assert any(c.after >= 0 for c in schedule.copies)  # a copy that overwrites slots a finished layer read
    offsets = [c.offset for c in schedule.copies]
    assert len(set(offsets)) < len(offsets)  # slots reused within one run
    for copy in schedule.copies:  # never issued before the layer that last read the slots' old contents
        assert copy.after < copy.issue <= copy.layer


def test_a_tied_weight_still_in_the_ring_is_not_copied_again():
    sizes = {"a": 1024, "b": 256, "c": 256}
    reads = [["a", "b"], ["c"], ["a"]]
    roomy = schedule_streaming(reads, sizes, (), 0)
    assert [c.name for c in roomy.copies] == ["a", "b", "c"]  # "a" stays loaded for layer 2
    assert roomy.waits == (1, 2, 0)


def test_a_copy_issued_too_early_changes_the_outputs(built):
    """The emulation is strict: move the first copy that waits for a layer to before that layer and
    a weight a layer still reads is overwritten (the check the schedule's `after` exists for)."""
    plan, expected = built["transformer"]
    engine = Engine(plan)
    engine.set_weight_streaming_budget(0)
    schedule = engine._streaming.schedule()
    k, early = next((k, c) for k, c in enumerate(schedule.copies) if c.after >= 0)
    copies = list(schedule.copies)
    copies[k] = dataclasses.replace(early, issue=early.after)
    engine._streaming._schedule = dataclasses.replace(schedule, copies=tuple(copies))
    engine._apply_streaming()
    with engine.create_execution_context() as ctx:
        assert ctx.execute(_feeds(MODELS["transformer"]))["y"].tobytes() != expected["y"].tobytes()


def test_a_plan_built_without_the_flag_refuses_a_budget_below_its_weights():
    engine = Engine(build_plan(MODELS["mlp"], BuilderConfig(target="cpu")))
    total = sum(-(-w.nbytes // 256) * 256 for w in engine.plan.weights.values())
    assert engine.streamable_weights_size == 0
    with pytest.raises(UsageError, match=f"built without --weight-streaming: all its {total} weight bytes"):
        engine.set_weight_streaming_budget(total - 1)
    engine.set_weight_streaming_budget(total)
    assert engine.get_weight_streaming_budget() == total
    assert engine.weight_streaming_scratch_memory_size == 0


def test_the_budget_is_set_before_contexts_are_created(built):
    plan, _ = built["mlp"]
    engine = Engine(plan)
    assert engine.get_weight_streaming_budget() == engine.streamable_weights_size  # all resident by default
    ctx = engine.create_execution_context()
    with pytest.raises(UsageError, match="before creating execution contexts"):
        engine.set_weight_streaming_budget(0)
    ctx.close()
    engine.weight_streaming_budget_v2 = 0
    assert engine.get_weight_streaming_budget() == 0
    with pytest.raises(UsageError, match="byte count >= 0"):
        engine.set_weight_streaming_budget(-1)


def test_the_record_survives_a_save_and_a_record_that_leaves_out_a_weight_is_refused(built):
    plan, expected = built["mlp"]
    loaded = Plan.deserialize(plan.serialize())
    assert loaded.metadata[RECORD_KEY] == plan.metadata[RECORD_KEY]
    outs, _, _ = _run(loaded, 0, _feeds(MODELS["mlp"]), runs=1)
    assert outs[0]["y"].tobytes() == expected["y"].tobytes()
    loaded.metadata[RECORD_KEY] = {"format": 1, "layers": [[] for _ in loaded.layers]}
    with pytest.raises(PlanError, match="does not match the weights its layers read"):
        Engine(loaded)


def test_a_refit_reaches_streamed_weights(built):
    plan, _ = built["mlp"]
    new = build_plan(refit_models.mlp(1), BuilderConfig(target="cpu"))
    with Engine(new) as engine, engine.create_execution_context() as ctx:
        want = ctx.execute(_feeds(MODELS["mlp"]))["y"]
    engine = Engine(Plan.deserialize(plan.serialize()))
    engine.set_weight_streaming_budget(0)
    engine.refit_weights(new.weights)
    with engine.create_execution_context() as ctx:
        assert ctx.execute(_feeds(MODELS["mlp"]))["y"].tobytes() == want.tobytes()


def test_the_flag_is_recorded_in_the_builder_config_only_when_set():
    assert "weight_streaming" not in BuilderConfig(target="cpu").to_json()  # other plans' bytes unchanged
    config = BuilderConfig(target="cpu", weight_streaming=True)
    assert BuilderConfig.from_json(config.to_json()) == config
