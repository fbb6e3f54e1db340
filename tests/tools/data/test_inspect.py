"""`polykit inspect data FILE`: per tensor statistics of saved inputs and outputs (polykit's,
Polygraphy's, plain .npz, .npy), and data readers from plugins."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polykit.tools.cli.app import main
from polykit.tools.data.inspect import describe_data, tensor_stats
from polykit.tools.data.results_io import save_feeds, save_outputs

pytestmark = pytest.mark.usefixtures("fresh_plugins")
DATA = Path(__file__).resolve().parents[2] / "data" / "polygraphy"
rng = np.random.default_rng(11)

CACHE_READER_PLUGIN = '''
from pathlib import Path

import numpy as np

from polykit.plugins import hookimpl
from polykit.tools.data.dataset import DataGroup, DataReaderSpec, DataSet


def read_ranges(path):
    """A made-up calibration cache: one `tensor: amax` line per tensor."""
    lines = [line.split(":") for line in Path(path).read_text().splitlines() if ":" in line]
    return DataSet("calibration cache", (DataGroup({n.strip(): np.array(float(v)) for n, v in lines}),))


@hookimpl
def polykit_data_readers():
    return [DataReaderSpec("ranges", lambda p: p.suffix == ".ranges", read_ranges, "tensor: amax lines")]
'''


def _inspect_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["inspect", "data", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_tensor_stats_cover_the_finite_values_and_count_nan_and_inf():
    arr = rng.normal(size=(4, 50)).astype(np.float32)
    arr[0, :3] = [np.nan, np.inf, -np.inf]
    stats = tensor_stats("t", arr)
    finite = arr[np.isfinite(arr)].astype(np.float64)
    assert (stats.nan, stats.inf) == (1, 2) and stats.shape == (4, 50) and stats.dtype == "float32"
    assert stats.min == finite.min() and stats.max == finite.max()
    assert stats.mean == pytest.approx(finite.mean()) and stats.std == pytest.approx(finite.std())
    assert sum(stats.counts) == finite.size and len(stats.edges) == len(stats.counts) + 1


def test_saved_feeds_show_every_iteration(tmp_path, capsys):
    feeds = [{"x": rng.random((2, 3), dtype=np.float32), "ids": np.arange(5, dtype=np.int64) * (i + 1)} for i in range(3)]
    doc = _inspect_json(capsys, str(save_feeds(tmp_path / "in.npz", feeds)))
    assert doc["kind"] == "feeds" and doc["reader"] == "saved"
    assert [g["iteration"] for g in doc["groups"]] == [0, 1, 2]
    ids = next(t for t in doc["groups"][2]["tensors"] if t["name"] == "ids")
    assert ids["dtype"] == "int64" and ids["max"] == 12 and ids["mean"] == 6


def test_polygraphy_outputs_folder_shows_each_runner_and_iteration(capsys):
    doc = _inspect_json(capsys, str(DATA / "outputs"))
    assert doc["kind"] == "outputs" and len(doc["groups"]) == 2
    assert all(g["runner"].startswith("onnxrt-runner") for g in doc["groups"])
    probs = next(t for t in doc["groups"][0]["tensors"] if t["name"] == "probs")
    assert 0 < probs["min"] <= probs["max"] < 1 and probs["shape"] == [1, 10]


def test_text_report_has_a_table_and_a_histogram_per_tensor(tmp_path, capsys):
    np.savez(tmp_path / "plain.npz", act=rng.normal(size=1000).astype(np.float32))
    capsys.readouterr()
    assert main(["inspect", "data", str(tmp_path / "plain.npz")]) == 0
    out = capsys.readouterr().out
    assert "arrays" in out and "1 group(s), 1 tensor(s)" in out
    bars = [line for line in out.splitlines() if line.startswith("  [")]
    assert len(bars) == 10 and sum(int(line.split()[-1]) for line in bars) == 1000


def test_show_values_prints_numpys_text_bounded(tmp_path, capsys):
    np.save(tmp_path / "big.npy", np.arange(1000, dtype=np.int32))
    capsys.readouterr()
    assert main(["inspect", "data", str(tmp_path / "big.npy"), "--show-values"]) == 0
    out = capsys.readouterr().out
    assert "[  0   1   2 ... 997 998 999]" in out
    doc = _inspect_json(capsys, str(tmp_path / "big.npy"), "--show-values")
    assert doc["groups"][0]["tensors"][0]["values"] == "[  0   1   2 ... 997 998 999]"


def test_an_npy_with_only_nan_has_no_statistics_but_counts(tmp_path, capsys):
    np.save(tmp_path / "nan.npy", np.full(3, np.nan, np.float16))
    t = _inspect_json(capsys, str(tmp_path / "nan.npy"))["groups"][0]["tensors"][0]
    assert t["nan"] == 3 and t["min"] is None and t["counts"] == []


def test_bfloat16_arrays_have_statistics(tmp_path):
    import ml_dtypes

    path = save_outputs(tmp_path / "out.json", {"trt": [{"h": np.array([1.5, -2.0, np.inf], ml_dtypes.bfloat16)}]},
                        "polykit")
    t = describe_data(path)["groups"][0]["tensors"][0]
    assert t["dtype"] == "bfloat16" and (t["min"], t["max"], t["inf"]) == (-2.0, 1.5, 1)


def test_saved_outputs_through_describe_data(tmp_path):
    path = save_outputs(tmp_path / "out.json", {"trt": [{"y": np.array([True, False, True])}]})
    (group,) = describe_data(path)["groups"]
    assert group["runner"] == "trt" and group["tensors"][0]["mean"] == pytest.approx(2 / 3)


def test_a_plugin_reader_adds_a_format_without_touching_the_command(tmp_path, capsys, monkeypatch):
    (tmp_path / "polykit_ranges_reader.py").write_text(CACHE_READER_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("POLYKIT_PLUGINS", "polykit_ranges_reader")
    (tmp_path / "calib.ranges").write_text("input: 2.5\n/conv1/Conv_output_0: 11.25\n")
    doc = _inspect_json(capsys, str(tmp_path / "calib.ranges"))
    assert doc["reader"] == "ranges" and doc["kind"] == "calibration cache"
    assert [(t["name"], t["max"]) for t in doc["groups"][0]["tensors"]] == [("input", 2.5), ("/conv1/Conv_output_0", 11.25)]


def test_reader_option_forces_a_reader(tmp_path, capsys):
    with open(tmp_path / "x.bin", "wb") as fh:
        np.save(fh, np.ones(3, np.float32))
    doc = _inspect_json(capsys, str(tmp_path / "x.bin"), "--reader", "npy")
    assert doc["groups"][0]["tensors"][0]["name"] == "x"


@pytest.mark.parametrize("name, content, message", [
    ("notes.txt", "hello", "no data reader recognizes the file"),
    ("missing.npz", None, "missing.npz' does not exist"),
    ("words.npy", np.array(["a", "b"]), "has dtype <U1, which has no statistics"),
    ("raw.npy", np.zeros(2, "V2"), "has dtype |V2, which has no statistics"),
])
def test_unreadable_data_is_exit_2_naming_the_file(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        np.save(path, content)
    assert main(["inspect", "data", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_reader_is_a_usage_error(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones(2))
    assert main(["inspect", "data", str(tmp_path / "x.npy"), "--reader", "hdf5"]) == 2
    assert "unknown data reader 'hdf5'" in capsys.readouterr().err


def _cache(tmp_path):
    from polykit.compiler.builder.calibration_cache import CalibrationCache, write_calibration_cache

    path = tmp_path / "model.cache"
    write_calibration_cache(path, CalibrationCache("entropy", {"x": 0.0125, "conv1: out": 0.25, "relu": 0.0125}))
    return path


def test_a_calibration_cache_shows_scale_and_threshold_per_tensor_widest_first(tmp_path, capsys):
    doc = _inspect_json(capsys, str(_cache(tmp_path)))
    assert doc["reader"] == "calibration-cache" and doc["calibrator"] == "entropy"
    assert [r["tensor"] for r in doc["rows"]] == ["conv1: out", "relu", "x"]  # by scale, then name
    top = doc["rows"][0]
    assert top["scale"] == float(np.float32(0.25)) and top["threshold"] == pytest.approx(127 * 0.25)
    assert float.fromhex(top["scale_hex"]) == top["scale"]


def test_a_calibration_cache_prints_as_one_table(tmp_path, capsys):
    assert main(["inspect", "data", str(_cache(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "calibration cache" in out and "calibrator entropy" in out and "31.75" in out  # 127 * 0.25


def test_a_damaged_calibration_cache_is_a_data_error_naming_the_line(tmp_path, capsys):
    path = _cache(tmp_path)
    path.write_text(path.read_text() + "bad line\n")
    assert main(["inspect", "data", str(path)]) == 2
    assert "model.cache:5" in capsys.readouterr().err
