"""polykit.tools.data.formats: a data file's format is told once, from its path and first bytes
(then, for JSON, its structure), and exactly one reader reads it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polykit.errors import DataFileError
from polykit.tools.data import formats, npz_format, polygraphy_json, polykit_json
from polykit.tools.data.results_io import save_feeds, save_outputs

DATA = Path(__file__).resolve().parents[2] / "data" / "polygraphy"
FEEDS = [{"x": np.arange(6, dtype=np.float32).reshape(2, 3)}]


@pytest.mark.parametrize("path, fmt, kind", [
    (DATA / "inputs.json", "polygraphy-json", "feeds"),
    (DATA / "outputs.json", "polygraphy-json", "outputs"),
    (DATA / "inputs", "polygraphy-folder", "feeds"),
    (DATA / "outputs", "polygraphy-folder", "outputs"),
])
def test_polygraphy_files_and_folders_are_told_apart_from_polykits(path, fmt, kind):
    got_fmt, data = formats.read_saved(path)
    assert (got_fmt, data.kind) == (fmt, kind) and len(data.groups) == 2


def test_polykit_files_are_read_by_their_own_reader(tmp_path):
    assert formats.read_saved(save_feeds(tmp_path / "in.npz", FEEDS))[0] == "npz"
    assert formats.read_saved(save_feeds(tmp_path / "in.json", FEEDS, "polykit"))[0] == "polykit-json"
    fmt, data = formats.read_saved(save_outputs(tmp_path / "out.json", {"trt": FEEDS}, "polykit"))
    assert (fmt, data.kind, data.groups[0].runner) == ("polykit-json", "outputs", "trt")


def test_a_json_path_gets_polygraphys_format_by_default(tmp_path):
    fmt, data = formats.read_saved(save_feeds(tmp_path / "in.json", FEEDS))
    assert (fmt, data.kind) == ("polygraphy-json", "feeds")
    fmt, data = formats.read_saved(save_outputs(tmp_path / "out.json", {"trt": FEEDS}))
    assert (fmt, data.kind, data.groups[0].runner) == ("polygraphy-json", "outputs", "trt")
    assert formats.read_saved(save_feeds(tmp_path / "in.npz", FEEDS))[0] == "npz"


def test_the_first_bytes_win_over_the_suffix(tmp_path):
    npz, text = tmp_path / "in.json", tmp_path / "in.txt"
    npz.write_bytes(save_feeds(tmp_path / "a.npz", FEEDS).read_bytes())
    text.write_text(json.dumps([{"x": [1.0, 2.0]}]))
    assert formats.read_saved(npz)[0] == "npz"
    assert formats.read_saved(text)[0] == "polykit-json"


@pytest.mark.parametrize("path", [DATA / "inputs.json", DATA / "outputs.json"])
def test_a_json_file_goes_to_exactly_one_reader(monkeypatch, path):
    def refuse(doc, where):
        raise AssertionError("polykit's JSON reader was asked too")

    monkeypatch.setattr(polykit_json, "from_document", refuse)
    monkeypatch.setattr(npz_format, "read", refuse)
    assert formats.read_saved(path)[0] == "polygraphy-json"


def test_polykits_json_never_reaches_polygraphys_reader(monkeypatch, tmp_path):
    def refuse(doc, where):
        raise AssertionError("Polygraphy's reader was asked too")

    monkeypatch.setattr(polygraphy_json, "from_document", refuse)
    assert formats.read_saved(save_feeds(tmp_path / "in.json", FEEDS, "polykit"))[0] == "polykit-json"


def test_a_polygraphy_array_among_polykits_says_the_file_mixes_formats(tmp_path):
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps([{"x": [1.0], "y": polygraphy_json.encode_array(np.ones(2, np.float32))}]))
    with pytest.raises(DataFileError, match=r"tensor 'y': an array must be (?s:.*)mixes Polygraphy's arrays"):
        formats.read_saved(path)


def test_a_folder_mixing_inputs_and_outputs_names_the_file(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / polygraphy_json.iteration_file_name(0)).write_text(json.dumps(polygraphy_json.encode_feeds(FEEDS)[0]))
    (folder / polygraphy_json.iteration_file_name(1)).write_text(
        json.dumps(polygraphy_json.encode_run_results({"trt": FEEDS})))
    with pytest.raises(DataFileError, match=r"0000000001.json: the file holds saved outputs .*first file saved feeds"):
        formats.read_saved(folder)


def test_polygraphy_float64_outputs_keep_their_dtype(tmp_path):
    y = np.linspace(0, 1, 5)
    path = save_outputs(tmp_path / "out.json", {"onnxrt": [{"y": y}]}, format="polygraphy")
    (got,) = formats.read_saved(path)[1].groups
    assert got.tensors["y"].dtype == np.float64
    np.testing.assert_array_equal(got.tensors["y"], y)
