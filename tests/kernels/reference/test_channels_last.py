"""Reference kernels of the channels-last ops: each equals its ONNX op on transposed operands."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.references import run_reference

RNG = np.random.default_rng(13)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def run(op, inputs, domain="", **attrs):
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
    return run_reference(Node(op, names, ["y"], attrs, name=op, domain=domain), inputs)[0]


CONV_CASES = [
    ((2, 8, 9, 11), (5, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 16, 13, 10), (7, 16, 3, 2), {"strides": [2, 3], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((1, 24, 6, 6), (9, 24, 1, 1), {}),
    ((1, 8, 7, 7), (6, 4, 3, 3), {"group": 2, "pads": [1, 0, 1, 0]}),
]


@pytest.mark.parametrize("x,w,attrs", CONV_CASES)
def test_conv_nhwc_is_conv_on_transposed_operands(x, w, attrs):
    X, W, B = rand(*x), rand(*w), rand(w[0])
    expected = run("Conv", [X, W, B], **attrs)
    got = run("ConvNHWC", [nhwc(X), nhwc(W), B], domain=POLYKIT_DOMAIN, kernel_shape=list(w[2:]), **attrs)
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, nhwc(expected))


def test_conv_nhwc_in_half_stays_half():
    X, W = rand(1, 8, 5, 5, dtype=np.float16), rand(3, 8, 3, 3, dtype=np.float16)
    got = run("ConvNHWC", [nhwc(X), nhwc(W)], domain=POLYKIT_DOMAIN, pads=[1, 1, 1, 1])
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, nhwc(run("Conv", [X, W], pads=[1, 1, 1, 1])))


def test_conv_nhwc_epilogue_reads_its_extra_inputs_in_nhwc():
    X, W, B, skip = rand(2, 8, 6, 7), rand(4, 8, 3, 3), rand(4), rand(2, 6, 7, 4)
    body = [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
            {"op": "Relu", "inputs": ["s"], "outputs": ["y"], "attrs": {}}]
    got = run_reference(Node("ConvNHWC", ["x", "w", "b", "skip"], ["y"],
                             {"pads": [1, 1, 1, 1], "epilogue": {"input": "raw", "body": body}}, domain=POLYKIT_DOMAIN),
                        [nhwc(X), nhwc(W), B, skip])[0]
    raw = nhwc(run("Conv", [X, W, B], pads=[1, 1, 1, 1]))
    np.testing.assert_array_equal(got, np.maximum(raw + skip, 0))


WINDOWS = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 0, 1]},
]
POOL_CASES = [("MaxPool", a) for a in WINDOWS] + [("AveragePool", a) for a in WINDOWS] + [
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1})]


@pytest.mark.parametrize("op,attrs", POOL_CASES)
def test_pools_nhwc_are_pools_on_transposed_input(op, attrs):
    X = rand(2, 5, 10, 9)
    got = run(f"{op}NHWC", [nhwc(X)], domain=POLYKIT_DOMAIN, **attrs)
    np.testing.assert_array_equal(got, nhwc(run(op, [X], **attrs)))
