import numpy as np
import pytest

from polykit.backends.base import TensorMeta
from polykit.errors import UsageError
from polykit.tools.data.loaders import DataLoader, DataLoaderOptions, ScriptDataLoader

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


@pytest.mark.parametrize("options, message", [
    (dict(seed=-1), r"--seed -1 is not a non-negative integer"),
    (dict(iterations=0), r"--iterations 0 is less than 1"),
    (dict(val_ranges={"x": (2.0, 1.0)}), r"--val-range x:\[2.0, 1.0\] is not a finite range"),
    (dict(val_ranges={"": (0.0, float("inf"))}), r"--val-range \[0.0, inf\] is not a finite range"),
    (dict(input_shapes={"x": (-1, 3)}), r"--input-shapes x:\[-1, 3\] has a negative dim"),
])
def test_impossible_options_are_usage_errors_naming_the_value(options, message):
    with pytest.raises(UsageError, match=message):
        DataLoaderOptions(**options)


def test_an_int_range_without_integers_is_a_usage_error():
    with pytest.raises(UsageError, match=r"value range \[0.2, 0.8\] holds no int64 value for input 'i'"):
        list(DataLoader(DataLoaderOptions(val_ranges={"i": (0.2, 0.8)}), META))


def test_bfloat16_inputs_get_random_floats():
    import ml_dtypes

    feed = next(iter(DataLoader(DataLoaderOptions(), {"h": TensorMeta("h", ml_dtypes.bfloat16, (3,))})))
    assert feed["h"].dtype == ml_dtypes.bfloat16 and np.all((feed["h"] >= 0) & (feed["h"] <= 1))


@pytest.mark.parametrize("body, line, error", [
    ("import numpy as np\n\ndef load_data():\n    raise ValueError('boom')\n", 4, "ValueError: boom"),
    ("def load_data():\n    yield {'x': 1}\n    yield 1 / 0\n", 3, "ZeroDivisionError: division by zero"),
    ("x = [\n", 1, "SyntaxError"),
    ("import no_such_module_here\n", 1, "ModuleNotFoundError"),
    ("def load_data():\n    return 5\n", None, "returned a int, not an iterable"),
])
def test_a_script_that_raises_is_a_usage_error_naming_script_line_and_exception(tmp_path, body, line, error):
    script = tmp_path / "loader.py"
    script.write_text(body)
    with pytest.raises(UsageError) as info:
        list(ScriptDataLoader(str(script)))
    assert error in str(info.value)
    if line is not None:
        assert info.value.where == f"{script}:{line}"


def test_a_missing_script_is_named(tmp_path):
    with pytest.raises(UsageError, match="data loader script .*nope.py' does not exist"):
        list(ScriptDataLoader(str(tmp_path / "nope.py")))
