"""Engine.refit_weights: new weight values in place, seen by every context of the engine (cpu
target); a name that is not a weight, or another dtype or shape, is refused and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import UsageError
from polykit.runtime.engine import Engine
from tests.compiler import refit_models as models


@pytest.fixture
def engine():
    return Engine(build_plan(models.mlp(0), BuilderConfig(target="cpu")))


def test_new_weight_values_reach_contexts_made_before_and_after(engine):
    feeds = models.feeds(models.mlp(0))
    early = engine.create_execution_context()
    weight = engine.plan.weights["fc1.weight"]
    engine.refit_weights({"fc1.weight": np.zeros_like(weight)})
    late = engine.create_execution_context()
    # fc1 computes its bias alone: y = relu(fc1.bias) @ fc2.weight + fc2's bias, the same for every row
    for ctx in (early, late):
        y = ctx.execute(feeds)["y"]
        assert np.array_equal(y, np.broadcast_to(y[0], y.shape))
        ctx.close()


@pytest.mark.parametrize("name, array, message", [
    ("x", np.zeros((4, 16), np.float32), "no weight 'x'"),
    ("fc1.weight", np.zeros((16, 32), np.float32), r"'fc1.weight' is float32\[16, 32\], the plan holds float32\[32, 16\]"),
    ("fc1.weight", np.zeros((32, 16), np.float16), r"'fc1.weight' is float16\[32, 16\]"),
])
def test_a_name_that_is_not_a_weight_or_another_dtype_or_shape_is_refused(engine, name, array, message):
    before = {n: w.tobytes() for n, w in engine.plan.weights.items()}
    with pytest.raises(UsageError, match=message):
        engine.refit_weights({"fc1.bias": np.zeros(32, np.float32), name: array})
    assert {n: w.tobytes() for n, w in engine.plan.weights.items()} == before
