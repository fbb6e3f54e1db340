"""INT8 calibration: activation thresholds from representative data (TensorRT's calibrators).

The fp32 engine of the graph *before fusion* runs over the data (`calibration_engine`: a plan
built with fusion off and every calibrated tensor marked as an output, so the names are the
model's own and a cache stays valid across builds), on the build's target. A build with
optimization profiles calibrates at its calibration profile (BuilderConfig.calibration_profile,
else its last profile, as Polygraphy sets TensorRT's setCalibrationProfile): the calibration engine serves that
profile, so each batch runs at its own shape inside it, and the one scale set serves every
profile of the plan. Memory stays
bounded: the first pass keeps each tensor's max |x|, the second (entropy and percentile) a
histogram of |x| in HIST_BINS bins over [0, max |x|]; no activation is stored.

Calibrators (CALIBRATORS; a threshold t gives the symmetric int8 scale t / 127):

  minmax      t = max |x|
  percentile  t = the upper edge of the first bin where the cumulative share of |x| reaches
              `percentile` percent
  entropy     TensorRT's, as NVIDIA's pytorch-quantization writes it: the first bin (where
              ReLU's zeros land) takes the second's count; then for each candidate i = 128 ..
              2048 kept bins, P = the first i bins with the outliers (every count beyond) added
              to the last kept bin; Q = the first i bins (outliers not folded) merged into 128
              levels (bin b in level b * 128 // i), each level's count spread evenly over the
              bins of its level that are non-zero, expanded back to i bins; KL(P || Q) of the
              normalized P and Q (infinite where Q is 0 and P is not). t = i * bin width for
              the largest i of least divergence.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from polykit.errors import DataFileError, RuntimeInputError, UsageError
from polykit.npy_io import open_npz

log = logging.getLogger("polykit")

HIST_BINS = 2048
QUANT_LEVELS = 128
QMAX = 127


def entropy_threshold(hist: np.ndarray, bin_width: float) -> float:
    """TensorRT's entropy threshold of a |x| histogram (module docstring): all candidates at once.

    Counts (whole numbers, np.histogram's, summing below 2**53) take the vectorized path; other
    non-negative weights take the candidate loop (`_entropy_threshold_loop`). Both give the same i."""
    hist = np.asarray(hist, np.float64)
    if hist.ndim != 1 or len(hist) < 2 or not np.all(np.isfinite(hist)) or np.any(hist < 0):
        raise UsageError(f"the entropy calibrator takes a 1-D histogram of at least 2 finite, non-negative "
                         f"counts; got shape {hist.shape}", hint="pass |x| bin counts (numpy.histogram's)")
    hist = hist.copy()
    hist[0] = hist[1]  # ReLU's zeros would weigh on every candidate alike
    total = float(hist.sum())
    if len(hist) <= QUANT_LEVELS or total == 0 or total >= 2.0**53 or np.any(hist != np.floor(hist)):
        return _entropy_threshold_loop(hist) * bin_width
    return _entropy_shortlist_winner(hist, total) * bin_width


def _entropy_threshold_loop(hist: np.ndarray) -> int:
    """The candidate loop: the largest i of least KL(P || Q) over i = QUANT_LEVELS .. len(hist)
    (hist with its first bin already replaced)."""
    outliers = _outliers(hist)
    best, best_kl = len(hist), np.inf
    for i in range(QUANT_LEVELS, len(hist) + 1):
        kl = _candidate_kl(hist, outliers, i)
        if kl <= best_kl:
            best, best_kl = i, kl
    return best


def _outliers(hist: np.ndarray) -> np.ndarray:
    return np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # outliers[i] = sum(hist[i:])


def _candidate_kl(hist: np.ndarray, outliers: np.ndarray, i: int) -> float:
    """KL(P || Q) of candidate i, as the loop computes it (the result the threshold is chosen by)."""
    sliced = hist[:i]
    p = sliced.copy()
    p[-1] += outliers[i]
    level = np.arange(i) * QUANT_LEVELS // i
    nonzero = sliced > 0
    level_sum = np.bincount(level, weights=sliced, minlength=QUANT_LEVELS)
    level_nonzero = np.bincount(level, weights=nonzero, minlength=QUANT_LEVELS)
    q = np.where(nonzero, level_sum[level] / np.maximum(level_nonzero[level], 1), 0.0)
    return _kl_divergence(p, q)


def _kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    p_total, q_total = p.sum(), q.sum()
    if p_total == 0:
        return 0.0
    mask = p > 0
    if q_total == 0 or np.any(q[mask] == 0):
        return np.inf
    pn, qn = p[mask] / p_total, q[mask] / q_total
    return float(np.sum(pn * np.log(pn / qn)))


# Candidates per block of the vectorized search: a (block, QUANT_LEVELS + 1) int64 matrix is ~4 MB,
# and the block's temporaries stay under ~40 MB whatever the histogram's length.
_ENTROPY_BLOCK = 4096


def _entropy_shortlist_winner(hist: np.ndarray, total: float) -> int:
    """The loop's i, from a vectorized estimate of every candidate's KL and the loop's own KL on the
    few that can win.

    For counts, every sum below is of whole numbers under 2**53 and so exact: P's total is `total`
    for every i, Q's is the first i counts' sum C_i, and a level's count and non-empty bins are
    differences of prefix sums. With T = total, p_last = h[i-1] + outliers[i] and L, n the counts
    and non-empty bins of the 128 levels,

        KL_i = (sum_{b<i-1} h_b log h_b + p_last log p_last - sum_l L_l log(L_l / n_l)
                - outliers[i] log(L_127 / n_127)) / T + log(C_i / T),

    128 levels a candidate instead of i bins. It is infinite exactly where the loop's is: Q is 0 only
    on empty bins, so only where bin i-1 is empty and outliers fold into it. The finite estimate and
    the loop's value each differ from the exact real number by a few rounding errors per summed term
    (sequential sums of at most len(hist) terms, logs within a few ulp, all of magnitude <=
    `scale`), so |estimate - loop| <= slack = 32 eps (len + 256) scale with a wide margin (eps =
    2**-52; measured below 1/7000 of it). Every i the loop could pick (least KL) then lies within
    2 slack of the least estimate; the loop's own `_candidate_kl` decides among those, largest i of
    least divergence, so the tie-breaking rule sees the very floats the loop sees. Dense histograms
    shortlist one candidate; a sparse one whose KL is 0 over a long run of candidates shortlists the
    run: at worst the loop's time."""
    n = len(hist)
    prefix = np.concatenate([[0.0], np.cumsum(hist)])  # prefix[k] = sum(hist[:k]), exact
    filled = np.concatenate([[0], np.cumsum(hist > 0)])
    safe = np.where(hist > 0, hist, 1.0)
    hlogh = np.concatenate([[0.0], np.cumsum(hist * np.log(safe))])  # sum of h log h over the first k
    estimates, slacks = [], []
    for first in range(QUANT_LEVELS, n + 1, _ENTROPY_BLOCK):
        i = np.arange(first, min(first + _ENTROPY_BLOCK, n + 1))
        estimate, slack = _kl_estimates(hist, i, total, prefix, filled, hlogh)
        estimates.append(estimate)
        slacks.append(slack)
    estimate, slack = np.concatenate(estimates), np.concatenate(slacks)
    finite = np.isfinite(estimate)
    if not finite.any():
        return n  # every candidate infinite: the loop keeps the last
    bound = np.min(estimate[finite] + slack[finite])
    shortlist = np.flatnonzero(finite & (estimate - slack <= bound)) + QUANT_LEVELS
    outliers = _outliers(hist)
    best, best_kl = n, np.inf
    for i in shortlist:
        kl = _candidate_kl(hist, outliers, int(i))
        if kl <= best_kl:
            best, best_kl = int(i), kl
    return best


def _kl_estimates(hist: np.ndarray, i: np.ndarray, total: float, prefix: np.ndarray, filled: np.ndarray,
                  hlogh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """KL estimates of candidates `i` (infinite where the loop's is) and their error bounds."""
    levels = np.arange(QUANT_LEVELS + 1)
    bounds = (levels * i[:, None] + QUANT_LEVELS - 1) // QUANT_LEVELS  # level l: bins ceil(l i / 128) ..
    counts, nonempty = np.diff(prefix[bounds], axis=1), np.diff(filled[bounds], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        level_terms = np.where(counts > 0, counts * np.log(counts / np.maximum(nonempty, 1)), 0.0)
    q_side = level_terms.sum(axis=1)
    last, outliers = hist[i - 1], total - prefix[i]
    infinite = (last == 0) & (outliers > 0)
    p_last = last + outliers
    last_log = np.log(np.where(last > 0, counts[:, -1] / np.maximum(nonempty[:, -1], 1), 1.0))
    fold = outliers * last_log  # outliers folded into bin i-1 weigh with that bin's Q
    p_last_log = p_last * np.log(np.where(p_last > 0, p_last, 1.0))
    q_share = np.log(np.where(infinite, 1.0, prefix[i]) / total)
    estimate = (hlogh[i - 1] + p_last_log - q_side - fold) / total + q_share
    scale = (hlogh[-1] + p_last_log + np.abs(level_terms).sum(axis=1) + np.abs(fold)) / total \
        + np.abs(q_share) + 2 * np.log(total) + np.abs(estimate) + 1.0
    slack = 32 * np.finfo(np.float64).eps * (len(hist) + 2 * QUANT_LEVELS) * scale
    return np.where(infinite, np.inf, estimate), slack


def percentile_threshold(hist: np.ndarray, bin_width: float, percentile: float) -> float:
    """The upper edge of the first bin where the cumulative share of counts reaches `percentile` %."""
    cumulative = np.cumsum(np.asarray(hist, np.float64))
    if cumulative[-1] == 0:
        return 0.0
    k = int(np.searchsorted(cumulative, cumulative[-1] * percentile / 100.0))
    return min(k + 1, len(hist)) * bin_width


@dataclass(frozen=True)
class Calibrator:
    """A threshold from max |x| and, when `histogram`, the |x| histogram over [0, max |x|]."""

    name: str
    histogram: bool
    threshold: Callable[[float, np.ndarray | None, float], float]  # (amax, hist, percentile) -> t


CALIBRATORS = {c.name: c for c in (
    Calibrator("minmax", False, lambda amax, hist, pct: amax),
    Calibrator("entropy", True, lambda amax, hist, pct: entropy_threshold(hist, amax / HIST_BINS)),
    Calibrator("percentile", True, lambda amax, hist, pct: percentile_threshold(hist, amax / HIST_BINS, pct)),
)}


#: the largest finite float8_e4m3fn: an FP8 scale is threshold / FP8_MAX
FP8_MAX = 448.0


def scale_of(threshold: float, qmax: float = QMAX) -> float:
    """The int8 (or, with qmax FP8_MAX, e4m3) scale of a symmetric threshold (1 for a tensor that
    is always zero)."""
    return float(np.float32(threshold / qmax)) if threshold > 0 else 1.0


@dataclass
class _Stats:
    amax: dict[str, float] = field(default_factory=dict)
    hist: dict[str, np.ndarray] = field(default_factory=dict)


def calibrate(graph: Any, names: list[str], data: Any, target: str, calibrator: str = "entropy",
              percentile: float = 99.99, build: Any = None, qmax: float = QMAX) -> dict[str, float]:
    """Scale of each tensor in `names` (graph inputs or node outputs of the unfused graph)
    over the batches of `data` (calibration_batches), on `target`. `build`: the BuilderConfig of
    the build being calibrated, whose input shapes, input values and calibration profile the
    calibration engine takes (`graph` then as the model has it, dynamic dims unresolved). `qmax`:
    the quantized type's largest value (127; FP8_MAX for e4m3)."""
    chosen = CALIBRATORS[calibrator]
    batches = calibration_batches(data)
    stats = _Stats({n: 0.0 for n in names})
    with calibration_engine(graph, names, target, build) as engine:
        _run(engine, batches, names, "calibrating: ranges", lambda name, x: _update_amax(stats, name, x))
        if chosen.histogram:
            stats.hist = {n: np.zeros(HIST_BINS, np.int64) for n in names}
            _run(engine, batches, names, "calibrating: histograms", lambda name, x: _update_hist(stats, name, x))
    return {n: scale_of(chosen.threshold(stats.amax[n], stats.hist.get(n), percentile), qmax) for n in names}


def _finite_abs(x: np.ndarray) -> np.ndarray:
    a = np.abs(x.ravel())
    return a[np.isfinite(a)]


# The two passes touch every element of every calibrated tensor of every batch (ResNet-50 bs32: ~1.3 GB
# of float32 a batch, 8 batches, twice), so they take the common case without copies: when the tensor
# holds no NaN or inf (its max |x| is finite), max |x| is max(max x, -min x), two reductions in place of
# an |x| copy, a mask and a filtered copy; and the histogram bins |x| clipped in place in one buffer.
# Where a NaN or inf is present, both fall back to the filtered copy: the same results either way.
def _update_amax(stats: _Stats, name: str, x: np.ndarray) -> None:
    if not x.size:
        return
    top = max(float(np.max(x)), -float(np.min(x)))
    if not np.isfinite(top):  # NaN or inf somewhere: the finite elements only
        a = _finite_abs(x)
        if not a.size:
            return
        top = float(np.max(a))
    stats.amax[name] = max(stats.amax[name], top)


def _update_hist(stats: _Stats, name: str, x: np.ndarray) -> None:
    amax = stats.amax[name]
    if amax <= 0 or not x.size:
        return
    a = np.abs(x.ravel())
    if not np.isfinite(np.max(a)):
        a = a[np.isfinite(a)]
        if not a.size:
            return
    # data beyond the first pass's max (a loader that changed) counts in the last bin
    counts, _ = np.histogram(np.minimum(a, amax, out=a), bins=HIST_BINS, range=(0.0, amax))
    stats.hist[name] += counts


def _workers() -> int:
    """Threads that update the tensors' statistics of one batch side by side (numpy's reductions
    and histogram arithmetic release the GIL on large arrays; each tensor's statistics are updated
    by one thread a batch, batches in order, so the results do not depend on the count)."""
    return max(1, min(8, os.cpu_count() or 1))


def _run(engine: Any, batches: Iterable[Mapping[str, np.ndarray]], names: list[str], what: str,
         update: Callable[[str, np.ndarray], None]) -> None:
    from polykit.compiler.builder.tuner import progress_bar

    total = len(batches) if hasattr(batches, "__len__") else None
    context = engine.create_execution_context()
    workers = _workers()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="polykit-calibrate") if workers > 1 and len(names) > 1 else None
    seen = 0
    try:
        with progress_bar(total, what) as advance:
            for seen, feeds in enumerate(batches, start=1):
                try:
                    outputs = context.execute(feeds)
                except RuntimeInputError as e:  # a batch the calibration engine's shapes do not take
                    raise UsageError(f"calibration batch {seen} does not fit the calibration engine: {e.what}",
                                     where=e.where, hint="give batches inside the calibration profile (the last "
                                     "profile unless BuilderConfig.calibration_profile says otherwise)") from None
                values = [(name, outputs[name] if name in outputs else feeds[name]) for name in names]
                if pool is None:
                    for name, value in values:
                        update(name, np.asarray(value, np.float32))
                else:  # every tensor's update of this batch done before the next batch runs
                    for done in [pool.submit(update, name, np.asarray(value, np.float32)) for name, value in values]:
                        done.result()
                advance(f"batch {seen}")
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        context.close()
    if not seen:
        raise UsageError("the calibration data holds no batch", hint="give at least one batch of inputs")


def calibration_engine(graph: Any, names: list[str], target: str, build: Any = None) -> Any:
    """The fp32 engine of `graph` unfused, with `names` (but graph inputs) marked as outputs; with
    `build` (a BuilderConfig), for its input shapes and values and its calibration profile."""
    from polykit.compiler.builder.builder import Builder
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.profiles import Profile
    from polykit.runtime.engine import Runtime

    marked = tuple(n for n in names if n not in graph.inputs)
    shapes: dict[str, Any] = {"input_values": graph.metadata.get("input_values", {})}
    if build is not None:
        profile = build.calibration_profile or (build.profiles[-1] if build.profiles else None)
        shapes = {"input_values": build.input_values, "input_shapes": dict(build.input_shapes),
                  "shape_values": build.shape_values, "profiles": ()}
        if profile is not None:  # inputs the profile fixes (min = max) are built at that shape
            fixed = {n: t[0] for n, t in profile.shapes.items() if t[0] == t[2]}
            shapes["input_shapes"].update(fixed)
            varying = Profile({n: t for n, t in profile.shapes.items() if n not in fixed}, profile.values, profile.ruled)
            shapes["profiles"] = (varying,) if varying.shapes or varying.values else ()
    config = BuilderConfig(target=target, mark_outputs=marked, fuse=False, builder_optimization_level=0,
                           channels_last=False, **shapes)
    return Runtime(target).deserialize_engine(Builder(config).build(graph))


def calibration_batches(data: Any) -> Iterable[Mapping[str, np.ndarray]]:
    """The batches of calibration data: a folder of .npz files (sorted by name), one .npz file,
    or an iterable of feed dicts that can be iterated twice."""
    if data is None:
        raise UsageError("INT8 / FP8 calibration needs data", hint="pass --calibration-data DIR (a folder of .npz "
                         "batches), --data-loader-script, a --calibration-cache, or --tensor-ranges")
    if isinstance(data, (str, os.PathLike)):
        return NpzBatches(Path(data))
    if iter(data) is data:
        raise UsageError("calibration data must be iterable twice (ranges, then histograms); got an iterator",
                         hint="pass a list of feed dicts or a data loader object")
    return data


class NpzBatches:
    """Feed dicts from .npz files (input name -> array; numpy.savez(path, **feeds))."""

    def __init__(self, path: Path):
        if path.is_dir():
            self.files = sorted(p for p in path.iterdir() if p.suffix == ".npz" and p.is_file())
            if not self.files:
                raise DataFileError("the calibration data folder holds no .npz file", where=str(path),
                                    hint="save batches with numpy.savez(f'{i}.npz', **{input_name: array})")
        elif path.is_file():
            self.files = [path]
        else:
            raise DataFileError("the calibration data folder does not exist", where=str(path), hint="check the path")

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for path in self.files:
            yield open_npz(path)
