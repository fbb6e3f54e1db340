"""The depthwise channels-last tactics (cuda.conv_nhwc.depthwise_p8 / _p4): the tile planning and
kernel choice (CPU), and every path of conv_depthwise.cu against the float64 reference kernel with
poisoned outputs (GPU): kernel sizes 3, 5, 7, 1 x 7, 7 x 1 and 4, strides 1 / 2 / 3, dilation 2,
asymmetric pads, 8 / 24 / 96 and tail (13) channels, channel multipliers 1 and 2, batch 1 and 3,
odd sizes, float16 / bfloat16 / float32 storage, each epilogue input class, misaligned tensors.
test_conv_depthwise_emulated.py runs the same kernels on the host, without a GPU."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.conv.conv_depthwise import (FAST_WIDTHS, SMEM_LIMIT, VARIANTS, compile_variants,
                                                      depthwise_window, plan_depthwise, row_slots)
from polykit.kernels.tactics import candidates, find_tactic

rng = np.random.default_rng(29)
BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
#: ||out - ref|| / ||ref|| against the float64 reference: the output's rounding dominates
TOL = {F16: 2e-3, BF16: 1e-2, F32: 1e-5}
P8, P4 = (v.name for v in VARIANTS)
RESIDUAL_RELU = {"input": "raw", "body": [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
                                          {"op": "Relu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}]}


def rand(shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def depthwise_layer(x, w, attrs, dtype=F16, *, bias=True, epilogue=None, extra=None, group=None):
    """(layer with stamped dtypes and shapes, inputs, output specs) of a depthwise ConvNHWC:
    x NHWC, w (M, KH, KW, 1), group C, random inputs of `dtype`; `extra`: epilogue input shapes.
    With `group`, any grouped ConvNHWC (w (M, KH, KW, C / group))."""
    from polykit.runtime.cuda.harness import infer_output_specs

    inputs = {"X": rand(x, dtype), "W": rand(w, dtype)}
    if bias:
        inputs["B"] = rand((w[0],), dtype)
    names = ("X", "W", "B" if bias else "")
    for name, shape in (extra or {}).items():
        inputs[name] = rand(shape, dtype)
        names += (name,)
    attrs = dict(attrs, group=group or x[3], kernel_shape=list(w[1:3]))
    if epilogue:
        attrs["epilogue"] = epilogue
    names = names if epilogue else tuple(n for n in names if n)
    layer = LayerDesc("dw", "ConvNHWC", names, ("Y",), attrs, domain=POLYKIT_DOMAIN, precision="fp16")
    specs = infer_output_specs(layer, inputs)
    layer = replace(layer, in_dtypes=tuple(np.dtype(inputs[n].dtype).name if n else "" for n in names),
                    out_dtypes=(np.dtype(dtype).name,), in_shapes=tuple(tuple(inputs[n].shape) if n else () for n in names),
                    out_shapes=(specs["Y"][0],))
    return layer, inputs, specs


def reference(layer, inputs) -> np.ndarray:
    from polykit.compiler.ops.references import run_reference

    node = Node("ConvNHWC", list(layer.inputs), ["Y"], dict(layer.attrs), "dw", POLYKIT_DOMAIN)
    return run_reference(node, [inputs[n].astype(np.float64) if n else None for n in layer.inputs])[0]


def rel_err(out, ref) -> float:
    out = np.asarray(out, np.float64)
    assert not np.isnan(out).any(), "unwritten (NaN) elements"
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


# ---- CPU: which layers the tactics take, and the tiles they launch --------------------------
def test_depthwise_window_takes_group_c_with_any_channel_multiplier():
    assert depthwise_window({"group": 8}, (1, 5, 5, 8), (8, 3, 3, 1)).M == 8
    assert depthwise_window({"group": 8}, (1, 5, 5, 8), (24, 3, 3, 1)).M == 24


@pytest.mark.parametrize("attrs,x,w", [({"group": 1}, (1, 5, 5, 8), (8, 3, 3, 8)),      # dense
                                       ({"group": 4}, (1, 5, 5, 8), (8, 3, 3, 2)),      # grouped
                                       ({"group": 8}, (1, 5, 5, 8), (12, 3, 3, 1)),     # M not a multiple of C
                                       ({"group": 8}, (1, 5, 8), (8, 3, 1))])           # 1-D
def test_depthwise_window_declines_other_convolutions(attrs, x, w):
    assert depthwise_window(attrs, x, w) is None


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("x,w,y,attrs,itemsize", [
    ((32, 56, 56, 96), (96, 7, 7, 1), (32, 56, 56, 96), {"pads": [3, 3, 3, 3]}, 2),       # ConvNeXt-T stage 1
    ((32, 7, 7, 768), (768, 7, 7, 1), (32, 7, 7, 768), {"pads": [3, 3, 3, 3]}, 2),        # ... stage 4
    ((32, 112, 112, 96), (96, 3, 3, 1), (32, 56, 56, 96), {"strides": [2, 2], "pads": [0, 0, 1, 1]}, 2),
    ((3, 13, 10, 13), (26, 5, 5, 1), (3, 7, 5, 26), {"strides": [2, 2], "pads": [2, 2, 2, 2]}, 4),
    ((1, 40, 40, 64), (64, 13, 13, 1), (1, 40, 40, 64), {"pads": [6, 6, 6, 6]}, 4),
    ((1, 9, 30, 16), (16, 3, 3, 1), (1, 5, 15, 16), {"strides": [2, 2], "pads": [2, 2, 2, 2],
                                                      "dilations": [2, 2]}, 2)])
def test_plan_covers_the_output_within_the_block_and_shared_memory_limits(variant, x, w, y, attrs, itemsize):
    plan = plan_depthwise(dict(attrs, group=x[3]), x, w, y, itemsize, variant)
    assert plan is not None and plan.smem <= SMEM_LIMIT and plan.block[0] <= variant.threads
    gx, gy, gz = plan.grid
    assert gx * plan.TH * plan.TWT * plan.p >= y[1] * y[2] and gy * plan.VB * 8 >= w[0] and gz == x[0]
    assert -(-y[1] // plan.TH) * plan.tiles_w == gx and plan.tiles_w * plan.TWT * plan.p >= y[2]
    iw = (plan.TWT * plan.p - 1) * plan.SW + (plan.KW - 1) * plan.DW + 1
    assert plan.IWP >= iw + (iw - 1) // (plan.p * plan.SW)  # the skewed row holds every column


def test_plan_declines_a_kernel_whose_smallest_tile_does_not_fit_shared_memory():
    x, w, y = (1, 64, 64, 8), (8, 41, 41, 1), (1, 64, 64, 8)
    assert plan_depthwise({"group": 8, "pads": [20] * 4}, x, w, y, 4, VARIANTS[0]) is None


@pytest.mark.parametrize("twt,vb", [(7, 2), (4, 2), (14, 1), (2, 4), (1, 8), (3, 2)])
def test_skewed_columns_put_the_8_lanes_of_a_16_byte_load_phase_on_8_bank_groups(twt, vb):
    """The first chunk each lane of a warp reads (column j = 0 of its group, kernel row 0): within
    each phase of 8 lanes, 8 different 16-byte bank groups when the groups of a phase share a row
    stride that row_slots could match (stride 1)."""
    p, sw, th = 8, 1, 32 // (twt * vb) + 2
    g = p * sw
    iwp = row_slots((twt * p - 1) * sw + 7, g, 1, twt)
    for warp in range(max(1, twt * th * vb // 32)):
        for phase in range(4):
            banks = set()
            for lane in range(8 * phase, 8 * phase + 8):
                t = 32 * warp + lane
                v, q = t % vb, t // vb
                tw, row = q % twt, q // twt
                banks.add(((row * iwp + tw * (g + 1)) * vb + v) % 8)
            assert len(banks) == 8


def test_kernels_specialize_common_widths_and_strides_and_run_the_rest_at_run_time():
    def kw_sw(x, w, attrs):
        layer, _, _ = depthwise_layer(x, w, attrs)
        (kernel,) = find_tactic("cuda", "ConvNHWC", P8).kernels(layer)
        d = dict(kernel.defines)
        return int(d["DW_KW"]), int(d["DW_SW"])

    assert kw_sw((1, 9, 9, 8), (8, 7, 7, 1), {"pads": [3, 3, 3, 3]}) == (7, 1)
    assert kw_sw((1, 9, 9, 8), (8, 1, 5, 1), {"strides": [1, 2]}) == (5, 2)
    assert kw_sw((1, 9, 9, 8), (8, 3, 3, 1), {"dilations": [2, 2]}) == (0, 1)     # W dilation
    assert kw_sw((1, 9, 9, 8), (8, 7, 1, 1), {}) == (0, 1)                       # width 1
    assert kw_sw((1, 9, 9, 8), (8, 3, 3, 1), {"strides": [3, 3]}) == (0, 1)      # W stride 3
    assert set(FAST_WIDTHS) == {3, 5, 7}


def test_depthwise_tactics_lead_the_candidates_of_depthwise_layers_only():
    dw, _, _ = depthwise_layer((1, 9, 9, 16), (16, 3, 3, 1), {"pads": [1, 1, 1, 1]})
    assert {t.name for t in candidates("cuda", "ConvNHWC", dw)[:2]} == {P8, P4}
    dense = replace(dw, attrs=dict(dw.attrs, group=1), in_shapes=((1, 9, 9, 16), (16, 3, 3, 16), (16,)))
    assert not {P8, P4} & {t.name for t in candidates("cuda", "ConvNHWC", dense)}


def test_every_variant_is_declared_for_the_nvrtc_compile_test():
    variants = compile_variants()
    declared = {(dict(k.defines)["ELEM"], dict(k.defines)["DW_KW"], dict(k.defines)["DW_SW"], dict(k.defines)["DW_P"])
                for k in variants if k.code is None}
    assert sum(k.code is not None and "apply_epilogue" in k.code for k in variants) == 2  # with an epilogue
    for v in VARIANTS:
        for kw in FAST_WIDTHS:
            for sw in (1, 2):
                assert ("half_t", str(kw), str(sw), str(v.p)) in declared
        assert {("half_t", "0", "1", str(v.p)), ("float", "0", "1", str(v.p)), ("bf16_t", "0", "1", str(v.p))} <= declared


# ---- GPU: every path against the reference --------------------------------------------------
# (x NHWC, w (M, KH, KW, 1), attrs)
CASES = [
    ((1, 9, 11, 8), (8, 3, 3, 1), {"pads": [1, 1, 1, 1]}),
    ((3, 13, 10, 24), (24, 5, 5, 1), {"strides": [2, 2], "pads": [2, 1, 2, 3]}),          # asymmetric pads
    ((2, 15, 17, 96), (96, 7, 7, 1), {"pads": [3, 3, 3, 3]}),                            # ConvNeXt-like
    ((1, 9, 17, 13), (13, 3, 3, 1), {"strides": [1, 2], "pads": [1, 1, 1, 1]}),          # tail channels
    ((3, 7, 9, 8), (16, 3, 3, 1), {"pads": [1, 1, 1, 1]}),                               # multiplier 2
    ((1, 6, 7, 13), (26, 5, 5, 1), {"strides": [2, 2], "pads": [2, 2, 2, 2]}),           # tail, multiplier 2
    ((1, 1, 23, 24), (24, 1, 7, 1), {"pads": [0, 3, 0, 3]}),                             # 1 x 7 on H = 1
    ((1, 10, 9, 16), (16, 7, 1, 1), {"pads": [3, 0, 3, 0]}),                             # 7 x 1: run-time
    ((1, 12, 13, 24), (24, 3, 3, 1), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),       # dilation: run-time
    ((2, 11, 12, 96), (96, 3, 3, 1), {"strides": [2, 2], "pads": [0, 0, 1, 1]}),         # EfficientNet-like
    ((2, 10, 10, 16), (16, 4, 4, 1), {"strides": [3, 2], "pads": [1, 2, 2, 1]}),         # width 4, stride 3
]
#: the cases run in every storage type (the rest in float16)
ALL_TYPES = (2, 3, 8)


def run_case(x, w, attrs, dtype, tactic, **kw):
    from polykit.runtime.cuda.harness import run_layer

    layer, inputs, specs = depthwise_layer(x, w, attrs, dtype, **{k: v for k, v in kw.items() if k != "misalign"})
    out = run_layer(layer, inputs, tactic=tactic, output_specs=specs, misalign=kw.get("misalign"))["Y"]
    assert out.dtype == np.dtype(dtype)
    return rel_err(out, reference(layer, inputs))


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", [P8, P4])
@pytest.mark.parametrize("x,w,attrs", CASES)
def test_depthwise_matches_the_reference_in_float16(x, w, attrs, tactic):
    assert run_case(x, w, attrs, F16, tactic) <= TOL[F16]


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", [P8, P4])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", ALL_TYPES)
def test_depthwise_matches_the_reference_in_bfloat16_and_float32(case, dtype, tactic):
    assert run_case(*CASES[case], dtype, tactic) <= TOL[dtype]


@pytest.mark.gpu
def test_depthwise_without_bias():
    assert run_case(*CASES[2], F16, P8, bias=False) <= TOL[F16]


# (x, w, attrs, skip shape): a residual of the output's shape ("full": 16-byte loads), a per-channel
# vector ("last"), a broadcast over rows ("general": strided), and a tail-channel residual
EPI_CASES = [
    ((2, 7, 9, 16), (16, 3, 3, 1), {"pads": [1, 1, 1, 1]}, (2, 7, 9, 16)),
    ((2, 7, 9, 16), (16, 3, 3, 1), {"pads": [1, 1, 1, 1]}, (16,)),
    ((2, 7, 9, 16), (16, 3, 3, 1), {"pads": [1, 1, 1, 1]}, (2, 1, 9, 1)),
    ((1, 11, 9, 13), (13, 5, 5, 1), {"strides": [2, 2], "pads": [2, 2, 2, 2]}, (1, 6, 5, 13)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("x,w,attrs,skip", EPI_CASES)
def test_residual_relu_epilogue_reads_each_input_class(x, w, attrs, skip, dtype):
    assert run_case(x, w, attrs, dtype, P8, epilogue=RESIDUAL_RELU, extra={"skip": skip}) <= TOL[dtype]


@pytest.mark.gpu
def test_epilogue_on_the_p4_tactic():
    x, w, attrs, skip = EPI_CASES[0]
    assert run_case(x, w, attrs, F16, P4, epilogue=RESIDUAL_RELU, extra={"skip": skip}) <= TOL[F16]


@pytest.mark.gpu
@pytest.mark.parametrize("shifted", ["X", "W", "Y", "skip"])
def test_misaligned_tensors_take_the_element_paths(shifted):
    """X off 16 bytes: element staging; W off: element weight loads; Y or the residual off: element
    stores / epilogue."""
    x, w, attrs, skip = EPI_CASES[0]
    assert run_case(x, w, attrs, F16, P8, epilogue=RESIDUAL_RELU, extra={"skip": skip},
                    misalign={shifted: 2}) <= TOL[F16]


@pytest.mark.gpu
def test_a_convnext_stage_1_layer_at_batch_4():
    """The tile of a real layer (56 x 56 x 96, 7 x 7): several blocks a row of tiles, 6 channel slices."""
    assert run_case((4, 56, 56, 96), (96, 7, 7, 1), {"pads": [3, 3, 3, 3]}, F16, P8) <= TOL[F16]


SILU = {"input": "raw", "body": [{"op": "Sigmoid", "inputs": ["raw"], "outputs": ["s"], "attrs": {}},
                                 {"op": "Mul", "inputs": ["raw", "s"], "outputs": ["Y"], "attrs": {}}]}
#: small images, where a block's weight run is long against its tile: (x, w, attrs) -- an EfficientNet-V2-like
#: 12 x 12 layer whose last channel slice runs past M (40 of 64), a 7 x 7 on a 3 x 3 image (several batches
#: of weight chunks a thread), 13 x 13 (the run-time width), and a 5 x 5 / 2 with a multiplier and M % 8 != 0
SMALL_CASES = [
    ((2, 12, 12, 40), (40, 3, 3, 1), {"pads": [1, 1, 1, 1]}),
    ((1, 3, 3, 64), (64, 7, 7, 1), {"pads": [3, 3, 3, 3]}),
    ((1, 5, 4, 24), (24, 13, 13, 1), {"pads": [6, 6, 6, 6]}),
    ((2, 7, 7, 13), (26, 5, 5, 1), {"strides": [2, 2], "pads": [2, 2, 2, 2]}),
]


# ---- CPU: the weights' 16-byte path is taken where W allows it ------------------------------
@pytest.mark.parametrize("w_ptr,vec_w", [(4096, True), (4098, False)])
def test_launch_reads_the_weights_16_bytes_at_a_time_only_from_an_aligned_w(w_ptr, vec_w):
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.cuda.conv.conv_depthwise import VEC_W, VEC_X, _depthwise_launch

    layer, _, _ = depthwise_layer(*SMALL_CASES[0])
    (x, w, _), y = layer.in_shapes, layer.out_shapes[0]
    plan = plan_depthwise(layer.attrs, x, w, y, 2, VARIANTS[1])
    tensors = [DeviceTensor(ptr, shape, F16) for ptr, shape in ((1 << 20, x), (w_ptr, w), (1 << 24, y))]
    _, vec_in, _ = _depthwise_launch(VARIANTS[1])(layer, plan, "half_t", *tensors)
    assert vec_in == VEC_X | (VEC_W if vec_w else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", [P8, P4])
@pytest.mark.parametrize("x,w,attrs", SMALL_CASES)
def test_small_images_with_a_silu_epilogue(x, w, attrs, tactic):
    assert run_case(x, w, attrs, F16, tactic, epilogue=SILU) <= TOL[F16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])
def test_small_image_weight_runs_in_bfloat16_and_float32(dtype):
    assert run_case(*SMALL_CASES[1], dtype, P4) <= TOL[dtype]


@pytest.mark.gpu
def test_misaligned_weights_of_a_small_image():
    assert run_case(*SMALL_CASES[3], F16, P4, misalign={"W": 2}) <= TOL[F16]
