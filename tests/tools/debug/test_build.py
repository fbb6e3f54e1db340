"""`polykit debug build` (polykit.tools.debug.build): repeated builds judged by a check command
reading polygraphy_debug.engine or by the built-in comparison, --until a count, good or bad,
--save-tactics replays sorted into good/ and bad/ (Polygraphy's debug/01 example flow)."""

from __future__ import annotations

import json
import sys

import pytest

from polykit.compiler.builder.tactic_replay import load_replay
from polykit.tools.cli.app import main
from tests.cli_models import ADD_MUL, MLP

POLYKIT = [sys.executable, "-m", "polykit.tools.cli.app"]


def test_each_build_is_checked_by_a_command_and_its_tactic_replay_sorted_into_good(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(ADD_MUL), "--onnxrt", "--save-outputs", "golden.json"]) == 0
    assert main(["debug", "build", str(ADD_MUL), "--target", "cpu", "--save-tactics", "replay.json",
                 "--artifacts-dir", "replays", "--artifacts", "replay.json", "--until=3",
                 "--check", *POLYKIT, "run", "polygraphy_debug.engine", "--trt", "--load-outputs", "golden.json"]) == 0
    assert "debug build: 3 of 3 build(s) passed" in capsys.readouterr().out
    good = sorted((tmp_path / "replays" / "good").iterdir())
    assert [p.name[-8:] for p in good] == ["_N0.json", "_N1.json", "_N2.json"]
    assert all(load_replay(p).layers for p in good)
    assert not (tmp_path / "replays" / "bad").exists() and not (tmp_path / "polygraphy_debug.engine").exists()


@pytest.mark.usefixtures("fault_plugin")
def test_the_builtin_check_stops_at_the_first_bad_build(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", ".")
    # level 0 takes the fault tactic for every Gemm (timing may not: builds then differ, debug build's case)
    assert main(["debug", "build", str(MLP), "--target", "cpu", "--builder-optimization-level", "0", "--until", "bad",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total"] == 1 and doc["passed"] == 0 and not doc["iterations"][0]["passed"]


def test_until_good_runs_until_the_check_passes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    count = "import pathlib, sys; p = pathlib.Path('count'); n = len(p.read_text()) if p.exists() else 0; " \
            "p.write_text('x' * (n + 1)); pathlib.Path('log.txt').write_text(str(n)); sys.exit(n < 2)"
    assert main(["debug", "build", str(ADD_MUL), "--target", "cpu", "--until", "good", "--artifacts", "log.txt",
                 "--json", "--check", sys.executable, "-c", count]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [it["passed"] for it in doc["iterations"]] == [False, False, True]
    assert len(list((tmp_path / "polygraphy_artifacts" / "bad").iterdir())) == 2
    assert [p.read_text() for p in (tmp_path / "polygraphy_artifacts" / "good").iterdir()] == ["2"]


def test_an_existing_iteration_artifact_or_a_bad_until_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["debug", "build", str(ADD_MUL), "--until", "sometimes", "--check", "true"]) == 2
    assert "--until 'sometimes'" in capsys.readouterr().err
    (tmp_path / "polygraphy_debug.engine").write_text("mine")
    assert main(["debug", "build", str(ADD_MUL), "--target", "cpu", "--until", "1", "--check", "true"]) == 2
    assert "polygraphy_debug.engine exists" in capsys.readouterr().err
    assert (tmp_path / "polygraphy_debug.engine").read_text() == "mine"
