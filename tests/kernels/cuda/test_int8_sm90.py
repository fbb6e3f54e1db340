"""The sm_90a INT8 convolution (`cuda.int8.sm90_*`, int8_sm90.py: conv_sm90 on s8 wgmma).

GPU tests (H100) compare against the exact cpu reference with outputs poisoned first: INT8 results are
exact (the int32 sum, then the float32 dequantization the reference computes), so equality is exact. CPU
tests check which layers the tactics take, on hand-made records and on a real --int8 ResNet plan.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.calibrate import calibrate
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes.insert_qdq import constant_tensors, int8_candidates
from polykit.kernels.cuda.int8 import int8, int8_gemm_sm90, int8_sm90
from polykit.runtime.engine import Runtime

from ...compiler.int8_models import feeds_for, quantize_with_onnxruntime, small_resnet
from .test_int8 import RESIDUAL, check, int8_residual, layer_of, q, rng, stamped

gpu = pytest.mark.gpu
TACTICS = [f"cuda.int8.sm90_{t.label}" for t in int8_sm90.TILES]
SUPPORTS = {f"cuda.int8.sm90_{t.label}": int8_sm90._supports(t) for t in int8_sm90.TILES}

# (NHWC X, KRSC W, attrs): C and N not multiples of the tiles, N*OH*OW not a multiple of BM, 1x1 / 3x3 /
# 7x7 stride 2, dilation, asymmetric pads, K over several stages (ring wrap), more tiles than SMs
CASES = [
    ((2, 7, 9, 48), (130, 1, 1, 48), {}),
    ((2, 15, 15, 256), (96, 1, 1, 256), {"strides": [2, 2]}),
    ((3, 14, 14, 64), (64, 3, 3, 64), {"pads": [1, 1, 1, 1]}),
    ((1, 13, 10, 32), (200, 3, 3, 32), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 17, 16, 16), (24, 7, 7, 16), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((1, 13, 10, 32), (9, 3, 2, 32), {"strides": [2, 3], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((1, 8, 8, 512), (72, 3, 3, 512), {"pads": [1, 1, 1, 1]}),
    ((16, 28, 28, 64), (160, 3, 3, 64), {"pads": [1, 1, 1, 1]}),
]


def sym_inputs(x, w, per_channel=True, y_dtype=None, bias=True):
    """Symmetric int8 operands (zero points 0: what --int8 builds make) and random scale / bias."""
    n = w[0]
    out = {"X": q(x, np.int8), "XZ": np.int8(0), "W": q(w, np.int8),
           "WZ": np.zeros((n,) if per_channel else (), np.int8),
           "S": rng.uniform(1e-4, 2e-3, (n,) if per_channel else ()).astype(np.float32)}
    if bias:
        out["B"] = rng.standard_normal(n).astype(np.float32)
    if y_dtype is not None:
        out.update(YS=np.float32(rng.uniform(0.05, 0.2)), YZ=q((), y_dtype))
    return out


def sym_layer(inputs, attrs, epilogue=None, extra=()):
    layer = layer_of("QConvNHWC", inputs, {**attrs, "symmetric": 1}, epilogue, extra)
    return stamped(layer, inputs)


def run_sm90(layer, inputs, tactic):
    assert SUPPORTS[tactic](layer), f"{tactic} refuses {layer.in_dtypes} {layer.in_shapes} {layer.attrs}"
    check(layer, inputs, tactic)


@gpu
@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize("x,w,attrs", CASES)
def test_sm90_qconv_float_output_equals_the_reference(x, w, attrs, tactic):
    inputs = sym_inputs(x, w)
    run_sm90(sym_layer(inputs, attrs), inputs, tactic)


@gpu
@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize("y_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("x,w,attrs", [CASES[0], CASES[1], CASES[3], CASES[4]])
def test_sm90_qconv_requantized_output_equals_the_reference(x, w, attrs, y_dtype, tactic):
    """N 96, 200, 24: the 8-channel epilogue (int8_out.cuh dequantize8 / store8, one 8-byte store); N 130: put."""
    inputs = sym_inputs(x, w, per_channel=False, y_dtype=y_dtype, bias=False)
    run_sm90(sym_layer(inputs, attrs), inputs, tactic)


@gpu
@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize("y_dtype", [np.int8, None])
@pytest.mark.parametrize("n", [24, 27], ids=["8_channels_a_lane", "per_element"])
def test_sm90_qconv_with_a_float_residual_and_relu(tactic, y_dtype, n):
    inputs = sym_inputs((2, 10, 9, 32), (n, 3, 3, 32), y_dtype=y_dtype)
    inputs["skip"] = rng.standard_normal((2, 10, 9, n)).astype(np.float32)
    run_sm90(sym_layer(inputs, {"pads": [1, 1, 1, 1]}, RESIDUAL, ("skip",)), inputs, tactic)



def near_tie_inputs(n, y_dtype):
    """Small int8 operands (|acc| < 2^8) and scale = y_scale / 2 per tensor, no bias: v / y_scale is
    acc / 2 up to float rounding, so every odd acc lands within a few ulps of a half-integer, where
    int8_out.cuh's requantize must leave v * (1 / y_scale) for the IEEE division."""
    small = lambda shape: rng.integers(-3, 4, shape).astype(np.int8)
    ys = np.float32(0.037)  # v * (1 / ys) rounds ~6 % of odd-acc quotients across the tie (0.1: none)
    return {"X": small((2, 7, 9, 48)), "XZ": np.int8(0), "W": small((n, 1, 1, 48)), "WZ": np.int8(0),
            "S": np.float32(ys * np.float32(0.5)), "YS": ys, "YZ": q((), y_dtype)}


def zero_y_case(case: str, y_dtype, n: int):
    """(layer, inputs) of a requantized layer whose output zero point is a constant 0 and stamped so (y_symmetric,
    what --int8 builds stamp: int8_out.cuh's Y_ZERO 0, the rounding by conversion): `case` "requantized" (random
    operands, per-channel scale and bias), "residual" (an int8 residual with Relu) or "ties" (near_tie_inputs: v /
    y_scale on and next to half-integers), n output channels."""
    from polykit.compiler.ops.quant.int8 import Y_SYMMETRIC

    if case == "residual":
        inputs = int8_residual_inputs(n, y_dtype)
        layer = sym_layer(inputs, {Y_SYMMETRIC: 1}, int8_residual(False), ("skip", "skip_scale"))
    else:
        inputs = near_tie_inputs(n, y_dtype) if case == "ties" else sym_inputs((2, 10, 9, 64), (n, 1, 1, 64),
                                                                               y_dtype=y_dtype)
        layer = sym_layer(inputs, {Y_SYMMETRIC: 1})
    inputs["YZ"] = np.zeros((), y_dtype)
    return layer, inputs


def test_a_constant_zero_output_zero_point_compiles_the_rounding_by_conversion():
    """int8.out_defines: Y_ZERO 0 for an int8 / uint8 output stamped y_symmetric, none for a float output or an
    unstamped layer (the zero point read at run time)."""
    from polykit.kernels.cuda.int8.int8 import out_defines

    for y_dtype in (np.int8, np.uint8):
        layer, _ = zero_y_case("requantized", y_dtype, 96)
        assert ("Y_ZERO", "0") in out_defines(layer)
        assert ("Y_ZERO", "0") in int8_sm90.kernel(layer, int8_sm90.TILES[0]).defines
        assert ("Y_ZERO", "0") not in out_defines(layer, "float32")
        plain = sym_layer(sym_inputs((2, 10, 9, 64), (96, 1, 1, 64), y_dtype=y_dtype), {})
        assert not any(name == "Y_ZERO" for name, _ in out_defines(plain))


@gpu
@pytest.mark.parametrize("tactic", TACTICS + [f"cuda.int8.gemm_sm90_{t.label}" for t in int8_gemm_sm90.TILES])
@pytest.mark.parametrize("case", ["requantized", "residual", "ties"])
@pytest.mark.parametrize("y_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("n", [136, 131], ids=["8_channels_a_lane", "per_element"])
def test_an_output_zero_point_of_constant_0_requantizes_as_the_reference(tactic, case, y_dtype, n):
    """Y_ZERO 0 (rint by cvt.rni, NaN -> 0, the packing's saturation) gives the reference's bytes, ties included, on
    the conv tiles and the GEMM tiles over rows (their residual in registers before the K loop up to 256 columns)."""
    from polykit.kernels.tactics import find_tactic

    layer, inputs = zero_y_case(case, y_dtype, n)
    assert find_tactic("cuda", "QConvNHWC", tactic).supports(layer)
    check(layer, inputs, tactic)


@gpu
@pytest.mark.parametrize("tactic", TACTICS + ["cuda.int8.mma_conv_nhwc"])
@pytest.mark.parametrize("y_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("n", [96, 130], ids=["8_channels_a_lane", "per_element"])
def test_requantization_at_half_integer_quotients_equals_the_reference(tactic, y_dtype, n):
    """Round half to even of v / y_scale where v / y_scale sits on or next to a tie, for a third or more
    of the outputs: the reciprocal product alone would round some of them the other way."""
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    inputs = near_tie_inputs(n, y_dtype)
    layer = sym_layer(inputs, {})
    ref = reference_layer(layer, inputs)["Y"]
    x, w = inputs["X"].astype(np.int64), inputs["W"].astype(np.int64)
    acc = np.einsum("bhwc,nc->bhwn", x, w[:, 0, 0, :])
    assert (acc % 2 == 1).mean() > 0.3 and np.abs(acc).max() < 256, "the case has too few ties"
    got = run_layer(layer, inputs, tactic=tactic)["Y"]
    differ = np.argwhere(got != ref)
    assert differ.size == 0, (f"{len(differ)} of {got.size} outputs differ from the reference, first at "
                              f"{differ[:3].tolist()}: acc {[int(acc[tuple(i)]) for i in differ[:3]]}")


@gpu
@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize("ys", [2.0 ** -95, 2.0 ** 95], ids=["tiny", "huge"])
def test_a_y_scale_outside_the_quotients_range_divides_and_equals_the_reference(tactic, ys):
    """int8_out.cuh's division-free quotient holds for y_scale in [2^-90, 2^90]; outside, vec_ok sends
    every output to put, whose requantize divides (__fdiv_rn). scale = ys / 2 keeps v / ys near acc / 2:
    ties and saturation on both sides."""
    inputs = near_tie_inputs(96, np.int8)
    inputs.update(YS=np.float32(ys), S=np.float32(ys * 0.5))
    run_sm90(sym_layer(inputs, {}), inputs, tactic)


def large_sum_inputs(n, y_dtype):
    """int8 operands near +-127 whose signs agree along C = 1536 for half the pixels (|acc| from 18.6 M
    to 24.8 M: past 2^22, where int8_out.cuh's acc_float leaves the 1.5 * 2^23 shifter for I2F, and
    past 2^24, where float32 rounds the sum) and are random for the rest (small sums, the shifter)."""
    pixels, c = (2, 6, 5), 1536
    mag = lambda shape: rng.integers(110, 128, shape)
    sign_x = np.where(rng.random(pixels + (1,)) < 0.5, 1, -1) * np.ones(pixels + (c,), np.int64)
    sign_x[1] = np.where(rng.random((6, 5, c)) < 0.5, 1, -1)  # the second image: random signs
    sign_w = np.where(rng.random((n, 1, 1, 1)) < 0.5, 1, -1)
    inputs = sym_inputs(pixels + (c,), (n, 1, 1, c), y_dtype=y_dtype)
    inputs.update(X=(sign_x * mag(pixels + (c,))).astype(np.int8), W=(sign_w * mag((n, 1, 1, c))).astype(np.int8))
    return inputs


@gpu
@pytest.mark.parametrize("tactic", TACTICS + ["cuda.int8.mma_conv_nhwc"])
@pytest.mark.parametrize("y_dtype", [np.int8, None])
@pytest.mark.parametrize("n", [96, 130], ids=["8_channels_a_lane", "per_element"])
def test_sums_past_2_22_round_to_float_as_the_reference(tactic, y_dtype, n):
    """float(acc) * scale + bias in float32 (reference/int8.py's dequantize): sums of 2^22 and more
    take __int2float_rn, those past 2^24 round to nearest even there, as numpy's astype does."""
    inputs = large_sum_inputs(n, y_dtype)
    x, w = inputs["X"].astype(np.int64), inputs["W"].astype(np.int64)
    acc = np.abs(np.einsum("bhwc,nc->bhwn", x, w[:, 0, 0, :]))
    assert (acc > 1 << 24).mean() > 0.3 and (acc % 2 == 1).any() and (acc < 1 << 22).mean() > 0.3, \
        "the case lacks large, odd or small sums"
    layer = sym_layer(inputs, {})
    if tactic.startswith("cuda.int8.sm90"):
        run_sm90(layer, inputs, tactic)
    else:
        check(layer, inputs, tactic)


def int8_residual_inputs(n, y_dtype):
    """An identity block's last conv: the block's int8 input as residual, int8 (or float) out."""
    inputs = sym_inputs((2, 10, 9, 64), (n, 1, 1, 64), y_dtype=y_dtype)
    inputs.update(skip=q((2, 10, 9, n), np.int8), skip_scale=np.float32(0.037))
    return inputs


@gpu
@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize("y_dtype", [np.int8, None])
@pytest.mark.parametrize("n", [136, 131], ids=["8_channels_a_lane", "per_element"])
def test_sm90_qconv_dequantizes_an_int8_residual_in_the_epilogue(tactic, y_dtype, n):
    inputs = int8_residual_inputs(n, y_dtype)
    layer = sym_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale"))
    assert layer.in_dtypes[8] == "int8"
    if y_dtype is not None:
        run_sm90(layer, inputs, tactic)
        return
    # float output: the residual's dequantize-multiply and the add may contract into one fma (one
    # rounding fewer than the reference's steps), as in test_int8.py: within an ulp of |y| (~136)
    from polykit.runtime.cuda.harness import assert_matches_reference

    assert SUPPORTS[tactic](layer)
    assert_matches_reference(layer, inputs, tactic=tactic, rtol=1e-6, atol=4e-5)


@gpu
@pytest.mark.parametrize("tactic", [TACTICS[0], TACTICS[-1]])
def test_sm90_qconv_int8_residual_float_output_is_the_same_bits_on_both_epilogue_paths(tactic):
    """Float output with an int8 residual is the one case checked with a tolerance (an fma may
    contract the residual's dequantization into the add), so check the 8-channel path against
    the per-element one directly: 136 channels take dequantize8 / store8, one more (137) sends every element
    through put; the shared 136 channels come from the same accumulators and must be the same
    bits."""
    from polykit.runtime.cuda.harness import run_layer

    full = int8_residual_inputs(137, None)
    per_channel = ("W", "WZ", "S", "B")
    narrow = {k: (np.ascontiguousarray(v[:136]) if k in per_channel else v) for k, v in full.items()}
    narrow["skip"] = np.ascontiguousarray(full["skip"][..., :136])
    out = {}
    for n, inputs in ((137, full), (136, narrow)):
        layer = sym_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale"))
        assert SUPPORTS[tactic](layer)
        out[n] = run_layer(layer, inputs, tactic=tactic)["Y"]
    pairs, vector = np.ascontiguousarray(out[137][..., :136]).view(np.uint32), out[136].view(np.uint32)
    differ = np.argwhere(vector != pairs)
    assert differ.size == 0, f"{len(differ)} elements differ between the paths, first at {differ[:3].tolist()}"


@gpu
@pytest.mark.parametrize("misalign,y_dtype", [({"Y": 1}, np.int8), ({"Y": 4}, None), ({"S": 4}, np.int8),
                                              ({"B": 4}, np.int8), ({"skip": 1}, np.int8)],
                         ids=["int8_Y", "float_Y", "scale", "bias", "residual"])
def test_sm90_qconv_with_unaligned_tensors_falls_back_to_put(misalign, y_dtype):
    """Out::vec_ok refuses the 8-channel path when Y, the per-channel scale / bias or the
    residual is off 16-byte alignment (element-aligned): the per-element path still equals the
    reference exactly."""
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    inputs = int8_residual_inputs(136, y_dtype)
    epilogue, extra = (int8_residual(False), ("skip", "skip_scale")) if y_dtype else (None, ())
    if not y_dtype:
        del inputs["skip"], inputs["skip_scale"]
    layer = sym_layer(inputs, {}, epilogue, extra)
    assert SUPPORTS[TACTICS[0]](layer)
    got = run_layer(layer, inputs, tactic=TACTICS[0], misalign=misalign)["Y"]
    np.testing.assert_array_equal(got, reference_layer(layer, inputs)["Y"])


#: an --fp16 build's INT8 layer whose float32 output a Cast to float16 read (passes/absorb_quantized_casts.py): Relu,
#: then that Cast, stored as float16 (int8_out.cuh Y_OUT 3)
HALF_OUT = {"input": "raw", "body": int8.HALF_OUT}
HALF_TACTICS = TACTICS + [f"cuda.int8.gemm_sm90_{t.label}" for t in int8_gemm_sm90.TILES] + ["cuda.int8.mma_conv_nhwc"]


def half_case(n: int):
    """(layer, inputs): a 1x1 stride-1 symmetric INT8 conv of 64 -> n channels (a GEMM over rows: every tactic of
    HALF_TACTICS takes it) with HALF_OUT, stamped: a float16 output."""
    inputs = sym_inputs((2, 10, 9, 64), (n, 1, 1, 64))
    return sym_layer(inputs, {}, HALF_OUT), inputs


@gpu
@pytest.mark.parametrize("tactic", HALF_TACTICS)
@pytest.mark.parametrize("n", [136, 131], ids=["8_channels_a_lane", "per_element"])
def test_a_float16_output_is_the_references_cast_bit_for_bit(tactic, n):
    """Y_OUT 3 on the sm90 conv and GEMM tiles (the transposed 16-byte path: 8 halves a store; put past it) and on
    int8.cu (put, the type compiled in): the float32 value rounded to float16 as the Cast rounds it."""
    from polykit.kernels.tactics import find_tactic

    layer, inputs = half_case(n)
    assert layer.out_dtypes == ("float16",) and find_tactic("cuda", "QConvNHWC", tactic).supports(layer)
    check(layer, inputs, tactic)


def test_every_int8_tactic_takes_a_float16_output_and_compiles_it_in():
    """CPU: the sm90 tiles compile Y_OUT 3 from the record (int8.out_defines), int8.cu's kernels too (int8.half_out:
    their flags say only float32 or 8 bits)."""
    from polykit.kernels.tactics import find_tactic

    layer, _ = half_case(136)
    for name in HALF_TACTICS:
        tactic = find_tactic("cuda", "QConvNHWC", name)
        assert tactic.supports(layer), name
        assert all(("Y_OUT", "3") in k.defines for k in tactic.kernels(layer)), name
    matmul = replace(int8.half_layer("QMatMul"), in_shapes=((33, 80), (), (80, 50), (), (50,), (), (), ()))
    for name in ("cuda.int8.mma_matmul", "cuda.int8.mma_matmul_sk4"):
        tactic = find_tactic("cuda", "QMatMul", name)
        assert tactic.supports(matmul), name
        assert all(("Y_OUT", "3") in k.defines for k in tactic.kernels(matmul)), name


def test_the_sm90_tactics_refuse_what_they_do_not_compute():
    inputs = sym_inputs((1, 6, 6, 32), (16, 3, 3, 32))
    layer = sym_layer(inputs, {"pads": [1, 1, 1, 1]})
    assert all(s(layer) for s in SUPPORTS.values())
    no_attr = stamped(layer_of("QConvNHWC", inputs, {"pads": [1, 1, 1, 1]}), inputs)
    u8 = dict(inputs, X=q((1, 6, 6, 32), np.uint8), XZ=np.uint8(128))
    nchw = sym_inputs((1, 32, 6, 6), (16, 32, 3, 3))
    refused = {"no symmetric attribute": no_attr, "uint8 X": sym_layer(u8, {"pads": [1, 1, 1, 1]}),
               "hand-built (unstamped)": layer_of("QConvNHWC", inputs, {"symmetric": 1}),
               "NCHW QConv": stamped(layer_of("QConv", nchw, {"symmetric": 1}), nchw)}
    for what, bad in refused.items():
        assert not any(s(bad) for s in SUPPORTS.values()), what


def test_an_int8_resnet_plan_marks_its_convolutions_symmetric_and_the_sm90_tactics_take_them():
    model = load_onnx(small_resnet())
    cfg = BuilderConfig(target="cpu", int8=True, channels_last=True,
                        calibration_data=[feeds_for(small_resnet(), s) for s in range(2)])
    convs = [layer for layer in build_plan(model, cfg).layers if layer.kind == "QConvNHWC"]
    assert len(convs) == 18  # 17 convolutions and the classifier's GEMM as a 1x1 conv over its rows
    assert [c.name for c in convs if not c.attrs.get("symmetric")] == []
    assert [c.name for c in convs if not SUPPORTS[TACTICS[0]](c)] == []


def test_an_onnxruntime_uint8_plan_is_not_symmetric(tmp_path):
    path = quantize_with_onnxruntime(small_resnet(), tmp_path / "q.onnx", activations="uint8", per_channel=True)
    convs = [layer for layer in build_plan(path, BuilderConfig(target="cpu", channels_last=True)).layers
             if layer.kind == "QConvNHWC"]
    assert convs and not any(c.attrs.get("symmetric") or SUPPORTS[TACTICS[0]](c) for c in convs)


def run_plan(plan, feeds):
    with Runtime(plan.target).deserialize_engine(plan) as engine:
        return next(iter(engine.create_execution_context().execute(feeds).values()))


@gpu
def test_an_int8_resnet_on_the_sm90_tactics_equals_the_mma_plan_and_the_cpu_plan():
    graph = load_onnx(small_resnet())
    names = list(dict.fromkeys(x for _, x in int8_candidates(graph, constant_tensors(graph))))
    scales = calibrate(graph, names, [feeds_for(small_resnet(), s) for s in range(2)], "cpu", "minmax")
    ranges = {name: (-127.0 * s, 127.0 * s) for name, s in scales.items()}  # tensor_ranges take (min, max)
    # level 0: the first tactic by priority everywhere (mma.sync for QConvNHWC), nothing timed
    cfg = BuilderConfig(target="cuda", int8=True, tensor_ranges=ranges, builder_optimization_level=0)
    mma = build_plan(graph, cfg)
    convs = {layer.name: layer.tactic for layer in mma.layers if layer.kind == "QConvNHWC"}
    # 17 convolutions and the classifier (a QMatMul, run as a 1x1 QConvNHWC)
    assert len(convs) == 18 and set(convs.values()) == {"cuda.int8.mma_conv_nhwc"}, convs
    replay = {name: TACTICS[i % len(TACTICS)] for i, name in enumerate(convs)}
    sm90 = build_plan(graph, replace(cfg, tactic_replay=replay))
    got = {layer.name: layer.tactic for layer in sm90.layers if layer.kind == "QConvNHWC"}
    assert got == replay, f"tactics not forced: {got}"
    cpu = build_plan(graph, BuilderConfig(target="cpu", int8=True, tensor_ranges=ranges, channels_last=True))
    feeds = feeds_for(small_resnet(), 5)
    got, want, exact = run_plan(sm90, feeds), run_plan(cpu, feeds), run_plan(mma, feeds)
    np.testing.assert_array_equal(got, exact, err_msg="the sm90 INT8 convolutions differ from the mma.sync ones")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg="cuda INT8 plan vs the cpu plan")


def test_the_8_channel_epilogue_reads_each_residual_in_its_own_type():
    """With stamped shapes the residual is read at the output index: apply_epilogue8 loads 8
    int8 (one 8-byte load) or 8 float residual values; without shapes the epilogue has no
    8-wide form (EPI_VEC 0) and the kernel keeps Out::put."""
    from polykit.kernels.cuda.gemm.epilogue import epilogue_prelude
    from polykit.kernels.cuda.int8.int8 import residual_layer

    int8_code = epilogue_prelude(int8_sm90._shaped_residual_layer("int8"), "float")
    float_code = epilogue_prelude(int8_sm90._shaped_residual_layer("float32"), "float")
    for code, elem in ((int8_code, "i8"), (float_code, "ELEM")):
        assert "#define EPI_VEC 1" in code and f"{elem} x0[8];" in code and "load8(in.x0, E.e0 + oi);" in code
    assert "#define EPI_VEC 0" in epilogue_prelude(residual_layer(int8_sm90.KIND, "int8"), "float")


@pytest.mark.parametrize("per_channel,bias,y_dtype", [(True, True, np.int8), (False, False, np.uint8),
                                                      (True, False, None)])
def test_the_kernel_a_plan_compiles_is_the_one_its_enqueue_launches(per_channel, bias, y_dtype):
    """int8_sm90.kernel compiles the output type and the scale / bias steps in (int8.out_defines): from
    the stamped record at build time, from the tensors at enqueue (int8_args' steps); the two agree."""
    from polykit.kernels.cuda.int8.int8 import Y_OUT, out_defines

    inputs = sym_inputs((1, 8, 8, 32), (24, 1, 1, 32), per_channel=per_channel, y_dtype=y_dtype, bias=bias)
    layer = sym_layer(inputs, {})
    want = {"Y_OUT": str(Y_OUT[np.dtype(y_dtype or np.float32).name]), "SCALE_STEP": str(int(per_channel)),
            "BIAS_STEP": str(int(per_channel) if bias else 2)}
    steps = (int(per_channel), int(per_channel) if bias else 2)
    assert dict(out_defines(layer)) == want
    assert dict(out_defines(layer, np.dtype(y_dtype or np.float32).name, steps)) == want
    tile = int8_sm90.TILES[0]
    assert int8_sm90.kernel(layer, tile) == int8_sm90.kernel(layer, tile, np.dtype(y_dtype or np.float32).name, steps)
