"""NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss reference kernels against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import RuntimeInputError

from .oracle import ort_run, ours

RNG = np.random.default_rng(15)


def _case(shape, n_classes=5, ignore=None):
    x = RNG.standard_normal((shape[0], n_classes, *shape[1:])).astype(np.float32)
    t = RNG.integers(0, n_classes, shape).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return x, t


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 2, -1])
def test_loss_matches_onnxruntime(op, reduction, weighted, ignore):
    x, t = _case((3, 4, 2), ignore=ignore)
    w = RNG.uniform(0.5, 2.0, 5).astype(np.float32) if weighted else None
    attrs = {"reduction": reduction, **({} if ignore is None else {"ignore_index": ignore})}
    n_out = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    got, want = ours(op, [x, t, w], attrs, n_out=n_out), ort_run(op, [x, t, w], attrs, opset=13, n_out=n_out)
    for g, e in zip(got, want):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_sce_of_a_2d_batch_with_int32_targets_matches_onnxruntime():
    x, t = _case((6,), n_classes=9)
    (got,), (want,) = ours("SoftmaxCrossEntropyLoss", [x, t.astype(np.int32)]), \
        ort_run("SoftmaxCrossEntropyLoss", [x, t.astype(np.int32)], opset=13)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_float64_loss_keeps_its_dtype_and_all_ignored_mean_is_nan():
    x, t = _case((4,))
    t[:] = 1
    (loss,) = ours("NegativeLogLikelihoodLoss", [x.astype(np.float64), t], {"ignore_index": 1})
    assert loss.dtype == np.float64 and loss.shape == () and np.isnan(loss)


def test_target_outside_the_classes_is_a_runtime_input_error():
    x, t = _case((2, 3))
    t[1, 2] = 7
    with pytest.raises(RuntimeInputError, match="outside"):
        ours("NegativeLogLikelihoodLoss", [x, t])
