"""Files Polygraphy writes are read by polykit, and polykit writes Polygraphy's JSON structure,
without Polygraphy installed: the fixtures in tests/data/polygraphy_examples/written_by_polygraphy
were written by the real Polygraphy 0.53.6 (its README says how)."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polykit.tools.cli.app import main
from polykit.tools.data import results_io
from tests.cli_models import fresh_plugins  # noqa: F401  (a pytest fixture)

DATA = Path(__file__).resolve().parents[1] / "data" / "polygraphy_examples"
WRITTEN = DATA / "written_by_polygraphy"
MODEL = DATA / "cli" / "run" / "02_comparing_across_runs" / "identity.onnx"


@pytest.fixture
def folder(tmp_path, monkeypatch, fresh_plugins):
    monkeypatch.setattr("polykit.runtime.target.default_target", lambda: "cpu")
    for path in (*WRITTEN.glob("*.json"), MODEL):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _skeleton(doc: Any) -> Any:
    """The JSON's structure: keys, list lengths and polygraphy_class markers; other values by type,
    runner names and timings left out, arrays as (dtype, shape) of the .npy they hold."""
    if isinstance(doc, dict):
        if doc.get("polygraphy_class") == "ndarray":
            array = np.load(io.BytesIO(base64.b64decode(doc["array"])), allow_pickle=False)
            return ("ndarray", str(array.dtype), array.shape)
        return {k: _skeleton(v) for k, v in doc.items() if k not in ("runner_name", "runtime")}
    if isinstance(doc, list):
        return [_skeleton(v) for v in doc if not isinstance(v, str)]  # the strings in lists: runner names
    return doc if isinstance(doc, str) else type(doc).__name__


def test_polykit_reads_polygraphys_inputs_and_outputs(folder):
    feeds = results_io.load_feeds(folder / "inputs.json")
    outputs = results_io.load_outputs(folder / "outputs.json")
    assert len(feeds) == 2 and feeds[0]["x"].shape == (1, 1, 2, 2)
    [(runner, iterations)] = outputs.items()
    assert runner.startswith("onnxrt-runner-N0") and len(iterations) == 2
    assert all(np.array_equal(f["x"], o["y"]) for f, o in zip(feeds, iterations))  # an identity model
    assert main(["run", "identity.onnx", "--trt", "--onnxrt", "--load-inputs", "inputs.json",
                 "--load-outputs", "outputs.json"]) == 0


def test_polykit_turns_polygraphys_layerwise_outputs_into_inputs(folder):
    assert main(["data", "to-input", "inputs.json", "layerwise_outputs.json", "-o", "layerwise_inputs.json"]) == 0
    [feed] = results_io.load_feeds(folder / "layerwise_inputs.json")[:1]
    assert sorted(feed) == ["x", "y"]


def test_polykit_writes_polygraphys_structure(folder):
    assert main(["run", "identity.onnx", "--onnxrt", "--iterations", "2", "--save-inputs", "pk_inputs.json",
                 "--save-outputs", "pk_outputs.json"]) == 0
    for ours, theirs in (("pk_inputs.json", "inputs.json"), ("pk_outputs.json", "outputs.json")):
        assert _skeleton(json.loads((folder / ours).read_text())) == _skeleton(json.loads((folder / theirs).read_text()))
