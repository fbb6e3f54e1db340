"""INT8 calibrators: the entropy threshold against an independent computation, minmax,
percentile, determinism, and the calibration data sources."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polykit.compiler.builder.calibrate import (CALIBRATORS, HIST_BINS, calibrate, calibration_batches, entropy_threshold,
                                        percentile_threshold)
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes.insert_qdq import constant_tensors, int8_candidates
from polykit.errors import DataFileError, UsageError

from .int8_models import convnet, feeds_for


def independent_entropy_threshold(hist, width):
    """TensorRT's entropy calibration written out from its description, one bin at a time."""
    h = [float(c) for c in hist]
    h[0] = h[1]  # the zero spike of ReLU outputs takes the next bin's count
    best_i, best_kl = None, math.inf
    for i in range(128, len(h) + 1):
        p = h[:i]
        p[i - 1] += sum(h[i:])  # outliers fold into the last kept bin
        levels = [[] for _ in range(128)]  # quantize the i kept bins (without outliers) to 128 levels
        for b in range(i):
            levels[b * 128 // i].append(b)
        q = [0.0] * i
        for members in levels:  # expand back: each level's count spread over its non-empty bins
            nonempty = [b for b in members if h[b] > 0]
            for b in nonempty:
                q[b] = sum(h[m] for m in members) / len(nonempty)
        p_total, q_total = sum(p), sum(q)
        kl = 0.0
        for pb, qb in zip(p, q):
            if pb > 0:
                if qb == 0:
                    kl = math.inf
                    break
                kl += pb / p_total * math.log((pb / p_total) / (qb / q_total))
        if kl <= best_kl:
            best_i, best_kl = i, kl
    return best_i * width


def synthetic_histogram(seed=0):
    """|x| of a Laplace distribution with a few far outliers, and ReLU-like exact zeros."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.laplace(0, 1.0, 200_000), rng.uniform(20, 40, 30), np.zeros(50_000)])
    amax = float(np.abs(x).max())
    hist, _ = np.histogram(np.abs(x), bins=HIST_BINS, range=(0, amax))
    return hist, amax / HIST_BINS


def test_entropy_threshold_equals_an_independent_computation():
    hist, width = synthetic_histogram()
    got = entropy_threshold(hist, width)
    assert got == pytest.approx(independent_entropy_threshold(hist, width), rel=0, abs=1e-12)
    assert 3.0 < got < 20.0  # clips the outliers, keeps the Laplace body


def test_entropy_keeps_everything_when_nothing_is_an_outlier():
    hist = np.full(HIST_BINS, 100)  # uniform on [0, 1]: every candidate but the full range loses mass
    assert entropy_threshold(hist, 1.0 / HIST_BINS) == pytest.approx(1.0)


def test_percentile_threshold_is_the_edge_of_the_bin_reaching_the_share():
    hist = np.zeros(HIST_BINS)
    hist[:10] = 1000
    hist[2000] = 1  # 1 in 10001
    width = 0.01
    assert percentile_threshold(hist, width, 99.99) == pytest.approx(10 * width)
    assert percentile_threshold(hist, width, 100.0) == pytest.approx(2001 * width)
    assert percentile_threshold(hist, width, 49.99) == pytest.approx(5 * width)  # 4999.5 of 10001: bin 4


def _graph_and_names():
    graph = load_onnx(convnet())
    return graph, list(dict.fromkeys(x for _, x in int8_candidates(graph, constant_tensors(graph))))


@pytest.mark.parametrize("calibrator", sorted(CALIBRATORS))
def test_calibrators_are_deterministic(calibrator):
    graph, names = _graph_and_names()
    batches = [feeds_for(convnet(), seed) for seed in range(3)]
    first = calibrate(graph, names, batches, "cpu", calibrator)
    again = calibrate(graph, names, [dict(b) for b in batches], "cpu", calibrator)
    assert first == again and set(first) == set(names) == {"x", "r1", "f"}
    assert all(s > 0 for s in first.values())


def test_minmax_scale_is_max_abs_over_127_and_others_clip_below_it():
    graph, names = _graph_and_names()
    batches = [feeds_for(convnet(), seed) for seed in range(3)]
    minmax = calibrate(graph, names, batches, "cpu", "minmax")
    amax = max(float(np.abs(b["x"]).max()) for b in batches)
    assert minmax["x"] == pytest.approx(amax / 127, rel=1e-6)
    for calibrator in ("entropy", "percentile"):
        scales = calibrate(graph, names, batches, "cpu", calibrator)
        assert all(scales[n] <= minmax[n] * (1 + 1e-6) for n in names)
    lower = calibrate(graph, names, batches, "cpu", "percentile", percentile=90.0)
    assert lower["x"] < minmax["x"]


def test_calibration_reads_a_folder_of_npz_batches(tmp_path):
    graph, names = _graph_and_names()
    batches = [feeds_for(convnet(), seed) for seed in range(3)]
    for k, feeds in enumerate(batches):
        np.savez(tmp_path / f"batch{k}.npz", **feeds)
    assert calibrate(graph, names, str(tmp_path), "cpu", "entropy") == calibrate(graph, names, batches, "cpu", "entropy")


def test_calibration_data_errors_name_the_problem(tmp_path):
    with pytest.raises(UsageError, match="needs data"):
        calibration_batches(None)
    with pytest.raises(UsageError, match="iterable twice"):
        calibration_batches(iter([{}]))
    with pytest.raises(DataFileError, match="no .npz"):
        calibration_batches(str(tmp_path))
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    graph, names = _graph_and_names()
    with pytest.raises(DataFileError, match="not an .npz"):
        calibrate(graph, names, str(tmp_path), "cpu", "minmax")
    with pytest.raises(UsageError, match="no batch"):
        calibrate(graph, names, [], "cpu", "minmax")


def _old_amax_and_hist(xs):
    """The statistics as the filtered copies give them (|x| of the finite elements only): the
    reference for the in-place fast paths."""
    amax = 0.0
    for x in xs:
        a = np.abs(x.ravel())
        a = a[np.isfinite(a)]
        if a.size:
            amax = max(amax, float(a.max()))
    hist = np.zeros(HIST_BINS, np.int64)
    for x in xs:
        a = np.abs(x.ravel())
        a = a[np.isfinite(a)]
        if amax > 0 and a.size:
            hist += np.histogram(np.minimum(a, amax), bins=HIST_BINS, range=(0.0, amax))[0]
    return amax, hist


@pytest.mark.parametrize("poison", ["none", "nan", "inf", "-inf", "all-nan", "zeros", "empty"])
def test_the_in_place_statistics_equal_the_filtered_copies(poison):
    from polykit.compiler.builder.calibrate import _Stats, _update_amax, _update_hist

    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((3, 7, 11)).astype(np.float32) * s for s in (1.0, 4.0, 0.5)]
    if poison == "all-nan":
        xs[1][...] = np.nan
    elif poison == "zeros":
        xs = [np.zeros_like(x) for x in xs] + [-np.zeros_like(xs[0])]
    elif poison == "empty":
        xs.append(np.zeros((0, 4), np.float32))
    elif poison != "none":
        xs[1][0, 3, 5] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[poison]
        xs[2][2, 0, 1] = -xs[1][0, 3, 5] if poison != "nan" else np.nan
    stats = _Stats({"t": 0.0})
    for x in xs:
        _update_amax(stats, "t", x.copy())
    stats.hist = {"t": np.zeros(HIST_BINS, np.int64)}
    for x in xs:
        _update_hist(stats, "t", x.copy())
    amax, hist = _old_amax_and_hist(xs)
    assert stats.amax["t"] == amax and np.array_equal(stats.hist["t"], hist)


@pytest.mark.parametrize("calibrator", ["entropy", "percentile"])
def test_the_scales_do_not_depend_on_the_statistics_threads(monkeypatch, calibrator):
    from polykit.compiler.builder import calibrate as calibrate_module

    graph, names = _graph_and_names()
    batches = [feeds_for(convnet(), seed) for seed in range(3)]
    monkeypatch.setattr(calibrate_module, "_workers", lambda: 1)
    one = calibrate(graph, names, batches, "cpu", calibrator)
    monkeypatch.setattr(calibrate_module, "_workers", lambda: 4)
    assert calibrate(graph, names, batches, "cpu", calibrator) == one
