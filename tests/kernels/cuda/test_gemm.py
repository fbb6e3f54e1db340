"""GPU: the GEMM tactics (MatMul, Gemm) against the reference kernels, outputs poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def matmul_layer(precision="fp32"):
    return LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}, precision=precision)


def gemm_layer(attrs, with_c=True, precision="fp32"):
    return LayerDesc("gemm", "Gemm", ("A", "B", "C") if with_c else ("A", "B"), ("Y",), attrs, precision=precision)


MATMUL_SHAPES = [
    ((1, 1), (1, 1)),
    ((3, 5), (5, 7)),
    ((65, 33), (33, 129)),
    ((130, 70), (70, 200)),
    ((2, 3, 17, 9), (9, 11)),
    ((17,), (4, 17, 5)),
    ((4, 6, 5), (5,)),
    ((3, 1, 8, 6), (1, 5, 6, 4)),
]


def _check(layer, inputs, tactic, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, tactic=tactic, **tol)


SIMT_TACTICS = ("cuda.gemm.simt", "cuda.gemm.simt_wide")


@pytest.mark.parametrize("tactic", SIMT_TACTICS)
@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES)
def test_simt_matmul_matches_reference_fp32(a_shape, b_shape, tactic):
    _check(matmul_layer(), {"A": rand(*a_shape), "B": rand(*b_shape)}, tactic, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tactic", SIMT_TACTICS)
@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES[1:5])
def test_simt_matmul_matches_reference_fp16_storage(a_shape, b_shape, tactic):
    inputs = {"A": rand(*a_shape, dtype=np.float16), "B": rand(*b_shape, dtype=np.float16)}
    _check(matmul_layer(), inputs, tactic, rel=2e-3)


@pytest.mark.parametrize("tactic", SIMT_TACTICS)
@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES + [((2, 3, 4, 8), (2, 3, 8, 6))])
def test_simt_matmul_matches_reference_bf16_storage(a_shape, b_shape, tactic):
    # the bf16 MatMuls of ONNX's Attention expansions (N = 6: rows too short for the sm90 kernels)
    from polykit.compiler.ir.dtypes import to_numpy

    bf16 = to_numpy(16)
    inputs = {"A": rand(*a_shape).astype(bf16), "B": rand(*b_shape).astype(bf16)}
    _check(LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}, precision="bf16"), inputs, tactic, rel=1e-2)


@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES)
def test_mma_matmul_matches_reference_fp32_storage(a_shape, b_shape):
    _check(matmul_layer("fp16"), {"A": rand(*a_shape), "B": rand(*b_shape)}, "cuda.gemm.mma", rel=3e-3)


@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES[1:5])
def test_mma_matmul_matches_reference_fp16_storage(a_shape, b_shape):
    inputs = {"A": rand(*a_shape, dtype=np.float16), "B": rand(*b_shape, dtype=np.float16)}
    _check(matmul_layer("fp16"), inputs, "cuda.gemm.mma", rel=3e-3)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [(), (37,), (1, 37), (19, 1), (19, 37)])
@pytest.mark.parametrize("tactic", SIMT_TACTICS)
def test_simt_gemm_with_transposes_alpha_beta_and_broadcast_c(ta, tb, c_shape, tactic):
    M, K, N = 19, 23, 37
    a = rand(K, M) if ta else rand(M, K)
    b = rand(N, K) if tb else rand(K, N)
    layer = gemm_layer({"transA": ta, "transB": tb, "alpha": 0.7, "beta": -1.3})
    _check(layer, {"A": a, "B": b, "C": rand(*c_shape)}, tactic, rtol=1e-4, atol=1e-4)


def test_simt_gemm_without_c():
    _check(gemm_layer({"transB": 1}, with_c=False), {"A": rand(5, 300), "B": rand(129, 300)},
           "cuda.gemm.simt", rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("ta,tb", [(0, 1), (1, 0)])
def test_mma_gemm_matches_reference(ta, tb):
    M, K, N = 131, 77, 260
    a = rand(K, M) if ta else rand(M, K)
    b = rand(N, K) if tb else rand(K, N)
    layer = gemm_layer({"transA": ta, "transB": tb, "alpha": 1.5, "beta": 0.5}, precision="fp16")
    _check(layer, {"A": a, "B": b, "C": rand(N)}, "cuda.gemm.mma", rel=3e-3)


@pytest.mark.parametrize("tactic,precision", [("cuda.gemm.simt", "fp32"), ("cuda.gemm.mma", "fp16")])
def test_matmul_with_bias_gelu_epilogue_matches_reference(tactic, precision):
    body = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
            {"op": "Gelu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}]
    layer = LayerDesc("mm", "MatMul", ("A", "B", "bias"), ("Y",), {"epilogue": {"input": "raw", "body": body}},
                      domain="ai.polykit", precision=precision)
    inputs = {"A": rand(2, 33, 40), "B": rand(40, 70), "bias": rand(70)}
    _check(layer, inputs, tactic, **({"rel": 3e-3} if precision == "fp16" else {"rtol": 1e-4, "atol": 1e-4}))


def test_gemm_with_c_and_sigmoid_epilogue_matches_reference():
    body = [{"op": "Sigmoid", "inputs": ["raw"], "outputs": ["Y"], "attrs": {}}]
    layer = LayerDesc("gemm", "Gemm", ("A", "B", "C"), ("Y",), {"transB": 1, "epilogue": {"input": "raw", "body": body}},
                      domain="ai.polykit")
    _check(layer, {"A": rand(9, 20), "B": rand(31, 20), "C": rand(31)}, "cuda.gemm.simt", rtol=1e-5, atol=1e-5)


# ---- split-K: few output tiles, deep K (the slices' partial sums are reduced in a fixed order) ----

SPLIT_SHAPES = [((7, 1500), (1500, 9)), ((3, 5, 700), (700, 6)), ((1, 4097), (4097, 130))]


@pytest.mark.parametrize("a_shape,b_shape", SPLIT_SHAPES)
@pytest.mark.parametrize("tactic,precision", [("cuda.gemm.simt", "fp32"), ("cuda.gemm.mma", "fp16")])
def test_split_k_matmul_matches_reference(a_shape, b_shape, tactic, precision):
    tol = {"rel": 3e-3} if precision == "fp16" else {"rtol": 1e-4, "atol": 2e-4}
    _check(matmul_layer(precision), {"A": rand(*a_shape), "B": rand(*b_shape)}, tactic, **tol)


@pytest.mark.parametrize("tactic,precision", [("cuda.gemm.simt", "fp32"), ("cuda.gemm.mma", "fp16")])
def test_split_k_gemm_applies_alpha_beta_c_and_epilogue_once(tactic, precision):
    body = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
            {"op": "Gelu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}]
    layer = LayerDesc("gemm", "Gemm", ("A", "B", "C", "bias"), ("Y",),
                      {"transB": 1, "alpha": 0.5, "beta": -2.0, "epilogue": {"input": "raw", "body": body}},
                      domain="ai.polykit", precision=precision)
    inputs = {"A": rand(20, 2000), "B": rand(45, 2000), "C": rand(45), "bias": rand(20, 45)}
    _check(layer, inputs, tactic, **({"rel": 3e-3} if precision == "fp16" else {"rtol": 1e-4, "atol": 2e-4}))
