"""`polykit inspect diff-tactics` (polykit.tools.debug.tactic_diff): the tactics only bad builds
chose, from polykit replays sorted by `debug build` or Polygraphy's TacticReplayData files."""

from __future__ import annotations

import json

from polykit.plugins import reset_plugin_manager
from polykit.tools.cli.app import main
from tests.cli_models import FAULT_PLUGIN, MLP


def _convert(replay, *extra) -> None:
    reset_plugin_manager()
    assert main(["convert", str(MLP), "-o", str(replay.with_suffix(".plan")), "--target", "cpu",
                 "--builder-optimization-level", "0", "--save-tactics", str(replay), *extra]) == 0


def test_the_fault_tactics_of_a_bad_build_are_named(tmp_path, monkeypatch, capsys, fresh_plugins):
    (tmp_path / "good").mkdir(), (tmp_path / "bad").mkdir()
    _convert(tmp_path / "good" / "replay_N0.json")
    _convert(tmp_path / "good" / "replay_N1.json")
    monkeypatch.syspath_prepend(str(FAULT_PLUGIN))
    monkeypatch.setenv("POLYKIT_PLUGINS", "polykit_fault")
    _convert(tmp_path / "bad" / "replay_N2.json")
    (tmp_path / "bad" / "notes.txt").write_text("not a replay")
    capsys.readouterr()
    assert main(["inspect", "diff-tactics", "--dir", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["good"]) == 2 and doc["bad"] == [str(tmp_path / "bad" / "replay_N2.json")]
    assert doc["suspects"] and all(c.startswith("fault.") for choices in doc["suspects"].values() for c in choices)
    assert main(["inspect", "diff-tactics", "--good", str(tmp_path / "good" / "replay_N0.json"),
                 "--bad", str(tmp_path / "bad")]) == 0
    text = capsys.readouterr().out
    assert "Loaded 1 good tactic replays." in text and "Found potentially bad tactics:" in text and "fault." in text


def _algorithm(tactic: int) -> dict:
    """An Algorithm as Polygraphy's JSON encoder writes it."""
    info = {"dtype": "DataType.FLOAT", "strides": [3, 1], "vectorized_dim": -1, "components_per_element": -1,
            "polygraphy_class": "TensorInfo"}
    return {"implementation": 2147483648, "tactic": tactic, "inputs": [info], "outputs": [info],
            "polygraphy_class": "Algorithm"}


def test_polygraphys_replay_files_are_read(tmp_path, capsys):
    for kind, tactic in (("good", 7), ("bad", 9)):
        replay = {"replay": {"layer0": _algorithm(1), "layer1": _algorithm(tactic)}, "polygraphy_class": "TacticReplayData"}
        (tmp_path / f"{kind}.json").write_text(json.dumps(replay))
    assert main(["inspect", "diff-tactics", "--good", str(tmp_path / "good.json"), "--bad", str(tmp_path / "bad.json")]) == 0
    text = capsys.readouterr().out
    assert "Layer: layer1\n    Algorithms: ['(Implementation: 2147483648, Tactic: 9) | Inputs: (TensorInfo(DataType.FLOAT, " \
           "(3, 1), -1, -1),) | Outputs: (TensorInfo(DataType.FLOAT, (3, 1), -1, -1),)']" in text
    assert "layer0" not in text


def test_no_bad_replays_means_no_suspects(tmp_path, capsys):
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "broken.json").write_text('{"replay": {"l": {"tactic": "x"}}}')  # skipped: not an Algorithm
    assert main(["inspect", "diff-tactics", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Loaded 0 good tactic replays.", "Loaded 0 bad tactic replays.",
        "Could not determine potentially bad tactics. Try generating more tactic replay files?"]
