import zipfile

import numpy as np
import pytest

from polykit.errors import PolykitError
from polykit.tools.results_io import load_feeds, load_outputs, save_feeds, save_outputs

rng = np.random.default_rng(0)
FEEDS = [{"x": rng.random((2, 3), dtype=np.float32), "/enc/ids:0": np.arange(4)} for _ in range(2)]


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_feeds_round_trip(tmp_path, suffix):
    loaded = load_feeds(save_feeds(tmp_path / f"in{suffix}", FEEDS))
    assert len(loaded) == 2
    for a, b in zip(FEEDS, loaded):
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
            assert a[k].dtype == b[k].dtype


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_outputs_round_trip_per_runner(tmp_path, suffix):
    outs = {"trt": [{"y": np.ones(3, np.float32)}], "onnxrt": [{"y": np.zeros(3, np.float32)}]}
    loaded = load_outputs(save_outputs(tmp_path / f"out{suffix}", outs))
    assert list(loaded) == ["trt", "onnxrt"]
    np.testing.assert_array_equal(loaded["trt"][0]["y"], np.ones(3, np.float32))


def test_npz_holds_plain_npy_files_not_pickles(tmp_path):
    path = save_feeds(tmp_path / "in.npz", FEEDS)
    names = zipfile.ZipFile(path).namelist()
    assert all(n.endswith(".npy") for n in names)


def test_hand_written_json_feeds_default_to_float32(tmp_path):
    path = tmp_path / "in.json"
    path.write_text('{"x": [[1, 2.5]]}')
    feed = load_feeds(path)[0]
    assert feed["x"].dtype == np.float32 and feed["x"].shape == (1, 2)


def test_corrupt_npz_is_polykit_error(tmp_path):
    path = tmp_path / "bad.npz"
    path.write_bytes(b"not a zip")
    with pytest.raises(PolykitError):
        load_feeds(path)
