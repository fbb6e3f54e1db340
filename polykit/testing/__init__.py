"""Accuracy gates for pytest suites.

    from polykit.testing import assert_accuracy

    def test_model_matches_onnxruntime():
        assert_accuracy("model.onnx", backends=("trt", "onnxrt"), atol=1e-4, rtol=1e-3)

The pytest plugin (polykit.testing.plugin, loaded through the `pytest11` entry point)
adds a `polykit_accuracy` fixture for the same and a `gpu` marker that skips tests where
no CUDA GPU is usable.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

__all__ = ["assert_accuracy"]


def assert_accuracy(
    model: "str | os.PathLike",
    backends: Sequence[str] = ("trt", "onnxrt"),
    *,
    atol: "float | Mapping[str, float]" = 1e-5,
    rtol: "float | Mapping[str, float]" = 1e-5,
    check_error_stat: str = "elemwise",
    compare: str = "simple",
    inputs: "Mapping[str, Any] | Sequence[Mapping[str, Any]] | None" = None,
    seed: int = 1,
    iterations: int = 1,
    val_range: "tuple[float, float] | Mapping[str, tuple[float, float]] | None" = None,
    input_shapes: "Mapping[str, tuple[int, ...]] | None" = None,
    target: str | None = None,
    validate: bool = True,
) -> Any:
    """Run `model` through `backends` (runner names: "trt", "onnxrt", plugins') on the same
    inputs and raise AssertionError, with the comparison report as its message, unless
    every output of every backend matches the first backend's within atol/rtol.

    `inputs`: one feed dict or a list of them (default: random data from `seed`);
    `atol`/`rtol`: a number or {output name: value} ("" = the default); `target`: the
    engine's target (default: cuda when usable, else cpu). Returns the AccuracyReport.
    """
    from polykit.backends.base import RunnerRequest
    from polykit.tools.compare.accuracy import AccuracySettings, check_accuracy
    from polykit.tools.compare.funcs import CompareOptions
    from polykit.tools.data.loaders import DataLoaderOptions
    from polykit.tools.report.comparison import render_text

    def table(value: Any, default: Any) -> dict[str, Any]:
        return {"": default, **dict(value)} if isinstance(value, Mapping) else {"": value}

    ranges = {} if val_range is None else (dict(val_range) if isinstance(val_range, Mapping) else {"": tuple(val_range)})
    settings = AccuracySettings(
        compare=compare,
        compare_options=CompareOptions(atol=table(atol, 1e-5), rtol=table(rtol, 1e-5),
                                       check_error_stat={"": check_error_stat}),
        data_options=DataLoaderOptions(seed=seed, iterations=iterations, val_ranges=ranges,
                                       input_shapes=dict(input_shapes or {})),
        validate=validate,
    )
    feeds = None
    if inputs is not None:
        feeds = [dict(inputs)] if isinstance(inputs, Mapping) else [dict(f) for f in inputs]
    request = RunnerRequest(model=os.fspath(model), target=target, input_shapes=dict(input_shapes or {}))
    results, report = check_accuracy(os.fspath(model), tuple(backends), settings, request=request, feeds=feeds)
    if not report.passed:
        raise AssertionError(f"polykit accuracy check failed for {os.fspath(model)}:\n" + render_text(report, results))
    return report
