"""pack_quantized_gemms: sibling FP8 QMatMuls reading one e4m3 tensor become one QMatMul (weights, per-channel
scales and biases concatenated) + Split; the plan computes bit for bit what the unpacked plan computes on the
cpu target (same products summed exactly, the same dequantize and bias roundings per column)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polykit.compiler.passes as passes
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Engine
from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq

B, S, E, HEADS = 2, 8, 32, 2


def attention_block(biases=(True, True, True), dims=(B, S, E, HEADS)):
    """x [B, S, E] -> LayerNorm -> h; q, k, v = h W + b (each E x E, a bias where `biases` says) -> heads ->
    softmax(q k^T / 4) v -> merged -> o = ctx Wo + bo; y = LayerNorm(o + h): BERT's self-attention (`dims`:
    B, S, E and the heads)."""
    B, S, E, HEADS = dims  # noqa: N806 (the module's names for them)
    rng = np.random.default_rng(0)
    d = E // HEADS

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    inits: list = []
    nodes = [helper.make_node("LayerNormalization", ["x", const("g1", np.ones(E, np.float32)),
                                                     const("be1", np.zeros(E, np.float32))], ["h"], axis=-1)]
    heads = const("heads", np.array([B, S, HEADS, d], np.int64))
    for name, bias in zip("qkv", biases):
        nodes.append(helper.make_node("MatMul", ["h", const(f"W{name}", rng.standard_normal((E, E)).astype(np.float32)
                                                            * np.float32(0.2))], [f"{name}m"], name=f"{name}_proj"))
        out = f"{name}m"
        if bias:
            nodes.append(helper.make_node("Add", [out, const(f"b{name}", rng.standard_normal(E).astype(np.float32)
                                                             * np.float32(0.1))], [f"{name}b"]))
            out = f"{name}b"
        nodes += [helper.make_node("Reshape", [out, heads], [f"{name}h"]),
                  helper.make_node("Transpose", [f"{name}h"], [f"{name}t"],
                                   perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["qt", "kt"], ["s"]),
              helper.make_node("Div", ["s", const("root", np.array(4.0, np.float32))], ["sd"]),
              helper.make_node("Softmax", ["sd"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["c"]),
              helper.make_node("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ct", const("merged", np.array([B, S, E], np.int64))], ["cm"]),
              helper.make_node("MatMul", ["cm", const("Wo", rng.standard_normal((E, E)).astype(np.float32)
                                                      * np.float32(0.2))], ["om"], name="o_proj"),
              helper.make_node("Add", ["om", const("bo", np.full(E, 0.05, np.float32))], ["o"]),
              helper.make_node("Add", ["o", "h"], ["r"]),
              helper.make_node("LayerNormalization", ["r", "g1", "be1"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, E])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=9)


def feeds(seed: int, shape=(B, S, E)) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def plans(model, monkeypatch, **config):
    """(packed plan, unpacked plan): the second built with pack_quantized_gemms a no-op."""
    packed = build_plan(model, BuilderConfig(target="cpu", **config))
    with monkeypatch.context() as m:
        m.setattr(passes, "pack_quantized_gemms", lambda graph, **_: False)
        unpacked = build_plan(model, BuilderConfig(target="cpu", **config))
    return packed, unpacked


def fp8_products(plan) -> list:
    return [layer for layer in plan.layers if layer.precision == "fp8"]


def assert_same_outputs(packed, unpacked, seeds=(1, 2, 3)):
    for seed in seeds:
        got = Engine(packed).create_execution_context().execute(feeds(seed))
        want = Engine(unpacked).create_execution_context().execute(feeds(seed))
        np.testing.assert_array_equal(got["y"], want["y"])


@pytest.mark.parametrize("how", ["explicit", "fp8"])
def test_q_k_v_pack_into_one_fp8_gemm_that_computes_the_unpacked_plan_bit_for_bit(monkeypatch, how):
    model = attention_block()
    if how == "explicit":  # the model's own Q/DQ (ModelOpt's form)
        packed, unpacked = plans(insert_fp8_qdq(model, calibrate_fp8(model, [feeds(0)])), monkeypatch)
    else:  # --fp8: calibrated, quantized and folded by the builder
        packed, unpacked = plans(model, monkeypatch, fp8=True, calibration_data=[feeds(0)])
    assert len(fp8_products(unpacked)) == 4 and len(fp8_products(packed)) == 2
    wide = [layer for layer in fp8_products(packed) if layer.out_shapes[0][-1] == 3 * E]
    assert len(wide) == 1 and wide[0].in_shapes[2] == (E, 3 * E) and wide[0].in_shapes[4] == (3 * E,)
    assert {"q_proj", "k_proj", "v_proj"} <= set(wide[0].fused_nodes)
    # the attention reads q, k and v as strided views of the packed output: no Split, no head Reshapes left (the
    # first LayerNorm and the attention write the GEMMs' e4m3 inputs themselves: fuse_output_quantize)
    assert [layer.kind for layer in packed.layers] == [
        "LayerNormQuantize", "QMatMul", "AttentionQuantize", "Reshape", "QMatMul", "LayerNormalization"]
    assert len(unpacked.layers) == len(packed.layers) + 5  # two more GEMMs and three head Reshapes
    assert_same_outputs(packed, unpacked)


def test_siblings_with_and_without_a_bias_stay_apart(monkeypatch):
    model = attention_block(biases=(True, False, True))
    packed, unpacked = plans(insert_fp8_qdq(model, calibrate_fp8(model, [feeds(0)])), monkeypatch)
    assert len(fp8_products(packed)) == 3  # q and v (both biased) pack; k does not join them
    assert max(layer.out_shapes[0][-1] for layer in fp8_products(packed)) == 2 * E
    assert_same_outputs(packed, unpacked, seeds=(1,))
