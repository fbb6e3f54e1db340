"""Compare functions: one output of one runner against the same output of the reference.

`simple` checks absolute and relative error with atol/rtol on an error statistic
(`elemwise`: an element fails when it exceeds BOTH atol and rtol; `max`, `mean`, `median`,
`quantile`: the statistic of the errors must be within atol OR rtol); `l2` (relative L2
error), `cosine` (1 - cosine similarity) and `snr` (signal-to-noise ratio in dB) check one
metric of the whole tensor. Every function reports the same error statistics, the worst
elements, a histogram of the absolute errors and the smallest atol/rtol that would pass, so
reports (text, JSON, HTML) look alike. Histogram and worst elements have a fixed size, so a
record stays small whatever the tensor's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from polykit.errors import UsageError

ERROR_STATS = ("elemwise", "max", "mean", "median", "quantile")
#: bins of an ErrorHistogram (log10-spaced between the smallest and the largest non-zero error)
HISTOGRAM_BINS = 20
#: elements an OutputComparison lists in `worst`
WORST_ELEMENTS = 5


@dataclass(frozen=True)
class CompareOptions:
    """Tolerances. atol/rtol/check_error_stat map an output name to a value; key "" is the default."""

    atol: Mapping[str, float] = field(default_factory=lambda: {"": 1e-5})
    rtol: Mapping[str, float] = field(default_factory=lambda: {"": 1e-5})
    check_error_stat: Mapping[str, str] = field(default_factory=lambda: {"": "elemwise"})
    error_quantile: float = 0.99
    l2_tol: float = 1e-5
    cosine_tol: float = 1e-6
    snr_min_db: float = 80.0

    def __post_init__(self) -> None:
        for option, table in (("--atol", self.atol), ("--rtol", self.rtol)):
            for name, value in table.items():
                if not value >= 0:  # also refuses NaN
                    raise UsageError(f"{option} {_named(name, value)} is not a non-negative number",
                                     hint="tolerances are numbers >= 0, e.g. --atol 1e-5")
        for name, stat in self.check_error_stat.items():
            if stat not in ERROR_STATS:
                raise UsageError(f"--check-error-stat {_named(name, stat)} is not an error statistic",
                                 hint=f"use one of: {', '.join(ERROR_STATS)}")
        for option, value, low, high in (("--error-quantile", self.error_quantile, 0.0, 1.0),
                                         ("--l2-tol", self.l2_tol, 0.0, float("inf")),
                                         ("--cosine-tol", self.cosine_tol, 0.0, 2.0)):
            if not low <= value <= high:
                raise UsageError(f"{option} {value} is not in [{low:g}, {high:g}]",
                                 hint="give a value inside that range")
        if self.snr_min_db != self.snr_min_db:
            raise UsageError("--snr-min is NaN", hint="give a number, e.g. --snr-min 40")

    def per_output(self, table: Mapping[str, Any], name: str, fallback: Any) -> Any:
        return table.get(name, table.get("", fallback))

    def check_output_names(self, outputs: Iterable[str]) -> None:
        """UsageError when a per-output option names an output none of `outputs` is."""
        known = set(outputs)
        for option, table in (("--atol", self.atol), ("--rtol", self.rtol), ("--check-error-stat", self.check_error_stat)):
            for name in table:
                if name and name not in known:
                    prefix = name.rpartition(":")[0]
                    hint = (f"{option} takes NAME:VALUE with one value; {name!r} looks like {prefix!r} with an extra "
                            "field" if prefix in known else f"outputs are: {', '.join(sorted(known)) or '(none)'}")
                    raise UsageError(f"{option} {_named(name, table[name])} names no output of the model",
                                     hint=hint)


def _named(name: str, value: Any) -> str:
    return f"{name}:{value}" if name else str(value)


@dataclass(frozen=True)
class ErrorHistogram:
    """How the absolute errors of one output spread: `zeros` exact matches, `counts[i]` errors in
    [edges[i], edges[i + 1]) (the last bin closed; edges log10-spaced), `nonfinite` NaN/Inf errors."""

    edges: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()
    zeros: int = 0
    nonfinite: int = 0


@dataclass(frozen=True)
class WorstElement:
    """One of the elements with the largest absolute error."""

    index: tuple[int, ...]
    reference: float
    actual: float
    abs_error: float
    rel_error: float


@dataclass(frozen=True)
class OutputComparison:
    """The verdict and error statistics for one output (all errors in float64)."""

    name: str
    passed: bool
    func: str
    message: str = ""
    shape: tuple[int, ...] | None = None
    dtype: str = ""
    max_abs: float = 0.0
    mean_abs: float = 0.0
    median_abs: float = 0.0
    max_rel: float = 0.0
    mean_rel: float = 0.0
    median_rel: float = 0.0
    worst_index: tuple[int, ...] | None = None
    worst_reference: float | None = None
    worst_actual: float | None = None
    atol: float | None = None
    rtol: float | None = None
    stat: str = ""
    required_atol: float | None = None
    required_rtol: float | None = None
    metric: str = ""
    metric_value: float | None = None
    threshold: float | None = None
    histogram: ErrorHistogram | None = None
    worst: tuple[WorstElement, ...] = ()


@dataclass(frozen=True)
class CompareFuncSpec:
    """A compare function offered as `--compare NAME`: factory(options) -> fn(name, reference, actual)."""

    name: str
    factory: Callable[[CompareOptions], Callable[[str, Any, Any], OutputComparison]]
    help: str = ""


def failed(name: str, func: str, message: str, **stats: Any) -> OutputComparison:
    return OutputComparison(name=name, passed=False, func=func, message=message, **stats)


def _as_float64(arr: Any) -> Any:
    """A flat float64 copy of a numeric array (bool, ints, float16, bfloat16 & co, floats);
    None for arrays that hold no numbers (strings, objects, structured types)."""
    import numpy as np

    if arr.dtype.kind not in "biu" and not is_float_dtype(arr.dtype):
        return None
    return arr.astype(np.float64).reshape(-1)


def is_float_dtype(dtype: Any) -> bool:
    """numpy's floats and ml_dtypes' bfloat16 / float8 / float4 (numpy calls their kind "V").
    Only engines from polykit's compiler give the latter, so the compiler's dtype table is
    imported only then (start-up of `polykit run m.onnx --onnxrt` stays free of it)."""
    if dtype.kind == "f":
        return True
    if dtype.kind != "V":
        return False
    from polykit.compiler.ir.dtypes import is_float

    return is_float(dtype)


def _errors(name: str, func: str, reference: Any, actual: Any) -> "tuple[dict[str, Any], Any, Any] | OutputComparison":
    """Shared statistics: (stats, absdiff, reldiff), both flat float64, or a finished record when
    shapes or dtypes cannot be compared numerically. Any rank (0-d included), any size."""
    import numpy as np

    ref = np.asarray(reference)
    act = np.asarray(actual)
    if ref.shape != act.shape:
        return failed(name, func, f"shape mismatch: reference {ref.shape} vs {act.shape}", shape=tuple(act.shape))
    ref64, act64 = _as_float64(ref), _as_float64(act)
    if ref64 is None or act64 is None:
        same = ref.dtype == act.dtype and bool(np.array_equal(ref, act))
        return OutputComparison(name, same, func, "" if same else f"{ref.dtype} and {act.dtype} values differ "
                                "(compared for equality: not numbers)", shape=tuple(ref.shape), dtype=str(act.dtype))
    both_nan = np.isnan(ref64) & np.isnan(act64)
    same_inf = np.isinf(ref64) & (ref64 == act64)
    with np.errstate(invalid="ignore", over="ignore"):
        absdiff = np.abs(ref64 - act64)
    absdiff[both_nan | same_inf] = 0.0
    absdiff[np.isnan(absdiff)] = np.inf  # NaN against a number is as wrong as it gets
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        reldiff = absdiff / np.maximum(np.abs(ref64), np.finfo(np.float64).tiny)
    reldiff[np.isnan(reldiff)] = np.inf
    reldiff[absdiff == 0] = 0.0
    stats: dict[str, Any] = {"shape": tuple(ref.shape), "dtype": str(act.dtype)}
    if absdiff.size:
        flat = int(np.argmax(absdiff))
        with np.errstate(over="ignore"):  # relative errors against zeros are huge: their mean may be inf
            stats.update(
                max_abs=float(absdiff.max()), mean_abs=float(absdiff.mean()), median_abs=float(np.median(absdiff)),
                max_rel=float(reldiff.max()), mean_rel=float(reldiff.mean()), median_rel=float(np.median(reldiff)),
                worst_index=tuple(int(i) for i in np.unravel_index(flat, ref.shape)),
                worst_reference=float(ref64[flat]), worst_actual=float(act64[flat]),
                histogram=error_histogram(absdiff), worst=worst_elements(ref.shape, ref64, act64, absdiff, reldiff),
            )
    return stats, absdiff, reldiff


def error_histogram(absdiff: Any, bins: int = HISTOGRAM_BINS) -> ErrorHistogram:
    """Histogram of flat absolute errors over log10-spaced bins (zeros and NaN/Inf counted apart)."""
    import numpy as np

    finite = np.isfinite(absdiff)
    positive = absdiff[finite & (absdiff > 0)]
    zeros, nonfinite = int(np.count_nonzero(absdiff == 0)), int(absdiff.size - np.count_nonzero(finite))
    if positive.size == 0:
        return ErrorHistogram(zeros=zeros, nonfinite=nonfinite)
    low, high = float(positive.min()), float(positive.max())
    if low == high:
        return ErrorHistogram((low, high), (int(positive.size),), zeros, nonfinite)
    counts, edges = np.histogram(np.log10(positive), bins=bins, range=(np.log10(low), np.log10(high)))
    return ErrorHistogram(tuple(float(10.0 ** e) for e in edges), tuple(int(c) for c in counts), zeros, nonfinite)


def worst_elements(shape: tuple[int, ...], ref64: Any, act64: Any, absdiff: Any, reldiff: Any,
                   count: int = WORST_ELEMENTS) -> tuple[WorstElement, ...]:
    """The (at most) `count` elements with the largest non-zero absolute error, largest first."""
    import numpy as np

    k = min(count, int(np.count_nonzero(absdiff)))
    if k == 0:
        return ()
    picked = np.argpartition(absdiff, absdiff.size - k)[absdiff.size - k:]
    picked = picked[np.lexsort((picked, -absdiff[picked]))]
    return tuple(WorstElement(tuple(int(i) for i in np.unravel_index(int(f), shape)), float(ref64[f]), float(act64[f]),
                              float(absdiff[f]), float(reldiff[f])) for f in picked)


def simple(options: CompareOptions) -> Callable[[str, Any, Any], OutputComparison]:
    """atol/rtol on an error statistic (Polygraphy's `simple` compare function)."""
    import numpy as np

    def compare(name: str, reference: Any, actual: Any) -> OutputComparison:
        res = _errors(name, "simple", reference, actual)
        if isinstance(res, OutputComparison):
            return res
        stats, absdiff, reldiff = res
        atol = float(options.per_output(options.atol, name, 1e-5))
        rtol = float(options.per_output(options.rtol, name, 1e-5))
        stat = options.per_output(options.check_error_stat, name, "elemwise")
        if absdiff.size == 0:
            return OutputComparison(name, True, "simple", atol=atol, rtol=rtol, stat=stat, **stats)
        if stat == "elemwise":
            bad = (absdiff > atol) & (reldiff > rtol)
            passed = not bool(bad.any())
            req_atol = float(absdiff[reldiff > rtol].max(initial=0.0))
            req_rtol = float(reldiff[absdiff > atol].max(initial=0.0))
            message = "" if passed else f"{int(bad.sum())} of {absdiff.size} elements exceed atol and rtol"
        else:
            reduce = {
                "max": np.max, "mean": np.mean, "median": np.median,
                "quantile": lambda a: np.quantile(a, options.error_quantile),
            }[stat]
            abs_stat, rel_stat = float(reduce(absdiff)), float(reduce(reldiff))
            passed = abs_stat <= atol or rel_stat <= rtol
            req_atol = 0.0 if rel_stat <= rtol else abs_stat
            req_rtol = 0.0 if abs_stat <= atol else rel_stat
            message = "" if passed else f"{stat} error: abs {abs_stat:.3g} > atol and rel {rel_stat:.3g} > rtol"
        return OutputComparison(name, passed, "simple", message, atol=atol, rtol=rtol, stat=stat,
                                required_atol=req_atol, required_rtol=req_rtol, **stats)

    return compare


def _metric_func(func: str, metric: str, threshold_of: Callable[[CompareOptions], float],
                 value_of: Callable[[Any, Any], float], higher_is_better: bool):
    def factory(options: CompareOptions) -> Callable[[str, Any, Any], OutputComparison]:
        import numpy as np

        threshold = threshold_of(options)

        def compare(name: str, reference: Any, actual: Any) -> OutputComparison:
            res = _errors(name, func, reference, actual)
            if isinstance(res, OutputComparison):
                return res
            stats, absdiff, _ = res
            ref, act = _as_float64(np.asarray(reference)), _as_float64(np.asarray(actual))
            if not np.isfinite(absdiff).all():
                return failed(name, func, "non-finite differences (NaN/Inf mismatch)", metric=metric, threshold=threshold, **stats)
            value = float(value_of(ref, act))
            passed = value >= threshold if higher_is_better else value <= threshold
            cmp = "<" if higher_is_better else ">"
            message = "" if passed else f"{metric} {value:.4g} {cmp} {threshold:g}"
            return OutputComparison(name, passed, func, message, metric=metric, metric_value=value,
                                    threshold=threshold, **stats)

        return compare

    return factory


def _rel_l2(ref: Any, act: Any) -> float:
    import numpy as np

    diff = float(np.linalg.norm((ref - act).ravel()))
    base = float(np.linalg.norm(ref.ravel()))
    return 0.0 if diff == 0 else diff / max(base, np.finfo(np.float64).tiny)


def _cosine_distance(ref: Any, act: Any) -> float:
    import numpy as np

    a, b = ref.ravel(), act.ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 and nb == 0:
        return 0.0
    if na == 0 or nb == 0:
        return 1.0
    return float(1.0 - np.dot(a, b) / (na * nb))


def _snr_db(ref: Any, act: Any) -> float:
    import numpy as np

    noise = float(np.sum((ref - act) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise == 0:
        return float("inf")
    return 10.0 * float(np.log10(max(signal, np.finfo(np.float64).tiny) / noise))


l2 = _metric_func("l2", "relative L2 error", lambda o: o.l2_tol, _rel_l2, higher_is_better=False)
cosine = _metric_func("cosine", "cosine distance", lambda o: o.cosine_tol, _cosine_distance, higher_is_better=False)
snr = _metric_func("snr", "SNR dB", lambda o: o.snr_min_db, _snr_db, higher_is_better=True)


def builtin_compare_funcs() -> list[CompareFuncSpec]:
    return [
        CompareFuncSpec("simple", simple, "atol/rtol on an error statistic (--check-error-stat)"),
        CompareFuncSpec("l2", l2, "relative L2 error <= --l2-tol"),
        CompareFuncSpec("cosine", cosine, "1 - cosine similarity <= --cosine-tol"),
        CompareFuncSpec("snr", snr, "signal-to-noise ratio >= --snr-min dB"),
    ]
