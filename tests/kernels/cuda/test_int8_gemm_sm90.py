"""The sm_90a INT8 GEMM tiles (`cuda.int8.gemm_sm90_*`, int8_gemm_sm90.py: gemm_sm90 I8, both operands by TMA).

CPU tests: which records they take (symmetric int8 convs over rows only), their priority below int8_sm90's conv
tiles, their arguments (a recording launcher: X's rows and W by TMA, int8_sm90's INT8 arguments), their variants,
and ptxas / SASS on every tile (no serialized wgmma, no spills, the s8 wgmma of the tile's width). GPU tests (H100 /
H200; outputs poisoned first) hold them to the exact cpu reference as test_int8_sm90.py holds the conv tiles.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, TensorMapSpec
from polykit.kernels.cuda.int8 import int8_gemm_sm90, int8_sm90
from polykit.kernels.tactics import find_tactic

from .recording_launcher import RecordingLauncher
from .test_fp8_gemm_sm90 import _cuobjdump, disassemble
from .test_int8 import check, int8_residual, layer_of, q, stamped
from .test_int8_sm90 import int8_residual_inputs, large_sum_inputs, near_tie_inputs, sym_inputs, sym_layer
from .test_sm90_wgmma_pipeline import assert_pipelined, ptxas_report

gpu = pytest.mark.gpu
TACTICS = [f"cuda.int8.gemm_sm90_{t.label}" for t in int8_gemm_sm90.TILES]
CONV = [f"cuda.int8.sm90_{t.label}" for t in int8_sm90.TILES]


def tactic(name: str):
    return find_tactic("cuda", "QConvNHWC", name)


# ---- records, priority, arguments (no GPU) ---------------------------------------------------------

def test_the_int8_gemm_tiles_take_symmetric_int8_convs_over_rows_only():
    inputs = sym_inputs((2, 7, 9, 48), (130, 1, 1, 48), y_dtype=np.int8)
    rows = sym_layer(inputs, {})
    assert all(tactic(t).supports(rows) for t in TACTICS + CONV)
    # a window, a stride or padding: not a GEMM over X's rows (int8_sm90's conv tiles take them)
    for attrs, w in (({"pads": [1, 1, 1, 1]}, (24, 3, 3, 48)), ({"strides": [2, 2]}, (24, 1, 1, 48)),
                     ({"pads": [1, 0, 1, 0]}, (24, 1, 1, 48)), ({}, (24, 3, 3, 48))):
        layer = sym_layer(sym_inputs((2, 7, 9, 48), w), attrs)
        assert all(tactic(t).supports(layer) for t in CONV), attrs
        assert not any(tactic(t).supports(layer) for t in TACTICS), attrs
    # int8_sm90's other terms hold: symmetric (zero points 0), int8 X, stamped shapes, C % 16
    unsymmetric = stamped(layer_of("QConvNHWC", inputs, {}), inputs)
    u8 = dict(inputs, X=q((2, 7, 9, 48), np.uint8), XZ=np.uint8(0))
    narrow = sym_inputs((1, 8, 8, 24), (16, 1, 1, 24))
    refused = {"no symmetric attribute (asymmetric)": unsymmetric, "uint8 X": sym_layer(u8, {}),
               "hand-built (unstamped)": layer_of("QConvNHWC", inputs, {"symmetric": 1}),
               "C 24": sym_layer(narrow, {})}
    for what, bad in refused.items():
        assert not any(tactic(t).supports(bad) for t in TACTICS), what
    # the epilogues int8_sm90 takes: an int8 residual with Relu, a float32 one
    residual = int8_residual_inputs(136, np.int8)
    assert all(tactic(t).supports(sym_layer(residual, {}, int8_residual(False), ("skip", "skip_scale")))
               for t in TACTICS)


def test_the_int8_gemm_tiles_rank_below_the_conv_tiles_so_level_0_keeps_them():
    from polykit.compiler.builder.tuner import by_estimate, capped, family

    assert max(tactic(t).priority for t in TACTICS) < min(tactic(t).priority for t in CONV)
    inputs = sym_inputs((32, 56, 56, 256), (128, 1, 1, 256))  # ResNet-50 bs32's layer2 conv1 (1x1, 256 -> 128)
    layer = sym_layer(inputs, {})
    pairs = by_estimate([(layer, tactic(t)) for t in TACTICS + CONV], 132)
    assert pairs[0][1].name.startswith("cuda.int8.sm90_")  # level 0: the first by priority
    # a timed build (level 1: two candidates) also times the best INT8 GEMM tile (another family)
    timed = [p[1].name for p in capped(pairs, 2)]
    assert {family(n) for n in timed} == {"cuda.int8.sm90", "cuda.int8.gemm"}


def test_the_estimate_counts_whole_tiles_a_wave_so_a_short_last_wave_ranks_the_smaller_tile_first():
    """ResNet-50 bs32's layer3 1x1 512 -> 256 at 28x28 (M 25088): 128x256 makes 1.48 waves, 128x128 2.97; the INT8
    plan of 2026-12-07 (H100) took 128x256, which outputs / SMs ranked first, at 38.3 us where FP8's 128x128 took
    19.2. Counted in whole tiles (int8_sm90._estimate), 128x128 leads."""
    layer = sym_layer(sym_inputs((32, 28, 28, 512), (256, 1, 1, 512)), {})
    costs = {t.label: int8_gemm_sm90._estimate(t)(layer, 132) for t in int8_gemm_sm90.TILES}
    assert min(costs, key=costs.get) == "128x128", costs


def device_tensors(inputs: dict[str, np.ndarray], y_shape: tuple[int, ...], y_dtype) -> dict[str, DeviceTensor]:
    """A DeviceTensor for each of `inputs` (at 0x10000, 0x20000, ... in their order) and an output Y at 0x900000."""
    tensors = {name: DeviceTensor(0x10000 * (i + 1), np.asarray(a).shape, np.asarray(a).dtype)
               for i, (name, a) in enumerate(inputs.items())}
    tensors["Y"] = DeviceTensor(0x900000, y_shape, np.dtype(y_dtype))
    return tensors


def recorded(name: str, layer, tensors):
    launcher = RecordingLauncher(sm_count=132)
    tactic(name).enqueue(layer, launcher, tensors)
    ((kernel, args),) = launcher.launches
    return kernel, args


@pytest.mark.parametrize("y_dtype", [np.int8, np.float32])
def test_the_enqueue_reads_x_rows_and_the_weight_through_tma_with_int8_sm90s_arguments(y_dtype):
    inputs = int8_residual_inputs(130, y_dtype if y_dtype != np.float32 else None)  # X (2, 10, 9, 64), N 130
    layer = sym_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale"))
    tensors = device_tensors(inputs, (2, 10, 9, 130), y_dtype)
    _, conv_args = recorded(CONV[0], layer, tensors)
    geo = int8_sm90._geometry(layer)
    conv_tail = conv_args[4 + len(geo.args()):]  # I8_PARAMS and the epilogue's arguments
    assert conv_tail[0] is tensors["S"] and len(conv_tail) > 7
    for tile, name in zip(int8_gemm_sm90.TILES, TACTICS):
        kernel, args = recorded(name, layer, tensors)
        assert kernel == "gemm_sm90"
        tm_a, tm_b = args[:2]
        assert isinstance(tm_a, TensorMapSpec) and tm_a.ptr == tensors["X"].ptr and tm_b.ptr == tensors["W"].ptr
        assert (tm_a.dims, tm_a.strides, tm_a.box) == ((64, 180, 1), (64, 180 * 64), (128, tile.bm, 1))
        assert (tm_b.dims, tm_b.strides, tm_b.box) == ((64, 130, 1), (64, 130 * 64), (128, tile.bn, 1))
        assert args[2] == 0 and args[3] is tensors["Y"] and args[4:9] == [180, 130, 64, 0, 0]
        assert args[11:14] == [1, 0, 0]  # one item, neither operand batched
        assert args[14:] == conv_tail


def test_the_kernel_a_plan_compiles_is_the_one_its_enqueue_launches(monkeypatch):
    """kernel() compiles the output type and the scale / bias steps in from the record (build) or from the
    tensors (enqueue), as int8_sm90.kernel does: the two agree."""
    inputs = sym_inputs((1, 8, 8, 32), (24, 1, 1, 32), per_channel=False, y_dtype=np.uint8, bias=False)
    layer = sym_layer(inputs, {})
    launched = []
    monkeypatch.setattr(RecordingLauncher, "launch", lambda self, k, *a, **kw: launched.append(k))
    for tile, name in zip(int8_gemm_sm90.TILES, TACTICS):
        tactic(name).enqueue(layer, RecordingLauncher(), device_tensors(inputs, (1, 8, 8, 24), np.uint8))
        assert launched[-1] == tactic(name).kernels(layer)[0] == int8_gemm_sm90.kernel(layer, tile)
        assert dict(launched[-1].defines)["I8"] == "1" and dict(launched[-1].defines)["Y_OUT"] == "2"


def test_a_layer_that_is_not_a_gemm_over_rows_is_refused_at_enqueue():
    inputs = sym_inputs((2, 7, 9, 48), (24, 1, 1, 48))
    layer = sym_layer(inputs, {"strides": [2, 2]})
    with pytest.raises(DeviceError, match="not an int8 GEMM over X's rows") as err:
        recorded(TACTICS[0], layer, device_tensors(inputs, (2, 4, 5, 24), np.float32))
    assert "rebuild the plan" in str(err.value) and repr(layer.name) in str(err.value)


def test_the_int8_gemm_variants_compile_gemm_sm90_with_i8():
    variants = int8_gemm_sm90.compile_variants()
    assert all(v.name == "gemm_sm90" and v.arch == "sm_90a" for v in variants)
    found = [dict(v.defines) for v in variants]
    assert all(d["I8"] == "1" and d["B_MN"] == "0" and "F8" not in d for d in found)
    assert {d["BN"] for d in found} == {str(t.bn) for t in int8_gemm_sm90.TILES}
    assert {(d["BN"], d["Y_OUT"]) for d in found} >= {(str(t.bn), y) for t in int8_gemm_sm90.TILES for y in "01"}
    residual = [dict(v.defines)["BN"] for v in variants if "const i8* e0" in (v.code or "")]
    assert {"192", "256"} <= set(residual)  # the first tile and the widest with an int8 residual


def test_the_int8_gemm_module_is_in_the_nvrtc_compile_units():
    from tests.kernel_units import module_chunks

    units = [u for c in module_chunks() if c.module == "int8.int8_gemm_sm90" for u in c.units]
    assert len(units) == len({v.key() for v in int8_gemm_sm90.compile_variants()}) > 0


# ---- ptxas and SASS (NVRTC, no GPU) ----------------------------------------------------------------

@pytest.mark.parametrize("index", range(len(int8_gemm_sm90.TILES)), ids=[t.label for t in int8_gemm_sm90.TILES])
@pytest.mark.parametrize("zero_y", [False, True], ids=["y_zero_read", "y_zero_0"])
def test_every_int8_gemm_tile_keeps_its_wgmma_pipeline_and_spills_nothing(index, zero_y):
    """BN / 2 int32 accumulators a thread with the int8 output and an int8 residual read 8 at a time (the tile's
    residual bytes in registers before its K loop, TILE_INPUTS: up to 256 columns), the output zero point read at
    run time or a constant 0 (Y_ZERO 0, what --int8 builds compile); ptxas serializes no wgmma (C7514)."""
    pytest.importorskip("cuda.core")
    tile = int8_gemm_sm90.TILES[index]
    layer = int8_sm90._shaped_residual_layer("int8")
    source = int8_gemm_sm90.kernel(int8_sm90.zero_y(layer) if zero_y else layer, tile, "int8")
    assert_pipelined(ptxas_report(source, "gemm_sm90.cu"), f"int8 gemm {tile.label}")
    tool = _cuobjdump()
    if tool is None:
        return  # (CUOBJDUMP: the SASS half of the check)
    from polykit.runtime.cuda.nvrtc import compile_source

    sass = disassemble(tool, compile_source(source, "sm_90a"))
    assert len(re.findall(rf"IGMMA\.64x{tile.bn}x32\.S8\.S8", sass)) >= 4 * tile.msub
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory in the kernel"


# ---- GPU ------------------------------------------------------------------------------------------

#: (NHWC X, N): GEMMs over rows with odd M and N, N past the tiles' widths, K from one 16-byte chunk to 12 stages,
#: a partial last stage (K 144), more tiles than SMs (M 4092)
ROWS = [((1, 7, 9, 48), 130), ((3, 5, 7, 16), 201), ((1, 9, 7, 1536), 40), ((2, 5, 5, 144), 72),
        ((4, 33, 31, 64), 520), ((8, 16, 1, 768), 299)]


def run_gemm(layer, inputs, name):
    assert tactic(name).supports(layer), f"{name} refuses {layer.in_dtypes} {layer.in_shapes} {layer.attrs}"
    check(layer, inputs, name)  # rtol 0, atol 0


@gpu
@pytest.mark.parametrize("name", TACTICS)
@pytest.mark.parametrize("x,n", ROWS)
def test_sm90_int8_gemm_float_output_equals_the_reference(x, n, name):
    inputs = sym_inputs(x, (n, 1, 1, x[3]))
    run_gemm(sym_layer(inputs, {}), inputs, name)


@gpu
@pytest.mark.parametrize("name", TACTICS)
@pytest.mark.parametrize("y_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("x,n", [ROWS[0], ROWS[2], ROWS[4]])
def test_sm90_int8_gemm_requantized_output_equals_the_reference(x, n, per_channel, y_dtype, name):
    inputs = sym_inputs(x, (n, 1, 1, x[3]), per_channel=per_channel, y_dtype=y_dtype, bias=per_channel)
    run_gemm(sym_layer(inputs, {}), inputs, name)


@gpu
@pytest.mark.parametrize("name", TACTICS)
@pytest.mark.parametrize("n", [136, 131], ids=["8_channels_a_lane", "per_element"])
def test_sm90_int8_gemm_with_an_int8_residual_and_relu_requantized_equals_the_reference(name, n):
    inputs = int8_residual_inputs(n, np.int8)
    run_gemm(sym_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale")), inputs, name)


@gpu
@pytest.mark.parametrize("name", TACTICS)
@pytest.mark.parametrize("n", [136, 131], ids=["8_channels_a_lane", "per_element"])
def test_sm90_int8_gemm_with_an_int8_residual_and_relu_float_output(name, n):
    """Float output with an int8 residual: the residual's dequantize-multiply and the add may contract into one
    fma (one rounding fewer than the reference's steps), so, as test_int8_sm90.py holds the conv tiles, within an
    ulp of |y|; every other output above is exact."""
    from polykit.runtime.cuda.harness import assert_matches_reference

    inputs = int8_residual_inputs(n, None)
    layer = sym_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale"))
    assert tactic(name).supports(layer)
    assert_matches_reference(layer, inputs, tactic=name, rtol=1e-6, atol=4e-5)


@gpu
@pytest.mark.parametrize("name", TACTICS)
@pytest.mark.parametrize("y_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("n", [96, 130], ids=["8_channels_a_lane", "per_element"])
def test_requantization_at_half_integer_quotients_equals_the_reference(name, y_dtype, n):
    inputs = near_tie_inputs(n, y_dtype)
    run_gemm(sym_layer(inputs, {}), inputs, name)


@gpu
@pytest.mark.parametrize("name", TACTICS)
@pytest.mark.parametrize("y_dtype", [np.int8, None])
@pytest.mark.parametrize("n", [96, 130], ids=["8_channels_a_lane", "per_element"])
def test_sums_past_2_22_round_to_float_as_the_reference(name, y_dtype, n):
    inputs = large_sum_inputs(n, y_dtype)
    run_gemm(sym_layer(inputs, {}), inputs, name)



def test_an_int8_resnet_plan_has_convs_over_rows_the_gemm_tiles_take():
    """The small ResNet's --int8 cpu plan (channels last): its stride-1 1x1 convs and the classifier are GEMMs over
    rows the tiles take; its 3x3 and stride-2 convs are not."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx

    from ...compiler.int8_models import feeds_for, small_resnet

    cfg = BuilderConfig(target="cpu", int8=True, channels_last=True,
                        calibration_data=[feeds_for(small_resnet(), s) for s in range(2)])
    convs = [layer for layer in build_plan(load_onnx(small_resnet()), cfg).layers if layer.kind == "QConvNHWC"]
    taken = [c.name for c in convs if tactic(TACTICS[0]).supports(c)]
    assert taken and len(taken) < len(convs)
    assert all(int8_gemm_sm90.over_rows(int8_sm90._geometry(c)) == (c.name in taken) for c in convs)
    # every requantized conv (int8 out) carries the constant 0 output zero point the calibrator writes: Y_ZERO 0
    from polykit.compiler.ops.quant.int8 import Y_SYMMETRIC

    requantized = [c for c in convs if c.out_dtypes[0] == "int8"]
    assert requantized and all(c.attrs.get(Y_SYMMETRIC) for c in requantized)
    assert all(("Y_ZERO", "0") in int8_gemm_sm90.kernel(c, int8_gemm_sm90.TILES[0]).defines
               for c in requantized if c.name in taken)


@gpu
def test_an_int8_resnet_with_its_convs_over_rows_on_the_gemm_tiles_equals_the_mma_plan():
    """Level 0 (mma.sync everywhere) against the same plan with every conv the GEMM tiles take forced onto them
    (each tile in turn): INT8 is exact, so the outputs are the same bits."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.calibrate import calibrate
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.compiler.passes.insert_qdq import constant_tensors, int8_candidates

    from ...compiler.int8_models import feeds_for, small_resnet
    from .test_int8_sm90 import run_plan

    graph = load_onnx(small_resnet())
    names = list(dict.fromkeys(x for _, x in int8_candidates(graph, constant_tensors(graph))))
    scales = calibrate(graph, names, [feeds_for(small_resnet(), s) for s in range(2)], "cpu", "minmax")
    ranges = {name: (-127.0 * s, 127.0 * s) for name, s in scales.items()}
    cfg = BuilderConfig(target="cuda", int8=True, tensor_ranges=ranges, builder_optimization_level=0)
    mma = build_plan(graph, cfg)
    rows = [layer.name for layer in mma.layers if layer.kind == "QConvNHWC" and tactic(TACTICS[0]).supports(layer)]
    assert rows, "no conv over rows in the plan"
    replay = {name: TACTICS[i % len(TACTICS)] for i, name in enumerate(rows)}
    gemm = build_plan(graph, replace(cfg, tactic_replay=replay))
    got = {layer.name: layer.tactic for layer in gemm.layers if layer.name in replay}
    assert got == replay, f"tactics not forced: {got}"
    feeds = feeds_for(small_resnet(), 5)
    np.testing.assert_array_equal(run_plan(gemm, feeds), run_plan(mma, feeds),
                                  err_msg="the sm90 INT8 GEMM tiles differ from the mma.sync convs")
