"""String tensors: the graph evaluator runs them; a plan refuses them on every target, before any
layer is chosen, with a BuildError that names the tensor (docs/CONFORMANCE.md, "Last gaps")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.evaluator import evaluate_model
from polykit.errors import BuildError


def _string_equal() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Equal", ["x", "y"], ["z"])], "strings",
                              [helper.make_tensor_value_info("x", TensorProto.STRING, [3]),
                               helper.make_tensor_value_info("y", TensorProto.STRING, [3])],
                              [helper.make_tensor_value_info("z", TensorProto.BOOL, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)


def test_the_graph_evaluator_compares_strings():
    feeds = {"x": np.array(["a", "bc", "d"], object), "y": np.array(["a", "b", "d"], object)}
    np.testing.assert_array_equal(evaluate_model(_string_equal(), feeds)["z"], [True, False, True])


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_plan_with_string_tensors_is_a_build_error_naming_the_tensor(target):
    with pytest.raises(BuildError, match="tensor 'x' holds strings") as info:
        build_plan(_string_equal(), BuilderConfig(target=target))
    assert "evaluate_model" in info.value.hint
