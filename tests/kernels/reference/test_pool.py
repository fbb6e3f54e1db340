"""Pooling, LRN and MaxUnpool reference kernels, checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.errors import NodeAttributeError
from polykit.compiler.ops.references import run_reference

RNG = np.random.default_rng(3)


def run(op, inputs, n_out=1, **attrs):
    node = Node(op, [f"x{i}" if v is not None else "" for i, v in enumerate(inputs)],
                [f"y{i}" for i in range(n_out)], attrs, "n")
    return run_reference(node, list(inputs))


def ort(op, inputs, n_out=1, opset=21, **attrs):
    import onnx
    import onnxruntime
    from onnx import helper

    from polykit.compiler.ir import dtypes

    names = [f"x{i}" if v is not None else "" for i, v in enumerate(inputs)]
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, dtypes.to_onnx(v.dtype), v.shape) for n, v in zip(names, inputs) if n],
        [onnx.ValueInfoProto(name=o) for o in node.output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: v for n, v in zip(names, inputs) if n})


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def assert_same(ours, theirs, rtol=1e-5, atol=1e-6):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


WINDOWS = {
    "plain": ((2, 3, 8, 7), {"kernel_shape": [2, 2]}),
    "strided_padded": ((1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 2]}),
    "ceil_mode": ((1, 2, 8, 7), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    "ceil_mode_padded": ((1, 1, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    "dilated": ((1, 2, 10, 10), {"kernel_shape": [3, 2], "dilations": [2, 3], "pads": [1, 1, 1, 1]}),
    "same_upper": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 2, 7, 8), {"kernel_shape": [2, 3], "strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    "valid": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    "1d": ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    "3d": ((1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2]}),
}


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_max_pool_matches_onnxruntime(name):
    shape, attrs = WINDOWS[name]
    x = rand(*shape)
    assert_same(run("MaxPool", [x], **attrs), ort("MaxPool", [x], **attrs))


@pytest.mark.parametrize("name", sorted(WINDOWS))
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_matches_onnxruntime(name, include_pad):
    shape, attrs = WINDOWS[name]
    x = rand(*shape)
    attrs = {**attrs, "count_include_pad": include_pad}
    assert_same(run("AveragePool", [x], **attrs), ort("AveragePool", [x], **attrs))


@pytest.mark.parametrize("name", ["plain", "strided_padded", "dilated", "1d"])
def test_lp_pool_matches_onnxruntime(name):
    shape, attrs = WINDOWS[name]
    x = rand(*shape)
    assert_same(run("LpPool", [x], p=3, **attrs), ort("LpPool", [x], p=3, **attrs))


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices_match_onnxruntime(storage_order):
    x = rand(2, 3, 7, 6)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "storage_order": storage_order}
    assert_same(run("MaxPool", [x], n_out=2, **attrs), ort("MaxPool", [x], n_out=2, **attrs))


def test_max_pool_of_uint8_pads_with_the_lowest_value():
    x = RNG.integers(0, 255, (1, 2, 5, 5), dtype=np.uint8)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    assert_same(run("MaxPool", [x], **attrs), ort("MaxPool", [x], **attrs))


def test_max_pool_without_kernel_shape_is_a_node_attribute_error():
    with pytest.raises(NodeAttributeError, match="kernel_shape"):
        run("MaxPool", [rand(1, 1, 4, 4)])


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"])
def test_global_pools_match_onnxruntime(op):
    x = rand(2, 3, 5, 4)
    assert_same(run(op, [x]), ort(op, [x]))


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_matches_onnxruntime(size):
    x = rand(2, 7, 4, 5)
    attrs = {"size": size, "alpha": 0.002, "beta": 0.6, "bias": 1.5}
    assert_same(run("LRN", [x], **attrs), ort("LRN", [x], **attrs))


def test_lrn_with_an_even_size_sums_one_more_channel_above_than_below():
    x = rand(1, 6, 2, 3)
    y = run("LRN", [x], size=4, alpha=0.01)[0]
    sq = x.astype(np.float64) ** 2
    square_sum = np.stack([sq[:, max(0, c - 1):c + 3].sum(axis=1) for c in range(6)], axis=1)
    np.testing.assert_allclose(y, x / (1 + 0.01 / 4 * square_sum) ** 0.75, rtol=1e-6)


def test_max_unpool_inverts_max_pool_indices_like_onnxruntime():
    x = rand(1, 2, 6, 6)
    pooled, indices = run("MaxPool", [x], n_out=2, kernel_shape=[2, 2], strides=[2, 2])
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    ours = run("MaxUnpool", [pooled, indices], **attrs)
    assert_same(ours, ort("MaxUnpool", [pooled, indices], **attrs))
    np.testing.assert_array_equal(ours[0][ours[0] != 0], x[ours[0] != 0])


def test_max_pool_of_a_resnet_sized_input_is_fast():
    """This process's CPU time after a warm-up (not wall time, which a loaded machine stretches)."""
    import time

    x = rand(1, 64, 112, 112)
    run("MaxPool", [x[:, :, :8, :8]], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    start = time.process_time()
    run("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    assert time.process_time() - start < 1.0
