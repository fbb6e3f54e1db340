"""Polygraphy's JSON data, read and written.

tests/data/polygraphy holds files Polygraphy 0.53.6 wrote for examples/models/mlp.onnx:
`polygraphy run mlp.onnx --onnxrt --iterations 2 --save-inputs inputs.json --save-outputs
outputs.json`, and the same into the folders `inputs/` and `outputs/` (per-iteration files).
What polykit writes is checked against Polygraphy's decoder rules (polygraphy/json/serde.py,
comparator/struct.py), mirrored in `_polygraphy_decode` below.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from polykit.errors import DataFileError
from polykit.tools.cli.app import main
from polykit.tools.data.results_io import load_feeds, load_outputs, save_feeds, save_outputs
from tests.cli_models import MLP

pytestmark = pytest.mark.usefixtures("fresh_plugins")
DATA = Path(__file__).resolve().parents[2] / "data" / "polygraphy"
rng = np.random.default_rng(3)


def _polygraphy_decode(text: str):
    """json.loads with Polygraphy's Decoder semantics: each tagged object becomes its class
    (ndarray: np.load(base64 .npy, allow_pickle=False); LazyArray: its values; IterationResult
    and RunResults: their fields, checked present)."""
    def hook(pairs):
        dct = dict(pairs)
        cls = dct.pop("polygraphy_class", None)
        if cls == "ndarray":
            return np.load(io.BytesIO(base64.b64decode(dct["array"].encode(), validate=True)), allow_pickle=False)
        if cls == "LazyArray":
            return dct["values"]
        if cls == "IterationResult":
            assert set(dct) == {"outputs", "runtime", "runner_name"}
            return dct
        if cls == "RunResults":
            assert set(dct) == {"lst"} and all(len(entry) == 2 for entry in dct["lst"])
            return [tuple(entry) for entry in dct["lst"]]
        assert cls is None, cls
        return dct

    return json.loads(text, object_pairs_hook=hook)


def test_polygraphy_written_inputs_load_as_feeds_file_or_folder():
    feeds, per_iteration = load_feeds(DATA / "inputs.json"), load_feeds(DATA / "inputs")
    assert len(feeds) == len(per_iteration) == 2
    for a, b in zip(feeds, per_iteration):
        assert a["x"].dtype == np.float32 and a["x"].shape == (1, 16)
        np.testing.assert_array_equal(a["x"], b["x"])


def test_polygraphy_written_outputs_load_per_runner_file_or_folder():
    outputs, per_iteration = load_outputs(DATA / "outputs.json"), load_outputs(DATA / "outputs")
    (runner,) = outputs
    assert runner.startswith("onnxrt-runner") and len(outputs[runner]) == 2
    assert list(outputs[runner][0]) == ["logits", "probs"]
    (folder_runner,) = per_iteration
    for a, b in zip(outputs[runner], per_iteration[folder_runner]):
        np.testing.assert_array_equal(a["probs"], b["probs"])


def test_polykit_engine_matches_polygraphy_saved_onnxrt_outputs(capsys):
    assert main(["run", str(MLP), "--trt", "--target", "cpu", "--load-inputs", str(DATA / "inputs.json"),
                 "--load-outputs", str(DATA / "outputs.json"), "--atol", "1e-4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] and len(doc["comparisons"]) == 2
    assert main(["run", str(MLP), "--trt", "--target", "cpu", "--load-inputs", str(DATA / "inputs"),
                 "--load-outputs", str(DATA / "outputs"), "--atol", "1e-4"]) == 0


def test_saved_inputs_in_polygraphy_format_decode_as_polygraphy_does(tmp_path):
    feeds = [{"x": rng.random((1, 16), dtype=np.float32), "ids": np.arange(4, dtype=np.int64)} for _ in range(2)]
    path = save_feeds(tmp_path / "in.json", feeds, format="polygraphy")
    decoded = _polygraphy_decode(path.read_text())
    assert isinstance(decoded, list) and len(decoded) == 2
    for want, got in zip(feeds, decoded):
        assert list(got) == ["x", "ids"]
        np.testing.assert_array_equal(got["ids"], want["ids"])
        np.testing.assert_array_equal(got["x"], want["x"])
    for want, got in zip(feeds, load_feeds(path)):
        np.testing.assert_array_equal(got["x"], want["x"])


def test_saved_outputs_in_polygraphy_format_are_a_run_results(tmp_path):
    outputs = {"trt": [{"y": rng.random(3, dtype=np.float32)}], "onnxrt": [{"y": rng.random(3, dtype=np.float32)}]}
    path = save_outputs(tmp_path / "out.json", outputs, format="polygraphy", times={"trt": [0.25]})
    runs = _polygraphy_decode(path.read_text())
    assert [name for name, _ in runs] == ["trt", "onnxrt"]
    (trt,), (onnxrt,) = (iterations for _, iterations in runs)
    assert trt["runner_name"] == "trt" and trt["runtime"] == 0.25 and onnxrt["runtime"] is None
    np.testing.assert_array_equal(trt["outputs"]["y"], outputs["trt"][0]["y"])
    np.testing.assert_array_equal(load_outputs(path)["onnxrt"][0]["y"], outputs["onnxrt"][0]["y"])


def test_polygraphy_format_without_a_suffix_writes_a_folder_of_iterations(tmp_path):
    feeds = [{"x": rng.random(2, dtype=np.float32)} for _ in range(3)]
    outputs = {"trt": [{"y": f["x"] * 2} for f in feeds]}
    save_feeds(tmp_path / "inputs", feeds, format="polygraphy")
    save_outputs(tmp_path / "outputs", outputs, format="polygraphy")
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == [f"{i:010d}.json" for i in range(3)]
    assert len(_polygraphy_decode((tmp_path / "outputs" / "0000000002.json").read_text())[0][1]) == 1
    assert set(_polygraphy_decode((tmp_path / "inputs" / "0000000001.json").read_text())) == {"x"}
    np.testing.assert_array_equal(load_outputs(tmp_path / "outputs")["trt"][2]["y"], outputs["trt"][2]["y"])
    with pytest.raises(DataFileError, match="not an empty folder"):
        save_feeds(tmp_path / "inputs", feeds, format="polygraphy")


def test_bfloat16_is_written_as_float32_which_polygraphy_can_read(tmp_path):
    h = np.array([1.5, -2.25], ml_dtypes.bfloat16)
    path = save_outputs(tmp_path / "out.json", {"trt": [{"h": h}]}, format="polygraphy")
    got = _polygraphy_decode(path.read_text())[0][1][0]["outputs"]["h"]
    assert got.dtype == np.float32 and got.tolist() == [1.5, -2.25]


def test_run_saves_polygraphy_format(tmp_path, capsys):
    assert main(["run", str(MLP), "--onnxrt", "--save-inputs", str(tmp_path / "in.json"), "--save-outputs",
                 str(tmp_path / "out.json"), "--format", "polygraphy"]) == 0
    runs = _polygraphy_decode((tmp_path / "out.json").read_text())
    assert runs[0][0] == "onnxrt" and set(runs[0][1][0]["outputs"]) == {"logits", "probs"}
    assert _polygraphy_decode((tmp_path / "in.json").read_text())[0]["x"].shape == (1, 16)


def test_an_unknown_format_is_a_usage_error(tmp_path, capsys):
    assert main(["run", str(MLP), "--onnxrt", "--save-outputs", str(tmp_path / "o.json"), "--format", "onnx"]) == 2
    assert "--format 'onnx' is not one of polykit, polygraphy" in capsys.readouterr().err


def test_the_oldest_polygraphy_arrays_an_npz_in_json_decode(tmp_path):
    x = rng.random((2, 2), dtype=np.float32)
    buf = io.BytesIO()
    np.savez(buf, x)
    feeds = [{"x": {"array": base64.b64encode(buf.getvalue()).decode(), "__polygraphy_encoded_ndarray":
                    "polygraphy_serialized_json_type"}}]
    (tmp_path / "old.json").write_text(json.dumps(feeds))
    np.testing.assert_array_equal(load_feeds(tmp_path / "old.json")[0]["x"], x)


def test_a_folder_without_iteration_files_is_a_data_file_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileError, match="empty: the folder holds no per-iteration .json files"):
        load_feeds(tmp_path / "empty")
