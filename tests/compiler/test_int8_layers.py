"""The INT8 layers (ai.polykit QConv, QMatMul): the exact integer reference, the cpu tactic
that agrees with it bit for bit, the shape rule's checks, plans that hold them."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, Value
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.plan.file import Plan
from polykit.errors import ShapeError
from polykit.kernels.cpu.int8 import run_float64
from polykit.compiler.ops.references import run_reference

RNG = np.random.default_rng(4)
NAMES = ["x", "xz", "w", "wz", "scale", "b", "ys", "yz"]


def ours(fn, node, inputs):
    """`fn(node, inputs)` with None for the inputs the node omits (as the engine passes them)."""
    return fn(node, [None if not name else arr for name, arr in zip(node.inputs, inputs)])


def qnode(kind, attrs=None, requantize=True, epilogue=None, extras=()):
    inputs = NAMES[:6] + (NAMES[6:] if requantize else ["", ""]) + list(extras)
    attrs = dict(attrs or {})
    if epilogue:
        attrs["epilogue"] = epilogue
    return Node(kind, inputs, ["y"], attrs, name="q", domain=POLYKIT_DOMAIN)


def matmul_inputs(xdt=np.uint8, wdt=np.int8, m=5, k=7, n=4):
    info_x, info_w = np.iinfo(xdt), np.iinfo(wdt)
    return [RNG.integers(info_x.min, info_x.max + 1, (m, k)).astype(xdt), np.array(131 % (info_x.max + 1), xdt),
            RNG.integers(info_w.min, info_w.max + 1, (k, n)).astype(wdt), RNG.integers(-3, 4, n).astype(wdt)
            if wdt == np.int8 else RNG.integers(120, 136, n).astype(wdt),
            RNG.uniform(1e-4, 1e-3, n).astype(np.float32), RNG.standard_normal(n).astype(np.float32),
            np.array(0.05, np.float32), np.array(-7, np.int8)]


def test_qmatmul_reference_is_the_integer_formula():
    inputs = matmul_inputs()
    x, xz, w, wz, scale, b, ys, yz = inputs
    (y,) = ours(run_reference, qnode("QMatMul"), inputs)
    acc = (x.astype(np.int64) - int(xz)) @ (w.astype(np.int64) - wz.astype(np.int64))
    value = acc.astype(np.float32) * scale + b  # float32, each operation rounded (no fma)
    want = np.clip(np.rint(value / ys) + int(yz), -128, 127).astype(np.int8)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, want)
    (raw,) = ours(run_reference, qnode("QMatMul", requantize=False), inputs)
    np.testing.assert_array_equal(raw, value)


@pytest.mark.parametrize("run", [run_reference, run_float64], ids=["reference", "float64"])
def test_the_dequantization_rounds_the_sum_to_float32_then_each_operation(run):
    # 127 * 127 * 1041 = 16790289 is odd and past 2**24: float32 holds it as 16790288 (nearest even);
    # times 0.75 exactly 12592716, plus 0.5 a tie that rounds to even: 12592716 (float64 once: 12592717)
    k = 1041
    inputs = [np.full((1, k), 127, np.int8), np.array(0, np.int8), np.full((k, 1), 127, np.int8),
              np.array(0, np.int8), np.array(0.75, np.float32), np.array([0.5], np.float32), None, None]
    (y,) = ours(run, qnode("QMatMul", requantize=False), inputs)
    assert y.dtype == np.float32 and y[0, 0] == 12592716


def test_requantization_rounds_half_to_even_and_saturates():
    x = np.array([[1], [3], [5], [-3], [127], [-128]], np.int8)  # times w = 1 and scale 0.5: k + 0.5 ties
    inputs = [x, np.array(0, np.int8), np.ones((1, 1), np.int8), np.array(0, np.int8), np.array(0.5, np.float32),
              None, np.array(1.0, np.float32), np.array(0, np.int8)]
    (y,) = ours(run_reference, qnode("QMatMul"), inputs)
    np.testing.assert_array_equal(y.ravel(), [0, 2, 2, -2, 64, -64])
    inputs[4] = np.array(4.0, np.float32)
    (y,) = ours(run_reference, qnode("QMatMul"), inputs)
    np.testing.assert_array_equal(y.ravel(), [4, 12, 20, -12, 127, -128])


def conv_inputs(group=2, xdt=np.uint8, wdt=np.int8):
    info_x = np.iinfo(xdt)
    x = RNG.integers(info_x.min, info_x.max + 1, (2, 4, 9, 9)).astype(xdt)
    w = RNG.integers(-127, 128, (6, 4 // group, 3, 3)).astype(wdt) if wdt == np.int8 else \
        RNG.integers(0, 256, (6, 4 // group, 3, 3)).astype(wdt)
    wz = np.zeros(6, wdt) if wdt == np.int8 else RNG.integers(100, 156, 6).astype(wdt)
    return [x, np.array(17, xdt), w, wz, RNG.uniform(1e-4, 5e-4, 6).astype(np.float32),
            RNG.standard_normal(6).astype(np.float32), np.array(0.1, np.float32), np.array(128, np.uint8)]


CONV_ATTRS = {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}


@pytest.mark.parametrize("wdt", [np.int8, np.uint8])
def test_qconv_equals_the_float_conv_of_its_dequantized_operands(wdt):
    inputs = conv_inputs(wdt=wdt)
    x, xz, w, wz, scale, b, ys, yz = inputs
    (y,) = ours(run_reference, qnode("QConv", CONV_ATTRS), inputs)
    conv = Node("Conv", ["x", "w", "b"], ["c"], dict(CONV_ATTRS))
    dx = (x.astype(np.float64) - int(xz))
    dw = (w.astype(np.float64) - wz.astype(np.float64).reshape(-1, 1, 1, 1)) * scale.reshape(-1, 1, 1, 1)
    (value,) = run_reference(conv, [dx, dw, b.astype(np.float64)])
    want = np.clip(np.rint(value.astype(np.float32) / ys) + 128, 0, 255).astype(np.uint8)
    assert y.dtype == np.uint8
    assert np.abs(y.astype(int) - want.astype(int)).max() <= 1  # float rounding of the product: ties only
    assert np.mean(y == want) > 0.999


EPILOGUE = {"input": "acc", "body": [{"op": "Add", "inputs": ["acc", "res"], "outputs": ["s"], "attrs": {}},
                                     {"op": "Relu", "inputs": ["s"], "outputs": ["r"], "attrs": {}}]}


@pytest.mark.parametrize("kind", ["QConv", "QMatMul"])
@pytest.mark.parametrize("requantize", [True, False])
def test_the_float64_cpu_tactic_agrees_with_the_reference_bit_for_bit(kind, requantize):
    inputs = conv_inputs() if kind == "QConv" else matmul_inputs(np.uint8, np.uint8)
    out_shape = ours(run_reference, qnode(kind, CONV_ATTRS if kind == "QConv" else {}, False), inputs)[0].shape
    epilogue = EPILOGUE if requantize else dict(EPILOGUE, body=[dict(s) for s in EPILOGUE["body"]])
    if not requantize:
        epilogue["body"][-1] = dict(epilogue["body"][-1], outputs=["y"])
    node = qnode(kind, CONV_ATTRS if kind == "QConv" else {}, requantize, epilogue, extras=["res"])
    inputs = inputs + [RNG.standard_normal(out_shape).astype(np.float32)]
    (ref,), (fast,) = ours(run_reference, node, inputs), ours(run_float64, node, inputs)
    assert ref.dtype == fast.dtype == (np.int8 if kind == "QMatMul" and requantize else
                                       np.uint8 if requantize else np.float32)
    np.testing.assert_array_equal(fast, ref)


def test_qmatmul_takes_an_activation_b_per_tensor_and_batches():
    a = RNG.integers(-128, 128, (3, 5, 6)).astype(np.int8)
    b = RNG.integers(-128, 128, (3, 6, 2)).astype(np.int8)
    inputs = [a, np.array(0, np.int8), b, np.array(3, np.int8), np.array(0.01, np.float32), None, None, None]
    (y,) = ours(run_reference, qnode("QMatMul", requantize=False), inputs)
    want = (a.astype(np.int64) @ (b.astype(np.int64) - 3)) * np.float64(np.float32(0.01))
    np.testing.assert_array_equal(y, want.astype(np.float32))


def _infer(node, metas):
    g = Graph([node], inputs=[n for n in node.inputs if n], outputs=node.outputs,
              values={n: Value(n, np.dtype(dt), shape) for n, (dt, shape) in metas.items()})
    infer_shapes(g)
    return g.value(node.outputs[0])


GOOD = {"x": ("uint8", (2, 4, 9, 9)), "xz": ("uint8", ()), "w": ("int8", (6, 2, 3, 3)), "wz": ("int8", (6,)),
        "scale": ("float32", (6,)), "b": ("float32", (6,)), "ys": ("float32", ()), "yz": ("uint8", ())}


def test_the_shape_rule_gives_the_requantized_output():
    out = _infer(qnode("QConv", CONV_ATTRS), GOOD)
    assert out.dtype == np.uint8 and out.shape == (2, 6, 5, 7)
    assert _infer(qnode("QConv", CONV_ATTRS, requantize=False), GOOD).dtype == np.float32


@pytest.mark.parametrize("change, message", [
    ({"x": ("float32", (2, 4, 9, 9))}, "not int8, uint8 or float8_e4m3fn"),
    ({"xz": ("int8", ())}, "zero point"),
    ({"scale": ("float32", (5,))}, "one value per output channel"),
    ({"b": ("float16", (6,))}, "float32"),
])
def test_the_shape_rule_refuses_malformed_int8_layers(change, message):
    with pytest.raises(ShapeError, match=message):
        _infer(qnode("QConv", CONV_ATTRS), {**GOOD, **change})


def test_y_scale_and_zero_point_come_together():
    node = qnode("QConv", CONV_ATTRS)
    node.inputs[7] = ""
    with pytest.raises(ShapeError, match="together"):
        _infer(node, GOOD)


def test_int8_plans_survive_serialization(tmp_path):
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Runtime

    from .int8_models import convnet, feeds_for

    plan = build_plan(convnet(), BuilderConfig(target="cpu", int8=True,
                                               tensor_ranges={"x": (-2, 2), "r1": (0, 3), "f": (0, 2)}))
    plan.save(tmp_path / "convnet.plan")
    loaded = Plan.load(tmp_path / "convnet.plan")
    feeds = feeds_for(convnet(), 1)
    outs = [Runtime("cpu").deserialize_engine(p).create_execution_context().execute(feeds)["y"] for p in (plan, loaded)]
    np.testing.assert_array_equal(*outs)
    assert {layer.kind for layer in loaded.layers} >= {"QConv", "QMatMul"}
