"""The entropy calibrator's vectorized threshold search gives the candidate loop's threshold: on the
histograms calibration produces, on random families (dense, sparse, ReLU-like, heavy-tailed, empty,
one bin, the first 128 bins only) and on exact and last-ulp ties of the KL divergence."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder import calibrate as calibrate_module
from polykit.compiler.builder.calibrate import (HIST_BINS, QUANT_LEVELS, _candidate_kl, _entropy_threshold_loop,
                                                _kl_estimates, _outliers, calibrate, entropy_threshold)
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes.insert_qdq import constant_tensors, int8_candidates
from polykit.errors import UsageError

from .int8_models import convnet, feeds_for, mlp, small_resnet


def loop_threshold(hist, width=1.0):
    """The reference: the loop over every candidate, on the histogram with its first bin replaced."""
    h = np.asarray(hist, np.float64).copy()
    h[0] = h[1]
    return _entropy_threshold_loop(h) * width


def _of_abs(x, bins=HIST_BINS):
    a = np.abs(np.asarray(x, np.float64))
    return np.histogram(a, bins=bins, range=(0.0, float(a.max()) or 1.0))[0]


def random_histogram(family, seed):
    rng = np.random.default_rng(seed)
    if family == "dense":
        return _of_abs(rng.standard_normal(rng.integers(100_000, 400_000)))
    if family == "sparse":  # a few hundred samples over 2048 bins: mostly empty bins
        return _of_abs(rng.standard_normal(rng.integers(20, 600)))
    if family == "relu":  # |x| of ReLU outputs: half the samples exactly 0
        return _of_abs(np.maximum(rng.standard_normal(rng.integers(10_000, 300_000)), 0.0))
    if family == "heavy":  # Cauchy tails: the body in the first few bins, far outliers
        return _of_abs(rng.standard_cauchy(rng.integers(10_000, 200_000)))
    if family == "first128":
        hist = np.zeros(HIST_BINS, np.int64)
        hist[:QUANT_LEVELS] = rng.integers(0, rng.integers(2, 1000), QUANT_LEVELS)
        return hist
    if family == "one bin":
        hist = np.zeros(HIST_BINS, np.int64)
        hist[rng.integers(0, HIST_BINS)] = rng.integers(1, 10**6)
        return hist
    if family == "empty":
        return np.zeros(HIST_BINS, np.int64)
    raise AssertionError(family)


FAMILIES = ["dense", "sparse", "relu", "heavy", "first128", "one bin", "empty"]


def _loop_kls(hist):
    """Every candidate's KL as the loop computes it."""
    h = np.asarray(hist, np.float64).copy()
    h[0] = h[1]
    outliers = _outliers(h)
    return h, np.array([_candidate_kl(h, outliers, i) for i in range(QUANT_LEVELS, len(h) + 1)])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_vectorized_search_gives_the_loops_threshold_on_random_histograms(family):
    for seed in range(6 if family not in ("empty", "one bin") else 3):
        hist = random_histogram(family, seed)
        assert entropy_threshold(hist, 0.01) == loop_threshold(hist, 0.01), (family, seed)


def test_the_vectorized_search_gives_the_loops_threshold_on_the_histograms_calibration_makes(monkeypatch):
    seen = []

    def recording(hist, width):
        seen.append((hist.copy(), width))
        return entropy_threshold(hist, width)

    monkeypatch.setattr(calibrate_module, "entropy_threshold", recording)
    for model in (convnet(), mlp(), small_resnet()):
        graph = load_onnx(model)
        names = list(dict.fromkeys(x for _, x in int8_candidates(graph, constant_tensors(graph))))
        calibrate(graph, names, [feeds_for(model, seed) for seed in range(3)], "cpu", "entropy")
    assert len(seen) >= 6
    for hist, width in seen:
        assert entropy_threshold(hist, width) == loop_threshold(hist, width)


def clustered_histogram(seed):
    """Three neighbouring bins of 1-3 counts and up to three lone spikes: for runs of candidates the
    cluster shares one level and every spike has a level of its own, so P and Q, and the divergence,
    are the same across the run (0 without the cluster's unequal counts)."""
    rng = np.random.default_rng(seed)
    hist = np.zeros(HIST_BINS, np.int64)
    first = rng.integers(2, 1000)
    hist[first:first + 3] = rng.integers(1, 4, 3)
    hist[rng.integers(2, HIST_BINS, rng.integers(0, 4))] = rng.integers(1, 4)
    return hist


def test_ties_go_to_the_candidate_the_loop_picks():
    """Exact ties of the loop's floats (the largest i wins), and ties of the exact divergence that the
    loop's sums break a few ulp apart, where its pick is not the largest tied i."""
    exact_ties = ulp_ties = 0
    for seed in range(30):
        hist = clustered_histogram(seed)
        _, kls = _loop_kls(hist)
        least = np.flatnonzero(kls == kls.min())
        near = np.flatnonzero(np.abs(kls - kls.min()) <= 1e-13)
        exact_ties += int(len(least) > 1)
        ulp_ties += int(near[-1] != least[-1])
        assert entropy_threshold(hist, 1.0) == loop_threshold(hist, 1.0) == least[-1] + QUANT_LEVELS, seed
    assert exact_ties >= 10 and ulp_ties >= 1


def test_the_estimates_are_within_their_slack_of_the_loops_divergence():
    for family in ("dense", "sparse", "relu", "heavy", "first128"):
        for seed in range(3):
            h, kls = _loop_kls(random_histogram(family, 50 + seed))
            total = h.sum()
            prefix = np.concatenate([[0.0], np.cumsum(h)])
            filled = np.concatenate([[0], np.cumsum(h > 0)])
            hlogh = np.concatenate([[0.0], np.cumsum(h * np.log(np.where(h > 0, h, 1.0)))])
            estimate, slack = _kl_estimates(h, np.arange(QUANT_LEVELS, len(h) + 1), total, prefix, filled, hlogh)
            assert np.array_equal(np.isinf(estimate), np.isinf(kls))
            finite = np.isfinite(kls)
            assert np.all(np.abs(estimate[finite] - kls[finite]) <= slack[finite]), (family, seed)


def test_the_search_in_blocks_gives_the_same_threshold(monkeypatch):
    hists = [random_histogram(family, 7) for family in ("dense", "relu", "heavy")]
    whole = [entropy_threshold(h, 1.0) for h in hists]
    monkeypatch.setattr(calibrate_module, "_ENTROPY_BLOCK", 97)
    assert [entropy_threshold(h, 1.0) for h in hists] == whole == [loop_threshold(h) for h in hists]


def test_other_histogram_lengths_and_fractional_weights_give_the_loops_threshold():
    rng = np.random.default_rng(9)
    for bins in (2, 100, 128, 129, 300, 4099):
        hist = _of_abs(rng.laplace(0, 1, 50_000), bins)
        assert entropy_threshold(hist, 0.5) == loop_threshold(hist, 0.5), bins
    weights = np.abs(rng.standard_normal(HIST_BINS)) * 1e-3  # not counts: the loop itself decides
    assert entropy_threshold(weights, 1.0) == loop_threshold(weights)


@pytest.mark.parametrize("hist", [np.array([3.0, -1.0, 2.0]), np.array([1.0, np.nan, 2.0]), np.ones((2, 2048)),
                                  np.ones(1)])
def test_a_histogram_that_is_not_counts_is_a_usage_error(hist):
    with pytest.raises(UsageError, match="1-D histogram of at least 2 finite, non-negative counts"):
        entropy_threshold(hist, 1.0)
