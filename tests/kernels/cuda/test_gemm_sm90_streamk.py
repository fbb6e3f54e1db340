"""Stream-K on the Hopper GEMM (gemm_sm90_streamk): the hybrid schedules, workspace and cost model
(CPU), ptxas on the stream-K kernels (NVRTC, no GPU), and every stream-K tactic against a float64
reference on random data with outputs poisoned (tiles fixed up in the kernel from 1 to ~11 other
blocks' pieces), run-to-run bit equality (GPU, compute capability 9.0)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan_records import LayerDesc, TensorDesc
from polykit.kernels.cuda.gemm_sm90 import Sm90Gemm, plan_gemm, predicted_us
from polykit.kernels.cuda.gemm_sm90_streamk import (SCHEDULES, STREAMK_TILES, StreamKSchedule, compile_variants,
                                                    partial_bytes, schedule, schedule_of, streamk_us)
from tests.kernels.cuda.test_gemm_sm90 import BF16, check_matmul, rand, rel_err, require_sm90
from tests.kernels.cuda.test_gemm_sm90_splitk import (GELU_RES, check_fused, check_gemm, check_same_bits,
                                                      check_tf32_gemm)
from tests.kernels.cuda.test_sm90_wgmma_pipeline import assert_pipelined, ptxas_report

H100_SMS = 132


# ---- schedule, workspace, cost model (no GPU) ----------------------------------------------

def test_every_streamk_tile_has_a_tactic_for_matmul_and_gemm():
    from polykit.kernels.tactics import find_tactic

    assert [t.label for t in STREAMK_TILES] == ["128x128", "128x256", "256x128", "64x128", "128x192"]
    for tile in STREAMK_TILES:
        for kind in ("MatMul", "Gemm"):
            for suffix, streamk in (("streamk", 1), ("streamk1", 2)):
                tactic = find_tactic("cuda", kind, f"cuda.gemm.sm90_{tile.label}_{suffix}")
                assert tactic is not None and tactic.params["streamk"] == streamk and tactic.params["bn"] == tile.bn


@pytest.mark.parametrize("tiles,ktiles,want", [
    (264, 12, StreamKSchedule(132, 264, 0, 12)),   # whole waves: all data-parallel, nothing split
    (192, 12, StreamKSchedule(132, 0, 192, 12)),   # 1.45 waves: the partial wave and the one before
    (400, 4, StreamKSchedule(132, 264, 136, 4)),   # 3.03 waves: two whole waves unsplit
    (48, 48, StreamKSchedule(132, 0, 48, 48)),     # under a wave: every tile by K steps
    (6, 12, StreamKSchedule(72, 0, 6, 12)),        # fewer K steps than SMs: one block a step
])
def test_schedule_runs_whole_waves_unsplit_and_spreads_the_rest(tiles, ktiles, want):
    assert schedule(tiles, ktiles, H100_SMS) == want


@pytest.mark.parametrize("tiles,ktiles,want", [
    (192, 12, StreamKSchedule(132, 132, 60, 12)),   # the partial wave alone: 720 steps, 5-6 a block
    (400, 40, StreamKSchedule(132, 396, 4, 40)),    # 160 steps: one or two a block
    (400, 4, StreamKSchedule(132, 264, 136, 4)),    # 16 steps for 132 blocks: the wave before joins
    (48, 48, StreamKSchedule(132, 0, 48, 48)),      # under a wave: as the default schedule
])
def test_the_partial_wave_schedule_splits_it_alone_where_every_block_gets_a_step(tiles, ktiles, want):
    assert SCHEDULES == {"streamk": True, "streamk1": False}
    assert schedule(tiles, ktiles, H100_SMS, extra_wave=False) == want


SCHEDULE_CASES = [(192, 12, True), (133, 5, True), (200, 2, True), (400, 4, True), (48, 48, True), (6, 12, True),
                  (3, 1, True), (192, 12, False), (400, 40, False), (133, 200, False)]


@pytest.mark.parametrize("tiles,ktiles,extra", SCHEDULE_CASES)
def test_block_ranges_cover_the_stream_k_steps_once_in_near_equal_shares(tiles, ktiles, extra):
    sched = schedule(tiles, ktiles, H100_SMS, extra)
    ranges = [sched.block_range(b) for b in range(sched.grid)]
    assert ranges[0][0] == 0 and ranges[-1][1] == sched.sk_tiles * ktiles
    assert all(r[1] == n[0] for r, n in zip(ranges, ranges[1:]))
    assert max(e - s for s, e in ranges) - min(e - s for s, e in ranges) <= 1
    assert min(e - s for s, e in ranges) >= 1 or not sched.sk_tiles


@pytest.mark.parametrize("tiles,ktiles,extra", SCHEDULE_CASES)
def test_stored_pieces_are_a_split_tiles_parts_but_the_fixup_blocks(tiles, ktiles, extra):
    """Brute force: a tile whose steps span n blocks has n - 1 pieces stored (its last block keeps
    its own in registers), and a block stores at most one (its slot and flag)."""
    sched = schedule(tiles, ktiles, H100_SMS, extra)
    owner = [b for b in range(sched.grid) for _ in range(*sched.block_range(b))]
    spans = [sorted(set(owner[t * ktiles:(t + 1) * ktiles])) for t in range(sched.sk_tiles)]
    assert sched.stored() == sum(len(s) - 1 for s in spans)
    storers = [b for s in spans for b in s[:-1]]
    assert len(storers) == len(set(storers))


def test_workspace_is_an_fp32_tile_and_a_flag_a_block_and_none_for_whole_waves():
    from polykit.kernels.tactics import find_tactic

    tactic = find_tactic("cuda", "MatMul", "cuda.gemm.sm90_128x128_streamk")
    layer = LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {})

    def tensors(M, N, K):
        return {"A": TensorDesc("A", "float16", (M, K), "input"), "B": TensorDesc("B", "float16", (K, N), "weight")}

    # 1024 x 3072: 192 tiles of 128x128 for 132 SMs
    assert tactic.workspace(layer, tensors(1024, 3072, 768), H100_SMS) == 132 * (128 * 128 + 1) * 4
    assert tactic.workspace(layer, tensors(1408, 3072, 768), H100_SMS) == 0  # 11 x 24 = 264 tiles: two waves
    geo = plan_gemm("MatMul", {}, (1024, 768), (768, 3072))
    assert partial_bytes(STREAMK_TILES[0], schedule_of(geo, STREAMK_TILES[0], "float16", H100_SMS)) > 0


def test_cost_model_prices_stream_k_below_the_unsplit_tile_only_where_the_last_wave_idles():
    tile = STREAMK_TILES[0]  # 128x128
    ffn2 = Sm90Gemm(1024, 768, 3072, 1, 1, 1, True)  # 48 tiles, 48 K steps: under half a wave
    assert streamk_us(tile, ffn2, H100_SMS) < predicted_us(tile, 1024, 768, 3072, 1, H100_SMS)
    assert streamk_us(tile, Sm90Gemm(1408, 3072, 768, 1, 1, 1, True), H100_SMS) == predicted_us(
        tile, 1408, 3072, 768, 1, H100_SMS)  # exactly two waves: the same kernel as unsplit


# ---- compile (NVRTC, no GPU) ---------------------------------------------------------------

def test_streamk_compile_variants_cover_each_tile_dtype_and_b_layout():
    units = compile_variants()
    keys = {(dict(u.defines)["ELEM"], dict(u.defines)["BN"], dict(u.defines)["B_MN"]) for u in units}
    assert {("half_t", str(t.bn), b) for t in STREAMK_TILES for b in "01"} <= keys
    assert {("bf16_t", "128", "1"), ("float", "128", "0")} <= keys
    assert all(dict(u.defines)["STREAMK"] == "1" and u.arch == "sm_90a" for u in units)


@pytest.mark.parametrize("tile", [t for t in STREAMK_TILES if t.label in ("128x128", "128x256", "128x192")],
                         ids=lambda t: t.label)
def test_the_fused_streamk_unit_keeps_its_wgmma_pipeline_and_spills_nothing(tile):
    pytest.importorskip("cuda.core")
    from polykit.kernels.cuda.gemm_sm90 import kernel_for

    M, N, K = 1024, 3072, 768  # BERT-base bs8's FFN1 with a bias + GELU + residual epilogue
    layer = LayerDesc("mm", "MatMul", ("A", "B", "bias", "res"), ("Y",), {"epilogue": {"input": "raw", "body": GELU_RES}},
                      domain="ai.polykit", in_dtypes=("float16",) * 4, out_dtypes=("float16",),
                      in_shapes=((M, K), (K, N), (N,), (M, N)), out_shapes=((M, N),))
    text = ptxas_report(kernel_for(layer, tile, "half_t", True, streamk=True), "gemm_sm90.cu")
    assert text.count("Used") == 1, f"expected the one kernel in the report (no reduce):\n{text}"
    assert_pipelined(text, f"stream-K tile {tile.label}")
    assert text.count(" 0 bytes spill stores") == 1, f"tile {tile.label} stream-K spills:\n{text}"


# ---- GPU ----------------------------------------------------------------------------------

TACTICS = [f"{t.label}_streamk" for t in STREAMK_TILES] + ["128x128_streamk1", "64x128_streamk1"]
SHAPES = [((896, 768), (768, 2432)),      # 7 x 19 = 133 tiles of 128x128: one over a wave
          ((1280, 200), (200, 2560)),     # 200 tiles, K 200: 4 K steps, the last partial
          ((1280, 72), (72, 2560)),       # K 72: 2 steps, a block's share spans several tiles
          ((2560, 256), (256, 2560)),     # 400 tiles: two whole waves data-parallel, then stream-K
          ((1024, 768), (768, 3072)), ((1024, 3072), (3072, 768)), ((128, 3072), (3072, 768)),  # BERT
          ((1, 768), (768, 768)), ((17, 3072), (3072, 768)),                                    # M 1, M 17
          ((3, 40, 136), (136, 200)),     # batch folded into M (B broadcast)
          ((4, 65, 136), (4, 136, 24)),   # batched A and B
          ((33, 264), (5, 264, 16))]      # A broadcast over B's batch


def test_the_gpu_shapes_reach_every_path_of_the_schedule():
    """On 132 SMs the shapes above split tiles (stored pieces), finish tiles whole inside a block's
    range, and run whole data-parallel waves."""
    tile = STREAMK_TILES[0]
    scheds = [schedule_of(plan_gemm("MatMul", {}, a, b), tile, "float16", H100_SMS) for a, b in SHAPES]
    assert all(s.stored() for s in scheds[:2])
    assert any(s.dp_tiles for s in scheds)
    assert any(s.sk_tiles * s.ktiles > 2 * s.stored() for s in scheds)  # whole tiles inside a range


@pytest.mark.gpu
@pytest.mark.parametrize("name", TACTICS)
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
def test_streamk_matmul_matches_float64_reference(name, a_shape, b_shape):
    check_matmul(f"cuda.gemm.sm90_{name}", a_shape, b_shape, np.dtype(np.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("a_shape,b_shape", [((896, 768), (768, 2432)), ((77, 200), (200, 264))])
def test_bf16_streamk_matmul_matches_float64_reference(a_shape, b_shape):
    check_matmul("cuda.gemm.sm90_128x128_streamk", a_shape, b_shape, BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["128x128_streamk", "128x192_streamk"])
@pytest.mark.parametrize("trans_b,c_shape", [(1, (2433,)), (0, (896, 1)), (1, (896, 2433)), (1, None)])
def test_streamk_gemm_applies_alpha_beta_and_broadcast_c(name, trans_b, c_shape):
    """N 2433 (odd: the reduce's pair path with a lone last column) where B is [N, K]; N 2432 else."""
    N = 2433 if trans_b else 2432
    check_gemm(f"cuda.gemm.sm90_{name}", 896, 1000, N, trans_b, c_shape and tuple(N if d == 2433 else d for d in c_shape))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["128x128_streamk", "128x256_streamk", "64x128_streamk"])
@pytest.mark.parametrize("M,N,K", [(1024, 3072, 768), (896, 2432, 200), (17, 136, 768)])
def test_streamk_runs_the_fused_bias_gelu_residual_epilogue_once_on_every_tile(name, M, N, K):
    """Whole tiles take the epilogue in the kernel, split ones in the reduce: both against float64."""
    check_fused(f"cuda.gemm.sm90_{name}", M, N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("name,M,N,K", [("128x128_streamk", 1024, 3072, 768), ("128x128_streamk1", 1024, 3072, 768),
                                         ("64x128_streamk", 128, 768, 3072)])  # the last: tiles of ~11 blocks
def test_streamk_results_are_the_same_bits_run_to_run(name, M, N, K):
    """Three runs (each workspace fresh: stale flags of the run before unless the memset zeroes them)."""
    check_same_bits(f"cuda.gemm.sm90_{name}", M, N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(896, 2432, 768), (1, 264, 72)])
def test_tf32_streamk_gemm_with_bias(M, N, K):
    check_tf32_gemm("cuda.gemm.sm90_128x128_streamk", M, N, K)


@pytest.mark.gpu
def test_two_streamk_layers_of_one_engine_share_the_workspace_through_graph_replays():
    """fp16 engine x @ W1 @ W2 (1024x3072x768 then 1024x768x3072), both layers forced to the
    128x128 stream-K tactic: the second borrows the workspace the first left its flags released
    in, and the CUDA graph replays both three times; only the memset before each launch keeps a
    fixup from reading stale pieces. Each run against float64 (h rounded to fp16), all bit-equal."""
    require_sm90()
    from onnx import TensorProto, helper, numpy_helper

    from polykit.compiler.builder import build_plan
    from polykit.compiler.config import BuilderConfig
    from polykit.runtime.engine import Engine

    x, w1, w2 = rand((1024, 768), np.float32), rand((768, 3072), np.float32) / 16, rand((3072, 768), np.float32) / 32
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024, 768])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024, 768])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    tactic = "cuda.gemm.sm90_128x128_streamk"
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, fuse=False,
                                           tactic_replay={"mm1": tactic, "mm2": tactic}))
    assert sorted(layer.tactic for layer in plan.layers if layer.kind == "MatMul") == [tactic, tactic]
    f16 = [a.astype(np.float16).astype(np.float64) for a in (x, w1, w2)]
    ref = (f16[0] @ f16[1]).astype(np.float16).astype(np.float64) @ f16[2]
    with Engine(plan) as engine, engine.create_execution_context(cuda_graph=True) as ctx:
        runs = [np.asarray(ctx.execute({"x": x})["y"]) for _ in range(3)]
    for i, out in enumerate(runs):
        err = rel_err(out, ref)
        assert err <= 3e-3, f"run {i}: relative error {err:.2e} (a stale flag lets a fixup add an old piece)"
        assert np.array_equal(out.view(np.uint32), runs[0].view(np.uint32)), f"run {i} differs from run 0"
