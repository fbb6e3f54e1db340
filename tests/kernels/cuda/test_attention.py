"""ai.polykit Attention on the GPU against the reference (masks additive and boolean, broadcast batches)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc

rng = np.random.default_rng(23)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def attn(ins, attrs=None, precision="fp32"):
    return LayerDesc("att", "Attention", tuple(ins), ("Y",), dict(attrs or {}), domain="ai.polykit", precision=precision)


def check(lay, feeds, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, **tol)


def test_attention_tactic_is_registered_for_the_polykit_domain():
    from polykit.kernels.tactics import candidates

    assert [t.name for t in candidates("cuda", "Attention", attn("QKV"))] == ["cuda.attention.simple"]


@pytest.mark.gpu
@pytest.mark.parametrize("q,k,v", [((5, 8), (7, 8), (7, 3)), ((2, 12, 128, 64), (2, 12, 128, 64), (2, 12, 128, 64)),
                                   ((3, 1, 4, 16), (1, 2, 9, 16), (1, 2, 9, 5)), ((1, 1, 1), (1, 1, 1), (1, 1, 1))])
def test_attention_without_mask(q, k, v):
    check(attn("QKV"), {"Q": rand(*q), "K": rand(*k), "V": rand(*v)}, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_attention_with_additive_broadcast_mask_and_scale():
    mask = np.where(rng.random((2, 1, 1, 33)) > 0.3, 0.0, -10000.0).astype(np.float32)
    feeds = {"Q": rand(2, 4, 17, 32), "K": rand(2, 4, 33, 32), "V": rand(2, 4, 33, 32), "M": mask}
    check(attn("QKVM", {"scale": 0.3}), feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_attention_with_boolean_keep_mask():
    keep = rng.random((6, 9)) > 0.3
    keep[:, 0] = True
    feeds = {"Q": rand(2, 6, 8), "K": rand(2, 9, 8), "V": rand(2, 9, 4), "M": keep}
    check(attn("QKVM"), feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_attention_fp16_storage():
    feeds = {"Q": rand(2, 3, 20, 64, dtype=np.float16), "K": rand(2, 3, 20, 64, dtype=np.float16),
             "V": rand(2, 3, 20, 64, dtype=np.float16)}
    check(attn("QKV", precision="fp16"), feeds, rtol=5e-3, atol=5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("q,k,v", [((5, 8), (7, 8), (7, 3)), ((2, 3, 33, 16), (2, 3, 65, 16), (2, 3, 65, 9)),
                                   ((1, 1, 1), (1, 1, 1), (1, 1, 1))])
def test_attention_float64_computes_in_double(q, k, v):
    feeds = {"Q": rand(*q, dtype=np.float64), "K": rand(*k, dtype=np.float64), "V": rand(*v, dtype=np.float64)}
    check(attn("QKV", {"scale": 0.37}), feeds, rtol=1e-12, atol=1e-13)


@pytest.mark.gpu
def test_attention_float64_with_additive_and_boolean_masks():
    add = rng.uniform(-3, 0, (1, 6, 9))
    keep = rng.random((6, 9)) > 0.3
    keep[:, 0] = True
    base = {"Q": rand(2, 6, 8, dtype=np.float64), "K": rand(2, 9, 8, dtype=np.float64),
            "V": rand(2, 9, 4, dtype=np.float64)}
    check(attn("QKVM"), {**base, "M": add}, rtol=1e-12, atol=1e-13)
    check(attn("QKVM"), {**base, "M": keep}, rtol=1e-12, atol=1e-13)


def test_float64_attention_launches_the_double_kernel_with_a_double_scale_and_wide_shared_memory():
    from polykit.kernels.cuda.attention.attention import enqueue_attention
    from polykit.kernels.cuda.base import DeviceTensor

    launches = []

    class Recorder:
        def launch(self, kernel, grid, block, args, shared_mem=0):
            launches.append((kernel.name, args, shared_mem))

    t = {n: DeviceTensor(4096, s, np.dtype(np.float64)) for n, s in
         (("Q", (2, 8, 16)), ("K", (2, 6, 16)), ("V", (2, 6, 5)), ("Y", (2, 8, 5)))}
    enqueue_attention(attn("QKV", {"scale": 0.5}), Recorder(), t)
    ((name, args, shared),) = launches
    assert name == "attention_f64" and shared == 8 * (16 + 6)
    assert args[-2] == 0.5 and args[-2].dtype == np.float64


# ---- the tiled kernel (float/half, D and Dv <= 128) and its fallback to the simple one ----------

@pytest.mark.gpu
@pytest.mark.parametrize("q,k,v", [((2, 3, 37, 64), (2, 3, 70, 64), (2, 3, 70, 48)),   # ragged query and key tiles
                                   ((1, 2, 16, 128), (1, 2, 32, 128), (1, 2, 32, 128)),  # largest tiled head
                                   ((2, 5, 160), (2, 9, 160), (2, 9, 130))])              # wider: simple kernel
def test_attention_tiles_and_fallback_match_reference(q, k, v):
    mask = rng.uniform(-4, 0, (q[-2], k[-2])).astype(np.float32)
    check(attn("QKVM", {"scale": 0.2}), {"Q": rand(*q), "K": rand(*k), "V": rand(*v), "M": mask}, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("nan_to_zero", [0, 1])
def test_fully_masked_rows_are_nan_or_zero_like_the_reference(dtype, nan_to_zero):
    keep = rng.random((40, 45)) > 0.4
    keep[:, 0] = True
    keep[[3, 17, 39]] = False  # rows with no key at all: softmax of all -inf
    feeds = {"Q": rand(2, 40, 32, dtype=dtype), "K": rand(2, 45, 32, dtype=dtype), "V": rand(2, 45, 20, dtype=dtype),
             "M": keep}
    tol = {"rtol": 5e-3, "atol": 5e-3} if dtype == np.float16 else {"rtol": 1e-4, "atol": 1e-5}
    got = check(attn("QKVM", {"nan_probs_to_zero": nan_to_zero}, precision="fp16" if dtype == np.float16 else "fp32"),
                feeds, **tol)["Y"]
    assert np.isnan(got[:, [3, 17, 39]]).all() != bool(nan_to_zero)
    assert not np.isnan(np.delete(got, [3, 17, 39], axis=1)).any()


def test_float_attention_with_small_heads_launches_the_tiled_kernel():
    from polykit.kernels.cuda.attention.attention import enqueue_attention
    from polykit.kernels.cuda.base import DeviceTensor

    launches = []

    class Recorder:
        def launch(self, kernel, grid, block, args, shared_mem=0):
            launches.append((kernel.name, tuple(grid), tuple(block), shared_mem))

    for d, dv in ((64, 64), (160, 64), (96, 64)):
        t = {n: DeviceTensor(4096, s, np.dtype(np.float16)) for n, s in
             (("Q", (3, 37, d)), ("K", (3, 50, d)), ("V", (3, 50, dv)), ("Y", (3, 37, dv)))}
        enqueue_attention(attn("QKV"), Recorder(), t)
    # heads of 64 (and 128) have their size compiled in; other sizes <= 128 take it at run time
    assert launches[0] == ("attention_tiled_f16_h64", (3 * 3, 1, 1), (128, 1, 1), 4 * (16 * 64 + 32 * 65 + 32 * 64))
    assert launches[1][0] == "attention_f16"
    assert launches[2][0] == "attention_tiled_f16"
