"""flash_attention.cu (mma.sync m16n8k16, ldmatrix .x4 / .trans, cp.async double buffers, quad
shuffles) emulated on the host (no GPU): the tactics' own enqueue launches the kernel source
compiled by g++, every thread of a block a real thread, the warp-level PTX a rendezvous of the
warp's threads (block_emulation.py, warp_emulation.py); outputs poisoned (NaN), against the
float64 reference. A sample of test_flash_attention.py's GPU cases: each tactic's block shape,
float16 and bfloat16, odd query and key lengths (partial tiles), several key tiles, additive and
bool masks, fully masked rows."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic
from tests.kernels.cuda.test_flash_attention import BF16, TOL, _arrays, causal_padding_keep, layer_for, reference

F16 = np.dtype(np.float16)
rng = np.random.default_rng(53)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    from tests.kernels.cuda.block_emulation import host_launcher, kernel_signature

    return host_launcher(tmp_path_factory, *kernel_signature("flash_attention.cu", "flash_attention"))


def run_emulated(launcher, layer, inputs, tactic) -> np.ndarray:
    y = np.full(layer.out_shapes[0], np.nan, inputs["Q"].dtype)
    tensors = {name: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for name, a in inputs.items()}
    tensors["Y"] = DeviceTensor(y.ctypes.data, y.shape, y.dtype)
    find_tactic("cuda", "Attention", tactic).enqueue(layer, launcher, tensors)
    return y.astype(np.float64)


def error(out: np.ndarray, ref: np.ndarray) -> float:
    """Relative error where the reference is defined; NaN rows must be the reference's."""
    assert np.array_equal(np.isnan(out), np.isnan(ref)), "NaN rows differ from the reference"
    ok = ~np.isnan(ref)
    return float(np.linalg.norm((out - ref)[ok]) / (np.linalg.norm(ref[ok]) or 1.0))


@pytest.mark.parametrize("tactic,dims,head,dtype", [
    ("cuda.attention.flash", (1, 2, 77, 77), 64, F16),         # partial query and key tiles
    ("cuda.attention.flash", (1, 1, 70, 200), 128, BF16),      # several key tiles, head 128
    ("cuda.attention.flash_q128", (2, 1, 130, 40), 32, F16),   # 128-row query blocks
    ("cuda.attention.flash_kv128", (1, 2, 9, 300), 64, BF16),  # 128-key tiles
])
def test_emulated_flash_matches_the_reference(launcher, tactic, dims, head, dtype):
    B, H, S, Skv = dims
    inputs = _arrays((B, H, S, head), (B, H, Skv, head), dtype)
    layer = layer_for(inputs, (B, H, S, head))
    assert error(run_emulated(launcher, layer, inputs, tactic), reference(layer, inputs)) <= TOL[dtype]


@pytest.mark.parametrize("mask_shape,kind,skv", [
    ((2, 1, 1, 90), "add", 90), ((2, 1, 70, 90), "bool", 90),
    # flash_mask_pass's other paths: odd row strides (one element at a time), a mask constant
    # along keys (key stride 0), a key count whose last pair crosses Skv (bool and additive pairs)
    ((1, 2, 70, 91), "add", 91), ((2, 2, 70, 91), "bool", 91), ((2, 2, 70, 1), "add", 90), ((2, 1, 1, 89), "bool", 89),
    ((2, 1, 1, 89), "add", 89),
])
def test_emulated_flash_with_additive_and_bool_masks(launcher, mask_shape, kind, skv):
    assert masked_error(launcher, "cuda.attention.flash", mask_shape, kind, skv) <= TOL[F16]


@pytest.mark.parametrize("tactic", ["cuda.attention.flash_q128", "cuda.attention.flash_kv128"])
@pytest.mark.parametrize("mask_shape,kind,skv", [((1, 2, 70, 91), "add", 91), ((2, 1, 70, 90), "bool", 90)])
def test_emulated_larger_tiles_apply_the_mask_a_row_at_a_time(launcher, tactic, mask_shape, kind, skv):
    # two m-tiles a warp and 128-key tiles take the mask pass's rows in a loop (FLASH_MASK_ROW_UNROLL 1)
    assert masked_error(launcher, tactic, mask_shape, kind, skv) <= TOL[F16]


def masked_error(launcher, tactic, mask_shape, kind, skv) -> float:
    inputs = _arrays((2, 2, 70, 64), (2, 2, skv, 64), F16)
    if kind == "add":
        inputs["mask"] = (rng.standard_normal(mask_shape) * 3).astype(np.float16)
    else:
        inputs["mask"] = rng.random(mask_shape) > 0.4
    layer = layer_for(inputs, (2, 2, 70, 64))
    return error(run_emulated(launcher, layer, inputs, tactic), reference(layer, inputs))


def test_emulated_fully_masked_rows_give_nan_like_the_reference(launcher):
    inputs = _arrays((1, 2, 20, 64), (1, 2, 30, 64), F16)
    mask = rng.random((1, 2, 20, 30)) > 0.3
    mask[0, 1, 4] = False
    mask[0, 0, 19] = False
    inputs["mask"] = mask
    layer = layer_for(inputs, (1, 2, 20, 64))
    ref = reference(layer, inputs)
    assert np.isnan(ref[0, 1, 4]).all() and error(run_emulated(launcher, layer, inputs, "cuda.attention.flash"),
                                                  ref) <= TOL[F16]


@pytest.mark.parametrize("tactic,to_zero", [("cuda.attention.flash", 0), ("cuda.attention.flash_kv128", 0),
                                             ("cuda.attention.flash", 1)])
def test_emulated_nan_and_inf_scores_give_nan_rows_like_the_reference(launcher, tactic, to_zero):
    """A NaN or +inf score makes its row's softmax NaN without a test of its own (flash_common.cuh:
    the probability exp2(x - m) is NaN, and so the row's sum): rows with a NaN query element, an
    infinite one (scores of +inf and -inf), and a NaN additive mask entry give NaN, or 0 with
    nan_probs_to_zero (the row is found undefined, not only NaN through its sums); the others match."""
    inputs = _arrays((1, 2, 70, 64), (1, 2, 150, 64), F16)
    inputs["Q"][0, 0, 3, 5] = np.nan
    inputs["Q"][0, 1, 40, 0] = np.inf
    mask = (rng.standard_normal((1, 2, 70, 150)) * 2).astype(np.float16)
    mask[0, 1, 66, 149] = np.nan  # in the last, partial key tile
    inputs["mask"] = mask
    layer = layer_for(inputs, (1, 2, 70, 64), **({"nan_probs_to_zero": 1} if to_zero else {}))
    ref = reference(layer, inputs)
    bad = ref[0, 0, 3], ref[0, 1, 40], ref[0, 1, 66]
    assert all((row == 0).all() if to_zero else np.isnan(row).all() for row in bad)
    assert error(run_emulated(launcher, layer, inputs, tactic), ref) <= TOL[F16]


@pytest.mark.parametrize("tactic,dims,offset,kind", [
    ("cuda.attention.flash", (2, 2, 200, 200), 0, "bool"),            # GPT-2's: square, 4 query blocks
    ("cuda.attention.flash_kv128", (1, 2, 150, 270), 120, "add"),     # keys ahead of the queries (a cache)
    ("cuda.attention.flash", (1, 1, 130, 130), -70, "bool"),          # rows with no key: undefined, like the mask's
])
def test_emulated_causal_hint_skips_key_tiles_with_the_masks_result(launcher, tactic, dims, offset, kind):
    """With `mask_causal` set, the kernel skips the key tiles past each block's diagonal (flash_key_tiles)
    and still applies the mask elsewhere: the result is the mask's, padding keys and fully masked rows
    included (a causal mask and-ed with a per-batch key mask, as GPT-2's export computes it)."""
    B, H, S, Skv = dims
    inputs = _arrays((B, H, S, 64), (B, H, Skv, 64), F16)
    keep = causal_padding_keep(B, S, Skv, offset, rng)
    inputs["mask"] = keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float16)
    layer = layer_for(inputs, (B, H, S, 64), mask_causal=offset, nan_probs_to_zero=1)
    assert error(run_emulated(launcher, layer, inputs, tactic), reference(layer, inputs)) <= TOL[F16]


def test_emulated_causal_hint_really_skips_the_tiles(launcher):
    """The hint is taken at its word: over an all-true mask it gives causal attention (the tiles past the
    diagonal are not read), which the reference of the mask itself does not."""
    inputs = _arrays((1, 1, 192, 64), (1, 1, 192, 64), F16)
    inputs["mask"] = np.ones((1, 1, 192, 192), np.bool_)
    hinted = run_emulated(launcher, layer_for(inputs, (1, 1, 192, 64), mask_causal=0), inputs, "cuda.attention.flash")
    full = reference(layer_for(inputs, (1, 1, 192, 64)), inputs)
    # rows 0..63 read one key tile of 64 (keys 0..63, all of them: the mask is all true), not 0..191
    assert error(hinted[:, :, :64], full[:, :, :64]) > 10 * TOL[F16]
    assert error(hinted[:, :, 128:], full[:, :, 128:]) <= TOL[F16]  # the last block reads every tile
    first_tile = dict(inputs, mask=np.broadcast_to(np.arange(192) < 64, (1, 1, 192, 192)).copy())
    ref_tile = reference(layer_for(first_tile, (1, 1, 192, 64)), first_tile)
    assert error(hinted[:, :, :64], ref_tile[:, :, :64]) <= TOL[F16]
