"""The tensor-core attention tactic (cuda.attention.flash): geometry rules (CPU) and results
against the float64 reference, [B, H, S, D] and [B, S, H, D] layouts, masks, undefined rows (GPU),
for every block shape of its kernel (FLASH_TACTICS: _q128, _kv128 at the head sizes they take)."""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.attention.flash_attention import SHAPES, _supports, head_view, mask_strides

rng = np.random.default_rng(3)
BF16 = np.dtype(ml_dtypes.bfloat16)
LAYOUTS = ("q_layout", "k_layout", "v_layout", "out_layout")
#: the tactics of flash_attention.cu's block shapes -> the head sizes each takes
FLASH_TACTICS = {s.name: s.heads for s in SHAPES}


def tactics_and_heads(heads) -> list[tuple[str, int]]:
    """(tactic, head) for every flash_attention.cu shape and each of `heads` it takes."""
    return [(name, h) for name, takes in FLASH_TACTICS.items() for h in heads if h in takes]


def layer_for(inputs: dict, out_shape, layout="bhsd", **attrs) -> LayerDesc:
    names = tuple(inputs)
    attrs = dict(attrs, **({a: layout for a in LAYOUTS} if layout != "bhsd" else {}))
    q = inputs["Q"]
    return LayerDesc("att", "Attention", names, ("Y",), attrs, domain="ai.polykit",
                     in_dtypes=tuple(np.dtype(a.dtype).name for a in inputs.values()), out_dtypes=(np.dtype(q.dtype).name,),
                     in_shapes=tuple(tuple(a.shape) for a in inputs.values()), out_shapes=(tuple(out_shape),))


# ---- CPU: geometry -----------------------------------------------------------------------

def test_strides_of_both_layouts_and_broadcast_dims():
    assert head_view({"q_layout": "bshd"}, 0, (2, 7, 3, 64)).shape == (2, 3, 7, 64)
    assert head_view({}, 0, (2, 3, 7, 64)).strides == (3 * 7 * 64, 7 * 64, 64)
    assert head_view({"out_layout": "bshd"}, 3, (2, 7, 3, 64)).strides == (7 * 3 * 64, 64, 3 * 64)
    assert head_view({}, 1, (1, 3, 7, 64)).strides[0] == 0
    assert head_view({}, 2, (3, 7, 64)).shape == (1, 3, 7, 64)  # rank 3: batch 1
    assert mask_strides((2, 1, 1, 9)) == (9, 0, 0, 1)
    assert mask_strides((9,)) == (0, 0, 0, 1)


def _arrays(shape_q, shape_kv, dtype):
    return {"Q": rand(shape_q, dtype), "K": rand(shape_kv, dtype), "V": rand(shape_kv, dtype)}


def rand(shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("case,ok", [
    (dict(q=(2, 3, 8, 64), kv=(2, 3, 8, 64), dtype=np.float16), True),
    (dict(q=(2, 3, 8, 128), kv=(2, 3, 8, 128), dtype=BF16), True),
    (dict(q=(2, 3, 8, 32), kv=(2, 3, 8, 32), dtype=np.float16), True),    # Swin's head size
    (dict(q=(2, 3, 8, 48), kv=(2, 3, 8, 48), dtype=np.float16), False),   # head size 48 has no kernel
    (dict(q=(2, 3, 8, 256), kv=(2, 3, 8, 256), dtype=BF16), True),         # key tiles of 32
    (dict(q=(2, 3, 8, 288), kv=(2, 3, 8, 288), dtype=np.float16), False),  # over 256
    (dict(q=(2, 3, 8, 64), kv=(2, 3, 8, 64), dtype=np.float32), False),   # fp32 keeps the simple kernel
    (dict(q=(3, 8, 64), kv=(3, 8, 64), dtype=np.float16), True),
])
def test_supports_fp16_bf16_heads_32_to_256(case, ok):
    inputs = _arrays(case["q"], case["kv"], case["dtype"])
    assert _supports(layer_for(inputs, case["q"])) is ok


# ---- GPU ----------------------------------------------------------------------------------

def reference(layer: LayerDesc, inputs: dict) -> np.ndarray:
    from polykit.compiler.ops.references import run_reference

    node = Node(layer.kind, list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name, layer.domain)
    wide = [a.astype(np.float64) if a.dtype != np.bool_ else a for a in inputs.values()]
    return run_reference(node, wide)[0]


def run_flash(layer, inputs, tactic="cuda.attention.flash"):
    from polykit.runtime.cuda.harness import run_layer

    spec = {"Y": (layer.out_shapes[0], inputs["Q"].dtype)}
    return run_layer(layer, inputs, tactic=tactic, output_specs=spec)["Y"]


def check(layer, inputs, tol, tactic="cuda.attention.flash"):
    out = np.asarray(run_flash(layer, inputs, tactic), np.float64)
    ref = reference(layer, inputs)
    assert out.shape == ref.shape
    assert np.array_equal(np.isnan(out), np.isnan(ref)), "NaN rows differ from the reference"
    ok = ~np.isnan(ref)
    err = np.linalg.norm((out - ref)[ok]) / (np.linalg.norm(ref[ok]) or 1.0)
    assert err <= tol, f"relative error {err:.3g}"


TOL = {np.dtype(np.float16): 3e-3, BF16: 2e-2}
SHAPES = [(1, 1, 1, 1), (2, 3, 5, 5), (2, 2, 64, 64), (1, 4, 77, 77), (2, 12, 128, 128), (1, 2, 200, 70),
          (1, 2, 9, 300)]


@pytest.mark.gpu
@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("tactic,head", tactics_and_heads([32, 64, 128]))
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["fp16", "bf16"])
def test_flash_matches_reference_without_mask(dims, tactic, head, dtype):
    B, H, S, Skv = dims
    inputs = _arrays((B, H, S, head), (B, H, Skv, head), dtype)
    check(layer_for(inputs, (B, H, S, head)), inputs, TOL[dtype], tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("mask_shape,kind", [((2, 1, 1, 90), "add"), ((2, 3, 70, 90), "add"), ((2, 1, 70, 90), "bool"),
                                             ((90,), "add")])
@pytest.mark.parametrize("tactic", FLASH_TACTICS)
def test_flash_with_additive_and_bool_masks(mask_shape, kind, tactic):
    inputs = _arrays((2, 3, 70, 64), (2, 3, 90, 64), np.float16)
    if kind == "add":
        inputs["mask"] = (rng.standard_normal(mask_shape) * 3).astype(np.float16)
    else:
        inputs["mask"] = rng.random(mask_shape) > 0.4
    check(layer_for(inputs, (2, 3, 70, 64)), inputs, 3e-3, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(2, 3, 5, 5), (1, 2, 130, 77)], ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("head", [96, 160, 192, 224, 256])
def test_flash_heads_between_64_and_256_with_a_mask(dims, head):
    # 8k + 4 chunks a row (96, 160, 224) swizzle by row pair; over 128, key tiles of 32
    B, H, S, Skv = dims
    inputs = _arrays((B, H, S, head), (B, H, Skv, head), np.float16)
    inputs["mask"] = (rng.standard_normal((1, H, S, Skv)) * 3).astype(np.float16)
    check(layer_for(inputs, (B, H, S, head)), inputs, 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["add", "bool"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("tactic", FLASH_TACTICS)
def test_windows_as_heads_with_a_mask_shared_by_the_batch_head_32(kind, layout, tactic):
    # Swin's shifted windows after recognize_attention: [B, W*H, 49, 32], one [1, W*H, 49, 49] mask
    B, WH, N, D = 2, 12, 49, 32
    inputs = _arrays((B, WH, N, D), (B, WH, N, D), np.float16)
    if kind == "add":
        inputs["mask"] = np.where(rng.random((1, WH, N, N)) > 0.3, rng.standard_normal((1, WH, N, N)),
                                  -100.0).astype(np.float16)
    else:
        inputs["mask"] = rng.random((1, WH, N, N)) > 0.3
        inputs["mask"][..., 0] = True  # no empty row
    if layout == "bshd":
        for name in ("Q", "K", "V"):
            inputs[name] = np.ascontiguousarray(inputs[name].transpose(0, 2, 1, 3))
    check(layer_for(inputs, (B, WH, N, D) if layout == "bhsd" else (B, N, WH, D), layout), inputs, 3e-3, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("tactic", FLASH_TACTICS)
def test_fully_masked_rows_give_nan_or_zero_like_the_reference(zero, tactic):
    inputs = _arrays((1, 2, 20, 64), (1, 2, 30, 64), np.float16)
    mask = rng.random((1, 2, 20, 30)) > 0.3
    mask[0, 1, 4] = False
    mask[0, 0, 19] = False
    inputs["mask"] = mask
    check(layer_for(inputs, (1, 2, 20, 64), nan_probs_to_zero=zero), inputs, 3e-3, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic,head", tactics_and_heads([64, 128]))
def test_flash_reads_and_writes_bshd_layouts(tactic, head):
    B, S, H = 3, 100, 4
    inputs = _arrays((B, S, H, head), (B, S, H, head), np.float16)
    inputs["mask"] = (rng.standard_normal((B, 1, 1, S)) * 2).astype(np.float16)
    check(layer_for(inputs, (B, S, H, head), layout="bshd", scale=0.1), inputs, 3e-3, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", FLASH_TACTICS)
def test_keys_and_values_shared_by_every_head_broadcast(tactic):
    inputs = {"Q": rand((2, 4, 33, 64), np.float16), "K": rand((2, 1, 50, 64), np.float16),
              "V": rand((2, 1, 50, 64), np.float16)}
    check(layer_for(inputs, (2, 4, 33, 64)), inputs, 3e-3, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fp32_and_fp64_attention_with_bshd_layouts_relays_through_the_workspace(dtype):
    from polykit.runtime.cuda.harness import run_layer

    B, S, H, D = 2, 37, 3, 16
    inputs = _arrays((B, S, H, D), (B, S, H, D), dtype)
    inputs["mask"] = (rng.standard_normal((B, 1, 1, S)) * 2).astype(dtype)
    layer = layer_for(inputs, (B, S, H, D), layout="bshd", scale=0.3)
    out = run_layer(layer, inputs, tactic="cuda.attention.simple", output_specs={"Y": ((B, S, H, D), np.dtype(dtype))})["Y"]
    np.testing.assert_allclose(out, reference(layer, inputs), rtol=1e-5, atol=1e-5)


def causal_padding_keep(B: int, S: int, Skv: int, offset: int, gen) -> np.ndarray:
    """[B, 1, S, Skv] keep-mask as GPT-2's export computes it: key k visible from query q when k <= q + offset,
    and-ed with a random per-batch key mask (the padding)."""
    causal = np.arange(Skv)[None, :] <= np.arange(S)[:, None] + offset
    return causal[None, None] & (gen.random((B, 1, 1, Skv)) > 0.2)


CAUSAL_CASES = [((2, 3, 200, 200), 0), ((1, 2, 150, 270), 120), ((1, 2, 130, 130), -70)]


@pytest.mark.gpu
@pytest.mark.parametrize("dims,offset", CAUSAL_CASES)
@pytest.mark.parametrize("kind", ["bool", "add"])
@pytest.mark.parametrize("tactic", FLASH_TACTICS)
def test_causal_hint_skips_tiles_and_keeps_the_masks_result(dims, offset, kind, tactic):
    """`mask_causal` (mark_causal_masks): key tiles past each block's diagonal skipped, the mask (causal and a
    per-batch key mask, GPT-2's form) applied elsewhere; rows without a key give 0 like the reference."""
    B, H, S, Skv = dims
    inputs = _arrays((B, H, S, 64), (B, H, Skv, 64), np.float16)
    keep = causal_padding_keep(B, S, Skv, offset, rng)
    inputs["mask"] = keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float16)
    check(layer_for(inputs, (B, H, S, 64), mask_causal=offset, nan_probs_to_zero=1), inputs, 3e-3, tactic)
