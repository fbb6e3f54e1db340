"""GPU: weight streaming on the cuda target (polykit.runtime.cuda.weight_streaming). At budgets
from 0 to all-resident a plan built --weight-streaming computes bit for bit what the plan built
without the flag (same tactics) computes, eagerly, captured into a CUDA graph and replayed;
the scratch a context allocates is the engine's weight_streaming_scratch_memory_size; the
resident weights fit the budget; a refit reaches the streamed weights in pinned memory."""

from __future__ import annotations

import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Engine
from tests.compiler import refit_models
from tests.runtime.test_weight_streaming import MODELS

pytestmark = pytest.mark.gpu


def _plans(model_name: str, **options):
    model = MODELS[model_name]
    streaming = build_plan(model, BuilderConfig(target="cuda", weight_streaming=True, **options))
    tactics = {layer.name: layer.tactic for layer in streaming.layers}
    plain = build_plan(model, BuilderConfig(target="cuda", tactic_replay=tactics, **options))
    return streaming, plain, refit_models.feeds(model, seed=3)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[n].tobytes() == b[n].tobytes() for n in a)


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_outputs_at_every_budget_match_the_plan_without_streaming(model, fraction, cuda_graph):
    streaming, plain, feeds = _plans(model)
    with Engine(plain) as engine, engine.create_execution_context() as ctx:
        expected = ctx.execute(feeds)
    engine = Engine(streaming)
    budget = int(engine.streamable_weights_size * fraction)
    engine.set_weight_streaming_budget(budget)
    with engine.create_execution_context(cuda_graph=cuda_graph) as ctx:
        for _ in range(3):  # eager, then captured, then replayed
            assert _same(ctx.execute(feeds), expected)
        streamer = ctx._ctx._streamer
        assert (streamer.nbytes if streamer else 0) == engine.weight_streaming_scratch_memory_size
    resident = engine._target_engine.streamed.resident.nbytes
    assert resident - (engine._streaming.total_bytes - engine.streamable_weights_size) <= budget
    engine.close()


def test_an_fp16_transformer_whose_weights_are_four_times_the_budget_runs():
    streaming, plain, feeds = _plans("transformer", fp16=True)
    with Engine(plain) as engine, engine.create_execution_context() as ctx:
        expected = ctx.execute(feeds)
    with Engine(streaming) as engine:
        engine.set_weight_streaming_budget(engine.streamable_weights_size // 4)
        with engine.create_execution_context() as ctx:
            for _ in range(3):
                assert _same(ctx.execute(feeds), expected)


def test_a_refit_reaches_streamed_weights_in_pinned_memory():
    streaming, _, feeds = _plans("mlp")
    tactics = {layer.name: layer.tactic for layer in streaming.layers}
    new = build_plan(refit_models.mlp(1), BuilderConfig(target="cuda", tactic_replay=tactics))
    with Engine(new) as engine, engine.create_execution_context() as ctx:
        expected = ctx.execute(feeds)
    with Engine(streaming) as engine:
        engine.set_weight_streaming_budget(0)
        with engine.create_execution_context() as ctx:
            ctx.execute(feeds)
            ctx.execute(feeds)  # captured: the graph's copies read the pinned buffer the refit writes
            engine.refit_weights(new.weights)
            assert _same(ctx.execute(feeds), expected)


def test_the_automatic_budget_leaves_room_for_a_context():
    streaming, _, _ = _plans("conv")
    with Engine(streaming) as engine:
        budget = engine.weight_streaming_automatic_budget
        assert 0 <= budget <= engine.streamable_weights_size
        engine.set_weight_streaming_budget(budget)
        engine.create_execution_context().close()


def test_a_replaced_budget_frees_the_old_weights_and_runs():
    streaming, plain, feeds = _plans("transformer")
    with Engine(plain) as engine, engine.create_execution_context() as ctx:
        expected = ctx.execute(feeds)
    with Engine(streaming) as engine:
        for budget in (0, engine.streamable_weights_size, engine.streamable_weights_size // 3):
            engine.set_weight_streaming_budget(budget)
            with engine.create_execution_context() as ctx:
                assert _same(ctx.execute(feeds), expected)

