"""The pytest plugin as a test suite uses it, run through pytest's own `pytester`."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import os

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
MLP = str(REPO / "examples" / "models" / "mlp.onnx")
ADD_MUL = str(REPO / "examples" / "models" / "add_mul.onnx")


@pytest.fixture(autouse=True)
def importable_polykit(monkeypatch):
    """Inner runs are subprocesses (in-process runs would re-import onnxruntime's C extension)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))


def plugin_args() -> list[str]:
    """Load the plugin with -p unless the installed entry point already does."""
    installed = any(ep.value == "polykit.testing.plugin" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "polykit.testing.plugin"]


def bad_mlp(path: Path) -> str:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(MLP)
    for t in model.graph.initializer:
        if t.name == "w2":
            arr = numpy_helper.to_array(t).copy()
            arr[3, 4] += 0.5
            t.CopyFrom(numpy_helper.from_array(arr, "w2"))
    onnx.save_model(model, str(path))
    return str(path)


def test_fixture_passes_matching_backends(pytester):
    pytester.makepyfile(f"""
        def test_mlp(polykit_accuracy):
            report = polykit_accuracy({MLP!r}, backends=("trt", "onnxrt"))
            assert report.passed
    """)
    result = pytester.runpytest_subprocess(*plugin_args(), "--polykit-target", "cpu")
    result.assert_outcomes(passed=1)


def test_perturbed_model_fails_with_report_naming_output(pytester, tmp_path):
    bad = bad_mlp(tmp_path / "bad.onnx")
    # a plugin runner that always runs the original model: the golden reference
    pytester.makepyfile(golden_runner=f"""
        from polykit.backends.base import RunnerSpec
        from polykit.backends.onnxrt import OnnxrtRunner, SessionFromOnnx
        from polykit.plugins import hookimpl

        @hookimpl
        def polykit_runners():
            return [RunnerSpec("golden", ("--golden",), lambda req: OnnxrtRunner(SessionFromOnnx({MLP!r}), "golden"))]
    """)
    pytester.makepyfile(test_gate=f"""
        from polykit.plugins import reset_plugin_manager
        from polykit.testing import assert_accuracy

        def test_engine_vs_golden(monkeypatch):
            monkeypatch.setenv("POLYKIT_PLUGINS", "golden_runner")
            reset_plugin_manager()
            try:
                assert_accuracy({bad!r}, backends=("golden", "trt"), target="cpu")
            finally:
                reset_plugin_manager()
    """)
    result = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*polykit accuracy check failed*", "*logits: FAILED*", "*worst element [[]0, 4[]]*"])


def test_assert_accuracy_accepts_per_output_tolerances_and_inputs(pytester):
    pytester.makepyfile(f"""
        import numpy as np
        from polykit.testing import assert_accuracy

        def test_add_mul():
            feeds = {{"a": np.full((2, 3, 4), 2, np.float32), "b": np.ones((2, 3, 4), np.float32)}}
            report = assert_accuracy({ADD_MUL!r}, ("trt", "onnxrt"), atol={{"y": 1e-3}}, rtol=0.0, inputs=feeds,
                                     target="cpu")
            assert report.pairs[0].outputs[0].worst_reference == 5.0
    """)
    pytester.runpytest_subprocess(*plugin_args()).assert_outcomes(passed=1)


def test_gpu_marker_skips_without_gpu(pytester):
    from polykit.testing.plugin import gpu_usable

    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpu
        def test_needs_gpu():
            pass

        def test_cpu():
            pass
    """)
    result = pytester.runpytest_subprocess(*plugin_args(), "--strict-markers")
    if gpu_usable():
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)


def test_marker_is_registered(pytester):
    result = pytester.runpytest_subprocess(*plugin_args(), "--markers")
    result.stdout.fnmatch_lines(["*gpu: needs a CUDA GPU*"])
