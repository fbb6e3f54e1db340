"""Polygraphy's spellings on polykit's commands (docs/POLYGRAPHY.md): each form as a Polygraphy
user writes it, on the cpu target."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polykit.tools.cli.app import main
from polykit.tools.data import polygraphy_json
from tests.cli_models import ADD_MUL

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def test_json_data_is_saved_in_polygraphys_format_and_read_back(tmp_path):
    inputs, outputs = tmp_path / "inputs.json", tmp_path / "run_0_outputs.json"
    assert main(["run", str(ADD_MUL), "--onnxrt", "--save-inputs", str(inputs), "--save-outputs", str(outputs)]) == 0
    feeds, results = json.loads(inputs.read_text()), json.loads(outputs.read_text())
    assert polygraphy_json.polygraphy_class(next(iter(feeds[0].values()))) == "ndarray"
    assert results["polygraphy_class"] == "RunResults" and results["lst"][0][0] == "onnxrt"
    assert main(["run", str(ADD_MUL), "--onnxrt", "--load-inputs", str(inputs), "--load-outputs", str(outputs)]) == 0


def test_format_polykit_keeps_polykits_json(tmp_path):
    inputs = tmp_path / "inputs.json"
    assert main(["run", str(ADD_MUL), "--onnxrt", "--save-inputs", str(inputs), "--format", "polykit"]) == 0
    feed = json.loads(inputs.read_text())[0]
    assert all(set(v) == {"dtype", "data"} for v in feed.values())
