"""`polykit run|bench --weight-streaming-budget` and `--allocation-strategy` as Polygraphy spells
them (docs/POLYGRAPHY.md, docs/WEIGHT_STREAMING.md), on the cpu target: the budget reaches the
engine before its context, the outputs do not change, bad values exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polykit.backends.loaders import EngineFromPath
from polykit.backends.polykit_runner import PolykitRunner
from polykit.errors import UsageError
from polykit.tools.cli.app import main
from polykit.tools.cli.args import parse_weight_streaming_budget
from polykit.tools.data.results_io import load_outputs
from tests.cli_models import MLP as MLP_PATH

pytestmark = pytest.mark.usefixtures("fresh_plugins")

MLP = str(MLP_PATH)
CPU = ["--target", "cpu"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """The MLP built for cpu with and without --weight-streaming; the streamable bytes."""
    folder = tmp_path_factory.mktemp("plans")
    paths = {name: str(folder / f"{name}.plan") for name in ("streaming", "resident")}
    assert main(["convert", MLP, *CPU, "--weight-streaming", "-o", paths["streaming"]]) == 0
    assert main(["convert", MLP, *CPU, "-o", paths["resident"]]) == 0
    engine = EngineFromPath(paths["streaming"])()
    with engine:
        paths["streamable"] = engine.streamable_weights_size
    assert paths["streamable"] > 1024  # so 0%, 50% and 1K stream some weights
    return paths


#: --weight-streaming-budget -> the budget the engine gets, as a function of the streamable bytes
BUDGETS = {"0%": lambda s: 0, "50%": lambda s: s // 2, "1K": lambda s: 1024, "0": lambda s: 0,
           "-1": lambda s: s,  # cpu: the automatic budget keeps everything (no device memory to fit)
           "-2": lambda s: s, "100%": lambda s: s}


def _trt_outputs(path) -> list:
    return [{k: np.asarray(v) for k, v in o.items()} for o in load_outputs(path)["trt"]]


@pytest.mark.parametrize("value", list(BUDGETS))
def test_run_at_each_budget_matches_onnxrt_and_the_run_without_a_budget(plans, tmp_path, capsys, value):
    common = ["run", MLP, "--trt", "--onnxrt", *CPU, "--weight-streaming", "--iterations", "2"]
    assert main([*common, "--save-outputs", str(tmp_path / "plain.npz")]) == 0
    capsys.readouterr()
    assert main(["-v", *common, "--weight-streaming-budget", value, "--save-outputs", str(tmp_path / "ws.npz")]) == 0
    expected = BUDGETS[value](plans["streamable"])
    err = capsys.readouterr().err  # the -v log line
    assert f"trt: weight streaming budget {expected} of {plans['streamable']} streamable bytes resident" in err
    plain, streamed = _trt_outputs(tmp_path / "plain.npz"), _trt_outputs(tmp_path / "ws.npz")
    assert len(plain) == len(streamed) == 2
    for a, b in zip(plain, streamed):  # streaming moves bytes, it changes no kernel: bit-identical
        assert list(a) == list(b)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("kwargs, expected", [
    ({"weight_streaming_percent": 50}, lambda s: s // 2),
    ({"weight_streaming_budget": 0}, lambda s: 0),
    ({"weight_streaming_budget": 512, "weight_streaming_percent": 100}, lambda s: 512),  # bytes win, as in Polygraphy
    ({"weight_streaming_budget": -2}, lambda s: s),
    ({}, lambda s: s),
])
def test_the_runner_sets_the_budget_before_its_context(plans, kwargs, expected):
    from polykit.compat.polygraphy.backend.trt import TrtRunner

    for cls in (PolykitRunner, TrtRunner):
        with cls(EngineFromPath(plans["streaming"]), **kwargs) as runner:
            assert runner.engine.get_weight_streaming_budget() == expected(plans["streamable"])
            streams = runner.engine.get_weight_streaming_budget() < plans["streamable"]
            assert (runner.engine.weight_streaming_scratch_memory_size > 0) == streams
            out = runner.infer({"x": np.ones(runner.get_input_metadata()["x"].shape, np.float32)})
            assert all(np.isfinite(v).all() for v in out.values())


def test_a_budget_below_the_weights_of_a_plan_built_without_the_flag_is_the_engines_error(plans, capsys):
    assert main(["run", plans["resident"], "--trt", "--weight-streaming-budget", "50%"]) == 2
    err = capsys.readouterr().err
    assert "built without --weight-streaming" in err and "rebuild the plan" in err and "Traceback" not in err
    for off in ("-2", "100%"):  # streaming off: nothing to set on a plan whose weights are all resident
        assert main(["run", plans["resident"], "--trt", "--weight-streaming-budget", off]) == 0
    engine = EngineFromPath(plans["resident"])()
    with pytest.raises(UsageError, match="built without --weight-streaming"):
        PolykitRunner(engine, weight_streaming_budget=0).activate()
    assert engine._closed is False  # a given engine stays the caller's: not closed on the failed activation
    engine.close()


@pytest.mark.parametrize("value", ["101%", "-0.5%", "%", "-3", "-1.5", "-1M", "abc", "1X", "inf", ""])
def test_bad_budgets_exit_2_with_a_hint(plans, capsys, value):
    for command in (["run", plans["streaming"], "--trt"], ["bench", plans["streaming"], "--iterations", "1"]):
        assert main([*command, f"--weight-streaming-budget={value}"]) == 2
        err = capsys.readouterr().err
        assert "--weight-streaming-budget" in err and "hint: give -2 (streaming off)" in err, err
    with pytest.raises(UsageError):
        parse_weight_streaming_budget(value)


@pytest.mark.parametrize("kwargs", [{"weight_streaming_budget": -3}, {"weight_streaming_budget": 1.5},
                                    {"weight_streaming_percent": 101}, {"weight_streaming_percent": "50%"},
                                    {"allocation_strategy": "dynamic"}])
def test_bad_runner_arguments_are_usage_errors(plans, kwargs):
    with pytest.raises(UsageError):
        PolykitRunner(EngineFromPath(plans["streaming"]), **kwargs)


def test_budget_values_parse_as_polygraphys_parse_num_bytes():
    assert parse_weight_streaming_budget(None) == (None, None)
    assert parse_weight_streaming_budget("50%") == (None, 50.0)
    assert parse_weight_streaming_budget("512M") == (512 << 20, None)
    assert parse_weight_streaming_budget("1g") == (1 << 30, None)
    assert parse_weight_streaming_budget("1.5K") == (1536, None)
    assert parse_weight_streaming_budget("1e3") == (1000, None)
    assert parse_weight_streaming_budget("12.7") == (12, None)  # truncated, as Polygraphy does
    assert parse_weight_streaming_budget("-1") == (-1, None) and parse_weight_streaming_budget("-2") == (-2, None)


@pytest.mark.parametrize("strategy", ["static", "profile", "runtime"])
def test_allocation_strategies_run_static_and_say_so(capsys, strategy):
    capsys.readouterr()
    assert main(["run", MLP, "--trt", "--onnxrt", *CPU, "--allocation-strategy", strategy]) == 0
    notices = [line for line in capsys.readouterr().err.splitlines() if "allocation strategy" in line]
    assert len(notices) == (0 if strategy == "static" else 1)
    assert all("allocates activation memory statically" in line for line in notices)


def test_an_unknown_allocation_strategy_exits_2():
    for command in (["run", MLP, "--trt", *CPU], ["bench", MLP, *CPU]):
        assert main([*command, "--allocation-strategy", "dynamic"]) == 2


def test_bench_runs_at_the_budget(plans, capsys):
    capsys.readouterr()
    assert main(["bench", plans["streaming"], "--weight-streaming-budget", "25%", "--iterations", "2",
                 "--warm-up", "0", "--duration", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["weight_streaming"] == {"budget": plans["streamable"] // 4, "streamable": plans["streamable"]}


def test_gen_script_writes_the_runner_arguments(plans, tmp_path, capsys):
    script = tmp_path / "gen.py"
    assert main(["run", plans["streaming"], "--trt", "--weight-streaming-budget", "0", "--allocation-strategy",
                 "profile", "--gen-script", str(script)]) == 0
    source = script.read_text()
    assert "weight_streaming_budget=0" in source and "allocation_strategy='profile'" in source
    assert main(["run", MLP, "--trt", *CPU, "--weight-streaming", "--weight-streaming-budget", "-1", "--gen-script",
                 str(script)]) == 0
    assert "weight_streaming_budget=-1" in script.read_text()
