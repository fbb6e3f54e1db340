"""The sm_90a FP8 conv tiles with the promotion in pieces (`cuda.fp8.conv_sm90_*`, fp8_conv_sm90.py: conv_sm90 F8
with F8_PIECES, wider tiles).

CPU tests: which records they take (every FP8 conv fp8_sm90's tiles take), their priority below fp8_sm90's and
fp8_gemm_sm90's (level 0 unchanged; a timed level reaches them), their launch (a recording launcher), their
variants, and ptxas / SASS on every tile with each output and residual (no serialized wgmma, no spills, 4 e4m3
wgmma a piece). GPU tests (H100 / H200; outputs poisoned first) hold them to test_fp8_sm90's tolerance against the
cpu reference on test_int8_sm90's conv cases and on ResNet-like odd shapes with each output and residual epilogue;
test_fp8_sm90.py's 1x1 residual / float16 tests run them too (OVER_ROWS), and tests/compiler/test_fp8_conv_plan.py
forces an FP8 ResNet onto each tile.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from polykit.kernels.cuda.base import TensorMapSpec
from polykit.kernels.cuda.int8 import fp8_conv_sm90, fp8_gemm_sm90, fp8_sm90
from polykit.kernels.tactics import find_tactic

from ...compiler.fp8_models import E4M3
from .fp8_cases import device_tensors, recorded_launch
from .test_fp8_gemm_sm90 import _cuobjdump, assert_fast_tile, disassemble
from .test_fp8_sm90 import HALF_OUT, check, e4m3, fp8_inputs, fp8_layer, reference_tests
from .test_int8 import RESIDUAL, int8_residual, rng
from .test_sm90_wgmma_pipeline import assert_pipelined, ptxas_report

gpu = pytest.mark.gpu
TACTICS = [fp8_conv_sm90.tactic_name(t) for t, _, _ in fp8_conv_sm90.TILES]
FAST = [fp8_conv_sm90.tactic_name(t, True) for t in fp8_conv_sm90.FAST_TILES]
CONV = [f"cuda.fp8.sm90_{t.label}" for t in fp8_sm90.TILES]
GEMM = [f"cuda.fp8.gemm_sm90_{t.label}" for t, _, _ in fp8_gemm_sm90.TILES]


def tactic(name: str):
    return find_tactic("cuda", "QConvNHWC", name)


# ---- records, priority, arguments (no GPU) ---------------------------------------------------------

def test_the_piece_tiles_take_every_fp8_conv_the_conv_tiles_take():
    # 3x3 padded, strided, the 7x7 stem, a 1x1 stride-2 shortcut, a 1x1 over rows
    for x, w, attrs in [((2, 9, 7, 32), (24, 3, 3, 32), {"pads": [1, 1, 1, 1]}),
                        ((1, 13, 11, 64), (40, 3, 3, 64), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
                        ((1, 19, 17, 16), (64, 7, 7, 16), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
                        ((1, 9, 9, 48), (130, 1, 1, 48), {"strides": [2, 2]}), ((2, 7, 9, 48), (130, 1, 1, 48), {})]:
        layer = fp8_layer(fp8_inputs(x, w, requant=True), attrs)
        assert all(tactic(t).supports(layer) for t in TACTICS + CONV), (x, w, attrs)
        assert not any(tactic(t).supports(replace(layer, precision="int8")) for t in TACTICS)
    # C % 16; float32 / e4m3 / float16 epilogue inputs only; a float16 output from a cast epilogue
    assert not any(tactic(t).supports(fp8_layer(fp8_inputs((1, 8, 8, 24), (16, 3, 3, 24)), {})) for t in TACTICS)
    inputs = fp8_inputs((1, 8, 8, 32), (24, 3, 3, 32))
    pads = {"pads": [1, 1, 1, 1]}
    e4m3_skip = {**inputs, "skip": np.zeros((1, 8, 8, 24), E4M3), "skip_scale": np.float32(0.5)}
    assert all(tactic(t).supports(fp8_layer(e4m3_skip, pads, int8_residual(False), ("skip", "skip_scale")))
               for t in TACTICS)
    double = {**inputs, "skip": np.zeros((1, 8, 8, 24), np.float64)}
    assert not any(tactic(t).supports(fp8_layer(double, pads, RESIDUAL, ("skip",))) for t in TACTICS)
    assert all(tactic(t).supports(fp8_layer(inputs, pads, HALF_OUT, ())) for t in TACTICS)


def with_shapes(layer, x, w, y):
    """`layer` stamped with other X, W and Y shapes (the tuner's and the cost model's view of a bigger conv)."""
    ins = list(layer.in_shapes)
    ins[0], ins[2] = x, w
    return replace(layer, in_shapes=tuple(ins), out_shapes=(y,))


def test_the_piece_tiles_rank_below_the_conv_and_gemm_tiles_and_a_timed_level_reaches_them():
    from polykit.compiler.builder.tuner import LEVELS, by_estimate, capped, family

    assert max(tactic(t).priority for t in TACTICS) < min(tactic(t).priority for t in GEMM)
    assert max(tactic(t).priority for t in GEMM) < min(tactic(t).priority for t in CONV)
    # ResNet-50 bs32's layer3 3x3 conv (M 6272, N 256, K 2304): level 0 keeps the conv tiles, level 1 times the best
    # piece tile beside the best two
    layer = with_shapes(fp8_layer(fp8_inputs((1, 6, 6, 16), (256, 3, 3, 16)), {"pads": [1, 1, 1, 1]}),
                        (32, 14, 14, 256), (256, 3, 3, 256), (32, 14, 14, 256))
    pairs = by_estimate([(layer, tactic(t)) for t in TACTICS + CONV], 132)
    assert pairs[0][1].name in CONV
    timed = [p[1].name for p in capped(pairs, LEVELS[1].cap)]
    assert {family(n) for n in timed} == {"cuda.fp8.sm90", "cuda.fp8.conv"} and len(timed) == 3
    # a 1x1 stride-1 conv (a GEMM over rows): level 1 times the best GEMM tile, level 2 both other families
    rows = fp8_layer(fp8_inputs((2, 7, 9, 64), (256, 1, 1, 64)), {})
    pairs = by_estimate([(rows, tactic(t)) for t in TACTICS + CONV + GEMM], 132)
    assert pairs[0][1].name in CONV
    assert {family(p[1].name) for p in capped(pairs, LEVELS[1].cap)} == {"cuda.fp8.sm90", "cuda.fp8.gemm"}
    assert {family(p[1].name) for p in capped(pairs, LEVELS[2].cap)} == {"cuda.fp8.sm90", "cuda.fp8.gemm",
                                                                          "cuda.fp8.conv"}


@pytest.mark.parametrize("M,N,K,best", [(6272, 1024, 512, "128x64x2"), (1568, 2048, 1024, "128x256"),
                                        (25088, 128, 1152, "128x128")])
def test_the_estimate_orders_the_piece_tiles_by_waves(M, N, K, best):
    """ResNet-50 bs32's layer3 stride-2 shortcut (128x64x2: 2.97 waves of two blocks an SM where 128x256 makes
    1.48), layer4's (128x256: 0.79 waves where 128x128 makes 1.58) and layer2's 3x3 (128x128: the narrowest full
    tile, 1.48 waves like the wider ones), as GEMMs of M rows, N columns and K (the cost model reads nothing else)."""
    from polykit.kernels.cuda.int8.int8_sm90 import _estimate

    layer = with_shapes(fp8_layer(fp8_inputs((1, 4, 4, 16), (N, 1, 1, 16)), {}), (1, M, 1, K), (N, 1, 1, K),
                        (1, M, 1, N))
    costs = {t.label: _estimate(t)(layer, 132) for t, _, _ in fp8_conv_sm90.TILES}
    assert min(costs, key=costs.get) == best, costs


def test_the_enqueue_launches_conv_sm90_with_the_pieces_compiled_in():
    inputs = fp8_inputs((3, 9, 7, 48), (130, 3, 3, 48), requant=True)
    layer = fp8_layer(inputs, {"strides": [2, 2], "pads": [1, 1, 1, 1]})
    tensors = device_tensors(inputs, (3, 5, 4, 130))
    for (tile, pieces, bufs), name in zip(fp8_conv_sm90.TILES, TACTICS):
        kernel, args = recorded_launch(name, layer, tensors)
        assert kernel == "conv_sm90"
        tm_w = args[0]
        assert isinstance(tm_w, TensorMapSpec) and tm_w.ptr == tensors["W"].ptr
        assert (tm_w.dims, tm_w.box) == ((432, 130, 1), (128, tile.bn, 1))
        assert args[1] is tensors["X"] and args[3] is tensors["Y"] and args[4:7] == [60, 130, 432]
        compiled = dict(tactic(name).kernels(layer)[0].defines)
        pieced = {k: compiled[k] for k in ("F8_PIECES", "F8_BUFS") if k in compiled}
        assert pieced == ({"F8_PIECES": str(pieces), "F8_BUFS": str(bufs)} if pieces > 1 else {})
        assert compiled["BLOCKS"] == str(tile.blocks) and compiled["BN"] == str(tile.bn) and compiled["Y_OUT"] == "1"


def test_the_piece_variants_compile_conv_sm90_f8_with_each_output_and_residual():
    every = fp8_conv_sm90.compile_variants()
    assert all(v.name == "conv_sm90" and v.arch == "sm_90a" and dict(v.defines)["F8"] == "1" for v in every)
    variants = [v for v in every if "F8_FAST" not in dict(v.defines)]
    assert {(dict(v.defines)["BN"], dict(v.defines)["BLOCKS"], dict(v.defines).get("F8_PIECES", "1"))
            for v in variants} == {(str(t.bn), str(t.blocks), str(p)) for t, p, _ in fp8_conv_sm90.TILES}
    # the fast tiles: whole-tile wgmma (no F8_PIECES), every one compiled
    fast = [dict(v.defines) for v in every if dict(v.defines).get("F8_FAST") == "1"]
    assert all("F8_PIECES" not in d for d in fast)
    assert {(d["BN"], d["BLOCKS"]) for d in fast} == {(str(t.bn), str(t.blocks)) for t in fp8_conv_sm90.FAST_TILES}
    assert {dict(v.defines)["Y_OUT"] for v in variants} == {"0", "1", "3"}
    assert any("const f8e4m3fn_t* e0" in (v.code or "") for v in variants)  # an e4m3 residual
    assert any("const half_t* e0" in (v.code or "") for v in variants)  # a float16 one


# ---- ptxas and SASS (NVRTC, no GPU) ----------------------------------------------------------------

@pytest.mark.parametrize("y_dtype, residual", fp8_conv_sm90.EPILOGUES[:4])
@pytest.mark.parametrize("index", range(len(fp8_conv_sm90.TILES)), ids=[t.label for t, _, _ in fp8_conv_sm90.TILES])
def test_every_piece_tile_keeps_its_wgmma_pipeline_and_spills_nothing(index, y_dtype, residual):
    """The conv consumers' register budget (224 with one block of two consumers, 88 with two blocks): BN / 2
    accumulators + the pieces' blocks, with each output and residual read 8 at a time; ptxas serializes no wgmma
    (C7514). With CUOBJDUMP (and nvdisasm on PATH): 4 e4m3 wgmma a piece of a stage, no local memory."""
    pytest.importorskip("cuda.core")
    tile, pieces, bufs = fp8_conv_sm90.TILES[index]
    source = fp8_sm90.kernel(fp8_sm90.fp8_layer(y_dtype, residual=residual), tile, pieces=pieces, bufs=bufs)
    assert_pipelined(ptxas_report(source, "conv_sm90.cu"), f"fp8 conv piece tile {tile.label}, {y_dtype} out, "
                                                           f"{residual} residual")
    tool = _cuobjdump()
    if tool is None or residual != "float32" or y_dtype != E4M3:
        return  # (the SASS half once a tile: benchmarks/cuda_sass.py --fp8-conv prints it)
    from polykit.runtime.cuda.nvrtc import compile_source

    sass = disassemble(tool, compile_source(source, "sm_90a"))
    assert len(re.findall(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", sass)) == 4 * pieces
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory in the kernel"


@pytest.mark.parametrize("index", range(len(fp8_conv_sm90.FAST_TILES)), ids=[t.label for t in fp8_conv_sm90.FAST_TILES])
def test_every_fast_conv_tile_keeps_its_wgmma_pipeline_and_spills_nothing(index):
    """The fast tiles (F8_FAST): BN / 2 accumulators and the widest epilogue (float16 residual and output)."""
    pytest.importorskip("cuda.core")
    tile = fp8_conv_sm90.FAST_TILES[index]
    assert_fast_tile(fp8_sm90.kernel(fp8_sm90.fp8_layer("float16", residual="float16"), tile, fast=True), tile,
                     "conv_sm90.cu")


# ---- GPU ------------------------------------------------------------------------------------------

(test_sm90_fp8_piece_conv_float_output_matches_the_reference,
 test_sm90_fp8_piece_conv_requantized_to_e4m3_matches_the_reference) = reference_tests(TACTICS)
(test_sm90_fp8_fast_conv_float_output_matches_the_reference,
 test_sm90_fp8_fast_conv_requantized_to_e4m3_matches_the_reference) = reference_tests(FAST)


#: ResNet-like convs with odd H / W and N past the tiles' widths: (id, NHWC X, KRSC W, attrs)
RESNET = [("3x3_pad1", (2, 13, 11, 64), (72, 3, 3, 64), {"pads": [1, 1, 1, 1]}),
          ("3x3_stride2", (2, 15, 13, 128), (264, 3, 3, 128), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
          ("1x1_stride2", (2, 15, 17, 256), (520, 1, 1, 256), {"strides": [2, 2]}),
          ("stem_7x7", (2, 37, 35, 16), (64, 7, 7, 16), {"strides": [2, 2], "pads": [3, 3, 3, 3]})]
#: the output and its epilogue: (id, requantized to e4m3, epilogue kind)
OUTPUTS = [("float32", False, None), ("e4m3", True, None), ("float16", False, "half"),
           ("float32_residual", False, "float32"), ("e4m3_float32_residual", True, "float32"),
           ("e4m3_e4m3_residual", True, "e4m3"), ("float16_half_residual", False, "half_residual")]


def resnet_case(x, w, attrs, requant, epilogue):
    """(layer, inputs): the stem's channels past 3 zero in X and W (to_channels_last's padding of the image)."""
    inputs = fp8_inputs(x, w, requant=requant)
    if w[1] == 7:
        inputs["X"][..., 3:] = 0
        inputs["W"][..., 3:] = 0
    plain = fp8_layer(inputs, attrs)
    y = plain.out_shapes[0]
    if epilogue is None:
        return plain, inputs
    if epilogue == "half":
        return fp8_layer(inputs, attrs, HALF_OUT, ()), inputs
    if epilogue == "float32":
        inputs["skip"] = rng.standard_normal(y).astype(np.float32)
        return fp8_layer(inputs, attrs, RESIDUAL, ("skip",)), inputs
    if epilogue == "e4m3":
        inputs.update(skip=e4m3(y, 40.0), skip_scale=np.float32(0.0037))
        return fp8_layer(inputs, attrs, int8_residual(False), ("skip", "skip_scale")), inputs
    inputs["skip"] = rng.standard_normal(y).astype(np.float16)
    return fp8_layer(inputs, attrs, {"input": "raw", "body": fp8_sm90.HALF_RESIDUAL}, ("skip",)), inputs


@gpu
@pytest.mark.parametrize("name", TACTICS + FAST)
@pytest.mark.parametrize("out,requant,epilogue", OUTPUTS, ids=[o[0] for o in OUTPUTS])
@pytest.mark.parametrize("x,w,attrs", [c[1:] for c in RESNET], ids=[c[0] for c in RESNET])
def test_sm90_fp8_piece_conv_on_resnet_shapes_with_each_output_and_residual(x, w, attrs, out, requant, epilogue, name):
    layer, inputs = resnet_case(x, w, attrs, requant, epilogue)
    assert layer.out_dtypes[0] == {"float32": "float32", "e4m3": E4M3, "float16": "float16"}[out.split("_")[0]]
    check(layer, inputs, name)
