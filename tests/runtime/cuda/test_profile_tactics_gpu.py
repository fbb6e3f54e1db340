"""GPU: a cuda plan of the tiny dynamic BERT built for two optimization profiles (small and large
batches) times its tactics per profile and matches onnxruntime on both, each context running
its own profile's tactics, eagerly and from CUDA graphs captured per shape set."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.profiles import Profile
from polykit.runtime.engine import Runtime
from tests.dynamic_models import tiny_bert
from tests.runtime.test_dynamic_shapes import _bert_feeds

pytestmark = pytest.mark.gpu

SMALL = ((1, 16), (1, 128), (2, 128))
LARGE = ((4, 64), (8, 256), (8, 512))
PROFILES = [Profile({"input_ids": r, "attention_mask": r}) for r in (SMALL, LARGE)]
#: (batch, seq) run on each profile: its corners and shapes between them
SHAPES = {0: [(1, 16), (1, 128), (2, 128), (2, 77)], 1: [(4, 64), (8, 256), (8, 512), (5, 200)]}


@pytest.fixture(scope="module")
def built():
    model = tiny_bert()
    plan = build_plan(model, BuilderConfig(target="cuda", profiles=PROFILES))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return Plan.deserialize(plan.serialize()), session


def _check(ctx, session, profile, dims, rng, differing):
    feeds = _bert_feeds(rng, *dims)
    got = ctx.execute(feeds)
    expected = session.run(None, feeds)
    for (name, value), want in zip(got.items(), expected):
        assert value.shape == want.shape, (profile, dims, name)
        np.testing.assert_allclose(value, want, rtol=1e-3, atol=1e-3, err_msg=(
            f"output {name!r} at batch x seq {dims} on optimization profile {profile}; layers with per-profile "
            f"tactics: {differing}"))


def test_each_profile_runs_its_own_tactics_and_matches_onnxruntime(built):
    plan, session = built
    differing = {l.name: l.profile_tactics for l in plan.layers if l.profile_tactics}
    rng = np.random.default_rng(5)
    with Runtime().deserialize_engine(plan) as engine:
        for profile in (0, 1):
            names = [l.tactic for l in engine.profile_layers[profile]]
            assert names == [l.profile_tactics[profile] if l.profile_tactics else l.tactic for l in plan.layers]
            with engine.create_execution_context() as ctx:
                ctx.set_optimization_profile(profile)
                for _ in range(3):  # eager, captured, replayed
                    for dims in SHAPES[profile]:
                        _check(ctx, session, profile, dims, rng, differing)


def test_one_context_switching_profiles_replays_each_profiles_graph(built):
    plan, session = built
    differing = {l.name: l.profile_tactics for l in plan.layers if l.profile_tactics}
    rng = np.random.default_rng(6)
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        for _ in range(3):
            for profile in (0, 1, 0):
                ctx.set_optimization_profile(profile)
                _check(ctx, session, profile, (2, 64) if profile == 0 else (4, 64), rng, differing)


def test_a_split_reduction_runs_every_shape_of_a_profile_whose_short_corner_does_not_split():
    """GPU: the column mean of tests/compiler/test_profiles.py's profile (split at opt, too short to
    split at min) takes cuda.reduce.span.split and matches onnxruntime at min, opt, max and between
    (where no split helps its enqueue runs the span kernel), eagerly and replayed."""
    from tests.compiler.test_profiles import _column_mean_model

    model = _column_mean_model()
    profile = Profile({"x": ((1, 256, 32), (2, 4096, 32), (4, 8192, 32))})
    plan = build_plan(model, BuilderConfig(target="cuda", builder_optimization_level=0, profiles=[profile]))
    assert next(l for l in plan.layers if l.kind == "ReduceMean").tactic == "cuda.reduce.span.split"
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        for _ in range(2):
            for n, length in ((1, 256), (2, 4096), (4, 8192), (3, 300), (1, 5000)):
                x = rng.standard_normal((n, length, 32)).astype(np.float32)
                np.testing.assert_allclose(ctx.execute({"x": x})["y"], session.run(None, {"x": x})[0],
                                           rtol=1e-4, atol=1e-5)
