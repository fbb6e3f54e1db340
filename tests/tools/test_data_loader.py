import numpy as np
import pytest

from polykit.backends.base import TensorMeta
from polykit.errors import UsageError
from polykit.tools.data_loader import DataLoader, DataLoaderOptions, ScriptDataLoader

META = {"x": TensorMeta("x", "float32", (2, 3)), "i": TensorMeta("i", "int64", (4,)), "b": TensorMeta("b", "bool", (5,))}


def test_same_seed_gives_same_feeds():
    a = list(DataLoader(DataLoaderOptions(seed=7), META))[0]
    b = list(DataLoader(DataLoaderOptions(seed=7), META))[0]
    for k in META:
        np.testing.assert_array_equal(a[k], b[k])


def test_different_seed_gives_different_floats():
    a = list(DataLoader(DataLoaderOptions(seed=1), META))[0]["x"]
    b = list(DataLoader(DataLoaderOptions(seed=2), META))[0]["x"]
    assert not np.array_equal(a, b)


def test_feeds_have_input_dtypes_and_shapes():
    feed = list(DataLoader(DataLoaderOptions(), META))[0]
    assert feed["x"].dtype == np.float32 and feed["x"].shape == (2, 3)
    assert feed["i"].dtype == np.int64 and feed["b"].dtype == np.bool_


def test_val_range_bounds_values_per_input():
    opts = DataLoaderOptions(val_ranges={"x": (-3.0, -2.0), "i": (5, 9)}, iterations=3)
    for feed in DataLoader(opts, META):
        assert feed["x"].min() >= -3 and feed["x"].max() <= -2
        assert feed["i"].min() >= 5 and feed["i"].max() <= 9


def test_iterations_give_that_many_distinct_feeds():
    feeds = list(DataLoader(DataLoaderOptions(iterations=3), META))
    assert len(feeds) == 3 and not np.array_equal(feeds[0]["x"], feeds[1]["x"])


def test_input_shapes_fill_dynamic_dims():
    meta = {"x": TensorMeta("x", "float32", ("N", 4))}
    assert list(DataLoader(DataLoaderOptions(input_shapes={"x": (3, 4)}), meta))[0]["x"].shape == (3, 4)


def test_unset_dynamic_dim_defaults_to_one():
    meta = {"x": TensorMeta("x", "float32", ("N", 4))}
    assert list(DataLoader(DataLoaderOptions(), meta))[0]["x"].shape == (1, 4)


def test_val_range_for_unknown_input_is_usage_error():
    with pytest.raises(UsageError):
        list(DataLoader(DataLoaderOptions(val_ranges={"nope": (0, 1)}), META))


def test_script_loader_calls_load_data(tmp_path):
    script = tmp_path / "data.py"
    script.write_text("import numpy as np\ndef load_data():\n    for i in range(2):\n        yield {'x': np.full((2, 3), i, np.float32)}\n")
    feeds = list(ScriptDataLoader(str(script)))
    assert len(feeds) == 2 and feeds[1]["x"][0, 0] == 1


def test_script_loader_named_function(tmp_path):
    script = tmp_path / "data.py"
    script.write_text("def feeds():\n    return [{'x': 1}]\n")
    assert list(ScriptDataLoader(f"{script}:feeds")) == [{"x": 1}]


def test_script_without_function_is_usage_error(tmp_path):
    script = tmp_path / "data.py"
    script.write_text("x = 1\n")
    with pytest.raises(UsageError):
        list(ScriptDataLoader(str(script)))
