"""fold_qdq.leading_bias: a MatMul's bias Add, the first step of its epilogue as a Linear's export writes it, moves
into the INT8 / FP8 layer's B slot. The layer computes `fl(fl(acc * scale) + B)` where the epilogue computed
`fl(product + bias)` on `product = fl(acc * scale)`: the same value, so a plan computes bit for bit what it computed
with the Add in the epilogue (cpu target), and the epilogue keeps only what follows the Add."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Engine

#: the module (polykit.compiler.passes exports its function under the same name)
FOLD_QDQ = importlib.import_module("polykit.compiler.passes.fold_qdq")


def run(plan, feeds):
    return Engine(plan).create_execution_context().execute(feeds)


def without_the_fold(monkeypatch):
    monkeypatch.setattr(FOLD_QDQ, "leading_bias", lambda *args: None)


def quantized(plan):
    return [layer for layer in plan.layers if layer.kind in ("QMatMul", "QConvNHWC", "QConv") and layer.domain]


@pytest.fixture(scope="module")
def fp8_bert():
    from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq
    from tests.compiler.passes.test_absorb_quantized_casts import SHAPES, bert_feeds
    from tests.dynamic_models import tiny_bert

    model = tiny_bert()
    return insert_fp8_qdq(model, calibrate_fp8(model, [bert_feeds(s) for s in range(2)], input_shapes=SHAPES))


def test_an_fp8_berts_linears_take_their_biases_into_b_and_compute_the_same_bits(fp8_bert, monkeypatch):
    """An explicit FP8 BERT (insert_fp8_qdq): every linear's bias Add becomes B. FFN1's epilogue keeps its Gelu
    alone (no float input left: the FP8 tiles finish it in the accumulators' layout), the attention output's and
    FFN2's their residual Add; the cpu plan's outputs are the Add-in-the-epilogue plan's, bit for bit."""
    from tests.compiler.passes.test_absorb_quantized_casts import SHAPES, bert_feeds

    config = BuilderConfig(target="cpu", input_shapes=SHAPES)
    plan = build_plan(fp8_bert, config)
    layers = [layer for layer in quantized(plan) if layer.precision == "fp8"]
    assert layers and all(layer.inputs[5] for layer in layers), [(layer.name, layer.inputs[5]) for layer in layers]
    bodies = [[step["op"] for step in (layer.attrs.get("epilogue") or {}).get("body", [])] for layer in layers]
    assert ["Gelu"] in bodies and [] in bodies and ["Add"] in bodies, bodies  # FFN1; Q, K, V; the residuals
    # no epilogue input left that is a column vector (a bias): the residuals are whole activations
    assert all(len(shape) > 1 for layer in layers for shape in layer.in_shapes[8:]), [l.in_shapes for l in layers]
    with monkeypatch.context() as patch:
        without_the_fold(patch)
        before = build_plan(fp8_bert, config)
    assert not all(layer.inputs[5] for layer in quantized(before) if layer.precision == "fp8")
    for seed in (5, 6):
        feeds = bert_feeds(seed)
        ours, theirs = run(plan, feeds), run(before, feeds)
        assert ours.keys() == theirs.keys()
        for name in ours:
            np.testing.assert_array_equal(ours[name], theirs[name])


def qdq_linear(bias_shape, *, swap: bool = False, reread: bool = False, gemm: bool = False):
    """x [2, 3, 8] -Q/DQ int8-> MatMul(W int8 [8, 4], per channel) -> Add(bias of `bias_shape`; `swap`: bias first)
    -> Relu (`reread`: Mul(Relu, product): the product read twice) -> y; `gemm`: x [6, 8] and a bias-free
    Gemm(transB) of W^T [4, 8] instead of the MatMul."""
    rng = np.random.default_rng(7)
    wq = rng.integers(-100, 100, (8, 4)).astype(np.int8)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("xs", np.array(0.05, np.float32)), ("xz", np.array(0, np.int8)),
        ("wq", np.ascontiguousarray(wq.T) if gemm else wq),
        ("ws", (rng.random(4) * 0.01 + 0.005).astype(np.float32)), ("wz", np.zeros(4, np.int8)),
        ("b", (rng.standard_normal(bias_shape) * 0.5).astype(np.float32)))]
    product = (helper.make_node("Gemm", ["xd", "wd"], ["p"], name="linear", transB=1) if gemm
               else helper.make_node("MatMul", ["xd", "wd"], ["p"], name="linear"))
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0 if gemm else 1),
             product,
             helper.make_node("Add", ["b", "p"] if swap else ["p", "b"], ["s"], name="bias"),
             helper.make_node("Relu", ["s"], ["r" if reread else "y"])]
    if reread:
        nodes.append(helper.make_node("Mul", ["r", "p"], ["y"]))
    rows = [6] if gemm else [2, 3]
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*rows, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*rows, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


@pytest.mark.parametrize("bias_shape,swap,reread,gemm,absorbed", [
    ((4,), False, False, False, True), ((1, 4), True, False, False, True), ((1, 1, 4), False, False, False, True),
    ((4,), False, False, True, True),  # a bias-free Gemm's Add
    ((3, 4), False, False, False, False),  # not along the last axis alone: a per-row-and-column addend
    ((4,), False, True, False, False),  # the product is read again after the Add: the Add stays in the epilogue
])
def test_the_bias_moves_only_when_it_is_a_constant_along_the_last_axis_read_once(tmp_path, monkeypatch, bias_shape,
                                                                                  swap, reread, gemm, absorbed):
    model = qdq_linear(bias_shape, swap=swap, reread=reread, gemm=gemm)
    config = BuilderConfig(target="cpu")
    plan = build_plan(model, config)
    (layer,) = [layer for layer in quantized(plan) if layer.name == "linear"]
    assert bool(layer.inputs[5]) == absorbed, layer.inputs
    ops = [step["op"] for step in layer.attrs["epilogue"]["body"]]
    assert ops == (["Relu"] if absorbed else ["Add", "Relu"] + (["Mul"] if reread else [])), ops
    with monkeypatch.context() as patch:
        without_the_fold(patch)
        before = build_plan(model, config)
    x = np.random.default_rng(3).standard_normal((6, 8) if gemm else (2, 3, 8)).astype(np.float32)
    (ours,), (theirs,) = run(plan, {"x": x}).values(), run(before, {"x": x}).values()
    np.testing.assert_array_equal(ours, theirs)
