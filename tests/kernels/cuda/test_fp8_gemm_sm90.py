"""The sm_90a FP8 GEMM tiles (`cuda.fp8.gemm_sm90_*`, fp8_gemm_sm90.py: gemm_sm90 F8, both operands by TMA,
a stage's columns promoted in pieces).

CPU tests: which records they take (FP8 convs over rows only), their priority below fp8_sm90's, their
arguments (a recording launcher), their variants, and ptxas / SASS on every tile (no serialized wgmma, no
spills, the e4m3 wgmma there). GPU tests (H100 / H200; outputs poisoned first) hold them to
test_fp8_sm90's tolerance against the cpu reference: GEMMs over rows here, the float32 / e4m3 / float16 residual
and float16 output tests in test_fp8_sm90.py (OVER_ROWS), a BERT-like FP8 plan forced onto them against the same
plan on fp8_sm90's conv tiles in tests/compiler/test_fp8_gemm_plan.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from polykit.kernels.cuda.base import TensorMapSpec
from polykit.kernels.cuda.int8 import fp8_gemm_sm90, fp8_sm90
from polykit.kernels.tactics import find_tactic

from ...compiler.fp8_models import E4M3
from .fp8_cases import device_tensors, recorded_launch
from .test_fp8_sm90 import HALF_OUT, check, fp8_inputs, fp8_layer
from .test_int8 import RESIDUAL, int8_residual
from .test_sm90_wgmma_pipeline import assert_pipelined, ptxas_report

gpu = pytest.mark.gpu
TACTICS = [f"cuda.fp8.gemm_sm90_{t.label}" for t, _, _ in fp8_gemm_sm90.TILES]
OLD = [f"cuda.fp8.sm90_{t.label}" for t in fp8_sm90.TILES]
FAST = [f"cuda.fp8.gemm_fast_sm90_{t.label}" for t in fp8_gemm_sm90.FAST_TILES]


def tactic(name: str):
    return find_tactic("cuda", "QConvNHWC", name)


# ---- records, priority, arguments (no GPU) ---------------------------------------------------------

def test_the_fp8_gemm_tiles_take_fp8_convs_over_rows_only():
    inputs = fp8_inputs((2, 7, 9, 48), (130, 1, 1, 48), requant=True)
    rows = fp8_layer(inputs, {})
    assert all(tactic(t).supports(rows) for t in TACTICS + OLD)
    assert not any(tactic(t).supports(replace(rows, precision="int8")) for t in TACTICS)
    # a window, a stride or padding: not a GEMM over X's rows (fp8_sm90's tiles take them)
    for attrs, w in (({"pads": [1, 1, 1, 1]}, (24, 3, 3, 48)), ({"strides": [2, 2]}, (24, 1, 1, 48)),
                     ({"pads": [1, 0, 1, 0]}, (24, 1, 1, 48))):
        layer = fp8_layer(fp8_inputs((2, 7, 9, 48), w), attrs)
        assert all(tactic(t).supports(layer) for t in OLD) and not any(tactic(t).supports(layer) for t in TACTICS)
    # fp8_sm90's other terms hold: C % 16 (the TMA rows' 16-byte stride), float32 / e4m3 / float16 epilogue inputs
    assert not any(tactic(t).supports(fp8_layer(fp8_inputs((1, 8, 8, 24), (16, 1, 1, 24)), {})) for t in TACTICS)
    residual = {**inputs, "skip": np.zeros((2, 7, 9, 130), E4M3), "skip_scale": np.float32(0.5)}
    assert all(tactic(t).supports(fp8_layer(residual, {}, int8_residual(False), ("skip", "skip_scale")))
               for t in TACTICS)
    double = {**inputs, "skip": np.zeros((2, 7, 9, 130), np.float64)}
    assert not any(tactic(t).supports(fp8_layer(double, {}, RESIDUAL, ("skip",))) for t in TACTICS)
    plain = fp8_inputs((2, 7, 9, 48), (130, 1, 1, 48))
    assert all(tactic(t).supports(fp8_layer(plain, {}, HALF_OUT, ())) for t in TACTICS)


def test_the_fp8_gemm_tiles_rank_below_the_conv_tiles_so_level_0_keeps_them():
    from polykit.compiler.builder.tuner import by_estimate, capped, family

    assert max(tactic(t).priority for t in TACTICS) < min(tactic(t).priority for t in OLD)
    inputs = fp8_inputs((8, 128, 1, 768), (3072, 1, 1, 768))  # BERT-base bs8's FFN1: M 1024, N 3072, K 768
    layer = fp8_layer(inputs, {})
    pairs = by_estimate([(layer, tactic(t)) for t in TACTICS + OLD], 132)
    assert pairs[0][1].name.startswith("cuda.fp8.sm90_")  # level 0: the first by priority
    # a timed build (level 1: two candidates) also times the best FP8 GEMM tile (another family)
    timed = [p[1].name for p in capped(pairs, 2)]
    assert {family(n) for n in timed} == {"cuda.fp8.sm90", "cuda.fp8.gemm"}
    assert "cuda.fp8.gemm_sm90_128x192" in timed  # one wave of 128 tiles on 132 SMs


@pytest.mark.parametrize("M,N,K,best", [(1024, 3072, 768, "128x192"), (1024, 2304, 768, "128x160"),
                                        (1024, 768, 3072, "64x96"), (100352, 256, 64, "128x256"),
                                        (6272, 1024, 256, "128x128")])
def test_the_estimate_prefers_the_tile_that_fills_the_sms(M, N, K, best):
    """BERT-base bs8 (M 1024: FFN1, QKV, FFN2) and ResNet-50 bs32's 1x1 64 -> 256 at 56x56: the wave
    arithmetic the tiles were chosen by (128 or 120 tiles on 132 SMs where 128x128 makes 1.45 or 1.09 waves);
    layer3's 1x1 256 -> 1024 (M 6272): 128x128's 2.97 waves before 128x256's 1.48, whose last wave's epilogue
    costs the busy SMs a whole tile (H100: 18.8 against 22.8 us alone)."""
    layer = fp8_layer(fp8_inputs((M // 8, 8, 1, K), (N, 1, 1, K)), {})
    costs = {t.label: fp8_gemm_sm90._estimate(t)(layer, 132) for t, _, _ in fp8_gemm_sm90.TILES}
    assert min(costs, key=costs.get) == best, costs


def test_the_enqueue_reads_x_rows_and_the_weight_through_tma(monkeypatch):
    inputs = fp8_inputs((3, 7, 5, 48), (130, 1, 1, 48), requant=True)
    layer = fp8_layer(inputs, {})
    tensors = device_tensors(inputs, (3, 7, 5, 130))
    for (tile, pieces, bufs), name in zip(fp8_gemm_sm90.TILES, TACTICS):
        kernel, args = recorded_launch(name, layer, tensors)
        assert kernel == "gemm_sm90"
        tm_a, tm_b = args[:2]
        assert isinstance(tm_a, TensorMapSpec) and tm_a.ptr == tensors["X"].ptr
        assert (tm_a.dims, tm_a.strides, tm_a.box) == ((48, 105, 1), (48, 105 * 48), (128, tile.bm, 1))
        assert (tm_b.dims, tm_b.strides, tm_b.box) == ((48, 130, 1), (48, 130 * 48), (128, tile.bn, 1))
        assert args[2] == 0 and args[3] is tensors["Y"] and args[4:7] == [105, 130, 48]
        assert args[11:14] == [1, 0, 0]  # one item, neither operand batched
        assert args[14] is tensors["S"]
    assert [d for t, p, b in fp8_gemm_sm90.TILES for d in (p, b)] == [2, 2, 2, 1, 2, 2, 2, 2, 2, 2]


def test_a_tile_whose_columns_are_not_whole_epilogue_groups_does_not_compile():
    """gemm_sm90's epilogue finishes 32-column groups: a 144-column tile left columns 128..143 unwritten and wrote
    16 past its own (H100, 2026-12-06), so gemm_sm90_core.cuh refuses BN % 32 at compile time (NVRTC, CI); the
    same tile at 160 columns compiles."""
    pytest.importorskip("cuda.core")
    from polykit.errors import DeviceError
    from polykit.kernels.cuda.gemm.gemm_sm90 import Sm90Tile
    from polykit.runtime.cuda.nvrtc import compile_source

    layer = fp8_sm90.fp8_layer(E4M3)
    with pytest.raises(DeviceError, match="whole groups of 4 column blocks"):  # pieces of 48: a wgmma that exists
        compile_source(fp8_gemm_sm90.kernel(layer, Sm90Tile(1, 2, 144, 6), 3, 2), "sm_90a")
    assert compile_source(fp8_gemm_sm90.kernel(layer, Sm90Tile(1, 2, 160, 6), 2, 2), "sm_90a")[:4] == b"\x7fELF"


def test_the_fp8_gemm_variants_compile_gemm_sm90_with_f8_pieces():
    every = fp8_gemm_sm90.compile_variants()
    assert all(v.name == "gemm_sm90" and v.arch == "sm_90a" for v in every)
    variants = [v for v in every if "F8_FAST" not in dict(v.defines)]
    fast = [dict(v.defines) for v in every if dict(v.defines).get("F8_FAST") == "1"]
    assert all("F8_PIECES" not in d and d["F8"] == "1" for d in fast)
    assert {d["BN"] for d in fast} == {str(t.bn) for t in fp8_gemm_sm90.FAST_TILES}
    assert all(dict(v.defines)["F8"] == "1" and dict(v.defines)["B_MN"] == "0" for v in variants)
    assert {(dict(v.defines)["BN"], dict(v.defines)["F8_PIECES"], dict(v.defines)["F8_BUFS"]) for v in variants} == {
        (str(t.bn), str(p), str(b)) for t, p, b in fp8_gemm_sm90.TILES}
    assert {dict(v.defines).get("Y_OUT") for v in variants} == {"0", "1", "3"}
    assert any("const f8e4m3fn_t* e0" in (v.code or "") for v in variants)  # an e4m3 residual


# ---- ptxas and SASS (NVRTC, no GPU) ----------------------------------------------------------------

def _cuobjdump() -> str | None:
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    return tool if tool and Path(tool).exists() else None


@pytest.mark.parametrize("index", range(len(fp8_gemm_sm90.TILES)), ids=[t.label for t, _, _ in fp8_gemm_sm90.TILES])
def test_every_fp8_gemm_tile_keeps_its_wgmma_pipeline_and_spills_nothing(index):
    """The register budget: BN / 2 accumulators + the pieces' blocks within setmaxnreg's 232, the e4m3 output
    with a float32 residual (the 8-column epilogue) compiled in; ptxas serializes no wgmma (C7514)."""
    pytest.importorskip("cuda.core")
    tile, pieces, bufs = fp8_gemm_sm90.TILES[index]
    source = fp8_gemm_sm90.kernel(fp8_layer_with_shapes(), tile, pieces, bufs)
    assert_pipelined(ptxas_report(source, "gemm_sm90.cu"), f"fp8 gemm {tile.label}")
    tool = _cuobjdump()
    if tool is None:
        return  # (CUOBJDUMP: the SASS half of the check; benchmarks/cuda_sass.py --fp8-gemm prints it)
    from polykit.runtime.cuda.nvrtc import compile_source

    sass = disassemble(tool, compile_source(source, "sm_90a"))
    assert len(re.findall(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", sass)) == 4 * pieces
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory in the kernel"


@pytest.mark.parametrize("index", range(len(fp8_gemm_sm90.FAST_TILES)), ids=[t.label for t in fp8_gemm_sm90.FAST_TILES])
def test_every_fast_fp8_gemm_tile_keeps_its_wgmma_pipeline_and_spills_nothing(index):
    """The fast tiles (F8_FAST): BN / 2 accumulators a thread, the e4m3 output with a float32 residual."""
    pytest.importorskip("cuda.core")
    tile = fp8_gemm_sm90.FAST_TILES[index]
    assert_fast_tile(fp8_gemm_sm90.kernel(fp8_layer_with_shapes(), tile, 1, 1, fast=True), tile, "gemm_sm90.cu")


def assert_fast_tile(source, tile, file: str) -> None:
    """A fast-accumulation FP8 kernel (F8_FAST, no pieces): no spills, no serialized wgmma (ptxas); with
    CUOBJDUMP, e4m3 wgmma of the whole tile's width (4 a stage at least) and nothing in local memory."""
    assert dict(source.defines)["F8_FAST"] == "1" and "F8_PIECES" not in dict(source.defines)
    assert_pipelined(ptxas_report(source, file), f"fp8 fast {file} {tile.label}")
    tool = _cuobjdump()
    if tool is None:
        return
    from polykit.runtime.cuda.nvrtc import compile_source

    sass = disassemble(tool, compile_source(source, "sm_90a"))
    assert len(re.findall(rf"QGMMA\.64x{tile.bn}x32\.F32\.E4M3\.E4M3", sass)) >= 4 * tile.msub
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory in the kernel"


def fp8_layer_with_shapes():
    """fp8_sm90.fp8_layer with an e4m3 output and a float32 residual read 8 at a time (the widest epilogue)."""
    return fp8_sm90.fp8_layer(E4M3, residual="float32")


def disassemble(tool: str, cubin: bytes) -> str:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, check=True).stdout


# ---- GPU ------------------------------------------------------------------------------------------

#: (NHWC X, N): GEMMs over rows with odd M, N past the tiles' widths, K from one 16-byte chunk to 24 stages, a
#: partial last stage (K 144), more tiles than SMs (M 4092)
ROWS = [((1, 7, 9, 48), 130), ((3, 5, 7, 16), 200), ((1, 9, 7, 3072), 40), ((2, 5, 5, 144), 72),
        ((4, 33, 31, 64), 520), ((8, 16, 1, 768), 300)]


@gpu
@pytest.mark.parametrize("name", TACTICS + FAST)
@pytest.mark.parametrize("x,n", ROWS)
def test_sm90_fp8_gemm_float_output_matches_the_reference(x, n, name):
    inputs = fp8_inputs(x, (n, 1, 1, x[3]))
    check(fp8_layer(inputs, {}), inputs, name)


@gpu
@pytest.mark.parametrize("name", TACTICS + FAST)
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("x,n", [ROWS[0], ROWS[2], ROWS[4]])
def test_sm90_fp8_gemm_requantized_to_e4m3_matches_the_reference(x, n, per_channel, name):
    inputs = fp8_inputs(x, (n, 1, 1, x[3]), per_channel=per_channel, requant=True)
    check(fp8_layer(inputs, {}), inputs, name)
