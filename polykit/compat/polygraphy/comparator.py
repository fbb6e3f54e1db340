"""`polygraphy.comparator` on polykit's comparator: RunResults (runner name -> a list of output
dicts, one per iteration, in insertion order; saved and loaded in Polygraphy's format),
Comparator.run / compare_accuracy, CompareFunc (simple, distance_metrics, quality_metrics with
Polygraphy's definitions) and DataLoader (polykit's random data loader)."""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence


class RunResults:
    """Polygraphy's RunResults: `add(out_list, runner_name=None)`, `items()`, `save(path)`,
    `RunResults.load(path)`, indexing by runner name."""

    def __init__(self, lst: Sequence[tuple[str, list[Mapping[str, Any]]]] = ()):
        self.lst = [(name, [dict(outs) for outs in its]) for name, its in lst]

    def add(self, out_list: Sequence[Mapping[str, Any]], runtime: float | None = None,
            runner_name: str | None = None) -> None:
        name = runner_name or f"custom_runner_{len(self.lst)}"
        self.lst.append((name, [dict(outs) for outs in out_list]))

    def items(self) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        return iter(self.lst)

    def keys(self) -> list[str]:
        return [name for name, _ in self.lst]

    def __getitem__(self, name: str) -> list[dict[str, Any]]:
        for runner, its in self.lst:
            if runner == name:
                return its
        raise KeyError(name)

    def __len__(self) -> int:
        return len(self.lst)

    def polygraphy_json(self) -> dict[str, Any]:
        from polykit.tools.data.polygraphy_json import encode_run_results

        return encode_run_results(dict(self.lst))

    def save(self, dest: str | os.PathLike) -> None:
        from polykit.compat.polygraphy.json import save_json

        save_json(self, dest, "inference results")

    @staticmethod
    def load(src: str | os.PathLike) -> "RunResults":
        from polykit.tools.data import results_io

        return RunResults(list(results_io.load_outputs(src).items()))


class DataLoader:
    """Polygraphy's DataLoader(seed=, iterations=, val_range=, input_metadata=): random feeds for
    the first runner's inputs (polykit.tools.data.loaders.DataLoader); `val_range` is (low, high)
    or {name: (low, high)}."""

    def __init__(self, seed: int | None = None, iterations: int | None = None, input_metadata: Any = None,
                 int_range: Any = None, float_range: Any = None, val_range: Any = None, data_loader_backend_module: Any = None):
        from polykit.tools.data.loaders import DataLoader as PolykitDataLoader, DataLoaderOptions

        ranges = val_range if isinstance(val_range, Mapping) else ({"": tuple(val_range)} if val_range else {})
        self._loader = PolykitDataLoader(DataLoaderOptions(seed=1 if seed is None else seed, iterations=iterations or 1,
                                                           val_ranges={k: tuple(v) for k, v in ranges.items()}))
        if input_metadata is not None:
            self._loader.bind(input_metadata)

    def bind(self, metadata: Any) -> None:
        self._loader.bind(metadata)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._loader)


def _polykit_results(results: Any) -> Any:
    from polykit.tools.compare.comparator import RunResults as PolykitResults

    if isinstance(results, PolykitResults):
        return results
    return PolykitResults(outputs={name: list(its) for name, its in results.items()})


class Comparator:
    """Polygraphy's Comparator: run(runners, data_loader=None, warm_up=None) -> RunResults, and
    compare_accuracy(run_results, fail_fast=False, comparisons=None, compare_func=None), whose
    result is truthy exactly when every comparison passed (the report is printed)."""

    @staticmethod
    def run(runners: Sequence[Any], data_loader: Iterable[Mapping[str, Any]] | None = None, warm_up: int | None = None,
            use_subprocess: Any = None, subprocess_timeout: Any = None, subprocess_polling_interval: Any = None,
            save_inputs_path: str | os.PathLike | None = None) -> RunResults:
        from polykit.tools.compare.comparator import Comparator as PolykitComparator

        done = PolykitComparator.run(runners, data_loader, warm_up=warm_up or 0)
        if save_inputs_path is not None:
            from polykit.compat.polygraphy.json import save_json

            save_json(done.feeds, save_inputs_path, "inference inputs")
        return RunResults(list(done.outputs.items()))

    @staticmethod
    def compare_accuracy(run_results: Any, fail_fast: bool = False, comparisons: Any = None,
                         compare_func: Callable[[str, Any, Any], Any] | None = None) -> Any:
        from polykit.tools.compare.comparator import Comparator as PolykitComparator
        from polykit.tools.report.comparison import render_text

        results = _polykit_results(run_results)
        if comparisons:
            raise NotImplementedError("compare_accuracy(comparisons=...): polykit compares every runner with the first")
        report = PolykitComparator.compare_accuracy(results, compare_func)
        print(render_text(report, results), end="")
        return report


def _per_output(table: Any, name: str, fallback: float) -> float:
    if isinstance(table, Mapping):
        return float(table.get(name, table.get("", fallback)))
    return fallback if table is None else float(table)


def _metric_compare(func: str, measure: Callable[[Any, Any], dict[str, float]],
                    passes: Callable[[str, dict[str, float]], tuple[bool, str]]) -> Callable[[str, Any, Any], Any]:
    def compare(name: str, reference: Any, actual: Any) -> Any:
        import numpy as np

        from polykit.tools.compare.funcs import OutputComparison, failed

        ref, act = np.asarray(reference), np.asarray(actual)
        if ref.shape != act.shape:
            return failed(name, func, f"shape {act.shape} differs from the reference's {ref.shape}", shape=ref.shape)
        values = measure(ref.astype(np.float64), act.astype(np.float64))
        passed, message = passes(name, values)
        return OutputComparison(name, passed, func, message, shape=tuple(ref.shape), dtype=str(ref.dtype))

    return compare


class CompareFunc:
    """Polygraphy's compare functions, usable as `compare_func=` of Comparator.compare_accuracy."""

    @staticmethod
    def simple(check_shapes: Any = None, rtol: Any = None, atol: Any = None, fail_fast: Any = None,
               find_output_func: Any = None, check_error_stat: Any = None, infinities_compare_equal: Any = None,
               save_heatmaps: Any = None, show_heatmaps: Any = None, save_error_metrics_plot: Any = None,
               show_error_metrics_plot: Any = None, error_quantile: Any = None) -> Callable[[str, Any, Any], Any]:
        """atol/rtol (a value or {name: value}, "" the default; 1e-5 each) on an error statistic."""
        from polykit.tools.compare.funcs import CompareOptions, simple

        def table(value: Any, fallback: Any) -> dict[str, Any]:
            value = fallback if value is None else value
            return dict(value) if isinstance(value, Mapping) else {"": value}

        return simple(CompareOptions(atol=table(atol, 1e-5), rtol=table(rtol, 1e-5),
                                     check_error_stat=table(check_error_stat, "elemwise"),
                                     **({} if error_quantile is None else {"error_quantile": error_quantile})))

    @staticmethod
    def distance_metrics(l2_tolerance: Any = None, cosine_similarity_threshold: Any = None, check_shapes: Any = None,
                         fail_fast: Any = None, find_output_func: Any = None) -> Callable[[str, Any, Any], Any]:
        """Polygraphy's: the L2 norm of the difference <= l2_tolerance (1e-5) and the cosine
        similarity >= cosine_similarity_threshold (0.997)."""
        import numpy as np

        def measure(ref: Any, act: Any) -> dict[str, float]:
            a, b = ref.ravel(), act.ravel()
            na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
            cosine = 1.0 if na == nb == 0 else 0.0 if 0 in (na, nb) else max(-1.0, min(1.0, float(a @ b) / (na * nb)))
            return {"l2": float(np.linalg.norm(a - b)), "cosine": cosine}

        def passes(name: str, v: dict[str, float]) -> tuple[bool, str]:
            l2_tol = _per_output(l2_tolerance, name, 1e-5)
            cos_min = _per_output(cosine_similarity_threshold, name, 0.997)
            ok = v["l2"] <= l2_tol and v["cosine"] >= cos_min
            return ok, "" if ok else f"L2 norm {v['l2']:.5g} (max {l2_tol:g}), cosine similarity {v['cosine']:.5g} (min {cos_min:g})"

        return _metric_compare("distance_metrics", measure, passes)

    @staticmethod
    def quality_metrics(psnr_tolerance: Any = None, snr_tolerance: Any = None, check_shapes: Any = None,
                        fail_fast: Any = None, find_output_func: Any = None) -> Callable[[str, Any, Any], Any]:
        """Polygraphy's: PSNR (peak = the reference's max, 1 when not positive) >= psnr_tolerance
        (30 dB) and SNR >= snr_tolerance (20 dB); a perfect match is infinite dB."""
        import numpy as np

        def measure(ref: Any, act: Any) -> dict[str, float]:
            mse = float(np.mean((ref - act) ** 2)) if ref.size else 0.0
            if mse == 0:
                return {"psnr": math.inf, "snr": math.inf}
            peak = float(ref.max()) if ref.size and ref.max() > 0 else 1.0
            signal = float(np.mean(ref ** 2))
            return {"psnr": 20 * math.log10(peak) - 10 * math.log10(mse),
                    "snr": 10 * math.log10(signal / mse) if signal > 0 else -math.inf}

        def passes(name: str, v: dict[str, float]) -> tuple[bool, str]:
            psnr_min = _per_output(psnr_tolerance, name, 30.0)
            snr_min = _per_output(snr_tolerance, name, 20.0)
            ok = v["psnr"] >= psnr_min and v["snr"] >= snr_min
            return ok, "" if ok else f"PSNR {v['psnr']:.5g} dB (min {psnr_min:g}), SNR {v['snr']:.5g} dB (min {snr_min:g})"

        return _metric_compare("quality_metrics", measure, passes)
