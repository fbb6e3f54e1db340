"""The tensor-core grouped channels-last tactics (cuda.conv_nhwc.grouped_mma_p32, grouped_mma_pipe_p32
and grouped_mma_persist_p32) and the dense ones on the same kernel (conv_halo_mma: halo_mma_pipe_p32
and halo_mma_persist_p32, group 1, 8 to 96 channels): which layers they take, the tiles they plan and
where the tuner puts them (CPU), NVRTC compiles
of every variant for sm_80 and sm_90, the grouped kernels run on the host (block_emulation.py with
warp_emulation.py's mma.sync, ldmatrix and cp.async; the dense tactics' emulated cases are
test_conv_halo_emulated.py's), and on the GPU against the
float64 reference with poisoned outputs: 8, 16, 24 and 32 channels a group, 3 x 3, 5 x 3, 3 x 1 and
1 x 1 kernels, strides 2, dilation 2, odd sizes, float16 and bfloat16, an epilogue, a misaligned
input (the element staging), blocks looping over several tiles; the dense tactics on DENSE_CASES
(8 to 96 channels, 1 x 1, 3 x 3, 5 x 5, strides 2, dilation 2, odd sizes) with a SiLU + residual
epilogue besides; outputs placed in a Concat's slice (PLACED: emulated and on the GPU, the rest of
each row keeping its poison); test_conv_grouped.py runs the grouped ones on misaligned tensors too."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.conv import conv_grouped_mma
from polykit.kernels.cuda.conv import conv_halo_mma
from polykit.kernels.cuda.conv.conv_grouped_mma import (MMA_SMEM_LIMIT, PERSIST, PIPE, VARIANTS, choose_mma_tile,
                                                        compile_variants, mma_window, plan_mma, predict, warp_n8)
from polykit.kernels.cuda.conv.conv_halo_mma import HALO_PRIORITY, MAX_CHANNELS, halo_window, tactic_name
from polykit.kernels.tactics import candidates, find_tactic
from tests.kernels.cuda.test_conv_depthwise import BF16, F16, F32, RESIDUAL_RELU, TOL
from tests.kernels.cuda.test_conv_grouped import CASES, EPI_CASES, grouped_layer, run_case

MMA, PIPES, PERSISTS = VARIANTS[0].name, PIPE.name, PERSIST.name
TACTICS = [v.name for v in VARIANTS]
#: the CASES with multiples of 8 input and output channels a group, and windows that split the
#: pipelined kernel's staging otherwise: 5 x 3 with H dilation 2 and strides 2 (three commit groups,
#: the last of several rows), 3 x 1 (kernel row 0 shorter than a k16 step: its phase empty), 1 x 1
MMA_CASES = [3, 5, 7, 8, 11, 12, 13, 14]
CASES = CASES + [
    ((1, 13, 12, 32), (32, 5, 3, 8), 4, {"strides": [2, 2], "dilations": [2, 1], "pads": [3, 1, 2, 1]}),
    ((2, 9, 7, 32), (32, 3, 1, 16), 2, {"pads": [1, 0, 1, 0]}),
    ((1, 6, 10, 64), (128, 1, 1, 8), 8, {"strides": [1, 2]}),
]
#: the dense tactics, each on conv_grouped_mma's variant of the same kernel
HALO = {tactic_name(v): v for v in conv_halo_mma.VARIANTS}
HALO_PIPE, HALO_PERSIST = tactic_name(PIPE), tactic_name(PERSIST)
#: group-1 layers (x NHWC, w (M, KH, KW, C), attrs): odd sizes, 8 to 96 channels in and out (n8
#: counts 1 to 4), 3 x 3, 1 x 1, 5 x 5, strides 2, dilation 2, asymmetric pads, M past one slice
DENSE_CASES = [
    ((1, 9, 11, 24), (24, 3, 3, 24), {"pads": [1, 1, 1, 1]}),                               # EfficientNet-V2 24 -> 24
    ((2, 13, 12, 8), (24, 3, 3, 8), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),             # its stem (C padded to 8)
    ((1, 11, 9, 32), (32, 3, 3, 32), {"pads": [1, 1, 1, 1]}),                               # UNet 32 -> 32
    ((1, 9, 10, 64), (32, 3, 3, 64), {"pads": [1, 1, 1, 1]}),                               # UNet 64 -> 32
    ((1, 7, 9, 32), (64, 3, 3, 32), {"pads": [1, 1, 1, 1]}),                                # UNet 32 -> 64
    ((1, 10, 9, 16), (16, 1, 1, 16), {}),                                                   # 1 x 1
    ((1, 9, 8, 16), (8, 5, 5, 16), {"pads": [2, 1, 2, 3]}),                                 # 5 x 5, asymmetric pads
    ((1, 12, 13, 24), (16, 3, 3, 24), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),         # dilation 2
    ((1, 13, 11, 40), (48, 3, 3, 40), {"strides": [1, 2], "pads": [1, 1, 1, 1]}),           # W stride 2, 40 -> 48
    ((1, 9, 9, 96), (96, 3, 3, 96), {"pads": [1, 1, 1, 1]}),                                # MAX_CHANNELS
]
#: (x, skip) of a SiLU + residual epilogue (EfficientNet's fused MBConv): a full residual, a broadcast one
SILU_RESIDUAL = {"input": "raw", "body": conv_halo_mma.SILU_RESIDUAL[:2] + [
    {"op": "Add", "inputs": ["t", "skip"], "outputs": ["Y"], "attrs": {}}]}


# ---- CPU --------------------------------------------------------------------------------------
def test_mma_window_takes_multiples_of_8_channels_a_group():
    assert mma_window({"group": 32}, (1, 7, 7, 256), (256, 3, 3, 8)) is not None
    assert mma_window({"group": 32}, (1, 7, 7, 128), (128, 3, 3, 4)) is None      # cpg 4
    assert mma_window({"group": 4}, (1, 7, 7, 32), (16, 3, 3, 8)) is None         # 4 outputs a group
    assert [warp_n8(m) for m in (8, 16, 24, 32, 64, 56)] == [1, 2, 3, 4, 4, 1]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("case", MMA_CASES + [2])
def test_plan_covers_the_output_in_whole_warps(case, variant):
    x, w, group, attrs = CASES[case]
    layer, _, specs = grouped_layer(x, w, group, attrs)
    plan = plan_mma(layer.attrs, x, w, specs["Y"][0], "float16", variant)
    if case == 2:  # cpg 4: not these tactics'
        assert plan is None and not find_tactic("cuda", "ConvNHWC", variant.name).supports(layer)
        return
    y = specs["Y"][0]
    assert plan is not None and plan.smem <= MMA_SMEM_LIMIT and plan.block[0] <= 256
    assert plan.TH * plan.TWT <= plan.PWARPS * 32 and plan.CB == plan.CW * 8 * plan.nb
    assert -(-plan.TH * plan.TWT // 32) == plan.PWARPS and plan.TH <= y[1]   # no warp without pixels
    assert plan.CB % (w[0] // group) == 0 or (w[0] // group) % plan.CB == 0
    gx, gy, gz = plan.grid
    tiles = -(-y[1] // plan.TH) * -(-y[2] // plan.TWT)
    if variant == PERSIST:   # blocks a slice looping over every image's tiles, as evenly as they divide
        assert (gx, gz) == (-(-w[0] // plan.CB), 1) and 1 <= gy == plan.ctas <= tiles * x[0]
        assert -(-tiles * x[0] // gy) * (gy - 1) < tiles * x[0]
    else:
        pair = (gy, gx) if variant == PIPE else (gx, gy)
        assert pair == (tiles, -(-w[0] // plan.CB)) and gz == x[0]
    assert plan_mma(layer.attrs, x, w, y, "float32", variant) is None
    assert find_tactic("cuda", "ConvNHWC", variant.name).supports(layer)


@pytest.mark.parametrize("x,w,group", [((32, 28, 28, 256), (256, 3, 3, 8), 32),
                                       ((32, 7, 7, 1024), (1024, 3, 3, 32), 32),
                                       ((32, 14, 14, 408), (408, 3, 3, 24), 17)])
def test_plans_of_real_layers_fit_with_several_warps(x, w, group):
    for variant in VARIANTS:
        plan = plan_mma({"group": group, "pads": [1, 1, 1, 1]}, x, w, x[:3] + (w[0],), "float16", variant)
        assert plan is not None and plan.smem <= MMA_SMEM_LIMIT and plan.block[0] >= 64


def test_predict_counts_the_launched_mmas_and_persist_stages_weights_once():
    """ResNeXt-50's stage-4 entry at batch 32 (14 x 14 -> 7 x 7, 32 groups of 32): every variant's
    launched MMAs cover the layer's (a 7 x 7 tile in two warps' 64 pixels at most), DRAM bytes are
    X, W and Y once, PERSIST stages less than PIPE (its weights once a block), and each tactic's
    estimate is a positive time."""
    x, w, group, attrs = (32, 14, 14, 1024), (1024, 3, 3, 32), 32, {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    layer, _, specs = grouped_layer(x, w, group, attrs)
    y = specs["Y"][0]
    exact = 2 * 32 * 7 * 7 * 1024 * 288
    preds = {}
    for variant in VARIANTS:
        plan = plan_mma(layer.attrs, x, w, y, "float16", variant)
        preds[variant] = predict(plan)
        assert exact <= preds[variant]["flops"] <= exact * 64 / 49
        assert preds[variant]["dram"] == 2 * (32 * 14 * 14 * 1024 + 32 * 7 * 7 * 1024 + 1024 * 288)
        assert preds[variant]["us"] >= preds[variant]["dram"] / 4.0e6
        assert find_tactic("cuda", "ConvNHWC", variant.name).estimate(layer, 132) > 0
    assert preds[PERSIST]["staged"] < preds[PIPE]["staged"]


def test_float32_layers_are_not_the_tensor_core_tactics():
    layer, _, _ = grouped_layer((1, 9, 9, 64), (64, 3, 3, 8), 8, {"pads": [1, 1, 1, 1]}, F32)
    assert not set(TACTICS) & {t.name for t in candidates("cuda", "ConvNHWC", layer)}
    layer, _, _ = grouped_layer((1, 9, 9, 64), (64, 3, 3, 8), 8, {"pads": [1, 1, 1, 1]}, BF16)
    assert set(TACTICS) <= {t.name for t in candidates("cuda", "ConvNHWC", layer)}


def test_every_variant_compiles_with_nvrtc():
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    variants = compile_variants()
    assert {(k.name, dict(k.defines).get("GM_PERSIST"), dict(k.defines)["GM_BF16"], dict(k.defines)["GM_NB"])
            for k in variants if k.code is None} == \
        {(name, persist, b, nb) for name, persist in (("conv_grouped_mma_nhwc", None),
                                                      ("conv_grouped_mma_pipe_nhwc", "0"),
                                                      ("conv_grouped_mma_pipe_nhwc", "1"))
         for b in ("0", "1") for nb in ("1", "2", "3", "4")}
    units = unique_units(variants)
    for arch in ("sm_80", "sm_90"):
        assert check_all(units, arch) == len(units)


# ---- CPU: group 1 (conv_halo_mma) --------------------------------------------------------------
def dense_layer(x, w, attrs, dtype=F16, **kw):
    return grouped_layer(x, w, 1, attrs, dtype, **kw)


def test_halo_window_takes_dense_multiples_of_8_channels_up_to_max_channels():
    win = halo_window({"group": 1}, (1, 7, 7, 24), (24, 3, 3, 24))
    assert (win.G, win.cpg, win.mg) == (1, 24, 24) and MAX_CHANNELS == 96
    assert halo_window({}, (1, 7, 7, 96), (8, 5, 5, 96)) is not None
    assert halo_window({"group": 1}, (1, 7, 7, 12), (16, 3, 3, 12)) is None       # C 12
    assert halo_window({"group": 1}, (1, 7, 7, 16), (20, 3, 3, 16)) is None       # M 20
    assert halo_window({"group": 1}, (1, 7, 7, 128), (32, 3, 3, 128)) is None     # past MAX_CHANNELS
    assert halo_window({"group": 1}, (1, 7, 7, 32), (104, 3, 3, 32)) is None
    assert halo_window({"group": 2}, (1, 7, 7, 32), (32, 3, 3, 16)) is None       # grouped: mma_window's
    assert mma_window({"group": 1}, (1, 7, 7, 32), (32, 3, 3, 32)) is None


@pytest.mark.parametrize("case", range(len(DENSE_CASES)))
def test_dense_layers_are_the_halo_tactics_and_not_the_grouped_ones(case):
    layer, _, _ = dense_layer(*DENSE_CASES[case])
    names = {t.name for t in candidates("cuda", "ConvNHWC", layer)}
    assert set(HALO) <= names and not set(TACTICS) & names
    grouped, _, _ = grouped_layer(*CASES[3][:3], CASES[3][3])
    assert not set(HALO) & {t.name for t in candidates("cuda", "ConvNHWC", grouped)}


@pytest.mark.parametrize("x,w,attrs,dtype", [
    ((1, 9, 9, 24), (24, 3, 3, 24), {"pads": [1, 1, 1, 1]}, F32),        # 32-bit storage
    ((1, 9, 9, 12), (24, 3, 3, 12), {"pads": [1, 1, 1, 1]}, F16),        # C not a multiple of 8
    ((1, 9, 9, 128), (128, 3, 3, 128), {"pads": [1, 1, 1, 1]}, F16),    # past MAX_CHANNELS
    ((1, 9, 9, 64), (64, 5, 5, 64), {"pads": [2, 2, 2, 2]}, F16),        # the smallest slice's weights past the limit
])
def test_halo_tactics_refuse_what_the_kernel_cannot_take(x, w, attrs, dtype):
    layer, _, _ = dense_layer(x, w, attrs, dtype)
    assert not set(HALO) & {t.name for t in candidates("cuda", "ConvNHWC", layer)}


@pytest.mark.parametrize("tactic", sorted(HALO))
@pytest.mark.parametrize("case", range(len(DENSE_CASES)))
def test_halo_plan_covers_the_output_with_slices_of_one_group(case, tactic):
    x, w, attrs = DENSE_CASES[case]
    layer, _, specs = dense_layer(x, w, attrs)
    y, variant = specs["Y"][0], HALO[tactic]
    plan = plan_mma(layer.attrs, x, w, y, "float16", variant, window_of=halo_window)
    assert plan is not None and plan.G == 1 and plan.smem <= MMA_SMEM_LIMIT and plan.block[0] <= 256
    assert w[0] % plan.CB == 0 and plan.CB == plan.CW * 8 * plan.nb           # a slice is M or a divisor of it
    assert plan.TH * plan.TWT <= plan.PWARPS * 32 and -(-plan.TH * plan.TWT // 32) == plan.PWARPS
    tiles = -(-y[1] // plan.TH) * -(-y[2] // plan.TWT)
    gx, gy, gz = plan.grid
    assert (gx, gz) == (w[0] // plan.CB, 1 if variant == PERSIST else x[0])
    assert 1 <= gy <= tiles * x[0] if variant == PERSIST else gy == tiles
    assert plan_mma(layer.attrs, x, w, y, "float32", variant, window_of=halo_window) is None


def test_predict_of_a_dense_layer_stages_whole_pixels():
    """EfficientNet-V2-S's 24 -> 24 3 x 3 at batch 32: the launched MMAs cover the layer's, DRAM
    bytes are X, W and Y once, a staged pixel is its 48 bytes (no sector rounding: the slice reads
    every channel), PERSIST stages less than PIPE, and the estimates are positive times."""
    x, w, attrs = (32, 192, 192, 24), (24, 3, 3, 24), {"pads": [1, 1, 1, 1]}
    exact = 2 * 32 * 192 * 192 * 24 * 216
    preds = {}
    for variant in (PIPE, PERSIST):
        plan = plan_mma(attrs, x, w, x, "float16", variant, window_of=halo_window)
        preds[variant] = predict(plan)
        tiles = -(-192 // plan.TH) * plan.tiles_w * 32
        window = ((plan.TH - 1) + 3) * ((plan.TWT - 1) + 3)
        weights = (plan.ctas or tiles) * 24 * 216 * 2
        assert exact <= preds[variant]["flops"] <= exact * 224 / 216 * 1.2
        assert preds[variant]["dram"] == 2 * (2 * 32 * 192 * 192 * 24 + 24 * 216)
        assert preds[variant]["staged"] == tiles * window * 48 + weights
    assert preds[PERSIST]["staged"] < preds[PIPE]["staged"]
    layer, _, _ = dense_layer((1, 9, 9, 24), w, attrs)
    assert all(find_tactic("cuda", "ConvNHWC", t).estimate(layer, 132) > 0 for t in HALO)


@pytest.mark.parametrize("x,w,attrs", [((32, 192, 192, 24), (24, 3, 3, 24), {"pads": [1, 1, 1, 1]}),
                                       ((32, 384, 384, 8), (24, 3, 3, 8), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
                                       ((8, 512, 512, 32), (32, 3, 3, 32), {"pads": [1, 1, 1, 1]})])
def test_level_0_keeps_the_sm90_tile_and_level_3_times_a_halo_tactic(x, w, attrs):
    """EfficientNet-V2-S's and UNet's small dense convs on sm_90 (132 SMs): the builder's candidates
    lead with the sm90 tiles, so a level-0 build takes one of them; the halo tactics sit below the
    sm90 tiles and igemm_mma (so no level-0 build anywhere takes them untimed), and a level-3 build
    times halo_mma_persist (the first halo family past the cap) against four sm90 tiles."""
    from dataclasses import replace

    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.builder.tuner import LEVELS, candidate_pairs, capped

    small, _, _ = dense_layer((1, 9, 9, x[3]), w, attrs)
    s = attrs.get("strides", [1, 1])[0]
    layer = replace(small, in_shapes=(x,) + small.in_shapes[1:], out_shapes=((x[0], x[1] // s, x[2] // s, w[0]),))
    pairs = candidate_pairs(layer, "cuda", BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0),
                            {}, "sm_90", 132)
    names = [t.name for _, t in pairs]
    assert names[0].startswith("cuda.conv_nhwc.sm90_") and set(HALO) <= set(names)
    assert all(t.priority > HALO_PRIORITY for _, t in pairs if t.name.startswith("cuda.conv_nhwc.sm90_"))
    assert find_tactic("cuda", "ConvNHWC", "cuda.conv_nhwc.igemm_mma").priority > HALO_PRIORITY
    timed = [t.name for _, t in capped(pairs, LEVELS[3].cap)]
    assert HALO_PERSIST in timed and sum(n.startswith("cuda.conv_nhwc.sm90_") for n in timed) == 4
    arch_free = candidate_pairs(layer, "cuda", BuilderConfig(target="cuda", fp16=True), {}, "", 0)
    assert arch_free[0][1].name == "cuda.conv_nhwc.igemm_mma"     # no GPU, or another one: as before


def test_every_halo_variant_compiles_with_nvrtc():
    """The SiLU + residual epilogue of a dense layer on each variant, storage and n8 count (the
    kernels without an epilogue are the grouped tactics' units, compiled above)."""
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    variants = conv_halo_mma.compile_variants()
    assert all(k.code is not None and "apply_epilogue" in k.code for k in variants)
    assert {(k.name, dict(k.defines)["GM_PERSIST"], dict(k.defines)["GM_BF16"], dict(k.defines)["GM_NB"])
            for k in variants} == {("conv_grouped_mma_pipe_nhwc", p, b, nb)
                                   for p in "01" for b in "01" for nb in "1234"}
    units = unique_units(variants)
    for arch in ("sm_80", "sm_90"):
        assert check_all(units, arch) == len(units)


# ---- host emulation (block_emulation.py; mma.sync, ldmatrix, cp.async: warp_emulation.py) ----------
#: the dense tactics' emulated cases are test_conv_halo_emulated.py's
def emulated_launcher(tmp_path_factory, eager: bool):
    """The kernels on the host, cp.async copies deferred to their wait or landing at once (`eager`)."""
    from tests.kernels.cuda.block_emulation import host_launcher

    return host_launcher(tmp_path_factory, "GM_PARAMS", "GM_ARGS", eager_copies=eager)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    return emulated_launcher(tmp_path_factory, eager=False)


@pytest.fixture(scope="module")
def eager_launcher(tmp_path_factory):
    return emulated_launcher(tmp_path_factory, eager=True)


@pytest.mark.parametrize("tactic,case,dtype", [(t, c, d) for t in TACTICS for c, d in ((3, F16), (5, BF16), (8, F16),
                                                                                     (11, F16))]
                         + [(t, c, d) for t in (PIPES, PERSISTS) for c, d in ((12, F16), (13, BF16), (14, F16))])
def test_emulated_mma_matches_the_reference(launcher, tactic, case, dtype):
    from tests.kernels.cuda.test_conv_depthwise_emulated import run_emulated

    x, w, group, attrs = CASES[case]
    assert run_emulated(launcher, tactic, x, w, attrs, dtype, group=group) <= TOL[dtype]


@pytest.mark.parametrize("tactic", TACTICS)
def test_emulated_mma_residual_relu_epilogue_and_misaligned_output(launcher, tactic):
    from tests.kernels.cuda.test_conv_depthwise_emulated import run_emulated

    x, w, group, attrs, skip = EPI_CASES[0]
    assert run_emulated(launcher, tactic, x, w, attrs, F16, shift_y=1, group=group, epilogue=RESIDUAL_RELU,
                        extra={"skip": skip}) <= TOL[F16]


@pytest.fixture
def two_sms(monkeypatch):
    """Plans for a device of 2 SMs holding one block each: PERSIST's blocks each loop over several
    tiles (at most 2 blocks a slice)."""
    monkeypatch.setattr(conv_grouped_mma, "SMS", 2)
    monkeypatch.setattr(conv_grouped_mma, "resident_blocks", lambda smem, warps, variant: 1)
    choose_mma_tile.cache_clear()
    yield
    choose_mma_tile.cache_clear()


def run_persistent(launcher, tactic, case, dtype):
    """`case` (x, w, group, attrs) at batch 3 on `tactic` (a PERSIST one) with two_sms's plans: the
    error against the reference; asserts the launch had fewer blocks a slice than tiles."""
    from tests.kernels.cuda.test_conv_depthwise_emulated import run_emulated

    x, w, group, attrs = case
    x = (3,) + tuple(x[1:])
    err = run_emulated(launcher, tactic, x, w, attrs, dtype, group=group)
    layer, _, specs = grouped_layer(x, w, group, attrs)
    window_of = halo_window if group == 1 else mma_window
    plan = plan_mma(layer.attrs, x, w, specs["Y"][0], "float16", PERSIST, window_of=window_of)
    tiles = x[0] * -(-plan.OH // plan.TH) * plan.tiles_w
    assert launcher.launches[-1][1] == plan.grid and 1 <= plan.ctas < tiles   # fewer blocks a slice than tiles
    return err


@pytest.mark.parametrize("copies", ["deferred", "eager"])
@pytest.mark.parametrize("case,dtype", [(3, F16), (5, BF16), (11, F16), (12, F16), (14, BF16)])
def test_emulated_persistent_blocks_loop_over_double_buffered_tiles(request, two_sms, case, dtype, copies):
    """Each block computes several tiles of several images (weights staged once, the next window
    in flight in the other buffer): with deferred copies a window read before its group was waited
    for computes with stale data, with eager ones a refill of a buffer some warp still reads races."""
    launcher = request.getfixturevalue("launcher" if copies == "deferred" else "eager_launcher")
    assert run_persistent(launcher, PERSISTS, CASES[case], dtype) <= TOL[dtype]


def run_misaligned_input(launcher, tactic, case):
    """`case` (x, w, group, attrs) in float16 with X 2 bytes off 16 on `tactic`: the error against
    the reference; asserts the pipelined kernel ran."""
    from tests.kernels.cuda.test_conv_depthwise import reference, rel_err

    x, w, group, attrs = case
    layer, inputs, specs = grouped_layer(x, w, group, attrs, F16)
    tensors = {name: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for name, a in inputs.items()}
    shifted = np.empty(inputs["X"].size + 8, F16)[1:1 + inputs["X"].size].reshape(x)
    shifted[...] = inputs["X"]
    tensors["X"] = DeviceTensor(shifted.ctypes.data, x, F16)
    shape, dt = specs["Y"]
    y = np.full(shape, np.nan, dt)
    tensors["Y"] = DeviceTensor(y.ctypes.data, shape, np.dtype(dt))
    find_tactic("cuda", "ConvNHWC", tactic).enqueue(layer, launcher, tensors)
    assert launcher.launches[-1][0].name == "conv_grouped_mma_pipe_nhwc"
    return rel_err(y, reference(layer, inputs))


@pytest.mark.parametrize("tactic", [PIPES, PERSISTS])
def test_emulated_pipe_misaligned_input_takes_the_element_staging(launcher, tactic):
    """X 2 bytes off 16: no cp.async, every element staged through registers, same layout."""
    assert run_misaligned_input(launcher, tactic, CASES[12]) <= TOL[F16]


def dense_case(c: int) -> tuple:
    """DENSE_CASES[c] as (x, w, group 1, attrs)."""
    x, w, attrs = DENSE_CASES[c]
    return x, w, 1, attrs


#: (tactic, (x, w, group, attrs), before, after): the output placed in a Concat's slice, rows of before
#: + M + after channels, the slice `before` in (odd: 2 bytes off 4, the element stores)
PLACED = [(HALO_PERSIST, dense_case(2), 0, 32),    # UNet's skip: the first 32 channels of 64, pair stores
          (HALO_PIPE, dense_case(0), 3, 5),        # 24 of 32, 6 bytes in: element stores
          (HALO_PERSIST, dense_case(8), 16, 8),    # 48 of 72, W stride 2
          (MMA, CASES[3], 8, 8), (PIPES, CASES[5], 16, 0), (PERSISTS, CASES[8], 1, 1)]


@pytest.mark.parametrize("tactic,case,before,after", PLACED)
def test_emulated_placed_output_writes_only_its_rows_of_the_concat(launcher, tactic, case, before, after):
    """Concat by placement (the tactics declare places_last_axis): each output pixel's channels at
    Y + pixel * LDY, the rest of each row keeping its poison."""
    from tests.kernels.cuda.test_conv_depthwise_emulated import run_emulated_placed

    x, w, group, attrs = case
    err, untouched = run_emulated_placed(launcher, tactic, x, w, attrs, F16, before, after, group=group)
    assert err <= TOL[F16] and untouched


@pytest.mark.parametrize("tactic", sorted(HALO))
def test_emulated_placed_output_reads_its_residual_at_the_dense_index(launcher, tactic):
    from tests.kernels.cuda.test_conv_depthwise_emulated import run_emulated_placed

    x, w, attrs = DENSE_CASES[0]
    err, untouched = run_emulated_placed(launcher, tactic, x, w, attrs, F16, 16, 8, group=1, epilogue=SILU_RESIDUAL,
                                         extra={"skip": (1, 9, 11, 24)})
    assert err <= TOL[F16] and untouched


# ---- GPU ---------------------------------------------------------------------------------------
#: (tactic, x, w, group, attrs): the grouped tactics on MMA_CASES, the dense ones on DENSE_CASES
GPU_CASES = ([(t, *CASES[c]) for c in MMA_CASES for t in TACTICS]
             + [(t, x, w, 1, attrs) for x, w, attrs in DENSE_CASES for t in sorted(HALO)])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("tactic,x,w,group,attrs", GPU_CASES)
def test_mma_matches_the_reference(tactic, x, w, group, attrs, dtype):
    assert run_case(x, w, group, attrs, dtype, tactic) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize("x,w,group,attrs,skip", EPI_CASES[:3])
def test_mma_residual_relu_epilogue(x, w, group, attrs, skip, tactic):
    assert run_case(x, w, group, attrs, F16, tactic, epilogue=RESIDUAL_RELU, extra={"skip": skip}) <= TOL[F16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("tactic", sorted(HALO))
@pytest.mark.parametrize("case,skip", [(0, (1, 9, 11, 24)), (2, (1, 11, 9, 32)), (3, (1, 1, 10, 1)), (8, (48,))])
def test_halo_silu_residual_epilogue(case, skip, tactic, dtype):
    """SiLU then a residual: of the output's shape, broadcast over rows and channels, per channel."""
    x, w, attrs = DENSE_CASES[case]
    assert run_case(x, w, 1, attrs, dtype, tactic, epilogue=SILU_RESIDUAL, extra={"skip": skip}) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", sorted(HALO))
@pytest.mark.parametrize("shifted", ["X", "Y", "skip"])
def test_halo_misaligned_tensors_take_the_element_paths(shifted, tactic):
    x, w, attrs = DENSE_CASES[0]
    assert run_case(x, w, 1, attrs, F16, tactic, epilogue=SILU_RESIDUAL, extra={"skip": (1, 9, 11, 24)},
                    misalign={shifted: 2}) <= TOL[F16]


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize("x,w,group,attrs", [
    ((4, 28, 28, 256), (256, 3, 3, 8), 32, {"pads": [1, 1, 1, 1]}),                          # ResNeXt stage 2
    ((4, 56, 56, 256), (256, 3, 3, 8), 32, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),       # its stride-2 entry
    ((4, 14, 14, 1024), (1024, 3, 3, 32), 32, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),    # stage 4 entry, 7 x 7 out
    ((4, 14, 14, 512), (512, 3, 3, 16), 32, {"pads": [1, 1, 1, 1]})])                        # stage 3
def test_mma_on_resnext_layers_at_batch_4(x, w, group, attrs, tactic):
    assert run_case(x, w, group, attrs, F16, tactic) <= TOL[F16]


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", sorted(HALO))
@pytest.mark.parametrize("x,w,attrs", [
    ((2, 192, 192, 24), (24, 3, 3, 24), {"pads": [1, 1, 1, 1]}),                          # EfficientNet-V2-S 24 -> 24
    ((2, 384, 384, 8), (24, 3, 3, 8), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),         # its stem
    ((1, 512, 512, 32), (32, 3, 3, 32), {"pads": [1, 1, 1, 1]}),                          # UNet 32 -> 32
    ((1, 256, 256, 64), (32, 3, 3, 64), {"pads": [1, 1, 1, 1]}),                          # UNet 64 -> 32
    ((1, 256, 256, 32), (64, 3, 3, 32), {"pads": [1, 1, 1, 1]})])                         # UNet 32 -> 64
def test_halo_on_efficientnet_and_unet_layers(x, w, attrs, tactic):
    assert run_case(x, w, 1, attrs, F16, tactic) <= TOL[F16]


def run_placed(tactic, x, w, group, attrs, dtype, before, after, **kw):
    """(error against the float64 reference, whether the rest of each row kept its poison) of the
    layer run on the GPU into a Concat's slice: pixel rows of before + M + after channels."""
    from polykit.runtime.cuda.harness import run_layer
    from tests.kernels.cuda.test_conv_depthwise import reference, rel_err

    layer, inputs, specs = grouped_layer(x, w, group, attrs, dtype, **kw)
    rows = run_layer(layer, inputs, tactic=tactic, output_specs=specs, placed={"Y": (before, after)})["Y"]
    m = specs["Y"][0][-1]
    assert find_tactic("cuda", "ConvNHWC", tactic).places(layer, m, before + m + after, before)
    untouched = np.isnan(rows[..., :before].astype(np.float32)).all() and \
        np.isnan(rows[..., before + m:].astype(np.float32)).all()
    return rel_err(rows[..., before:before + m], reference(layer, inputs)), untouched


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("tactic,case,before,after", PLACED)
def test_placed_output_writes_only_its_rows_of_the_concat(tactic, case, before, after, dtype):
    err, untouched = run_placed(tactic, *case, dtype, before, after)
    assert err <= TOL[dtype] and untouched


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", sorted(HALO))
@pytest.mark.parametrize("before,after", [(16, 8), (3, 5)])
def test_placed_halo_output_reads_its_residual_at_the_dense_index(tactic, before, after):
    x, w, attrs = DENSE_CASES[0]
    err, untouched = run_placed(tactic, x, w, 1, attrs, F16, before, after, epilogue=SILU_RESIDUAL,
                                extra={"skip": (1, 9, 11, 24)})
    assert err <= TOL[F16] and untouched


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", sorted(HALO))
def test_unet_skip_layer_placed_in_its_concat(tactic):
    """UNet's down.0.3 (32 -> 32, 3 x 3) at 256 x 256 into the first 32 channels of the skip Concat's 64."""
    err, untouched = run_placed(tactic, (1, 256, 256, 32), (32, 3, 3, 32), 1, {"pads": [1, 1, 1, 1]}, F16, 0, 32)
    assert err <= TOL[F16] and untouched
