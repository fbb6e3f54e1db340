"""Polygraphy's lenient inputs on `polykit run`: dynamic dims default to 1 (one warning), a feed
`x` for input `X` is renamed and extra feeds are ignored (one warning each); --strict-inputs
makes each an error (exit 2)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from polykit.tools.cli.app import main
from polykit.tools.data.feeds import FeedMatcher, default_input_shapes
from polykit.errors import UsageError
from tests.cli_models import save

pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture
def dynamic_identity(tmp_path):
    """Polygraphy's run example model: Y = Identity(X), X of shape [1, 2, height, width]."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, "height", "width"])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2, "height", "width"])
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "dynamic_identity", [x], [y])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "dynamic_identity.onnx")


def _warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("[WARNING]")]


def test_run_trt_uses_1_for_dynamic_dims_with_one_warning(dynamic_identity, tmp_path, capsys):
    inputs = tmp_path / "in.npz"
    assert main(["run", dynamic_identity, "--trt", "--onnxrt", "--target", "cpu", "--save-inputs", str(inputs)]) == 0
    assert np.load(inputs)["0/X"].shape == (1, 2, 1, 1)
    [warning] = _warnings(capsys)
    assert "X:[1, 2, 1, 1]" in warning


def test_strict_inputs_keeps_a_dynamic_dim_an_error(dynamic_identity, capsys):
    assert main(["run", dynamic_identity, "--trt", "--target", "cpu", "--strict-inputs"]) == 2
    assert "dynamic shape" in capsys.readouterr().err


def test_strict_inputs_makes_the_onnxrt_data_loader_refuse_dynamic_dims(dynamic_identity, capsys):
    assert main(["run", dynamic_identity, "--onnxrt", "--strict-inputs"]) == 2
    assert "'height', 'width'" in capsys.readouterr().err


def test_feeds_named_in_another_case_and_extra_feeds_warn_once_and_run(dynamic_identity, tmp_path, capsys):
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **{"0/x": np.ones((1, 2, 5, 5), np.float32), "0/hidden": np.zeros(3, np.float32),
                       "1/x": np.ones((1, 2, 5, 5), np.float32), "1/hidden": np.zeros(3, np.float32)})
    out = tmp_path / "out.npz"
    assert main(["run", dynamic_identity, "--trt", "--onnxrt", "--target", "cpu", "--load-inputs", str(feeds),
                 "--save-outputs", str(out)]) == 0
    assert np.load(out)["trt/1/Y"].shape == (1, 2, 5, 5)  # built for the feeds' shape
    warnings = _warnings(capsys)
    assert sum("'x' -> 'X'" in w for w in warnings) == 1 and sum("'hidden'" in w for w in warnings) == 1


def test_strict_inputs_refuses_feeds_named_for_no_input(dynamic_identity, tmp_path, capsys):
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **{"0/x": np.ones((1, 2, 5, 5), np.float32)})
    assert main(["run", dynamic_identity, "--onnxrt", "--load-inputs", str(feeds), "--strict-inputs"]) == 2
    assert "'x' (the model has 'X')" in capsys.readouterr().err


def test_a_case_insensitive_match_must_be_unique():
    match = FeedMatcher(["X", "x2"], source="t")
    assert set(match({"x": 1, "X2": 2})) == {"X", "x2"}
    ambiguous = FeedMatcher(["a", "A"], source="t")
    assert set(ambiguous({"a": 1, "A": 2})) == {"a", "A"}
    assert ambiguous({"a": 1})  == {"a": 1}


def test_strict_matcher_raises_usage_error():
    with pytest.raises(UsageError, match="'Z'"):
        FeedMatcher(["X"], strict=True, source="t")({"X": 1, "Z": 2})


def test_default_shapes_leave_given_and_static_inputs_alone():
    inputs = {"a": (1, "n"), "b": (2, 3), "c": ("n", 4)}
    assert default_input_shapes(inputs, {"c": (5, 4)}) == {"a": (1, 1)}
    assert default_input_shapes(inputs, {}, [{"a": np.zeros((1, 7))}]) == {"a": (1, 7), "c": (1, 4)}
    assert default_input_shapes(inputs, {}, strict=True) == {}
