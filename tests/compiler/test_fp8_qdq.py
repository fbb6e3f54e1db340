"""Explicit FP8 (float8_e4m3fn) Q/DQ models fold into FP8 layers (QConv / QMatMul on e4m3 operands,
precision "fp8") and match onnxruntime running the Q/DQ as written (docs/INT8.md "FP8")."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.utils
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.references import run_reference

from .fp8_models import E4M3, E4M3_MAX, Fp8Graph, conv_chain, gemm_mlp, matmul_batched
from .test_int8_qdq import run_onnxruntime, run_plan

QUANT_KINDS = {"QConv", "QMatMul"}


def fp8_layers(plan) -> list:
    return [layer for layer in plan.layers if layer.kind in QUANT_KINDS]


def e4m3_ordinal(a: np.ndarray) -> np.ndarray:
    """Position of each e4m3 value on the number line (adjacent values differ by 1)."""
    bits = np.asarray(a, E4M3).view(np.uint8).astype(np.int32)
    return np.where(bits & 0x80, -(bits & 0x7F), bits & 0x7F)


def requantized(path) -> list[str]:
    """The model's e4m3 activations between layers (QuantizeLinear outputs other than the input's)."""
    return [n.output[0] for n in onnx.load(str(path)).graph.node if n.op_type == "QuantizeLinear" and n.input[0] != "x"]


def with_outputs(path, names: list[str], out) -> str:
    model = onnx.load(str(path))
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT8E4M3FN, None) for n in names)
    onnx.save(model, str(out))
    return str(out)


def check_against_onnxruntime(path, tol, x_shape, tmp_path, seeds=(1, 2, 3)):
    """Build on the cpu, check the FP8 layers, compare with onnxruntime. An e4m3 activation between two
    layers may round the other way where the float value lies within the summation-order difference
    of a rounding midpoint (one e4m3 step): it must be within one step of onnxruntime's everywhere
    and equal almost everywhere; the last layer is then checked on *our* e4m3 input (the model's
    tail from that DequantizeLinear, run by onnxruntime) to the float tolerance."""
    plan = build_plan(path, BuilderConfig(target="cpu"))
    layers = fp8_layers(plan)
    assert layers and all(layer.precision == "fp8" for layer in layers)
    assert all(layer.in_dtypes[0] == layer.in_dtypes[2] == "float8_e4m3fn" for layer in layers)
    assert not {"Conv", "Gemm", "MatMul", "DequantizeLinear"} & {layer.kind for layer in plan.layers}
    mids = requantized(path)
    probe = build_plan(path, BuilderConfig(target="cpu", mark_all=True)) if mids else plan
    assert len(fp8_layers(probe)) == len(layers)
    theirs_path = with_outputs(path, mids, tmp_path / "probe.onnx")
    tail = tmp_path / "tail.onnx"
    if mids:
        dq = next(n for n in onnx.load(str(path)).graph.node if n.op_type == "DequantizeLinear" and n.input[0] == mids[-1])
        onnx.utils.extract_model(str(path), str(tail), [dq.output[0]], ["y"])
        scale = next(numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer if t.name == dq.input[1])
    for seed in seeds:
        x = np.random.default_rng(seed).standard_normal(x_shape).astype(np.float32) * np.float32(1.2)
        ours, theirs = run_plan(probe, {"x": x}), run_onnxruntime(theirs_path, {"x": x})
        for name in mids:
            steps = np.abs(e4m3_ordinal(ours[name]) - e4m3_ordinal(theirs[name].view(E4M3)))
            assert steps.max() <= 1 and steps.mean() <= 0.02, (name, steps.max(), steps.mean())
        if mids:  # the last layer on our e4m3 input; DequantizeLinear = one float32 rounding
            theirs = run_onnxruntime(tail, {dq.output[0]: ours[mids[-1]].astype(np.float32) * scale})
        assert ours["y"].shape == theirs["y"].shape
        # tolerance: fp8_models.float_tolerance (two float32 sums of the same exact products)
        # plus 4 ulps of the value for the dequantize and bias roundings
        diff = np.abs(ours["y"] - theirs["y"])
        assert np.all(diff <= tol + np.abs(theirs["y"]) * 2.0 ** -21), diff.max()
    return plan


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_conv_chain_runs_in_fp8_with_no_float_round_trip(tmp_path, per_channel):
    path, tol = conv_chain(tmp_path / "c.onnx", per_channel=per_channel)
    plan = check_against_onnxruntime(path, tol, (2, 5, 13, 11), tmp_path)
    first, second = fp8_layers(plan)
    assert first.out_dtypes[0] == "float8_e4m3fn"  # Relu + requantize fused: e4m3 in, e4m3 out
    assert second.inputs[0] == first.outputs[0] and second.out_dtypes[0] == "float32"
    assert "QuantizeLinear" not in {layer.kind for layer in plan.layers[1:]}
    assert first.attrs["strides"] == [2, 2] and len(second.in_shapes[4]) <= 1


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_batched_matmul_runs_in_fp8(tmp_path, per_channel):
    path, tol = matmul_batched(tmp_path / "m.onnx", per_channel=per_channel)
    plan = check_against_onnxruntime(path, tol, (2, 3, 5, 19), tmp_path)
    (layer,) = fp8_layers(plan)
    assert layer.out_shapes[0] == (2, 3, 5, 11)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_gemm_mlp_with_bias_runs_in_fp8(tmp_path, per_channel):
    path, tol = gemm_mlp(tmp_path / "g.onnx", per_channel=per_channel)
    plan = check_against_onnxruntime(path, tol, (6, 23), tmp_path)
    first, second = fp8_layers(plan)
    assert first.out_dtypes[0] == "float8_e4m3fn" and second.in_dtypes[0] == "float8_e4m3fn"


def test_fp8_reference_requantizes_like_quantize_linear():
    # acc exact, rounded once to float32, * scale[n] + B[n]; a Y_scale makes e4m3 by ONNX's saturating
    # round to nearest even: column 0 is -1.0625 steps of 0.25 (a tie: even -1.0, not -1.125),
    # column 1 -126.3 / 0.25 = -505.2, saturated to -448
    x = np.array([[2.0, -3.0, 0.5]], E4M3)
    w = np.array([[1.0, 40.0], [0.25, 448.0], [-6.0, 2.0]], E4M3)  # acc: [-1.75, -1263]
    zero = np.zeros((), E4M3)
    scale, bias = np.array([0.5, 0.1], np.float32), np.array([0.609375, 0.0], np.float32)
    inputs = [x, zero, w, zero, scale, bias, np.float32(0.25), zero]
    node = Node("QMatMul", ["x", "xz", "w", "wz", "s", "b", "ys", "yz"], ["y"], domain="ai.polykit", name="q")
    (y,) = run_reference(node, inputs)
    assert y.dtype == E4M3
    assert y.astype(np.float32).tolist() == [[-1.0, -448.0]]
    (v,) = run_reference(node, inputs[:6] + [None, None])
    assert v.dtype == np.float32 and v.tolist() == [[-0.265625, np.float32(-1263.0) * np.float32(0.1)]]


def test_integer_and_float8_operands_never_pair(tmp_path):
    # an int8 weight under a float8 activation stays as written: Q/DQ layers and the op in float
    path, _ = matmul_batched(tmp_path / "m.onnx", per_channel=False)
    model = onnx.load(str(path))
    w = next(t for t in model.graph.initializer if t.name.startswith("w") and not t.name.startswith("ws")
             and not t.name.startswith("wz"))
    zero = next(t for t in model.graph.initializer if t.name.startswith("wz"))
    w.CopyFrom(numpy_helper.from_array(np.ones(numpy_helper.to_array(w).shape, np.int8), w.name))
    zero.CopyFrom(numpy_helper.from_array(np.zeros((), np.int8), zero.name))
    onnx.save(model, str(path))
    plan = build_plan(path, BuilderConfig(target="cpu"))
    assert not fp8_layers(plan)
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 19)).astype(np.float32)
    np.testing.assert_allclose(run_plan(plan, {"x": x})["y"], run_onnxruntime(path, {"x": x})["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_an_fp8_matmul_runs_channels_last_as_a_1x1_conv_over_its_rows(tmp_path, per_channel):
    # what a cuda build does (the sm90 FP8 tactics run convolutions): X [..., M, K] reshaped to
    # [1, 1, rows, K], W packed KRSC [N, 1, 1, K] at build time; the cpu's exact sums make it equal
    path, _ = matmul_batched(tmp_path / "m.onnx", per_channel=per_channel, k=32)
    plain = build_plan(path, BuilderConfig(target="cpu"))
    rows = build_plan(path, BuilderConfig(target="cpu", channels_last=True))
    (layer,) = fp8_layers(rows) + [layer for layer in rows.layers if layer.kind == "QConvNHWC"]
    assert layer.kind == "QConvNHWC" and layer.in_shapes[0] == (1, 1, 30, 32) and layer.in_shapes[2] == (11, 1, 1, 32)
    x = np.random.default_rng(4).standard_normal((2, 3, 5, 32)).astype(np.float32)
    np.testing.assert_array_equal(run_plan(rows, {"x": x})["y"], run_plan(plain, {"x": x})["y"])
    # K not a multiple of 16 stays a QMatMul
    path, _ = matmul_batched(tmp_path / "m19.onnx", per_channel=per_channel)
    assert [layer.kind for layer in fp8_layers(build_plan(path, BuilderConfig(target="cpu", channels_last=True)))] \
        == ["QMatMul"]


def test_chained_fp8_gemms_with_a_full_shaped_epilogue_input_run_as_1x1_convs(tmp_path):
    # x[4,32] -> Gemm (bias) -> Add C[4,16] -> Relu -> Q -> DQ -> MatMul W[16,8]: the Add's input has the
    # output's shape (reshaped to rows like it), the e4m3 hidden layer passes between the two convs
    g = Fp8Graph(seed=9)
    h = g.op("Gemm", [g.qdq("x", 3.0 / E4M3_MAX), g.weight((32, 16), 1), g.bias(16)])
    h = g.op("Add", [h, g.init(g.rng.standard_normal((4, 16)).astype(np.float32), "c")])
    h = g.qdq(g.op("Relu", [h]), 2.0 / E4M3_MAX)
    path, _ = g.model((4, 32), g.op("MatMul", [h, g.weight((16, 8), None)]), tmp_path / "g.onnx", k=16)
    plain = build_plan(path, BuilderConfig(target="cpu"))
    rows = build_plan(path, BuilderConfig(target="cpu", channels_last=True))
    convs = [layer for layer in rows.layers if layer.kind == "QConvNHWC"]
    assert len(convs) == 2 and convs[0].out_dtypes[0] == "float8_e4m3fn" and "epilogue" in convs[0].attrs
    x = np.random.default_rng(5).standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_array_equal(run_plan(rows, {"x": x})["y"], run_plan(plain, {"x": x})["y"])
