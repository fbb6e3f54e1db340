"""GPU: the INT8 tactics (int8.cu) against the exact cpu reference, outputs poisoned first.

Equality is exact: the centered int32 sum is exact and the dequantization is the reference's
float32 arithmetic (float(acc) * scale + bias, each step rounded, no fma), so float outputs match
bit for bit and requantized ones step for step.
"""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(23)


@pytest.fixture(autouse=True)
def _fresh_rng():
    """Each test draws from its own fresh generator: its data does not depend on which tests a worker ran before
    (pytest-xdist's order), so a failure repeats."""
    global rng
    rng = np.random.default_rng(23)
INS = ("X", "XZ", "W", "WZ", "S", "B", "YS", "YZ")


def q(shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


def params(n, x_dtype, w_dtype, per_channel, requant, bias=True):
    """Zero points, scale, bias, Y scale / zero point of an INT8 layer with n output channels."""
    wz = q((n,) if per_channel else (), w_dtype)
    if np.dtype(w_dtype) == np.int8:
        wz = wz // 16  # near 0, like real asymmetric int8 weights (and 0 itself for some channels)
    out = {"XZ": q((), x_dtype), "WZ": wz,
           "S": (rng.uniform(1e-4, 2e-3, (n,) if per_channel else ())).astype(np.float32),
           "B": rng.standard_normal(n).astype(np.float32) if bias else None}
    if requant:
        out.update(YS=np.float32(rng.uniform(0.05, 0.2)), YZ=q((), requant))
    return {k: v for k, v in out.items() if v is not None}


def layer_of(kind, inputs, attrs=None, epilogue=None, extra=()):
    names = tuple(n if n in inputs else "" for n in INS) + tuple(extra)
    attrs = dict(attrs or {})
    if epilogue:
        attrs["epilogue"] = epilogue
    return LayerDesc("q", kind, names, ("Y",), attrs, domain=POLYKIT_DOMAIN, precision="int8")


def check(layer, inputs, tactic):
    from polykit.runtime.cuda.harness import assert_matches_reference

    assert_matches_reference(layer, inputs, tactic=tactic, rtol=0, atol=0)


MATMUL = "cuda.int8.mma_matmul"
# (X shape, K, N): M and N of 1, K not a multiple of 16 or 32, rows folded from batch dims, tiles past 128
MATMUL_CASES = [((1, 1), 1, 1), ((1, 70), 70, 1), ((5, 33), 33, 7), ((3, 4, 64), 64, 130), ((131, 100), 100, 257),
                ((2, 65, 96), 96, 40)]
DTYPES = [(np.int8, np.int8), (np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.uint8)]


@pytest.mark.parametrize("x_dtype,w_dtype", DTYPES)
@pytest.mark.parametrize("x,k,n", MATMUL_CASES)
@pytest.mark.parametrize("per_channel", [False, True])
def test_qmatmul_float_output_equals_the_reference(x, k, n, x_dtype, w_dtype, per_channel):
    inputs = {"X": q(x, x_dtype), "W": q((k, n), w_dtype), **params(n, x_dtype, w_dtype, per_channel, None)}
    check(layer_of("QMatMul", inputs), inputs, MATMUL)


@pytest.mark.parametrize("y_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("x,k,n", MATMUL_CASES[2:])
def test_qmatmul_requantized_output_equals_the_reference(x, k, n, y_dtype):
    inputs = {"X": q(x, np.uint8), "W": q((k, n), np.int8), **params(n, np.uint8, np.int8, True, y_dtype)}
    check(layer_of("QMatMul", inputs), inputs, MATMUL)


def test_qmatmul_without_bias():
    inputs = {"X": q((9, 48), np.int8), "W": q((48, 20), np.int8), **params(20, np.int8, np.int8, True, None, False)}
    check(layer_of("QMatMul", inputs), inputs, MATMUL)


NCHW, NHWC = "cuda.int8.mma_conv_nchw", "cuda.int8.mma_conv_nhwc"
# (NCHW X, KCRS W, attrs): a 1x1 output, odd sizes, strides, dilations, asymmetric pads, the ResNet stem
CONV_CASES = [
    ((1, 16, 1, 1), (1, 16, 1, 1), {}),
    ((2, 16, 9, 11), (5, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 32, 13, 10), (9, 32, 3, 2), {"strides": [2, 3], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((2, 48, 8, 8), (130, 48, 1, 1), {}),
    ((1, 16, 17, 16), (16, 16, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((3, 64, 14, 14), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
]


def to_nhwc(inputs):
    out = dict(inputs, X=np.ascontiguousarray(inputs["X"].transpose(0, 2, 3, 1)),
               W=np.ascontiguousarray(inputs["W"].transpose(0, 2, 3, 1)))
    for name in ("skip",):
        if name in out:
            out[name] = np.ascontiguousarray(out[name].transpose(0, 2, 3, 1))
    return out


def conv_inputs(x, w, x_dtype, w_dtype, per_channel, requant=None):
    return {"X": q(x, x_dtype), "W": q(w, w_dtype), **params(w[0], x_dtype, w_dtype, per_channel, requant)}


@pytest.mark.parametrize("x_dtype,w_dtype", DTYPES)
@pytest.mark.parametrize("x,w,attrs", CONV_CASES)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_qconv_equals_the_reference(x, w, attrs, x_dtype, w_dtype, layout):
    inputs = conv_inputs(x, w, x_dtype, w_dtype, per_channel=True)
    if layout == "nhwc":
        check(layer_of("QConvNHWC", to_nhwc(inputs), attrs), to_nhwc(inputs), NHWC)
    else:
        check(layer_of("QConv", inputs, attrs), inputs, NCHW)


def test_qconv_nchw_takes_channels_the_nhwc_kernel_cannot():
    inputs = conv_inputs((2, 3, 15, 15), (8, 3, 7, 7), np.uint8, np.int8, per_channel=False)
    check(layer_of("QConv", inputs, {"strides": [2, 2], "pads": [3, 3, 3, 3]}), inputs, NCHW)


RESIDUAL = {"input": "raw", "body": [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
                                     {"op": "Relu", "inputs": ["s"], "outputs": ["r"], "attrs": {}}]}


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("y_dtype", [np.int8, np.uint8])
def test_qconv_with_residual_epilogue_and_requantization(layout, y_dtype):
    inputs = conv_inputs((2, 32, 10, 9), (24, 32, 3, 3), np.uint8, np.int8, True, y_dtype)
    inputs["skip"] = rng.standard_normal((2, 24, 10, 9)).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1]}
    if layout == "nhwc":
        inputs = to_nhwc(inputs)
    check(layer_of("QConvNHWC" if layout == "nhwc" else "QConv", inputs, attrs, RESIDUAL, ("skip",)), inputs,
          NHWC if layout == "nhwc" else NCHW)


def test_qmatmul_with_a_float_output_epilogue():
    body = {"input": "raw", "body": [{"op": "Relu", "inputs": ["raw"], "outputs": ["Y"], "attrs": {}}]}
    inputs = {"X": q((33, 80), np.int8), "W": q((80, 50), np.int8), **params(50, np.int8, np.int8, True, None)}
    check(layer_of("QMatMul", inputs, epilogue=body), inputs, MATMUL)


@pytest.mark.parametrize("tactic", [MATMUL, "cuda.int8.mma_matmul_sk4"])
@pytest.mark.parametrize("x,k,n", [((33, 80), 80, 50), ((2, 65, 96), 96, 40)])
def test_qmatmul_with_a_float16_output(x, k, n, tactic):
    """An --fp16 build's INT8 layer whose Cast to float16 its epilogue took (int8.HALF_OUT: Relu, the Cast): int8.cu
    and the split-K reduce store float16 (Y_OUT 3 compiled in), the reference's values bit for bit."""
    from polykit.kernels.cuda.int8.int8 import HALF_OUT

    inputs = {"X": q(x, np.int8), "W": q((k, n), np.int8), **params(n, np.int8, np.int8, True, None)}
    layer = stamped(layer_of("QMatMul", inputs, epilogue={"input": "raw", "body": HALF_OUT}), inputs)
    assert layer.out_dtypes == ("float16",)
    check(layer, inputs, tactic)


def int8_residual(zero_point: bool):
    """fold_qdq's epilogue of a residual read as 8-bit (dequantizing_steps), then Add + Relu."""
    steps = [{"op": "Cast", "inputs": ["skip"], "outputs": ["f"], "attrs": {"to": 1}}]
    if zero_point:
        steps.append({"op": "Sub", "inputs": ["f", "skip_zero"], "outputs": ["c"], "attrs": {}})
    steps += [{"op": "Mul", "inputs": [steps[-1]["outputs"][0], "skip_scale"], "outputs": ["d"], "attrs": {}},
              {"op": "Add", "inputs": ["raw", "d"], "outputs": ["s"], "attrs": {}},
              {"op": "Relu", "inputs": ["s"], "outputs": ["r"], "attrs": {}}]
    return {"input": "raw", "body": steps}


def stamped(layer, inputs):
    """The layer with the dtypes and shapes a build stamps (the 8-bit residual's kernel is chosen by them)."""
    from dataclasses import replace

    from polykit.runtime.cuda.harness import reference_layer

    out = reference_layer(layer, inputs)["Y"]
    ins = [inputs.get(n) for n in layer.inputs]
    return replace(layer, in_dtypes=tuple(a.dtype.name if a is not None else "" for a in ins),
                   in_shapes=tuple(a.shape if a is not None else () for a in ins),
                   out_dtypes=(out.dtype.name,), out_shapes=(out.shape,))


@pytest.mark.parametrize("skip_dtype,zero_point", [(np.int8, False), (np.uint8, True)])
@pytest.mark.parametrize("y_dtype", [np.int8, None])
def test_qconv_nhwc_reads_an_8_bit_residual_and_dequantizes_it_in_the_epilogue(skip_dtype, zero_point, y_dtype):
    # an identity block's last conv: int8 in, the block's int8 input as residual, int8 out
    inputs = to_nhwc(conv_inputs((2, 32, 10, 9), (24, 32, 1, 1), np.int8, np.int8, True, y_dtype))
    inputs.update(skip=q((2, 10, 9, 24), skip_dtype), skip_scale=np.float32(0.037),
                  **({"skip_zero": np.float32(q((), skip_dtype))} if zero_point else {}))
    extra = ("skip", "skip_zero", "skip_scale") if zero_point else ("skip", "skip_scale")
    layer = stamped(layer_of("QConvNHWC", inputs, {}, int8_residual(zero_point), extra), inputs)
    assert layer.in_dtypes[8] == np.dtype(skip_dtype).name
    if y_dtype is not None:
        check(layer, inputs, NHWC)
        return
    # float output: bit for bit too. The epilogue's Mul and Add round on their own (pointwise.cuh's float pk_mul /
    # pk_add): NVRTC had contracted the residual's dequantize-multiply and the add into one fma, within an ulp here
    # (the H100 showed it) and, at a near-tie of the requantization, one step off an int8 output (2026-12-08)
    check(layer, inputs, NHWC)
