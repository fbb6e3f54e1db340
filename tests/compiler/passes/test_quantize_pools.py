"""quantize_pools: QuantizeLinear moves above MaxPool, and Q(DQ(q)) with equal parameters is q;
both exact (rtol=atol=0)."""

from __future__ import annotations

import numpy as np

from polykit.compiler.passes.quantize_pools import quantize_pools

from .passes_testkit import graph, node, run_and_compare, scalar

POOL = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}


def exact(g):
    return run_and_compare(g, quantize_pools, rtol=0, atol=0)


def test_a_quantized_max_pool_pools_the_quantized_input():
    g = graph([node("MaxPool", ["x"], "p", **POOL), node("QuantizeLinear", ["p", "s", "z"], "q"),
               node("DequantizeLinear", ["q", "s", "z"], "y")],
              {"x": (2, 3, 9, 9)}, ["y"], {"s": scalar(0.02), "z": scalar(3, np.int8)})
    out, changed = exact(g)
    pool = next(n for n in out.nodes if n.op_type == "MaxPool")
    assert changed and out.value(pool.input(0)).dtype == np.int8 and out.value(pool.outputs[0]).dtype == np.int8


def test_an_explicit_dq_pool_q_runs_the_pool_on_the_8_bit_tensor():
    # onnxruntime's QDQ form of a pool: DQ -> MaxPool -> Q with the same parameters
    g = graph([node("DequantizeLinear", ["x", "s", "z"], "d"), node("MaxPool", ["d"], "p", **POOL),
               node("QuantizeLinear", ["p", "s", "z"], "q"), node("DequantizeLinear", ["q", "s", "z"], "y")],
              {"x": ((1, 4, 7, 7), np.uint8)}, ["y"], {"s": scalar(0.05), "z": scalar(128, np.uint8)})
    out, _ = exact(g)
    pool = next(n for n in out.nodes if n.op_type == "MaxPool")
    last = next(n for n in out.nodes if n.outputs == ["y"])
    assert pool.input(0) == "x" and last.input(0) == pool.outputs[0]  # the Q left is dead code


def test_a_pool_whose_output_others_read_or_a_different_scale_stays():
    shared = graph([node("MaxPool", ["x"], "p", **POOL), node("QuantizeLinear", ["p", "s", "z"], "q"),
                    node("Relu", ["p"], "r")], {"x": (1, 2, 5, 5)}, ["q", "r"], {"s": scalar(0.02), "z": scalar(0, np.int8)})
    assert not exact(shared)[1]
    rescaled = graph([node("DequantizeLinear", ["x", "s", "z"], "d"), node("QuantizeLinear", ["d", "t", "z"], "y")],
                     {"x": ((1, 8), np.int8)}, ["y"], {"s": scalar(0.05), "t": scalar(0.1), "z": scalar(0, np.int8)})
    assert not exact(rescaled)[1]


def test_an_fp8_quantized_max_pool_pools_the_e4m3_input_exactly_nan_and_padding_included():
    """float8_e4m3fn too (saturating Q, zero point +0): the max of quantized values is the quantized max, a NaN
    propagates through both orders, and a window reaching past the input pads with e4m3's least value (-448:
    the reference's lowest, where -inf would be NaN); run on a float input holding NaN, values past 448 and
    tiny ones, with pads as large as the kernel less one."""
    from polykit.compiler.ops.quant.int8 import FP8

    g = graph([node("MaxPool", ["x"], "p", kernel_shape=[3, 3], strides=[2, 2], pads=[2, 2, 2, 2]),
               node("QuantizeLinear", ["p", "s", "z"], "q"), node("DequantizeLinear", ["q", "s", "z"], "y")],
              {"x": (2, 3, 9, 9)}, ["y"], {"s": scalar(0.02), "z": np.zeros((), FP8)})
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 3, 9, 9)) * 4).astype(np.float32)
    x[0, 0, 0, 0], x[1, 2, 4, 4], x[0, 1, 8, 8], x[1, 0, 3, 3] = np.nan, 50.0, -60.0, 1e-6
    out, changed = run_and_compare(g, quantize_pools, rtol=0, atol=0, feeds={"x": x})
    pool = next(n for n in out.nodes if n.op_type == "MaxPool")
    assert changed and out.value(pool.input(0)).dtype == FP8 and out.value(pool.outputs[0]).dtype == FP8
