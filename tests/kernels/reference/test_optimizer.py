"""Adagrad / Adam / Momentum reference kernels against ONNX's reference implementation."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.models.optimizer import TRAINING_DOMAIN
from polykit.compiler.ops.references import run_reference

RNG = np.random.default_rng(22)

CASES = [
    ("Adagrad", "XGH", 2, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.001}),
    ("Adam", "XGVH", 2, {"alpha": 0.9, "beta": 0.8, "epsilon": 1e-3, "norm_coefficient": 0.01,
                         "norm_coefficient_post": 0.02}),
    ("Momentum", "XGV", 1, {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.01}),
    ("Momentum", "XGV", 2, {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.01}),
]
OUTS = {"Adagrad": "XH", "Adam": "XVH", "Momentum": "XV"}


@pytest.mark.parametrize("op,groups,n,attrs", CASES)
@pytest.mark.parametrize("step", [0, 3])
def test_optimizer_matches_the_onnx_reference(op, groups, n, attrs, step):
    states = [np.abs(RNG.standard_normal((3, 4))).astype(np.float32) for _ in range(n * len(groups))]
    inputs = [np.array(0.1, np.float32), np.array(step, np.int64), *states]
    names = [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(n * len(OUTS[op]))]
    node = helper.make_node(op, names, outs, domain=TRAINING_DOMAIN, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(nm, 1 if v.dtype == np.float32 else 7, v.shape)
                                            for nm, v in zip(names, inputs)], [onnx.ValueInfoProto(name=o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(TRAINING_DOMAIN, 1)])
    want = ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))
    got = run_reference(Node(op, names, outs, attrs, "opt", TRAINING_DOMAIN), inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
