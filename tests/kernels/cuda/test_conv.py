"""GPU: the Conv / ConvTranspose tactics against the reference kernels, outputs poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(11)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(layer, inputs, tactic, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, tactic=tactic, **tol)


def conv_layer(attrs, bias=True, precision="fp32", kind="Conv"):
    return LayerDesc("conv", kind, ("X", "W", "B") if bias else ("X", "W"), ("Y",), attrs, precision=precision)


# (x shape, w shape, attrs)
CONV_CASES = [
    ((1, 1, 1, 1), (1, 1, 1, 1), {}),
    ((2, 3, 9, 11), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 7, 13, 10), (9, 7, 3, 2), {"strides": [2, 3], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((2, 16, 8, 8), (70, 16, 1, 1), {}),
    ((1, 4, 7, 7), (3, 4, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((3, 5, 17), (4, 5, 3), {"pads": [1, 2], "strides": [2]}),
    ((1, 3, 5, 6, 7), (2, 3, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
]
GROUP_CASES = [
    ((2, 8, 9, 9), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    ((1, 6, 10, 7), (12, 2, 3, 3), {"group": 3, "strides": [2, 1]}),
    ((1, 4, 6, 6), (8, 1, 5, 5), {"group": 4, "pads": [2, 2, 2, 2], "dilations": [1, 1]}),
]


@pytest.mark.parametrize("tactic", ["cuda.conv.igemm_simt", "cuda.conv.igemm_simt_wide"])
@pytest.mark.parametrize("x,w,attrs", CONV_CASES + GROUP_CASES)
def test_igemm_simt_conv_matches_reference(x, w, attrs, tactic):
    check(conv_layer(attrs), {"X": rand(*x), "W": rand(*w), "B": rand(w[0])}, tactic,
          rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x,w,attrs", CONV_CASES)
def test_igemm_mma_conv_matches_reference(x, w, attrs):
    check(conv_layer(attrs, precision="fp16"), {"X": rand(*x), "W": rand(*w), "B": rand(w[0])},
          "cuda.conv.igemm_mma", rel=3e-3)


@pytest.mark.parametrize("x,w,attrs", GROUP_CASES + CONV_CASES[:3])
def test_direct_conv_matches_reference(x, w, attrs):
    check(conv_layer(attrs), {"X": rand(*x), "W": rand(*w), "B": rand(w[0])}, "cuda.conv.direct",
          rtol=1e-4, atol=1e-4)


def test_conv_without_bias_and_fp16_storage():
    inputs = {"X": rand(1, 5, 12, 12, dtype=np.float16), "W": rand(6, 5, 3, 3, dtype=np.float16)}
    check(conv_layer({"pads": [1, 1, 1, 1]}, bias=False), inputs, "cuda.conv.igemm_simt", rel=2e-3)


# (x shape, w shape (C, M/g, k...), attrs)
TRANSPOSE_CASES = [
    ((1, 2, 3, 3), (2, 3, 3, 3), {}),
    ((2, 4, 5, 4), (4, 2, 3, 2), {"strides": [2, 3], "pads": [1, 0, 1, 1], "output_padding": [1, 0]}),
    ((1, 6, 4, 4), (6, 1, 3, 3), {"group": 3, "strides": [2, 2], "dilations": [2, 1]}),
    ((1, 3, 7), (3, 2, 4), {"strides": [3], "auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("x,w,attrs", TRANSPOSE_CASES)
def test_conv_transpose_matches_reference(x, w, attrs):
    m = w[1] * attrs.get("group", 1)
    check(conv_layer(attrs, kind="ConvTranspose"), {"X": rand(*x), "W": rand(*w), "B": rand(m)},
          "cuda.conv_transpose.direct", rtol=1e-4, atol=1e-4)


EPI_BODY = [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
            {"op": "Relu", "inputs": ["s"], "outputs": ["y"], "attrs": {}}]


@pytest.mark.parametrize("tactic,precision,group", [("cuda.conv.igemm_simt", "fp32", 1),
                                                     ("cuda.conv.igemm_mma", "fp16", 1),
                                                     ("cuda.conv.direct", "fp32", 4)])
@pytest.mark.parametrize("skip_shape", [(2, 8, 7, 9), (8, 1, 1), (1, 8, 1, 9)])
def test_conv_with_residual_relu_epilogue_matches_reference(tactic, precision, group, skip_shape):
    layer = LayerDesc("conv", "Conv", ("X", "W", "B", "skip"), ("y",),
                      {"pads": [1, 1, 1, 1], "group": group, "epilogue": {"input": "raw", "body": EPI_BODY}},
                      domain="ai.polykit", precision=precision)
    inputs = {"X": rand(2, 8, 7, 9), "W": rand(8, 8 // group, 3, 3), "B": rand(8), "skip": rand(*skip_shape)}
    tol = {"rel": 3e-3} if precision == "fp16" else {"rtol": 1e-4, "atol": 1e-4}
    check(layer, inputs, tactic, **tol)


# few output tiles and a deep reduction: the implicit GEMM splits K (gemm.split_k)
SPLIT_CASES = [
    ((1, 96, 5, 5), (40, 96, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 130, 3, 4), (7, 130, 3, 3), {"strides": [2, 1], "pads": [1, 0, 1, 2]}),
    ((2, 64, 6, 6), (32, 32, 3, 3), {"group": 2}),
]


@pytest.mark.parametrize("x,w,attrs", SPLIT_CASES)
def test_split_k_igemm_simt_conv_matches_reference(x, w, attrs):
    check(conv_layer(attrs), {"X": rand(*x), "W": rand(*w), "B": rand(w[0])}, "cuda.conv.igemm_simt",
          rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("x,w,attrs", SPLIT_CASES[:2])
def test_split_k_igemm_mma_conv_matches_reference(x, w, attrs):
    check(conv_layer(attrs, precision="fp16"), {"X": rand(*x), "W": rand(*w), "B": rand(w[0])},
          "cuda.conv.igemm_mma", rel=3e-3)


@pytest.mark.parametrize("tactic,precision", [("cuda.conv.igemm_simt", "fp32"), ("cuda.conv.igemm_mma", "fp16")])
def test_split_k_conv_runs_its_epilogue_once(tactic, precision):
    layer = LayerDesc("conv", "Conv", ("X", "W", "B", "skip"), ("y",),
                      {"pads": [1, 1, 1, 1], "epilogue": {"input": "raw", "body": EPI_BODY}},
                      domain="ai.polykit", precision=precision)
    inputs = {"X": rand(1, 64, 4, 4), "W": rand(64, 64, 3, 3), "B": rand(64), "skip": rand(1, 64, 4, 4)}
    check(layer, inputs, tactic, **({"rel": 3e-3} if precision == "fp16" else {"rtol": 1e-4, "atol": 2e-4}))
