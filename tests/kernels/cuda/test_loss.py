"""Loss tactics: declared kernels, and on the GPU every reduction / weight / ignore_index form
against the reference (outputs poisoned)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.models import loss

rng = np.random.default_rng(52)


def loss_layer(op, weighted, n_out=1, **attrs):
    inputs = ("X", "T", "W") if weighted else ("X", "T")
    return LayerDesc("loss", op, inputs, ("L", "P")[:n_out], dict(attrs))


def feeds(shape, n_classes, weighted, dtype=np.float32, ignore=None):
    x = rng.standard_normal((shape[0], n_classes, *shape[1:])).astype(dtype)
    t = rng.integers(0, n_classes, shape).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::4] = ignore
    out = {"X": x, "T": t}
    if weighted:
        out["W"] = rng.uniform(0.5, 2.0, n_classes).astype(dtype)
    return out


def check(layer, inputs, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, **(tol or {"rtol": 1e-5, "atol": 1e-5}))


def test_sce_borrows_scratch_log_probabilities_only_without_a_log_prob_output():
    from polykit.compiler.plan.records import TensorDesc

    tensors = {"X": TensorDesc("X", "float32", (4, 10, 3), "activation")}
    assert loss._sce_workspace(loss_layer("SoftmaxCrossEntropyLoss", False), tensors, 1) == 4 * 10 * 3 * 4
    assert loss._sce_workspace(loss_layer("SoftmaxCrossEntropyLoss", False, n_out=2), tensors, 1) == 0


def test_loss_kernels_are_one_module():
    assert len({k.key() for k in loss.compile_variants()}) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("op,n_out", [("NegativeLogLikelihoodLoss", 1), ("SoftmaxCrossEntropyLoss", 1),
                                      ("SoftmaxCrossEntropyLoss", 2)])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 3, -1])
def test_loss_float32_matches_reference(op, n_out, reduction, weighted, ignore):
    attrs = {"reduction": reduction, **({} if ignore is None else {"ignore_index": ignore})}
    check(loss_layer(op, weighted, n_out, **attrs), feeds((3, 5, 2), 7, weighted, ignore=ignore))


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_large_mean_loss_with_int32_targets(op):
    inputs = feeds((64, 300), 33, True)
    inputs["T"] = inputs["T"].astype(np.int32)
    check(loss_layer(op, True, reduction="mean"), inputs, rel=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(np.float64, {"rtol": 1e-12, "atol": 1e-12}), (np.float16, {"rel": 3e-3})])
def test_sce_float64_and_float16(dtype, tol):
    check(loss_layer("SoftmaxCrossEntropyLoss", True, 2, reduction="sum"), feeds((4, 6), 10, True, dtype), **tol)
