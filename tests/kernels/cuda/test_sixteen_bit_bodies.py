"""16-bit fused bodies compute as the nodes they replaced: every op's result rounded to T.

The reference evaluates a Pointwise body, and the body fused after a GEMM (its epilogue), op by
op, each output of type T, as ONNX does; the cuda kernels compute in float and round each op's
result (`round_as`) and, in an epilogue, the GEMM's result before the body. Rounding only at
the store gave other bits (ONNX's fp16 GQA Attention expansion: 6 of 576 outputs two fp16
steps off; three bf16 expansions likewise).
"""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.dtypes import to_numpy
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.gemm.epilogue import epilogue_prelude
from polykit.kernels.cuda.pointwise.pointwise_expr import emit_expression

rng = np.random.default_rng(41)
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(to_numpy(16))}
CHAIN = [{"op": "Mul", "inputs": ["a", "b"], "outputs": ["t"], "attrs": {}},
         {"op": "Add", "inputs": ["t", "c"], "outputs": ["u"], "attrs": {}},
         {"op": "Sub", "inputs": ["u", "a"], "outputs": ["y"], "attrs": {}}]


def test_emit_expression_rounds_each_arithmetic_result_to_its_storage_type():
    code, env = emit_expression(CHAIN, {"a": "A", "b": "B", "c": "C"}, {"a": "T0", "b": "T1", "c": "T2"})
    assert code.splitlines() == ["    auto v0 = round_as<T0>(pk_mul(A, B));",
                                 "    auto v1 = round_as<T0>(pk_add(v0, C));",
                                 "    auto v2 = round_as<T0>(pk_sub(v1, A));"]
    assert env["y"] == "v2"


def test_emit_expression_types_results_by_onnx_rules():
    """A comparison gives bool (exact: not rounded), Where the type of its second input, Cast
    its `to` type (Cast rounds itself), and arithmetic after them rounds to that type."""
    body = [{"op": "Less", "inputs": ["x", "z"], "outputs": ["m"], "attrs": {}},
            {"op": "Where", "inputs": ["m", "x", "z"], "outputs": ["w"], "attrs": {}},
            {"op": "Cast", "inputs": ["w"], "outputs": ["h"], "attrs": {"to": 16}},
            {"op": "Add", "inputs": ["h", "h"], "outputs": ["y"], "attrs": {}}]
    code, _ = emit_expression(body, {"x": "X", "z": "Z"}, {"x": "float", "z": "float"})
    lines = code.splitlines()
    assert lines[0] == "    auto v0 = (X < Z);"
    assert lines[1].startswith("    auto v1 = round_as<float>(")
    assert lines[2] == "    auto v2 = pk_to_bf16(v1);"
    assert lines[3] == "    auto v3 = round_as<bf16_t>(pk_add(v2, v2));"


def _epilogue_matmul(dtype: str, shapes: tuple = ()) -> LayerDesc:
    body = [{"op": "Add", "inputs": ["raw", "mask"], "outputs": ["Y"], "attrs": {}}]
    stamp = {}
    if shapes:
        stamp = {"in_dtypes": (dtype,) * 3, "out_dtypes": (dtype,), "in_shapes": shapes[:3], "out_shapes": shapes[3:]}
    return LayerDesc("mm", "MatMul", ("A", "B", "mask"), ("Y",), {"epilogue": {"input": "raw", "body": body}},
                     domain="ai.polykit", precision="fp16" if dtype == "float16" else "fp32", **stamp)


def test_gemm_epilogue_rounds_the_product_before_its_body():
    shapes = ((2, 16, 8), (8, 24), (2, 16, 24), (2, 16, 24))
    text = epilogue_prelude(_epilogue_matmul("float16", shapes), "half_t")
    assert "round_as<ELEM>(pk_add(round_as<ELEM>(v), ld(E.e0, off0)))" in text
    # the 8-wide sm90 path (its last op's rounding is the 16-byte store's)
    assert "auto t0 = pk_add(round_as<ELEM>(v[i]), ld(rows.x0, i));" in text


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("shape", [(7, 33), (4, 256)])
def test_16bit_pointwise_chain_equals_the_reference_bit_for_bit(dtype, shape):
    """(a * b + c) - a in T: a float operation on two T values rounded to T is what numpy
    (float16) and ml_dtypes (bfloat16) compute for each node, so the fused kernel (strided path
    for 7x33, 4-wide vector path for 4x256) equals the op-by-op reference bit for bit. The
    inputs are checked to tell this from rounding once at the store."""
    from polykit.runtime.cuda.harness import reference_layer, run_layer
    from tests.kernels.cuda.ulps import bit_mismatches

    dt = DTYPES[dtype]
    feeds = {n: (rng.standard_normal(shape) * 8).astype(dt) for n in "abc"}
    lay = LayerDesc("pw", "Pointwise", ("a", "b", "c"), ("y",), {"body": CHAIN}, domain="ai.polykit",
                    in_dtypes=(dtype,) * 3, out_dtypes=(dtype,), in_shapes=(shape,) * 3, out_shapes=(shape,))
    want = reference_layer(lay, feeds)["y"]
    a, b, c = (feeds[n].astype(np.float32) for n in "abc")
    assert bit_mismatches(((a * b + c) - a).astype(dt), want) != "", "inputs do not tell per-op rounding apart"
    assert bit_mismatches(run_layer(lay, feeds)["y"], want) == ""


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_gemm_epilogue_rounds_the_product_to_T_like_the_reference_on_every_tactic(dtype):
    """A @ B + mask with A, B entries k/64 (|k| <= 64, exact in both types) and K = 8: every
    product and partial sum is a multiple of 2^-12 below 2^4 (16 bits), exact in fp32 whatever
    the order, so each tactic must give the reference's bits: the float64 product rounded to T
    (it needs rounding in both types), plus mask, rounded to T. The mask cancels most of the
    product, so rounding the sum once (the product unrounded, as before) gives other bits; the
    inputs are checked to tell the two apart."""
    from polykit.kernels.tactics import candidates
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.harness import reference_layer, run_layer
    from tests.kernels.cuda.ulps import bit_mismatches

    dt = DTYPES[dtype]
    m, k, n = 16, 8, 24
    a = (rng.integers(-64, 65, (2, m, k)) / 64).astype(dt)
    b = (rng.integers(-64, 65, (k, n)) / 64).astype(dt)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    mask = (-exact + rng.uniform(-0.25, 0.25, exact.shape)).astype(np.float32).astype(dt)
    feeds = {"A": a, "B": b, "mask": mask}
    lay = _epilogue_matmul(dtype, ((2, m, k), (k, n), (2, m, n), (2, m, n)))
    want = reference_layer(lay, feeds)["Y"]
    once = (exact + mask.astype(np.float64)).astype(np.float32).astype(dt)
    assert bit_mismatches(once, want) != "", "inputs do not tell rounding the product apart"
    tactics = [t.name for t in candidates("cuda", "MatMul", lay, arch=driver.current_device().arch)]
    assert tactics, f"no cuda tactic runs a {dtype} MatMul with an epilogue"
    failed = {name: bit_mismatches(run_layer(lay, feeds, tactic=name)["Y"], want) for name in tactics}
    assert {name: why for name, why in failed.items() if why} == {}
