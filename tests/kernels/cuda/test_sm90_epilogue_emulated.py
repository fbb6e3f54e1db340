"""The sm90 INT8 / FP8 GEMM tiles' epilogue on the host, and the rolled tiles (EPI_ROLL) against their twins.

sm90_epilogue_emulation.py runs a tactic's own launch of gemm_sm90 with its K loop replaced by the product (exact for
INT8), so the epilogue's output bytes are compared without a GPU: INT8 tiles exactly against the cpu reference (as
their GPU tests hold them), FP8 tiles within test_fp8_sm90's bound, and each rolled tile
(`cuda.int8.gemm_rolled_sm90_*`, `cuda.fp8.gemm_fast_rolled_sm90_*`: the native epilogue as a loop over 32-column
groups, gemm_sm90_epilogue.cuh) bit for bit against its unrolled twin on the same accumulators: partial tiles (rows
past M, columns past N, a last group short of 32), per-channel and per-tensor scales, int8 / uint8 / float32 / e4m3
outputs, an int8 residual read before the K loop (TILE_INPUTS), an e4m3 one, BERT's Gelu. The twins' other paths
(per element, the transposed 16-byte path of float16 outputs and promoted FP8 tiles, one consumer warpgroup) are held
to the reference on the host too. The GPU tests at the end run the rolled tiles against the reference on the device.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.gemm import gemm_sm90
from polykit.kernels.cuda.int8 import fp8_gemm_sm90, int8_gemm_sm90
from polykit.kernels.tactics import find_tactic
from polykit.runtime.cuda.harness import reference_layer

from ...compiler.fp8_models import E4M3
from . import test_fp8_sm90, test_gemm_sm90, test_int8, test_int8_sm90
from .fp8_cases import device_tensors
from .recording_launcher import RecordingLauncher
from .sm90_epilogue_emulation import epilogue_launcher, run_emulated_layer
from .test_fp8_sm90 import HALF_OUT, check, e4m3, fp8_inputs, fp8_layer
from .test_gemm_sm90 import BF16
from .test_int8 import int8_residual
from .test_int8_sm90 import int8_residual_inputs, near_tie_inputs, sym_inputs, sym_layer, zero_y_case

gpu = pytest.mark.gpu
ROLLED = [t.label for t in fp8_gemm_sm90.ROLLED_TILES]  # 128x192, 128x256, 128x160, 128x128
GELU = {"input": "raw", "body": [{"op": "Gelu", "inputs": ["raw"], "outputs": ["g"], "attrs": {"approximate": "none"}}]}


@pytest.fixture(autouse=True)
def _fresh_rng(monkeypatch):
    """One generator per test, the same in every helper module: a test's data does not depend on which tests ran
    before it in its worker."""
    fresh = np.random.default_rng(35)
    for module in (test_int8, test_int8_sm90, test_fp8_sm90, test_gemm_sm90):
        monkeypatch.setattr(module, "rng", fresh)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    return epilogue_launcher(tmp_path_factory)


def int8_case(case: str):
    """(layer, inputs) of an INT8 GEMM over rows: every output and epilogue the INT8 tiles' native path serves."""
    if case == "float_out":  # 63 rows, 130 columns: rows past M, a last group of 2 columns
        inputs = sym_inputs((1, 7, 9, 48), (130, 1, 1, 48))
        return sym_layer(inputs, {}), inputs
    if case == "int8_per_channel":  # 252 rows x 200: two row tiles, the last 56 columns a short group
        inputs = sym_inputs((4, 9, 7, 64), (200, 1, 1, 64), y_dtype=np.int8)
        return sym_layer(inputs, {}), inputs
    if case == "uint8_per_tensor":
        inputs = sym_inputs((2, 10, 9, 48), (136, 1, 1, 48), per_channel=False, y_dtype=np.uint8, bias=False)
        return sym_layer(inputs, {}), inputs
    if case in ("residual_int8", "residual_float"):  # an identity block's last conv: the tile inputs
        inputs = int8_residual_inputs(136, np.int8 if case == "residual_int8" else None)
        return sym_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale")), inputs
    if case == "near_ties":
        inputs = near_tie_inputs(96, np.int8)
        return sym_layer(inputs, {}), inputs
    if case in ("zero_y", "zero_y_residual"):  # what --int8 builds stamp: Y_ZERO 0
        return zero_y_case("requantized" if case == "zero_y" else "residual", np.int8, 264)
    raise ValueError(case)


INT8_CASES = ["float_out", "int8_per_channel", "uint8_per_tensor", "residual_int8", "residual_float", "near_ties",
              "zero_y", "zero_y_residual"]


def fp8_case(case: str):
    """(layer, inputs) of an FP8 GEMM over rows the fast tiles' native path serves (e4m3 or float32 out)."""
    if case == "gelu":  # BERT's FFN1: bias, Gelu, e4m3 out; 330 rows x 456 columns
        inputs = fp8_inputs((3, 11, 10, 32), (456, 1, 1, 32), requant=True)
        return fp8_layer(inputs, {}, GELU), inputs
    if case == "e4m3_per_tensor":
        inputs = fp8_inputs((2, 10, 9, 32), (200, 1, 1, 32), per_channel=False, requant=True)
        return fp8_layer(inputs, {}), inputs
    if case == "float_out":
        inputs = fp8_inputs((1, 7, 9, 48), (130, 1, 1, 48))
        return fp8_layer(inputs, {}), inputs
    if case == "e4m3_residual":  # an --fp8 ResNet's identity block: the e4m3 residual dequantized, Add, Relu
        inputs = fp8_inputs((2, 10, 9, 64), (136, 1, 1, 64), requant=True)
        inputs.update(skip=e4m3((2, 10, 9, 136), 40.0), skip_scale=np.float32(0.0037))
        return fp8_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale")), inputs
    raise ValueError(case)


FP8_CASES = ["gelu", "e4m3_per_tensor", "float_out", "e4m3_residual"]


def _int8_name(label: str, rolled: bool) -> str:
    return f"cuda.int8.gemm_{'rolled_' if rolled else ''}sm90_{label}"


def _fp8_name(label: str, rolled: bool) -> str:
    return f"cuda.fp8.gemm_fast_{'rolled_' if rolled else ''}sm90_{label}"


#: every case on the widest tiles (128x256: its residual a group ahead when rolled; 128x192: before the K loop), the
#: residual and the plain output on the others (each case a host build of both twins: CI's minutes)
INT8_COMBOS = ([(c, t) for t in ("128x192", "128x256") for c in INT8_CASES]
               + [(c, t) for t in ("128x160", "128x128") for c in ("int8_per_channel", "zero_y_residual")])
FP8_COMBOS = ([("gelu", t) for t in ROLLED] + [(c, t) for t in ("128x192", "128x256") for c in FP8_CASES if c != "gelu"])


@pytest.mark.parametrize("case,label", INT8_COMBOS)
def test_an_int8_tile_and_its_rolled_twin_write_the_references_bytes(launcher, case, label):
    layer, inputs = int8_case(case)
    want = reference_layer(layer, inputs)["Y"]
    unrolled = run_emulated_layer(launcher, layer, inputs, _int8_name(label, False))["Y"]
    rolled = run_emulated_layer(launcher, layer, inputs, _int8_name(label, True))["Y"]
    assert unrolled.dtype == want.dtype and unrolled.shape == want.shape
    np.testing.assert_array_equal(unrolled.view(np.uint8), want.view(np.uint8))  # the harness: the GPU tests' bar
    assert rolled.tobytes() == unrolled.tobytes()


@pytest.mark.parametrize("case,label", FP8_COMBOS)
def test_an_fp8_fast_tile_and_its_rolled_twin_write_the_same_bytes_within_the_references_bound(launcher, case,
                                                                                                label):
    layer, inputs = fp8_case(case)
    unrolled = run_emulated_layer(launcher, layer, inputs, _fp8_name(label, False))["Y"]
    rolled = run_emulated_layer(launcher, layer, inputs, _fp8_name(label, True))["Y"]
    check(layer, inputs, _fp8_name(label, False), got=unrolled)
    assert rolled.tobytes() == unrolled.tobytes()


#: the twins' other epilogue paths on the host (the GPU tests cover them on the device): the per-element path (131
#: channels: rows not a multiple of 8), the transposed 16-byte path (a float16 output, Y_OUT 3; the promoted FP8
#: tiles, F8_PIECES 2), one consumer warpgroup (64x96)
OTHER_PATHS = [("int8", "cuda.int8.gemm_sm90_128x192", "per_element"),
               ("int8", "cuda.int8.gemm_sm90_64x96", "residual_int8"),
               ("int8", "cuda.int8.gemm_sm90_128x256", "residual_per_element"),
               ("fp8", "cuda.fp8.gemm_fast_sm90_64x96", "gelu"),
               ("fp8", "cuda.fp8.gemm_sm90_128x192", "e4m3_residual"),
               ("fp8", "cuda.fp8.gemm_sm90_128x256", "gelu"),
               ("fp8", "cuda.fp8.gemm_fast_sm90_128x192", "half_out"),
               ("fp8", "cuda.fp8.gemm_fast_sm90_128x160", "per_element")]


@pytest.mark.parametrize("family,tactic,case", OTHER_PATHS, ids=[f"{t.split('.')[-1]}-{c}" for _, t, c in OTHER_PATHS])
def test_the_tiles_other_epilogue_paths_match_the_reference_on_the_host(launcher, family, tactic, case):
    if family == "int8":
        if case == "per_element":
            inputs = sym_inputs((2, 10, 9, 48), (131, 1, 1, 48), y_dtype=np.int8)
            layer = sym_layer(inputs, {})
        elif case == "residual_per_element":
            inputs = int8_residual_inputs(131, np.int8)
            layer = sym_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale"))
        else:
            layer, inputs = int8_case(case)
        got = run_emulated_layer(launcher, layer, inputs, tactic)["Y"]
        np.testing.assert_array_equal(got.view(np.uint8), reference_layer(layer, inputs)["Y"].view(np.uint8))
        return
    if case == "half_out":
        inputs = fp8_inputs((2, 10, 9, 64), (136, 1, 1, 64))
        layer = fp8_layer(inputs, {}, HALF_OUT, ())
    elif case == "per_element":
        inputs = fp8_inputs((2, 10, 9, 32), (131, 1, 1, 32), requant=True)
        layer = fp8_layer(inputs, {})
    else:
        layer, inputs = fp8_case(case)
    check(layer, inputs, tactic, got=run_emulated_layer(launcher, layer, inputs, tactic)["Y"])


def test_the_harness_sees_a_wrong_accumulator_layout(launcher, monkeypatch):
    """The emulation is not vacuous: with the product's columns swapped in pairs (a lane's two accumulators of a
    block read the other way round) an INT8 tile's output leaves the reference."""
    from . import sm90_epilogue_emulation as emulation

    layer, inputs = int8_case("int8_per_channel")
    want = reference_layer(layer, inputs)["Y"]  # (before numpy's matmul is swapped: the reference calls it too)
    matmul = np.matmul
    monkeypatch.setattr(emulation.np, "matmul", lambda a, b: matmul(a, b)[..., [i ^ 1 for i in range(b.shape[-1])]])
    got = run_emulated_layer(launcher, layer, inputs, _int8_name("128x192", True))["Y"]
    assert not np.array_equal(got, want)


def test_the_rolled_tiles_take_only_what_their_native_epilogue_serves():
    """A float16 output (Y_OUT 3) or a float32 residual keeps the transposed path, which EPI_ROLL leaves as it is:
    the rolled tiles refuse those layers (their twins take them), and take the rest as their twins do."""
    inputs = fp8_inputs((2, 10, 9, 64), (136, 1, 1, 64))
    half = fp8_layer(inputs, {}, HALF_OUT, ())
    skip = {**fp8_inputs((2, 10, 9, 32), (136, 1, 1, 32), requant=True),
            "skip": np.zeros((2, 10, 9, 136), np.float32)}
    float_residual = fp8_layer(skip, {}, test_int8.RESIDUAL, ("skip",))
    for label in ROLLED:
        twin, rolled = find_tactic("cuda", "QConvNHWC", _fp8_name(label, False)), find_tactic(
            "cuda", "QConvNHWC", _fp8_name(label, True))
        for layer in (half, float_residual):
            assert twin.supports(layer) and not rolled.supports(layer), (label, layer.out_dtypes)
        for case in FP8_CASES:
            layer, _ = fp8_case(case)
            assert rolled.supports(layer), (label, case)
    for label in ROLLED:
        rolled = find_tactic("cuda", "QConvNHWC", _int8_name(label, True))
        for case in INT8_CASES:
            assert rolled.supports(int8_case(case)[0]), (label, case)


@pytest.mark.parametrize("which", ["fp8", "fp16"])
def test_a_timed_build_times_the_rolled_twin_of_the_best_tile_and_nothing_less(which):
    """Variants of their twins (tuner._with_variants): the default level (3) times the rolled twin of its family's
    best tile (BERT-base bs8's FFN1: 128x192) besides all it timed before the rolled tiles existed; level 0 keeps
    the twin first."""
    from polykit.compiler.builder.tuner import LEVELS, by_estimate, capped, variant_of
    from polykit.kernels.tactics import candidates

    if which == "fp8":
        layer = fp8_layer(fp8_inputs((8, 128, 1, 768), (3072, 1, 1, 768), requant=True), {}, GELU)
        kind, twin, rolled = "QConvNHWC", _fp8_name("128x192", False), _fp8_name("128x192", True)
    else:
        from .test_gemm_sm90 import stamped

        body = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
                {"op": "Gelu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}]
        inputs = {"A": np.zeros((1024, 768), np.float16), "B": np.zeros((768, 3072), np.float16),
                  "bias": np.zeros(3072, np.float16)}
        layer = stamped(LayerDesc("mm", "MatMul", ("A", "B", "bias"), ("Y",),
                                  {"epilogue": {"input": "raw", "body": body}}, domain="ai.polykit"),
                        inputs, (1024, 3072), np.float16)
        kind, twin, rolled = "MatMul", "cuda.gemm.sm90_128x192", "cuda.gemm.sm90_rolled_128x192"
    pairs = by_estimate([(layer, t) for t in candidates("cuda", kind, layer, arch="sm_90")], 132)
    timed = [p[1].name for p in capped(pairs, LEVELS[3].limit("cuda"))]
    before = [p[1].name for p in capped([p for p in pairs if variant_of(p[1]) is None], LEVELS[3].limit("cuda"))]
    assert timed == before + [rolled] and twin in before
    assert pairs[0][1].name != rolled and [p[1].name for p in pairs].index(twin) < [p[1].name for p in pairs].index(rolled)


@pytest.mark.parametrize("family", ["int8", "fp8"])
def test_the_rolled_kernel_a_plan_compiles_is_the_one_its_enqueue_launches(family):
    if family == "fp8":
        layer, inputs = fp8_case("gelu")
        name = _fp8_name("128x192", True)
    else:
        layer, inputs = int8_case("residual_int8")
        name = _int8_name("128x256", True)
    y_dtype = layer.out_dtypes[0]
    tensors = device_tensors({k: v for k, v in inputs.items() if k in layer.inputs}, layer.out_shapes[0])
    tensors["Y"] = replace(tensors["Y"], dtype=np.dtype(E4M3 if y_dtype == "float8_e4m3fn" else y_dtype))
    launched = []
    launcher = RecordingLauncher(sm_count=132)
    launcher.launch = lambda kernel, *args, **kw: launched.append(kernel)
    find_tactic("cuda", "QConvNHWC", name).enqueue(layer, launcher, tensors)
    (planned,) = find_tactic("cuda", "QConvNHWC", name).kernels(layer)
    assert launched == [planned] and ("EPI_ROLL", "1") in planned.defines


#: the widest rolled tiles hold the most accumulators (the narrower ones' registers are looser; each case an NVRTC
#: compile: CI's minutes)
WIDEST = ["128x192", "128x256"]


@pytest.mark.parametrize("family,case", [("int8", "residual_int8"), ("int8", "int8_per_channel"), ("fp8", "gelu"),
                                         ("fp8", "e4m3_residual")])
@pytest.mark.parametrize("label", WIDEST)
def test_a_rolled_tile_spills_nothing_and_its_epilogue_is_a_loop(family, case, label):
    """ptxas: no spills, no serialized wgmma; with CUOBJDUMP, a backward branch around one group's stores whose
    body is far shorter than the unrolled twin's straight line (BERT's Gelu on FP8 128x192: 641 against 2,615; an
    int8 residual on INT8 128x256, its tile inputs selected a group at a time: 910)."""
    pytest.importorskip("cuda.core")
    from .test_sm90_wgmma_pipeline import assert_pipelined, ptxas_report

    tile = next(t for t in fp8_gemm_sm90.ROLLED_TILES if t.label == label)
    if family == "fp8":
        source = fp8_gemm_sm90.kernel(fp8_case(case)[0], tile, 1, 1, fast=True, rolled=True)
    else:
        source = int8_gemm_sm90.kernel(int8_case(case)[0], tile, rolled=True)
    assert_pipelined(ptxas_report(source, "gemm_sm90.cu"), f"rolled {family} {label}")
    loops = store_loops(source, "STG.E.64")
    assert loops is None or (loops and min(loops) <= 1000), loops  # the group loop: its stores and transposes inside


def store_loops(source, store: str) -> list[int] | None:
    """The sizes (SASS instructions) of `source`'s loops (a backward branch and what it jumps over) that hold a `store`
    and a warp shuffle; None without CUOBJDUMP (the SASS half of a test: benchmarks/cuda_sass.py prints it)."""
    from polykit.runtime.cuda.nvrtc import compile_source

    from .test_fp8_gemm_sm90 import _cuobjdump, disassemble

    tool = _cuobjdump()
    if tool is None:
        return None
    rows = [(int(m[1], 16), m[2]) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);",
                                                      disassemble(tool, compile_source(source, "sm_90a")))]
    loops = []
    for at, text in rows:
        m = re.search(r"\bBRA(?:\.\w+)? (?:!?U?P\w+, )?(0x[0-9a-f]+)$", text.strip())
        if m and int(m[1], 16) < at:
            body = [t for a, t in rows if int(m[1], 16) <= a <= at]
            if any(f"{store} " in t for t in body) and any(t.lstrip("@!P0123456789 ").startswith("SHFL") for t in body):
                loops.append(len(body))
    return loops


# ---- the 16-bit GEMM tiles (cuda.gemm.sm90_*) and their rolled twins --------------------------------

GEMM_ROLLED = [t.label for t in gemm_sm90.ROLLED_TILES]  # 128x128, 128x256, 64x128, 128x192


def fp16_case(case: str, dtype=np.float16):
    """(layer, inputs, float64 reference) of a 16-bit GEMM with a fused epilogue on the 16-byte path."""
    from math import erf

    from .test_gemm_sm90 import rand, stamped

    gelu = np.vectorize(erf)
    if case == "ffn1":  # BERT's FFN1: MatMul (B [K, N]) + bias + Gelu; 300 rows, 456 columns (a short last group)
        a, b, bias = rand((300, 64), dtype), rand((64, 456), dtype), rand((456,), dtype)
        body = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
                {"op": "Gelu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}]
        layer = LayerDesc("mm", "MatMul", ("A", "B", "bias"), ("Y",), {"epilogue": {"input": "raw", "body": body}},
                          domain="ai.polykit")
        inputs = {"A": a, "B": b, "bias": bias}
        x = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)
        return stamped(layer, inputs, (300, 456), dtype), inputs, 0.5 * x * (1.0 + gelu(x / np.sqrt(2.0)))
    # test_gemm_sm90's 16-byte path case: a Gemm (B [N, K]) with C, alpha, beta, bias + Gelu + residual; 77 rows
    a, b, c = rand((77, 96), dtype), rand((200, 96), dtype), rand((200,), dtype)
    bias, res = rand((200,), dtype), rand((77, 200), dtype)
    body = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
            {"op": "Gelu", "inputs": ["s"], "outputs": ["g"], "attrs": {}},
            {"op": "Add", "inputs": ["g", "res"], "outputs": ["Y"], "attrs": {}}]
    attrs = {"transB": 1, "alpha": 0.75, "beta": -1.5, "epilogue": {"input": "raw", "body": body}}
    layer = LayerDesc("gemm", "Gemm", ("A", "B", "C", "bias", "res"), ("Y",), attrs, domain="ai.polykit")
    inputs = {"A": a, "B": b, "C": c, "bias": bias, "res": res}
    x = 0.75 * (a.astype(np.float64) @ b.T.astype(np.float64)) - 1.5 * c.astype(np.float64) + bias.astype(np.float64)
    return stamped(layer, inputs, (77, 200), dtype), inputs, 0.5 * x * (1.0 + gelu(x / np.sqrt(2.0))) + res


@pytest.mark.parametrize("label", GEMM_ROLLED)
@pytest.mark.parametrize("case,dtype", [("ffn1", np.float16), ("gemm_residual", np.float16), ("ffn1", BF16)],
                         ids=["ffn1", "gemm_residual", "ffn1_bf16"])
def test_a_16_bit_gemm_tile_and_its_rolled_twin_write_the_same_bytes(launcher, case, dtype, label):
    from .test_gemm_sm90 import TOL, rel_err

    layer, inputs, want = fp16_case(case, dtype)
    kind = layer.kind
    unrolled = run_emulated_layer(launcher, layer, inputs, f"cuda.gemm.sm90_{label}", kind)["Y"]
    rolled = run_emulated_layer(launcher, layer, inputs, f"cuda.gemm.sm90_rolled_{label}", kind)["Y"]
    assert rel_err(unrolled, want) <= max(TOL[np.dtype(dtype)], 3e-3)
    assert rolled.tobytes() == unrolled.tobytes()


def test_the_16_bit_rolled_tiles_take_16_bit_layers_with_an_epilogue_only():
    from .test_gemm_sm90 import rand, stamped

    layer, _, _ = fp16_case("ffn1")
    plain = stamped(LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}, domain="ai.polykit"),
                    {"A": rand((64, 64), np.float16), "B": rand((64, 128), np.float16)}, (64, 128), np.float16)
    for label in GEMM_ROLLED:
        rolled = find_tactic("cuda", "MatMul", f"cuda.gemm.sm90_rolled_{label}")
        assert rolled.supports(layer) and not rolled.supports(plain), label
        assert find_tactic("cuda", "MatMul", f"cuda.gemm.sm90_{label}").supports(plain)


@pytest.mark.parametrize("label", WIDEST)
def test_a_16_bit_rolled_tile_spills_nothing_and_stores_16_bytes_in_its_loop(label):
    pytest.importorskip("cuda.core")
    from .test_sm90_wgmma_pipeline import assert_pipelined, ptxas_report

    tile = next(t for t in gemm_sm90.ROLLED_TILES if t.label == label)
    for source in (gemm_sm90.kernel_for(fp16_case(case)[0], tile, "half_t", case == "ffn1", rolled=True)
                   for case in ("ffn1", "gemm_residual")):
        assert_pipelined(ptxas_report(source, "gemm_sm90.cu"), f"rolled gemm {label}")
        loops = store_loops(source, "STG.E.128")  # (16-byte stores: store8's st.global.v4, not four 4-byte ones)
        assert loops is None or (loops and min(loops) <= 1000), loops


# ---- GPU: the rolled tiles against the reference -------------------------------------------------

@gpu
@pytest.mark.parametrize("label", ROLLED)
@pytest.mark.parametrize("case", INT8_CASES)
def test_sm90_rolled_int8_gemm_equals_the_reference(case, label):
    """Exact, as the twins' GPU tests hold them; a float output with an int8 residual within an ulp of |y|, as
    test_int8_gemm_sm90.py holds the twins there."""
    from polykit.runtime.cuda.harness import assert_matches_reference

    layer, inputs = int8_case(case)
    tolerance = {"rtol": 1e-6, "atol": 4e-5} if case == "residual_float" else {"rtol": 0, "atol": 0}
    assert_matches_reference(layer, inputs, tactic=_int8_name(label, True), **tolerance)


@gpu
@pytest.mark.parametrize("label", ROLLED)
@pytest.mark.parametrize("case", FP8_CASES)
def test_sm90_rolled_fp8_gemm_matches_the_reference(case, label):
    layer, inputs = fp8_case(case)
    check(layer, inputs, _fp8_name(label, True))


@gpu
@pytest.mark.parametrize("label", GEMM_ROLLED)
@pytest.mark.parametrize("case", ["ffn1", "gemm_residual"])
def test_sm90_rolled_16_bit_gemm_matches_the_reference(case, label):
    from polykit.runtime.cuda.harness import run_layer

    from .test_gemm_sm90 import rel_err

    layer, inputs, want = fp16_case(case)
    got = run_layer(layer, inputs, tactic=f"cuda.gemm.sm90_rolled_{label}")["Y"]
    assert rel_err(got, want) <= 3e-3
