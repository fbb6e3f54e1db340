"""DepthToSpace and SpaceToDepth reference kernels, checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.errors import NodeAttributeError, ShapeError
from polykit.compiler.ops.references import run_reference

RNG = np.random.default_rng(2)


def run(op, x, **attrs):
    return run_reference(Node(op, ["x"], ["y"], attrs, "n"), [x])[0]


def ort(op, x, opset=13, **attrs):
    import onnx
    import onnxruntime
    from onnx import helper

    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [onnx.ValueInfoProto(name="y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_matches_onnxruntime(mode):
    x = RNG.standard_normal((2, 12, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run("DepthToSpace", x, blocksize=2, mode=mode),
                                  ort("DepthToSpace", x, blocksize=2, mode=mode))


def test_space_to_depth_matches_onnxruntime():
    x = RNG.standard_normal((2, 3, 6, 9)).astype(np.float32)
    np.testing.assert_array_equal(run("SpaceToDepth", x, blocksize=3), ort("SpaceToDepth", x, blocksize=3))


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_inverts_depth_to_space_in_the_same_mode(mode):
    x = RNG.standard_normal((1, 8, 3, 5)).astype(np.float32)
    y = run("DepthToSpace", x, blocksize=2, mode=mode)
    assert y.shape == (1, 2, 6, 10)
    np.testing.assert_array_equal(run("SpaceToDepth", y, blocksize=2, mode=mode), x)


def test_depth_to_space_rejects_channels_not_divisible_by_the_block_area():
    with pytest.raises(ShapeError, match="divisible"):
        run("DepthToSpace", np.zeros((1, 6, 2, 2), np.float32), blocksize=2)


def test_space_to_depth_rejects_an_unknown_mode():
    with pytest.raises(NodeAttributeError, match="mode"):
        run("SpaceToDepth", np.zeros((1, 1, 2, 2), np.float32), blocksize=2, mode="XYZ")
