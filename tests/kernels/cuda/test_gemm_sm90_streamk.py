"""Stream-K on the Hopper GEMM (gemm_sm90_streamk): the hybrid schedule, workspace and cost model
(CPU), ptxas on the stream-K kernel (NVRTC, no GPU), and the stream-K tactic against a float64
reference on random data with outputs poisoned (tiles fixed up in the kernel from 1 to 21 other
blocks' pieces), run-to-run bit equality, an engine's graph replays (GPU, compute capability 9.0)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.kernels.cuda.gemm.gemm_sm90 import TILES, Sm90Gemm, plan_gemm, predicted_us
from polykit.kernels.cuda.gemm.gemm_sm90_splitk import SPLIT_TILES, SPLITS
from polykit.kernels.cuda.gemm.gemm_sm90_streamk import (STREAMK_TILES, StreamKSchedule, compile_variants, partial_bytes,
                                                    schedule, schedule_of, streamk_us)
from tests.kernels.cuda.test_gemm_sm90 import BF16, check_matmul, rand, rel_err, require_sm90
from tests.kernels.cuda.test_gemm_sm90_splitk import (check_fused, check_gemm, check_same_bits, check_tf32_gemm,
                                                      fused_fp16_desc)
from tests.kernels.cuda.test_sm90_wgmma_pipeline import assert_pipelined, ptxas_report

H100_SMS = 132


# ---- schedule, workspace, cost model (no GPU) ----------------------------------------------

def test_the_128x128_tile_alone_has_a_stream_k_tactic_for_matmul_and_gemm():
    from polykit.kernels.tactics import find_tactic

    assert [t.label for t in STREAMK_TILES] == ["128x128"]
    for kind in ("MatMul", "Gemm"):
        tactic = find_tactic("cuda", kind, "cuda.gemm.sm90_128x128_streamk")
        assert tactic is not None and tactic.params["streamk"] == 1 and tactic.params["bn"] == 128
        assert find_tactic("cuda", kind, "cuda.gemm.sm90_128x256_streamk") is None


@pytest.mark.parametrize("tiles,ktiles,want", [
    (264, 12, StreamKSchedule(132, 264, 0, 12)),    # whole waves: all data-parallel, nothing split
    (192, 12, StreamKSchedule(132, 132, 60, 12)),   # 1.45 waves: the partial wave alone, 5-6 steps a block
    (400, 40, StreamKSchedule(132, 396, 4, 40)),    # 160 steps of the partial wave: one or two a block
    (400, 4, StreamKSchedule(132, 264, 136, 4)),    # its 16 steps for 132 blocks: the wave before joins
    (133, 64, StreamKSchedule(132, 0, 133, 64)),    # 896x2432x8192's 64 steps: so does the one wave
    (48, 48, StreamKSchedule(132, 0, 48, 48)),      # under a wave: every tile by K steps
    (6, 12, StreamKSchedule(72, 0, 6, 12)),         # fewer K steps than SMs: one block a step
])
def test_schedule_runs_whole_waves_unsplit_and_spreads_the_rest(tiles, ktiles, want):
    assert schedule(tiles, ktiles, H100_SMS) == want


SCHEDULE_CASES = [(192, 12), (133, 5), (200, 2), (400, 4), (48, 48), (6, 12), (3, 1), (400, 40), (133, 200)]


@pytest.mark.parametrize("tiles,ktiles", SCHEDULE_CASES)
def test_block_ranges_cover_the_stream_k_steps_once_in_near_equal_shares(tiles, ktiles):
    sched = schedule(tiles, ktiles, H100_SMS)
    ranges = [sched.block_range(b) for b in range(sched.grid)]
    assert ranges[0][0] == 0 and ranges[-1][1] == sched.sk_tiles * ktiles
    assert all(r[1] == n[0] for r, n in zip(ranges, ranges[1:]))
    assert max(e - s for s, e in ranges) - min(e - s for s, e in ranges) <= 1
    assert min(e - s for s, e in ranges) >= 1 or not sched.sk_tiles


@pytest.mark.parametrize("tiles,ktiles", SCHEDULE_CASES)
def test_stored_pieces_and_span_match_the_blocks_each_tile_lies_in(tiles, ktiles):
    """Brute force: a tile whose steps span n blocks has n - 1 pieces stored (its last block keeps
    its own in registers), a block stores at most one (its slot and flag), span is the widest n."""
    sched = schedule(tiles, ktiles, H100_SMS)
    owner = [b for b in range(sched.grid) for _ in range(*sched.block_range(b))]
    spans = [sorted(set(owner[t * ktiles:(t + 1) * ktiles])) for t in range(sched.sk_tiles)]
    assert sched.stored() == sum(len(s) - 1 for s in spans)
    storers = [b for s in spans for b in s[:-1]]
    assert len(storers) == len(set(storers))
    assert sched.span() == max(len(s) for s in spans)


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


#: H100 timings (us, session 15, benchmarks/cuda_gemm.py --shapes waves,bert): 128x128 stream-K
#: against the best unsplit or split-K sm90 tactic; stream-K wins only on the first two
MEASURED = {(896, 4864, 4096): (60.3, 71.1), (896, 2432, 8192): (57.9, 64.5), (1280, 2560, 3072): (42.5, 37.0),
            (1024, 768, 768): (16.0, 7.3), (1024, 3072, 768): (21.8, 12.8), (1024, 768, 3072): (22.0, 14.9),
            (128, 768, 768): (17.3, 5.7), (128, 3072, 768): (17.4, 6.1), (128, 768, 3072): (26.8, 9.5)}


@pytest.mark.parametrize("M,N,K", sorted(MEASURED))
def test_an_untimed_build_takes_stream_k_exactly_where_it_measured_fastest(M, N, K):
    """The cost model ranks stream-K first among the sm90 fp16 tactics (unsplit tiles, split-K)
    on the shapes where the H100 timed it fastest, and below one of them elsewhere."""
    others = [predicted_us(t, M, N, K, 1, H100_SMS) for t in TILES]
    others += [predicted_us(t, M, N, K, 1, H100_SMS, splits=s) for t in SPLIT_TILES for s in SPLITS]
    streamk = streamk_us(STREAMK_TILES[0], Sm90Gemm(M, N, K, 1, 1, 1, True), H100_SMS)
    measured, best_other = MEASURED[(M, N, K)]
    assert (streamk < min(others)) == (measured < best_other), f"predicted {streamk:.1f} us against {min(others):.1f}"


def test_whole_waves_cost_what_the_unsplit_tile_does():
    tile = STREAMK_TILES[0]
    assert streamk_us(tile, Sm90Gemm(1408, 3072, 768, 1, 1, 1, True), H100_SMS) == predicted_us(
        tile, 1408, 3072, 768, 1, H100_SMS)  # 264 tiles, exactly two waves: the same kernel as unsplit


# ---- compile (NVRTC, no GPU) ---------------------------------------------------------------

def test_streamk_compile_variants_cover_each_tile_dtype_and_b_layout():
    units = compile_variants()
    keys = {(dict(u.defines)["ELEM"], dict(u.defines)["BN"], dict(u.defines)["B_MN"]) for u in units}
    assert {("half_t", str(t.bn), b) for t in STREAMK_TILES for b in "01"} <= keys
    assert {("bf16_t", "128", "1"), ("float", "128", "0")} <= keys
    assert all(dict(u.defines)["STREAMK"] == "1" and u.arch == "sm_90a" for u in units)


@pytest.mark.parametrize("tile", STREAMK_TILES, ids=lambda t: t.label)
def test_the_fused_streamk_unit_keeps_its_wgmma_pipeline_and_spills_nothing(tile):
    pytest.importorskip("cuda.core")
    from polykit.kernels.cuda.gemm.gemm_sm90 import kernel_for

    # BERT-base bs8's FFN1 with a bias + GELU + residual epilogue
    text = ptxas_report(kernel_for(fused_fp16_desc(1024, 3072, 768), tile, "half_t", True, streamk=True), "gemm_sm90.cu")
    assert text.count("Used") == 1, f"expected the one kernel in the report (no reduce):\n{text}"
    assert_pipelined(text, f"stream-K tile {tile.label}")
    assert text.count(" 0 bytes spill stores") == 1, f"tile {tile.label} stream-K spills:\n{text}"


# ---- GPU ----------------------------------------------------------------------------------

TACTIC = "cuda.gemm.sm90_128x128_streamk"
SHAPES = [((896, 768), (768, 2432)),      # 7 x 19 = 133 tiles of 128x128: one over a wave
          ((896, 4096), (4096, 4864)),    # 266 tiles, 64 steps: 2 past two waves (stream-K's measured win)
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
    range, run whole data-parallel waves, split the partial wave alone and with the wave before,
    and fix up tiles from 1 to 21 other blocks."""
    tile = STREAMK_TILES[0]
    scheds = [schedule_of(plan_gemm("MatMul", {}, a, b), tile, "float16", H100_SMS) for a, b in SHAPES]
    assert all(s.stored() for s in scheds[:3])
    assert scheds[1] == StreamKSchedule(132, 132, 134, 64)  # 128 steps past two waves: the wave before joins
    assert scheds[4] == StreamKSchedule(132, 264, 136, 4)   # 16 steps past three waves: so does it
    assert scheds[5] == StreamKSchedule(132, 132, 60, 12)   # 720 steps past a wave: split alone
    assert {2, 22} <= {s.span() for s in scheds}
    assert any(s.sk_tiles * s.ktiles > 2 * s.stored() for s in scheds)  # whole tiles inside a range


@pytest.mark.gpu
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
def test_streamk_matmul_matches_float64_reference(a_shape, b_shape):
    check_matmul(TACTIC, a_shape, b_shape, np.dtype(np.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("a_shape,b_shape", [((896, 768), (768, 2432)), ((77, 200), (200, 264))])
def test_bf16_streamk_matmul_matches_float64_reference(a_shape, b_shape):
    check_matmul(TACTIC, a_shape, b_shape, BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("trans_b,c_shape", [(1, (2433,)), (0, (896, 1)), (1, (896, 2433)), (1, None)])
def test_streamk_gemm_applies_alpha_beta_and_broadcast_c(trans_b, c_shape):
    """N 2433 (odd: the epilogue's pair path with a lone last column) where B is [N, K]; N 2432 else."""
    N = 2433 if trans_b else 2432
    check_gemm(TACTIC, 896, 1000, N, trans_b, c_shape and tuple(N if d == 2433 else d for d in c_shape))


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1024, 3072, 768), (896, 2432, 200), (17, 136, 768), (128, 768, 3072)])
def test_streamk_runs_the_fused_bias_gelu_residual_epilogue_once_on_every_tile(M, N, K):
    """Whole tiles and fixed-up split tiles both take the epilogue once: against float64."""
    check_fused(TACTIC, M, N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1024, 3072, 768), (896, 2432, 768), (128, 768, 3072)])  # the last: 22 blocks a tile
def test_streamk_results_are_the_same_bits_run_to_run(M, N, K):
    """Three runs (each workspace fresh: stale flags of the run before unless the memset zeroes them)."""
    check_same_bits(TACTIC, M, N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(896, 2432, 768), (1, 264, 72)])
def test_tf32_streamk_gemm_with_bias(M, N, K):
    check_tf32_gemm(TACTIC, M, N, K)


@pytest.mark.gpu
def test_two_streamk_layers_of_one_engine_share_the_workspace_through_graph_replays():
    """fp16 engine x @ W1 @ W2 (1024x3072x768 then 1024x768x3072), both layers forced to the
    128x128 stream-K tactic: the second borrows the workspace the first left its flags released
    in, and the CUDA graph replays both three times; only the memset before each launch keeps a
    fixup from reading stale pieces. Each run against float64 (h rounded to fp16), all bit-equal."""
    require_sm90()
    from onnx import TensorProto, helper, numpy_helper

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Engine

    x, w1, w2 = rand((1024, 768), np.float32), rand((768, 3072), np.float32) / 16, rand((3072, 768), np.float32) / 32
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024, 768])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024, 768])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, fuse=False,
                                           tactic_replay={"mm1": TACTIC, "mm2": TACTIC}))
    assert sorted(layer.tactic for layer in plan.layers if layer.kind == "MatMul") == [TACTIC, TACTIC]
    f16 = [a.astype(np.float16).astype(np.float64) for a in (x, w1, w2)]
    ref = (f16[0] @ f16[1]).astype(np.float16).astype(np.float64) @ f16[2]
    with Engine(plan) as engine, engine.create_execution_context(cuda_graph=True) as ctx:
        runs = [np.asarray(ctx.execute({"x": x})["y"]) for _ in range(3)]
    for i, out in enumerate(runs):
        err = rel_err(out, ref)
        assert err <= 3e-3, f"run {i}: relative error {err:.2e} (a stale flag lets a fixup add an old piece)"
        assert np.array_equal(out.view(np.uint32), runs[0].view(np.uint32)), f"run {i} differs from run 0"
