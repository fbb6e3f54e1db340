"""The grouped channels-last tactics (cuda.conv_nhwc.grouped_p4 / _p2): which layers they take, the
tile planning and kernel choice (CPU), NVRTC compiles of every variant, and every path of
conv_grouped.cu against the float64 reference kernel with poisoned outputs (GPU): 2, 3, 4, 8, 12,
16, 24 and 32 channels a group, kernels 1 x 1, 3 x 3, 5 x 5, strides 1 / 2, dilation 2, sizes that
are no multiple of the tile, output channels a group other than the input's, float16 / bfloat16 /
float32 storage, epilogues, misaligned tensors. test_conv_grouped_emulated.py runs a sample on the
host, without a GPU."""

from __future__ import annotations


import numpy as np
import pytest

from polykit.kernels.cuda.conv.conv_grouped import (MAX_SLICE, SMEM_LIMIT, VARIANTS, compile_variants, grouped_window,
                                                    plan_grouped, slices, thread_channels)
from polykit.kernels.cuda.conv.conv_grouped_mma import VARIANTS as MMA_VARIANTS
from polykit.kernels.tactics import candidates, find_tactic
from tests.kernels.cuda import test_conv_depthwise
from tests.kernels.cuda.test_conv_depthwise import (BF16, F16, F32, RESIDUAL_RELU, TOL, depthwise_layer, reference,
                                                    rel_err)

P4, P2 = (v.name for v in VARIANTS)


def grouped_layer(x, w, group, attrs, dtype=F16, **kw):
    return depthwise_layer(x, w, attrs, dtype, group=group, **kw)


# ---- CPU: which layers the tactics take, and the tiles they launch --------------------------
def test_grouped_window_takes_two_or_more_channels_a_group():
    win = grouped_window({"group": 32}, (1, 56, 56, 128), (128, 3, 3, 4))
    assert (win.cpg, win.mg, win.v) == (4, 4, 4)
    assert grouped_window({"group": 4}, (1, 5, 5, 16), (8, 3, 3, 4)).v == 2
    assert grouped_window({"group": 4}, (1, 5, 5, 12), (12, 3, 3, 3)).v == 1


@pytest.mark.parametrize("attrs,x,w", [({"group": 1}, (1, 5, 5, 8), (8, 3, 3, 8)),      # dense
                                       ({"group": 8}, (1, 5, 5, 8), (8, 3, 3, 1)),      # depthwise
                                       ({"group": 4}, (1, 5, 5, 8), (6, 3, 3, 2)),      # M not a multiple of group
                                       ({"group": 3}, (1, 5, 5, 8), (6, 3, 3, 2)),      # C not group * cpg
                                       ({"group": 4}, (1, 5, 8), (8, 3, 2))])           # 1-D
def test_grouped_window_declines_other_convolutions(attrs, x, w):
    assert grouped_window(attrs, x, w) is None


def test_thread_channels_divide_a_groups_output_channels():
    assert [thread_channels(m) for m in (32, 24, 12, 4, 6, 3, 1)] == [8, 8, 4, 4, 2, 1, 1]


def test_slices_are_whole_groups_or_part_of_one():
    win = grouped_window({"group": 32}, (1, 7, 7, 1024), (1024, 3, 3, 32))
    assert set(slices(win, 256)) == {8, 16, 32, 64, 128}        # parts of a group of 32, then 2 and 4 groups
    win = grouped_window({"group": 4}, (1, 7, 7, 48), (48, 3, 3, 12))
    assert all(cb % win.mg == 0 or win.mg % cb == 0 for cb in slices(win, 256)) and 12 in slices(win, 256)
    assert max(slices(win, 256)) <= MAX_SLICE


# (x NHWC, w (M, KH, KW, C / group), group, attrs)
CASES = [
    ((1, 9, 11, 16), (16, 3, 3, 2), 8, {"pads": [1, 1, 1, 1]}),                              # cpg 2
    ((2, 7, 10, 12), (12, 3, 3, 3), 4, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),           # cpg 3, C % 8 != 0
    ((2, 14, 13, 128), (128, 3, 3, 4), 32, {"pads": [1, 1, 1, 1]}),                          # ResNeXt stage 1
    ((1, 11, 9, 64), (64, 3, 3, 8), 8, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),           # cpg 8, stride 2
    ((1, 8, 9, 48), (48, 5, 5, 12), 4, {"pads": [2, 1, 2, 3]}),                              # 5 x 5, asymmetric pads
    ((2, 7, 7, 256), (256, 3, 3, 16), 16, {"pads": [1, 1, 1, 1]}),                           # cpg 16
    ((1, 9, 10, 48), (48, 1, 1, 24), 2, {}),                                                 # 1 x 1, cpg 24
    ((2, 7, 7, 1024), (1024, 3, 3, 32), 32, {"pads": [1, 1, 1, 1]}),                         # ResNeXt stage 4
    ((1, 12, 13, 32), (32, 3, 3, 8), 4, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),        # dilation 2
    ((1, 9, 9, 16), (32, 3, 3, 4), 4, {"pads": [1, 1, 1, 1]}),                               # 8 outputs a group
    ((1, 9, 9, 16), (8, 3, 3, 4), 4, {"strides": [1, 2], "pads": [1, 1, 1, 1]}),             # 2 outputs a group
    ((3, 29, 31, 48), (48, 3, 3, 24), 2, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),         # RegNet-like, odd size
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("x,w,group,attrs", CASES + [
    ((32, 56, 56, 128), (128, 3, 3, 4), 32, {"pads": [1, 1, 1, 1]}),
    ((32, 56, 56, 256), (256, 3, 3, 8), 32, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((32, 7, 7, 1024), (1024, 3, 3, 32), 32, {"pads": [1, 1, 1, 1]})])
def test_plan_covers_the_output_within_the_block_and_shared_memory_limits(variant, x, w, group, attrs):
    layer, _, specs = grouped_layer(x, w, group, attrs) if x[0] < 4 else (None, None, None)
    y = specs["Y"][0] if specs else (x[0], -(-x[1] // attrs["strides"][0]) if "strides" in attrs else x[1],
                                     -(-x[2] // attrs["strides"][1]) if "strides" in attrs else x[2], w[0])
    plan = plan_grouped(dict(attrs, group=group), x, w, y, variant)
    assert plan is not None and plan.smem <= SMEM_LIMIT and plan.block[0] <= variant.threads
    gx, gy, gz = plan.grid
    assert gx * plan.TH * plan.TWT * plan.p >= y[1] * y[2] and gy * plan.CB >= w[0] and gz == x[0]
    assert plan.CB % plan.v == 0 and (plan.CB % (w[0] // group) == 0 or (w[0] // group) % plan.CB == 0)
    groups = max(1, plan.CB // (w[0] // group))
    assert plan.CINP >= groups * -(-w[3] // 4) * 4 and plan.CINP % 4 == 0


def test_plan_declines_a_kernel_whose_smallest_tile_does_not_fit_shared_memory():
    x, w, y = (1, 64, 64, 512), (512, 15, 15, 64), (1, 64, 64, 512)
    assert plan_grouped({"group": 8, "pads": [7] * 4}, x, w, y, VARIANTS[0]) is None
    layer, _, _ = grouped_layer((1, 9, 9, 512), (512, 15, 15, 64), 8, {"pads": [7] * 4})
    assert not find_tactic("cuda", "ConvNHWC", P4).supports(layer)


def test_kernels_take_the_channels_a_thread_of_the_layers_groups():
    for w, group, v in (((128, 3, 3, 4), 32, 4), ((48, 3, 3, 12), 4, 4), ((256, 3, 3, 16), 16, 8),
                        ((12, 3, 3, 3), 4, 1)):
        layer, _, _ = grouped_layer((1, 9, 9, w[3] * group), w, group, {"pads": [1, 1, 1, 1]})
        (kernel,) = find_tactic("cuda", "ConvNHWC", P4).kernels(layer)
        assert dict(kernel.defines)["GC_V"] == str(v)


def test_grouped_tactics_lead_the_candidates_of_grouped_layers_only():
    layer, _, _ = grouped_layer((1, 9, 9, 64), (64, 3, 3, 8), 8, {"pads": [1, 1, 1, 1]})
    assert {t.name for t in candidates("cuda", "ConvNHWC", layer)[:2]} == {P4, P2}
    dw, _, _ = depthwise_layer((1, 9, 9, 16), (16, 3, 3, 1), {"pads": [1, 1, 1, 1]})
    assert not {P4, P2} & {t.name for t in candidates("cuda", "ConvNHWC", dw)}


def test_every_variant_compiles_with_nvrtc():
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    variants = compile_variants()
    assert sum(k.code is not None and "apply_epilogue" in k.code for k in variants) == 2  # with an epilogue
    declared = {(dict(k.defines)["ELEM"], dict(k.defines)["GC_V"], dict(k.defines)["GC_P"])
                for k in variants if k.code is None}
    for v in VARIANTS:
        assert {("half_t", str(c), str(v.p)) for c in (8, 4, 2, 1)} <= declared
        assert {(e, "8", str(v.p)) for e in ("float", "bf16_t")} <= declared
    units = unique_units(variants)
    assert check_all(units, "sm_90") == len(units)


# ---- GPU: every path against the reference --------------------------------------------------
def run_case(x, w, group, attrs, dtype, tactic, **kw):
    return test_conv_depthwise.run_case(x, w, attrs, dtype, tactic, group=group, **kw)


#: the CASES the p2 tactic runs too (each channels-a-thread count, strides, dilation, odd sizes)
P2_CASES = (0, 1, 4, 8, 10, 11)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic,case", [(P4, c) for c in range(len(CASES))] + [(P2, c) for c in P2_CASES])
def test_grouped_matches_the_reference_in_float16(case, tactic):
    assert run_case(*CASES[case], F16, tactic) <= TOL[F16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", [1, 2, 5])
def test_grouped_matches_the_reference_in_bfloat16_and_float32(case, dtype):
    assert run_case(*CASES[case], dtype, P4) <= TOL[dtype]


@pytest.mark.gpu
def test_grouped_without_bias():
    assert run_case(*CASES[3], F16, P4, bias=False) <= TOL[F16]


# (x, w, group, attrs, skip shape): a residual of the output's shape ("full": 16-byte loads with 8
# channels a thread), a per-channel vector, a broadcast over rows (strided), 4 channels a thread
EPI_CASES = [
    ((2, 7, 9, 64), (64, 3, 3, 8), 8, {"pads": [1, 1, 1, 1]}, (2, 7, 9, 64)),
    ((2, 7, 9, 64), (64, 3, 3, 8), 8, {"pads": [1, 1, 1, 1]}, (64,)),
    ((2, 7, 9, 64), (64, 3, 3, 8), 8, {"pads": [1, 1, 1, 1]}, (2, 1, 9, 1)),
    ((1, 11, 9, 48), (48, 3, 3, 4), 12, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, (1, 6, 5, 48)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("x,w,group,attrs,skip", EPI_CASES)
def test_residual_relu_epilogue_reads_each_input_class(x, w, group, attrs, skip, dtype):
    assert run_case(x, w, group, attrs, dtype, P4, epilogue=RESIDUAL_RELU, extra={"skip": skip}) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", [P2] + [v.name for v in MMA_VARIANTS])
@pytest.mark.parametrize("shifted", ["X", "Y", "skip"])
def test_misaligned_tensors_take_the_element_paths(shifted, tactic):
    x, w, group, attrs, skip = EPI_CASES[0]
    assert run_case(x, w, group, attrs, F16, tactic, epilogue=RESIDUAL_RELU, extra={"skip": skip},
                    misalign={shifted: 2}) <= TOL[F16]


@pytest.mark.gpu
def test_a_resnext_stage_1_layer_at_batch_4():
    """The tile of a real layer (56 x 56 x 128, 32 groups of 4): many blocks a row, several slices."""
    assert run_case((4, 56, 56, 128), (128, 3, 3, 4), 32, {"pads": [1, 1, 1, 1]}, F16, P4) <= TOL[F16]
