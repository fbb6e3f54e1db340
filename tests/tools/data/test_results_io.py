import zipfile

import numpy as np
import pytest

from polykit.errors import DataFileError, PolykitError
from polykit.tools.data.results_io import (load_data, load_feeds, load_outputs, load_reference_outputs, save_feeds,
                                      save_outputs)

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


def _polygraphy_array(arr, legacy=False):
    """An array as Polygraphy's JSON encoder writes it (polygraphy/json/serde.py)."""
    import base64
    import io

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    data = {"array": base64.b64encode(buf.getvalue()).decode()}
    if legacy:
        data["__polygraphy_encoded_ndarray"] = "polygraphy_serialized_json_type"
    else:
        data["polygraphy_class"] = "ndarray"
    return data


def test_polygraphy_saved_inputs_load_as_feeds(tmp_path):
    import json

    x = rng.random((2, 3), dtype=np.float32)
    ids = np.arange(4, dtype=np.int64)
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps([{"x": _polygraphy_array(x), "ids": _polygraphy_array(ids, legacy=True)}]))
    feeds = load_feeds(path)
    np.testing.assert_array_equal(feeds[0]["x"], x)
    assert feeds[0]["ids"].dtype == np.int64


def test_polygraphy_run_results_load_as_outputs(tmp_path):
    import json

    y = rng.random((3,), dtype=np.float32)
    lazy = {"values": _polygraphy_array(y), "polygraphy_class": "LazyArray"}
    iteration = {"outputs": {"y": lazy}, "runtime": 0.1, "runner_name": "trt-runner", "polygraphy_class": "IterationResult"}
    doc = {"lst": [["trt-runner", [iteration]], ["onnxrt-runner", [iteration]]], "polygraphy_class": "RunResults"}
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(doc))
    outs = load_outputs(path)
    assert list(outs) == ["trt-runner", "onnxrt-runner"]
    np.testing.assert_array_equal(outs["trt-runner"][0]["y"], y)


def test_a_truncated_npz_is_a_data_file_error_naming_the_file(tmp_path):
    data = save_feeds(tmp_path / "in.npz", FEEDS).read_bytes()
    path = tmp_path / "cut.npz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFileError, match="cut.npz: .*cannot be read"):
        load_feeds(path)


def test_a_lone_npy_is_named_as_such(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.ones(3, np.float32))
    with pytest.raises(DataFileError, match="x.npy: the file is a single .npy array, not an .npz archive"):
        load_feeds(path)


def test_a_text_file_named_npz_is_not_a_zip_archive(tmp_path):
    path = tmp_path / "notes.npz"
    path.write_text("hello\n")
    with pytest.raises(DataFileError, match=r"notes.npz: the file is not an .npz \(zip\) archive"):
        load_feeds(path)


def test_an_object_array_in_an_npz_is_refused_not_unpickled(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, **{"0/x": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(DataFileError, match=r"obj.npz: array '0/x': the array holds Python objects .* never unpickles"):
        load_feeds(path)


@pytest.mark.parametrize("text, message", [
    ('[{"x": [[1, 2], [3]]}]', r"feed 0: tensor 'x': the data is not a rectangular array"),
    ('[{"x": {"dtype": "object", "data": [1]}}]', r"feed 0: tensor 'x': an array must be .*dtype 'object'"),
    ('[{"x": ["a", "b"]}]', r"feed 0: tensor 'x': the data is not an array of numbers"),
    ('[[1, 2]]', r"feed 0: a feed must be an object"),
    ('{"x": {"polygraphy_class": "Tensor", "tensor": "AAAA"}}', r"tensor 'x': the file holds a torch tensor .*pickle"),
    ('{"x": {"polygraphy_class": "FormattedArray", "array": 1}}', r"Polygraphy class 'FormattedArray' is not one"),
    ('[{"x": {"polygraphy_class": "ndarray", "array": "AAAA"}}]', r"a Polygraphy array does not decode"),
    ('"just text"', r"feeds must be a list"),
    ('[{"x": ', r"is not valid JSON"),
])
def test_malformed_json_feeds_are_data_file_errors_naming_the_entry(tmp_path, text, message):
    path = tmp_path / "in.json"
    path.write_text(text)
    with pytest.raises(DataFileError, match=message):
        load_feeds(path)


def test_outputs_json_given_as_feeds_says_so(tmp_path):
    path = save_outputs(tmp_path / "out.json", {"trt": [{"y": np.ones(2, np.float32)}]})
    with pytest.raises(DataFileError, match="give it to --load-outputs"):
        load_feeds(path)


def test_an_npz_member_whose_header_claims_more_data_than_it_has_is_refused_before_allocating(tmp_path):
    import io

    buf = io.BytesIO()
    np.save(buf, np.zeros(4, np.float32))
    raw = buf.getvalue().replace(b"(4,)", b"(1099511627776,)".ljust(4))
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("0/x.npy", raw)
    with pytest.raises(DataFileError, match=r"huge.npz: array '0/x': the .npy header says float32\[1099511627776\]"):
        load_feeds(path)


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_saving_into_a_missing_folder_names_the_file(tmp_path, suffix):
    with pytest.raises(DataFileError, match=f"nodir/in{suffix}: cannot write the file: No such file"):
        save_feeds(tmp_path / "nodir" / f"in{suffix}", FEEDS)


def test_scalar_bfloat16_and_bool_outputs_round_trip_through_json(tmp_path):
    import ml_dtypes

    outs = {"trt": [{"s": np.float32(1.5), "b": np.array([True, False]), "h": np.array([1.5], ml_dtypes.bfloat16)}]}
    back = load_outputs(save_outputs(tmp_path / "o.json", outs, "polykit"))["trt"][0]
    assert back["s"].shape == () and back["b"].dtype == np.bool_ and back["h"].dtype == ml_dtypes.bfloat16
    exact = load_outputs(save_outputs(tmp_path / "p.json", outs))["trt"][0]  # Polygraphy's: bfloat16 as float32
    assert exact["s"].shape == () and exact["b"].dtype == np.bool_ and exact["h"].dtype == np.float32


def test_a_plain_name_keyed_npz_is_one_feed(tmp_path):
    x, ids = rng.random((1, 16), dtype=np.float32), np.arange(3)
    np.savez(tmp_path / "in.npz", x=x, **{"/enc/ids:0": ids})
    (feed,) = load_feeds(tmp_path / "in.npz")
    np.testing.assert_array_equal(feed["x"], x)
    np.testing.assert_array_equal(feed["/enc/ids:0"], ids)


def test_a_plain_name_keyed_npz_is_the_outputs_of_one_runner_named_after_the_file(tmp_path):
    y = rng.random(10, dtype=np.float32)
    np.savez(tmp_path / "golden.npz", logits=y)
    assert list(load_outputs(tmp_path / "golden.npz")) == ["golden"]
    np.testing.assert_array_equal(load_outputs(tmp_path / "golden.npz")["golden"][0]["logits"], y)


def test_saved_outputs_given_as_inputs_and_the_reverse_say_so(tmp_path):
    outs = save_outputs(tmp_path / "out.npz", {"trt": [{"y": np.ones(2, np.float32)}]})
    feeds = save_feeds(tmp_path / "in.npz", FEEDS)
    with pytest.raises(DataFileError, match=r"out.npz: the archive holds saved outputs (?s:.*) give it to --load-outputs"):
        load_feeds(outs)
    with pytest.raises(DataFileError, match=r"in.npz: the archive holds saved inputs (?s:.*) give it to --load-inputs"):
        load_outputs(feeds)


def test_an_empty_npz_is_a_data_file_error(tmp_path):
    np.savez(tmp_path / "empty.npz")
    with pytest.raises(DataFileError, match="empty.npz: the archive holds no arrays"):
        load_feeds(tmp_path / "empty.npz")


def test_load_data_tells_feeds_outputs_and_plain_arrays_apart(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    assert load_data(save_feeds(tmp_path / "in.npz", FEEDS))[0] == "feeds"
    assert load_data(save_outputs(tmp_path / "o.json", {"trt": [{"y": np.ones(2, np.float32)}]}))[0] == "outputs"
    kind, arrays = load_data(tmp_path / "plain.npz")
    assert kind == "arrays" and list(arrays) == ["a"]


def test_reference_outputs_of_several_files_keep_every_runner(tmp_path):
    a = save_outputs(tmp_path / "a.npz", {"trt": [{"y": np.ones(2, np.float32)}]})
    b = save_outputs(tmp_path / "b.npz", {"trt": [{"y": np.zeros(2, np.float32)}]})
    reference = load_reference_outputs([a, b])
    assert list(reference) == ["trt", "trt-1"]
    np.testing.assert_array_equal(reference["trt-1"][0]["y"], np.zeros(2, np.float32))


def test_run_takes_plain_npz_inputs_and_outputs(tmp_path, capsys):
    from polykit.tools.cli.app import main
    from tests.cli_models import MLP

    assert main(["run", str(MLP), "--onnxrt", "--save-inputs", str(tmp_path / "in.npz"),
                 "--save-outputs", str(tmp_path / "ref.npz")]) == 0
    feed, ref = load_feeds(tmp_path / "in.npz")[0], load_outputs(tmp_path / "ref.npz")["onnxrt"][0]
    np.savez(tmp_path / "plain_in.npz", **feed)
    np.savez(tmp_path / "golden.npz", **ref)
    capsys.readouterr()
    assert main(["run", str(MLP), "--trt", "--target", "cpu", "--load-inputs", str(tmp_path / "plain_in.npz"),
                 "--load-outputs", str(tmp_path / "golden.npz"), "--atol", "1e-4"]) == 0
    out = capsys.readouterr().out
    assert "trt vs golden (reference)" in out and "PASSED" in out
