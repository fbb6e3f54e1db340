"""The Hopper attention tactics (cuda.attention.flash_sm90 and its ping-pong shapes flash_sm90_pp,
_pp_s3): TMA maps, registration, launch geometry and kernel defines (CPU); results against the float64
reference on random data with outputs poisoned, masks (padding, causal, additive), layouts and broadcast
heads, and against cuda.attention.flash (GPU, compute capability 9.0)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, all_cuda_tactics
from polykit.kernels.cuda.attention.flash_attention import head_view
from polykit.kernels.cuda.attention.flash_attention_sm90 import (SHAPES, _enqueue, _supports, compile_variants,
                                                                  kernel_for, tensor_map)
from tests.kernels.cuda.test_flash_attention import CAUSAL_CASES, causal_padding_keep, layer_for, rand, reference

rng = np.random.default_rng(90)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
NAMES = [s.name for s in SHAPES]


# ---- CPU ------------------------------------------------------------------------------------

def test_tensor_maps_of_both_layouts_put_sequence_and_head_in_stride_order():
    spec, bits = tensor_map(DeviceTensor(4096, (2, 3, 77, 64), FP16), head_view({}, 0, (2, 3, 77, 64)), 64)
    assert (spec.dims, spec.strides, spec.box, bits) == ((64, 77, 3, 2), (128, 77 * 128, 3 * 77 * 128), (64, 64, 1, 1), 0)
    spec, bits = tensor_map(DeviceTensor(4096, (2, 77, 3, 128), BF16), head_view({"k_layout": "bshd"}, 1, (2, 77, 3, 128)), 128)
    assert (spec.dims, spec.strides, spec.box, bits) == ((128, 3, 77, 2), (256, 3 * 256, 77 * 3 * 256), (64, 1, 128, 1), 1)
    _, bits = tensor_map(DeviceTensor(4096, (1, 1, 50, 64), FP16), head_view({}, 0, (1, 1, 50, 64)), 64)
    assert bits == 2 | 4  # batch and head broadcast: coordinate 0
    _, bits = tensor_map(DeviceTensor(4096, (50, 4, 64), FP16), head_view({}, 0, (50, 4, 64)), 64)  # rank 3: batch 1
    assert bits == 2


def test_tensor_map_refuses_a_pointer_tma_cannot_read():
    with pytest.raises(DeviceError, match="16-byte aligned"):
        tensor_map(DeviceTensor(4098, (1, 1, 8, 64), FP16), head_view({}, 0, (1, 1, 8, 64)), 64)


@pytest.mark.parametrize("q,dtype,ok", [
    ((2, 3, 8, 64), FP16, True), ((2, 3, 8, 128), BF16, True),
    ((2, 3, 8, 32), FP16, False),               # head size 32: the mma.sync kernel stays
    ((2, 3, 8, 96), FP16, False),
    ((2, 3, 8, 64), np.dtype(np.float32), False),
])
def test_supports_fp16_bf16_heads_64_and_128_only(q, dtype, ok):
    inputs = {"Q": rand(q, dtype), "K": rand(q, dtype), "V": rand(q, dtype)}
    assert _supports(layer_for(inputs, q)) is ok


def test_registered_for_compute_capability_9_only_and_every_variant_targets_sm_90a():
    tactics = {t.name: t for t in all_cuda_tactics() if t.kind == "Attention"}
    for name in NAMES:
        assert tactics[name].archs == ("sm_90",)
        assert tactics[name].runs_on("sm_90") and not tactics[name].runs_on("sm_80") and not tactics[name].runs_on("sm_100")
    units = compile_variants()
    plain = [u for u in units if "FLASH_Q8" not in dict(u.defines)]
    assert len(plain) == len(SHAPES) * 2 * 2 + len(SHAPES) and all(u.arch == "sm_90a" for u in units)
    assert sum(dict(u.defines).get("FLASH_MASKED") == "0" for u in units) == len(SHAPES)  # one unmasked a shape
    # AttentionQuantize's e4m3 output stage: every shape in both storage types at head 64, in float16 at head 128
    q8 = {(dict(u.defines)["ELEM"], dict(u.defines)["HD"]) for u in units if dict(u.defines).get("FLASH_Q8") == "1"}
    assert q8 == {("half_t", "64"), ("bf16_t", "64"), ("half_t", "128")}
    assert len(units) - len(plain) == len(SHAPES) * 3


def test_block_shapes_fit_the_shared_memory_of_one_sm():
    for s in SHAPES:
        # a producer warp; the ping-pong shapes' producer is a whole warpgroup (setmaxnreg is warpgroup-wide)
        assert s.threads == (128 * (s.consumers + 1) if s.pingpong else 128 * s.consumers + 32)
        assert s.smem(128) <= 227 * 1024
    assert NAMES == ["cuda.attention.flash_sm90", "cuda.attention.flash_sm90_pp", "cuda.attention.flash_sm90_pp_s3",
                     "cuda.attention.flash_sm90_pp_persist_s3"]


def test_ping_pong_shapes_rank_below_flash_sm90_so_an_untimed_build_keeps_it():
    tactics = {t.name: t for t in all_cuda_tactics() if t.kind == "Attention"}
    for s in SHAPES[1:]:
        assert tactics[s.name].priority < tactics["cuda.attention.flash_sm90"].priority
        assert tactics[s.name].params == {"block_q": 128, "block_kv": 128, "consumers": 2, "stages": s.stages,
                                          "pingpong": 1, "persistent": int(s.persistent)}


def test_flash_sm90_keeps_its_defines_and_the_ping_pong_shapes_compile_theirs_in():
    assert dict(kernel_for(SHAPES[0], "half_t", 128).defines) == {"ELEM": "half_t", "HD": "128", "CONSUMERS": "1",
                                                                  "BKV": "64"}
    for s in SHAPES[1:]:
        d = dict(kernel_for(s, "bf16_t", 64).defines)
        assert (d["PINGPONG"], d["STAGES"], d["CONSUMERS"], d["BKV"]) == ("1", str(s.stages), "2", "128")
        assert d.get("PERSISTENT") == ("1" if s.persistent else None)


class _Launches:
    """Records grid, block and shared memory of each launch (RecordingLauncher keeps only the arguments)."""

    def __init__(self, sm_count: int):
        self.sm_count = sm_count
        self.launches = []

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.launches.append((kernel, grid, block, args, shared_mem))


@pytest.mark.parametrize("shape", [s for s in SHAPES[1:] if not s.persistent], ids=lambda s: s.name)
@pytest.mark.parametrize("S", [1, 128, 129, 300])
def test_ping_pong_launch_covers_the_queries_in_blocks_of_128_with_key_tiles_of_128(shape, S):
    kernel, grid, block, args, smem = _launch(shape, S, sm_count=132)
    assert grid == (-(-S // 128), 3, 2) and block == (384,) and smem == shape.smem(128)
    assert dict(kernel.defines)["PINGPONG"] == "1" and "PERSISTENT" not in dict(kernel.defines)
    tm_q, tm_k, tm_v = args[:3]
    assert tm_q.box == (64, 128, 1, 1) and tm_k.box == tm_v.box == (64, 128, 1, 1)


@pytest.mark.parametrize("S,sm_count,blocks", [(300, 132, 18), (2048, 132, 96), (2048, 8, 8), (1, 132, 6)])
def test_the_persistent_launch_has_one_block_an_sm_at_most_and_passes_heads_and_batch(S, sm_count, blocks):
    """ceil(S / 128) x 3 heads x 2 batch items, at most one block an SM; heads and batch after geo (ITEM_PARAMS)."""
    shape = next(s for s in SHAPES if s.persistent)
    kernel, grid, block, args, smem = _launch(shape, S, sm_count)
    assert grid == (blocks, 1, 1) and block == (384,) and smem == shape.smem(128)
    assert dict(kernel.defines)["PERSISTENT"] == "1"
    assert [int(a) for a in args[-2:]] == [3, 2]


def _launch(shape, S, sm_count):
    """The one launch of `shape` for a [2, 3, S, 128] fp16 layer over 200 keys."""
    B, H, D = 2, 3, 128
    inputs = {"Q": rand((B, H, S, D), FP16), "K": rand((B, H, 200, D), FP16), "V": rand((B, H, 200, D), FP16)}
    layer = layer_for(inputs, (B, H, S, D))
    tensors = {n: DeviceTensor(4096 * (i + 1), x.shape, FP16) for i, (n, x) in enumerate(inputs.items())}
    tensors[layer.outputs[0]] = DeviceTensor(1 << 20, (B, H, S, D), FP16)
    rec = _Launches(sm_count)
    _enqueue(shape)(layer, rec, tensors)
    (launch,) = rec.launches
    return launch


# ---- GPU ------------------------------------------------------------------------------------

def require_sm90():
    from tests.kernels.cuda import on_sm90

    if not on_sm90():
        pytest.skip("needs a compute capability 9.0 GPU")


TOL = {FP16: 3e-3, BF16: 2e-2}


def run(layer, inputs, tactic):
    from polykit.runtime.cuda.harness import run_layer

    spec = {"Y": (layer.out_shapes[0], inputs["Q"].dtype)}
    return np.asarray(run_layer(layer, inputs, tactic=tactic, output_specs=spec)["Y"], np.float64)


def check(layer, inputs, tactic, tol):
    """The tactic's output (poisoned before the run) against the float64 reference: NaN rows
    where the reference has them, relative error (Frobenius) within `tol`."""
    out, ref = run(layer, inputs, tactic), reference(layer, inputs)
    assert out.shape == ref.shape
    nan_out, nan_ref = np.isnan(out), np.isnan(ref)
    assert np.array_equal(nan_out, nan_ref), (
        f"{tactic}: {int((nan_out & ~nan_ref).sum())} NaN outputs where the reference is finite (first at "
        f"{np.argwhere(nan_out & ~nan_ref)[:1].tolist()}: unwritten or wrong rows), "
        f"{int((nan_ref & ~nan_out).sum())} finite where it is NaN")
    ok = ~nan_ref
    diff = np.abs(out - ref) * ok
    err = np.linalg.norm(diff[ok]) / (np.linalg.norm(ref[ok]) or 1.0)
    worst = np.unravel_index(np.argmax(diff), diff.shape)
    assert err <= tol, (f"{tactic}: relative error {err:.3g} > {tol:g}; worst at {list(worst)}: "
                        f"{out[worst]:.5g} vs reference {ref[worst]:.5g}")


def arrays(q_shape, kv_shape, dtype):
    return {"Q": rand(q_shape, dtype), "K": rand(kv_shape, dtype), "V": rand(kv_shape, dtype)}


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", NAMES)
@pytest.mark.parametrize("seq", [1, 7, 64, 77, 128, 513, 1031])  # 1031: 9 key tiles of 128, the stage rings wrap
@pytest.mark.parametrize("head", [64, 128])
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_matches_reference_without_mask(tactic, seq, head, dtype):
    require_sm90()
    inputs = arrays((2, 3, seq, head), (2, 3, seq, head), dtype)
    check(layer_for(inputs, (2, 3, seq, head)), inputs, tactic, TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", NAMES)
@pytest.mark.parametrize("sq,skv", [(7, 7), (77, 77), (128, 128), (513, 513), (40, 100)])
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_causal_keep_mask(tactic, sq, skv, dtype):
    """Causal as the layer receives it: a bool [Sq, Skv] keep-mask, query i sees keys <= i + Skv - Sq."""
    require_sm90()
    inputs = arrays((2, 2, sq, 64), (2, 2, skv, 64), dtype)
    inputs["mask"] = np.tril(np.ones((sq, skv), bool), k=skv - sq)
    check(layer_for(inputs, (2, 2, sq, 64)), inputs, tactic, TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", NAMES)
@pytest.mark.parametrize("head", [64, 128])
@pytest.mark.parametrize("kind", ["bool", "add"])
def test_padding_masks_per_batch(tactic, head, kind):
    """Key padding [B, 1, 1, Skv]: batch i keeps its first lengths[i] keys (bool), or adds -10000
    to the rest (additive, as BERT exports write it)."""
    require_sm90()
    lengths = [130, 1, 77, 200]
    inputs = arrays((4, 3, 200, head), (4, 3, 200, head), FP16)
    keep = np.arange(200)[None, :] < np.array(lengths)[:, None]
    keep = keep[:, None, None, :]
    inputs["mask"] = keep if kind == "bool" else np.where(keep, 0.0, -10000.0).astype(FP16)
    check(layer_for(inputs, (4, 3, 200, head)), inputs, tactic, 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", NAMES)
@pytest.mark.parametrize("mask_shape", [(2, 3, 70, 90), (90,)])
def test_dense_and_broadcast_additive_masks(tactic, mask_shape):
    require_sm90()
    inputs = arrays((2, 3, 70, 64), (2, 3, 90, 64), BF16)
    inputs["mask"] = (rng.standard_normal(mask_shape) * 3).astype(BF16)
    check(layer_for(inputs, (2, 3, 70, 64)), inputs, tactic, 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", NAMES)
@pytest.mark.parametrize("zero", [0, 1])
def test_fully_masked_rows_give_nan_or_zero_like_the_reference(tactic, zero):
    require_sm90()
    inputs = arrays((1, 2, 20, 64), (1, 2, 30, 64), FP16)
    mask = rng.random((1, 2, 20, 30)) > 0.3
    mask[0, 1, 4] = False
    mask[0, 0, 19] = False
    inputs["mask"] = mask
    check(layer_for(inputs, (1, 2, 20, 64), nan_probs_to_zero=zero), inputs, tactic, 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", NAMES)
@pytest.mark.parametrize("head", [64, 128])
def test_reads_and_writes_bshd_layouts(tactic, head):
    require_sm90()
    B, S, H = 3, 100, 4
    inputs = arrays((B, S, H, head), (B, S, H, head), FP16)
    inputs["mask"] = (rng.standard_normal((B, 1, 1, S)) * 2).astype(FP16)
    check(layer_for(inputs, (B, S, H, head), layout="bshd", scale=0.1), inputs, tactic, 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", NAMES)
def test_keys_and_values_shared_by_every_head_and_batch(tactic):
    require_sm90()
    inputs = {"Q": rand((2, 4, 33, 128), FP16), "K": rand((1, 1, 150, 128), FP16), "V": rand((1, 1, 150, 128), FP16)}
    check(layer_for(inputs, (2, 4, 33, 128)), inputs, tactic, 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", NAMES)
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_agrees_with_the_mma_sync_kernel_on_a_bert_shape(tactic, dtype):
    """[8, 12, 128, 64] with a padding mask: within 16-bit rounding of cuda.attention.flash, and
    the same bits on a second run (deterministic)."""
    require_sm90()
    inputs = arrays((8, 12, 128, 64), (8, 12, 128, 64), dtype)
    inputs["mask"] = np.where(np.arange(128)[None, None, None, :] < rng.integers(1, 129, (8, 1, 1, 1)), 0.0,
                              -10000.0).astype(dtype)
    layer = layer_for(inputs, (8, 12, 128, 64))
    ours, theirs = run(layer, inputs, tactic), run(layer, inputs, "cuda.attention.flash")
    assert not np.isnan(ours).any(), f"{tactic}: NaN outputs ({int(np.isnan(ours).sum())})"
    ulp = 2.0 ** (-10 if dtype == FP16 else -7)
    bound = 4 * ulp * np.maximum(np.abs(theirs), 1.0)
    bad = np.abs(ours - theirs) > bound
    assert not bad.any(), (f"{tactic}: {int(bad.sum())} outputs differ from cuda.attention.flash by more than 4 ulp; "
                           f"max difference {np.abs(ours - theirs).max():.3g}")
    assert np.array_equal(run(layer, inputs, tactic), ours), f"{tactic}: a second run gave other bits"


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", NAMES)
@pytest.mark.parametrize("dims,offset", CAUSAL_CASES + [((1, 2, 300, 300), -150)])
@pytest.mark.parametrize("head", [64, 128])
def test_causal_hint_skips_tiles_in_producer_and_consumers_alike(tactic, dims, offset, head):
    """`mask_causal`: the producer loads and the consumers wait for the same, fewer key tiles
    (flash_key_tiles); the result is the mask's (causal and a per-batch key mask). Offset -150: the first
    query block sees no key at all (no tile: the ping-pong consumers take no turn)."""
    require_sm90()
    B, H, S, Skv = dims
    inputs = arrays((B, H, S, head), (B, H, Skv, head), FP16)
    inputs["mask"] = np.where(causal_padding_keep(B, S, Skv, offset, rng), 0.0, -np.inf).astype(np.float16)
    check(layer_for(inputs, (B, H, S, head), mask_causal=offset, nan_probs_to_zero=1), inputs, tactic, TOL[FP16])


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [None, 0, -150])
@pytest.mark.parametrize("head", [64, 128])
def test_the_persistent_grid_runs_several_items_a_block(offset, head):
    """[8, 16, 300, D]: 3 query blocks x 128 heads = 384 items for at most one block an SM, so every block runs
    two or three (the stage ring and the barrier parities carry over from item to item); with the causal hint
    the items need 0 to 3 key tiles (offset -150: the first query block of every head none)."""
    require_sm90()
    shape = next(s for s in SHAPES if s.persistent)
    B, H, S = 8, 16, 300
    inputs = arrays((B, H, S, head), (B, H, S, head), FP16)
    attrs = {}
    if offset is not None:
        inputs["mask"] = np.where(causal_padding_keep(B, S, S, offset, rng), 0.0, -np.inf).astype(np.float16)
        attrs = {"mask_causal": offset, "nan_probs_to_zero": 1}
    check(layer_for(inputs, (B, H, S, head), **attrs), inputs, shape.name, TOL[FP16])
