"""The conformance gate: ONNX's backend test suite on the cpu target must not regress.

Runs every kind of the suite once (about 1-1.5 minutes on 2 cores) and fails if a case of
the committed baseline (tests/data/conformance/cpu_passed.json) stops passing, if the pass
rate over node cases whose ops are all supported drops below 0.90, or if a light_* model
fails. Refresh the baseline after fixing cases:
    polykit conformance --target cpu --save report.json   (then write its passed names)
POLYKIT_CONFORMANCE_PATTERN=REGEX narrows the run (local debugging; the gate then checks
only the cases it ran).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from polykit.tools.conformance import (CaseResult, ConformanceReport, load_baseline, regressions, run_conformance,
                                       undefined_elements)

BASELINE = Path(__file__).resolve().parents[1] / "data" / "conformance" / "cpu_passed.json"
MIN_NODE_PASS_RATE = 0.90


@pytest.fixture(scope="module")
def report() -> ConformanceReport:
    return run_conformance(target="cpu", pattern=os.environ.get("POLYKIT_CONFORMANCE_PATTERN") or None)


def test_no_baseline_case_stops_passing(report):
    lost = regressions(report, load_baseline(BASELINE))
    messages = {r.name: r.message.splitlines()[0] if r.message else r.status for r in report.results}
    assert not lost, "\n".join(f"{name}: {messages[name]}" for name in lost)


def test_node_pass_rate_over_supported_cases_is_at_least_90_percent(report):
    if not report.counts("node"):
        pytest.skip("no node case matched POLYKIT_CONFORMANCE_PATTERN")
    assert report.pass_rate_supported("node") >= MIN_NODE_PASS_RATE


def test_every_light_model_builds_and_matches_its_expected_output(report):
    light = [r for r in report.results if r.kind == "light"]
    if not light and os.environ.get("POLYKIT_CONFORMANCE_PATTERN"):
        pytest.skip("no light model matched POLYKIT_CONFORMANCE_PATTERN")
    assert len(light) >= 9
    assert [f"{r.name}: {r.message[:200]}" for r in light if r.status != "passed"] == []


def test_regressions_lists_baseline_cases_that_ran_and_did_not_pass():
    rep = ConformanceReport("cpu", [CaseResult("a", "node", ("Abs",), "passed"),
                                    CaseResult("b", "node", ("Abs",), "failed", "boom"),
                                    CaseResult("c", "node", ("Foo",), "unsupported")])
    assert regressions(rep, ["a", "b", "c", "not_run"]) == ["b", "c"]


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
def test_float_to_integer_cast_elements_onnx_leaves_undefined_are_masked(op):
    """NaN and values truncating outside int4 are undefined in ONNX: the suite's expected values
    there come from ml_dtypes' processor-dependent casts, so the comparison leaves them out."""
    from onnx import TensorProto, helper

    inputs = ["x", "like"] if op == "CastLike" else ["x"]
    node = helper.make_node(op, inputs, ["y"], **({} if op == "CastLike" else {"to": TensorProto.INT4}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT if n == "x" else
                                                                          TensorProto.INT4, [6]) for n in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.INT4, [6])])
    x = np.array([-9.0, -8.9, 7.9, 8.0, np.nan, np.inf], np.float32)
    (mask,) = undefined_elements(helper.make_model(graph), [x, np.zeros(6, np.float32)][: len(inputs)])
    assert mask.tolist() == [True, False, False, True, True, True]


def test_casts_to_floats_and_other_graphs_have_no_undefined_elements():
    from onnx import TensorProto, helper

    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])])
    assert undefined_elements(helper.make_model(graph), [np.array([np.nan, 1e10], np.float32)]) == [None]


def test_the_baseline_is_a_sorted_list_of_unique_case_names():
    names = json.loads(BASELINE.read_text())
    assert names == sorted(set(names)) and len(names) > 1454


def test_the_cli_prints_counts_and_the_pass_rate_for_a_filtered_run():
    from typer.testing import CliRunner

    from polykit.tools.cli.app import build_app

    result = CliRunner().invoke(build_app(), ["conformance", "--kind", "node", "--filter", "^test_abs$", "--failures"])
    assert result.exit_code == 0, result.output
    assert "node pass rate over cases whose ops are all supported: 100.0%" in result.output


def test_the_onnxrt_runner_runs_the_same_cases_under_the_same_comparison():
    """--runner onnxrt: onnxruntime on the suite's cases, judged as polykit is (a like-for-like
    count); a case it refuses (batchwise GRU, layout 1) is a failure, polykit passes it."""
    pattern = "^test_(abs|relu|gru_batchwise)$"
    ort = {r.name: r for r in run_conformance(("node",), pattern=pattern, runner="onnxrt").results}
    ours = {r.name: r for r in run_conformance(("node",), pattern=pattern).results}
    assert set(ort) == set(ours) == {"test_abs", "test_relu", "test_gru_batchwise"}
    assert ort["test_abs"].status == ort["test_relu"].status == "passed"
    assert ort["test_gru_batchwise"].status == "failed" and "layout" in ort["test_gru_batchwise"].message
    assert ours["test_gru_batchwise"].status == "passed"


def test_the_cli_names_onnxruntime_and_its_version_for_the_onnxrt_runner():
    import onnxruntime
    from typer.testing import CliRunner

    from polykit.tools.cli.app import build_app

    app = build_app()
    result = CliRunner().invoke(app, ["conformance", "--kind", "node", "--filter", "^test_abs$", "--runner", "onnxrt"])
    assert result.exit_code == 0, result.output
    assert f"onnxruntime {onnxruntime.__version__}" in result.output
    from polykit.tools.cli.app import main

    assert main(["conformance", "--runner", "tensorrt"]) == 2  # a usage error, before any case runs


def test_the_cases_that_once_needed_an_engine_per_input_value_build_one():
    """A sequence insert whose position is fed as an input and whose elements differ in shape
    (test_sequence_insert_at_front) checks and selects at run time; a Loop whose body's shapes
    change with the iteration number (test_loop11) runs its body plan for a profile, a Loop that
    appends to its carried sequence (test_loop13_seq) gives it as a ragged output, a Reshape to a
    shape fed as an input ranges over the targets the data allows, a Resize to float scales fed as
    an input over positive scales, a Range expanded into a Loop whose trip count its inputs' values
    decide sizes its output at run time: one build each, like an Abs."""
    names = ("abs", "reshape_reduced_dims", "resize_upsample_scales_nearest", "loop11", "loop13_seq",
             "range_int32_type_negative_delta_expanded", "sequence_insert_at_front")
    report = run_conformance(("node",), pattern=f"^test_({'|'.join(names)})$")
    assert {r.name: (r.status, r.builds) for r in report.results} == {f"test_{n}": ("passed", 1) for n in names}
    assert report.rebuilt() == [] and report.to_json()["rebuilt_per_value"] == 0


def test_the_report_counts_passing_cases_whose_engine_was_rebuilt_per_input_value():
    report = ConformanceReport("cpu", [CaseResult("test_a", "node", ("Abs",), "passed", builds=1),
                                       CaseResult("test_b", "node", ("Loop",), "passed", builds=3),
                                       CaseResult("test_c", "node", ("Loop",), "failed", builds=2)])
    assert report.rebuilt() == ["test_b"] and report.to_json()["rebuilt_per_value"] == 1
