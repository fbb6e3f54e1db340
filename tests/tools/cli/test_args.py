import pytest

from polykit.errors import UsageError
from polykit.tools.cli.args import (
    expand_multi_values, parse_error_stats, parse_input_shapes, parse_tolerances, parse_val_ranges, rewrite_runner_flags,
)


def test_multi_value_option_is_split_into_repeated_options():
    argv = ["run", "m.onnx", "--atol", "1e-4", "logits:1e-3", "--trt"]
    assert expand_multi_values(argv) == ["run", "m.onnx", "--atol", "1e-4", "--atol", "logits:1e-3", "--trt"]


def test_multi_value_option_leaves_following_model_path_alone():
    argv = ["run", "--val-range", "x:[-1,1]", "[0,2]", "m.onnx"]
    assert expand_multi_values(argv) == ["run", "--val-range", "x:[-1,1]", "--val-range", "[0,2]", "m.onnx"]


def test_runner_flags_become_ordered_runner_options():
    out = rewrite_runner_flags(["run", "m.onnx", "--onnxrt", "--polykit"], {"--onnxrt": "onnxrt", "--polykit": "trt"})
    assert out == ["run", "m.onnx", "--runner", "onnxrt", "--runner", "trt"]


def test_tolerances_parse_default_and_per_output():
    assert parse_tolerances(["1e-4", "logits:1e-3", "in:0:2"], "--atol") == {"": 1e-4, "logits": 1e-3, "in:0": 2.0}


def test_bad_tolerance_is_usage_error():
    with pytest.raises(UsageError):
        parse_tolerances(["abc"], "--atol")


def test_val_ranges_parse_named_and_default():
    assert parse_val_ranges(["x:[-1,1]", "[0, 5]"]) == {"x": (-1.0, 1.0), "": (0.0, 5.0)}


def test_empty_val_range_is_usage_error():
    with pytest.raises(UsageError):
        parse_val_ranges(["x:[2,1]"])


def test_input_shapes_parse():
    assert parse_input_shapes(["x:[1,3,224,224]", "mask:[]"]) == {"x": (1, 3, 224, 224), "mask": ()}


def test_malformed_input_shape_is_usage_error():
    with pytest.raises(UsageError):
        parse_input_shapes(["x:1x3"])


def test_error_stats_parse_per_output():
    assert parse_error_stats(["median", "logits:max"]) == {"": "median", "logits": "max"}
