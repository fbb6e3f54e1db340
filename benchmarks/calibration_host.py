"""Host time of INT8 calibration's threshold step: the entropy calibrator's vectorized search against
the candidate loop it replaced (calibrate._entropy_threshold_loop, kept as the reference), on CPU.

    PYTHONPATH=. python3 benchmarks/calibration_host.py [--tensors 120] [--sample 2000000] [--repeat 5]

Per tensor: 2048-bin histograms of |x| for realistic activations (ReLU outputs of N(0,1)
pre-activations, as ResNet-50's 32x64x112x112 stem output; the pre-activations themselves; a
heavy-tailed residual sum), each made from a `--sample`-element sample of the tensor. Then the whole
CALIBRATORS["entropy"] threshold step over `--tensors` such histograms (ResNet-50 calibrates ~120),
loop against vectorized, checking that both give the same thresholds. Prints the median of `--repeat`
runs (perf_counter), the machine and the date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import numpy as np

from polykit.compiler.builder.calibrate import CALIBRATORS, HIST_BINS, _entropy_threshold_loop


def histogram(kind: str, rng: np.random.Generator, sample: int) -> tuple[float, np.ndarray]:
    """(max |x|, the 2048-bin |x| histogram) of one activation tensor of `kind`."""
    if kind == "relu":
        x = np.maximum(rng.standard_normal(sample, np.float32), 0) * rng.uniform(0.2, 5)
    elif kind == "pre-activation":
        x = rng.standard_normal(sample, np.float32) * rng.uniform(0.2, 5) + rng.uniform(-1, 1)
    else:  # a residual sum with heavy tails
        x = rng.standard_t(3, sample).astype(np.float32) * rng.uniform(0.2, 5)
    a = np.abs(x)
    amax = float(a.max())
    return amax, np.histogram(a, bins=HIST_BINS, range=(0.0, amax))[0]


def loop_threshold(amax: float, hist: np.ndarray) -> float:
    h = np.asarray(hist, np.float64).copy()
    h[0] = h[1]
    return _entropy_threshold_loop(h) * (amax / HIST_BINS)


def machine() -> str:
    """The CPU's model name (Linux), else the architecture."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def median_seconds(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=120)
    parser.add_argument("--sample", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    entropy = CALIBRATORS["entropy"].threshold
    rng = np.random.default_rng(0)
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}, "
          f"{os.cpu_count()} cores, numpy {np.__version__}")
    for kind in ("relu", "pre-activation", "heavy tails"):
        amax, hist = histogram(kind, rng, args.sample)
        loop = median_seconds(lambda: loop_threshold(amax, hist), args.repeat)
        vectorized = median_seconds(lambda: entropy(amax, hist, 0.0), args.repeat)
        same = loop_threshold(amax, hist) == entropy(amax, hist, 0.0)
        print(f"one tensor, {kind:15s} loop {loop * 1e3:7.2f} ms  vectorized {vectorized * 1e3:6.2f} ms  "
              f"{loop / vectorized:5.1f}x  same threshold: {same}")
    kinds = ("relu", "pre-activation", "heavy tails")
    tensors = [histogram(kinds[k % 3], rng, args.sample) for k in range(args.tensors)]
    loop = median_seconds(lambda: [loop_threshold(a, h) for a, h in tensors], max(1, args.repeat // 2))
    vectorized = median_seconds(lambda: [entropy(a, h, 0.0) for a, h in tensors], args.repeat)
    same = [loop_threshold(a, h) for a, h in tensors] == [entropy(a, h, 0.0) for a, h in tensors]
    print(f"{args.tensors} tensors' entropy thresholds: loop {loop:.3f} s  vectorized {vectorized:.3f} s  "
          f"{loop / vectorized:.1f}x  same thresholds: {same}")


if __name__ == "__main__":
    main()
