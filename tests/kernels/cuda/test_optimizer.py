"""Optimizer tactics: on the GPU against the reference (poisoned outputs)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ops.models.optimizer import TRAINING_DOMAIN
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.models import optimizer

rng = np.random.default_rng(65)


def test_constants_follow_onnx_defaults():
    layer = LayerDesc("a", "Adam", ("r", "t", "x", "g", "v", "h"), ("x1", "v1", "h1"), {}, TRAINING_DOMAIN)
    assert optimizer._constants(layer) == (1, [0.0, 1e-6, 0.9, 0.999, 0.0])


@pytest.mark.gpu
@pytest.mark.parametrize("op,groups,outs,attrs", [
    ("Adagrad", "XGH", "XH", {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.001}),
    ("Adam", "XGVH", "XVH", {"alpha": 0.9, "beta": 0.8, "norm_coefficient_post": 0.02}),
    ("Momentum", "XGV", "XV", {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.01}),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_optimizer_matches_reference(op, groups, outs, attrs, dtype):
    from polykit.runtime.cuda.harness import assert_matches_reference

    n = 2
    names = ["r", "t"] + [f"{g}{i}" for g in groups for i in range(n)]
    feeds = {"r": np.array(0.1, np.float32), "t": np.array(2, np.int64)}
    feeds.update({nm: np.abs(rng.standard_normal((5, 7))).astype(dtype) for nm in names[2:]})
    layer = LayerDesc("o", op, tuple(names), tuple(f"{g}{i}_new" for g in outs for i in range(n)), attrs,
                      TRAINING_DOMAIN)
    assert_matches_reference(layer, feeds, rtol=1e-6, atol=1e-6)
