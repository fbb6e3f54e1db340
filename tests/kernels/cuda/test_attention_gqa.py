"""Grouped- and multi-query Attention (`kv_groups` g: K and V hold H / g heads, query head h reads
key/value head h // g) on every cuda tactic of the fused Attention. CPU: the launch arguments each
tactic derives, checked by emulating the kernels' index math on the host against the reference's
repeat of the heads (the flash kernels' h / kv_groups over their strides, the sm90 kernel's TMA maps
of the un-repeated K and V, the simple kernels' split batch dims); GPU: every tactic against the
reference on random data, odd lengths, causal and additive masks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.ops.nn.fused import OperandView, dense_strides
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.attention import attention as simple
from polykit.kernels.cuda.attention import flash_attention_f32
from polykit.kernels.cuda.attention.flash_attention import NO_CAUSAL, OUTER_ARGS, _supports, flash_geometry, flash_launch
from polykit.kernels.cuda.attention.flash_attention_sm90 import SHAPES, _enqueue
from polykit.kernels.cuda.attention.flash_attention_sm90 import _supports as sm90_supports
from polykit.kernels.cuda.base import DeviceTensor
from tests.kernels.cuda.recording_launcher import RecordingLauncher
from tests.kernels.cuda.test_attention_views import BF16, FP16, SM90_TACTICS, check, mask_input, rand
from tests.kernels.cuda.test_flash_attention import FLASH_TACTICS

FP32 = np.dtype(np.float32)
#: kv_groups: the flash launch argument before the causal offset and the trailing outer-batch ones
KV_GROUPS_ARG = -2 - OUTER_ARGS


def gqa_layer(B, S, Hq, Hkv, D, dtype, mask=None, k_layout="bhsd", Skv=None, **attrs) -> LayerDesc:
    """Q [B, Hq, S, D], K and V [B, Hkv, Skv, D] (stored [B, Skv, Hkv, D] for k_layout "bshd"),
    kv_groups Hq // Hkv."""
    Skv = Skv or S
    kv = (B, Skv, Hkv, D) if k_layout == "bshd" else (B, Hkv, Skv, D)
    attrs = dict(attrs, kv_groups=Hq // Hkv)
    if k_layout == "bshd":
        attrs.update(k_layout="bshd", v_layout="bshd")
    names, dtypes, shapes = ["Q", "K", "V"], [np.dtype(dtype).name] * 3, [(B, Hq, S, D), kv, kv]
    if mask is not None:
        names.append("mask")
        dtypes.append(np.dtype(mask.dtype).name)
        shapes.append(tuple(mask.shape))
    return LayerDesc("att", "Attention", tuple(names), ("Y",), attrs, domain="ai.polykit", in_dtypes=tuple(dtypes),
                     out_dtypes=(np.dtype(dtype).name,), in_shapes=tuple(shapes), out_shapes=((B, Hq, S, D),))


def _tensors(layer: LayerDesc, dtype) -> dict[str, DeviceTensor]:
    out, ptr = {}, 1 << 20
    for name, shape in [*zip(layer.inputs, layer.in_shapes), ("Y", layer.out_shapes[0])]:
        out[name] = DeviceTensor(ptr, shape, np.dtype(dtype) if name != "mask" else np.dtype(np.bool_))
        ptr += 1 << 24
    return out


# ---- CPU: geometry and launch arguments --------------------------------------------------------

@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("B,S,Hq,Hkv,D", [(1, 128, 12, 4, 64), (2, 13, 8, 1, 128), (3, 77, 6, 2, 32), (1, 9, 4, 4, 64)])
def test_flash_launch_reads_key_value_head_h_over_g(layout, B, S, Hq, Hkv, D):
    """Emulate the flash kernels' K and V addressing (pointer + b kb + (h / kv_groups) kh + s ks + d)
    over K's elements: it must read the reference's K repeated g times along the heads."""
    layer = gqa_layer(B, S, Hq, Hkv, D, FP16, k_layout=layout)
    assert _supports(layer) and flash_geometry(layer) == ("float16", D)
    tensors = _tensors(layer, FP16)
    run = flash_launch(layer, tensors)
    g = int(run.args[KV_GROUPS_ARG])
    assert g == Hq // Hkv and run.grid == (-(-S // 64), Hq, B)
    stored = np.arange(B * Hkv * S * D, dtype=np.int64).reshape(tensors["K"].shape)
    logical = np.swapaxes(stored, 1, 2) if layout == "bshd" else stored
    want = np.repeat(logical, g, axis=1)
    b, h, s, d = np.meshgrid(*(np.arange(n) for n in (B, Hq, S, D)), indexing="ij")
    for i in (1, 2):
        assert run.args[i].ptr == tensors["KV"[i - 1]].ptr  # no offset: whole tensors
        kb, kh, ks = (int(x) for x in run.args[7 + 3 * i: 10 + 3 * i])
        np.testing.assert_array_equal(stored.reshape(-1)[b * kb + (h // g) * kh + s * ks + d], want)
    assert tuple(int(x) for x in run.args[16:19]) == dense_strides((B, Hq, S, D))[:3]  # O: Q's heads


def test_flash_reads_grouped_heads_of_a_packed_projection():
    """Q, K, V as views of one [B, S, (Hq + 2 Hkv) D] projection (fused qkv of Phi-3 style models)."""
    B, S, Hq, Hkv, D = 2, 21, 8, 2, 64
    width = (Hq + 2 * Hkv) * D
    views = [OperandView(0, (B, Hq, S, D), (S * width, D, width, 1)),
             OperandView(Hq * D, (B, Hkv, S, D), (S * width, D, width, 1)),
             OperandView((Hq + Hkv) * D, (B, Hkv, S, D), (S * width, D, width, 1))]
    attrs = {a: v.encode() for a, v in zip(("q_view", "k_view", "v_view"), views)}
    layer = LayerDesc("att", "Attention", ("P", "P", "P"), ("Y",), dict(attrs, kv_groups=4), domain="ai.polykit",
                      in_dtypes=("float16",) * 3, out_dtypes=("float16",), in_shapes=((B, S, width),) * 3,
                      out_shapes=((B, Hq, S, D),))
    assert _supports(layer) and sm90_supports(layer)
    run = flash_launch(layer, {"P": DeviceTensor(1 << 20, (B, S, width), FP16),
                               "Y": DeviceTensor(1 << 30, (B, Hq, S, D), FP16)})
    packed = np.arange(B * S * width, dtype=np.int64)
    b, h, s, d = np.meshgrid(*(np.arange(n) for n in (B, Hq, S, D)), indexing="ij")
    for i, first in ((1, Hq), (2, Hq + Hkv)):
        kb, kh, ks = (int(x) for x in run.args[7 + 3 * i: 10 + 3 * i])
        base = (run.args[i].ptr - (1 << 20)) // 2
        got = packed[base + b * kb + (h // int(run.args[KV_GROUPS_ARG])) * kh + s * ks + d]
        heads = np.moveaxis(packed.reshape(B, S, Hq + 2 * Hkv, D), 2, 1)  # [B, heads, S, D]
        np.testing.assert_array_equal(got, np.repeat(heads[:, first:first + Hkv], 4, axis=1))


def test_heads_that_do_not_group_are_refused():
    layer = gqa_layer(1, 16, 12, 4, 64, FP16)
    assert _supports(replace(layer, attrs=dict(layer.attrs, kv_groups=3)))
    for g in (2, 6, 0):
        bad = replace(layer, attrs=dict(layer.attrs, kv_groups=g))
        assert not _supports(bad) and not sm90_supports(bad)


def test_sm90_maps_the_un_repeated_key_values_and_passes_kv_groups_before_geo():
    B, S, Hq, Hkv, D = 2, 77, 12, 4, 128
    layer = gqa_layer(B, S, Hq, Hkv, D, BF16)
    assert sm90_supports(layer)
    rec = RecordingLauncher()
    _enqueue(SHAPES[0])(layer, rec, _tensors(layer, BF16))
    ((name, args),) = rec.launches
    tm_q, tm_k, tm_v = args[:3]
    assert name == "flash_attention_sm90" and tm_q.dims == (D, S, Hq, B) and tm_k.dims == tm_v.dims == (D, S, Hkv, B)
    assert int(args[-3]) == Hq // Hkv and int(args[-2]) == NO_CAUSAL  # kv_groups, the causal offset, then geo
    assert int(args[-1]) == 0  # [B, H, S, D] everywhere, batch and heads not broadcast


def test_fp32_flash_takes_grouped_heads_and_passes_kv_groups_before_the_outer_batch_args():
    layer = replace(gqa_layer(1, 40, 8, 2, 64, FP32), precision="fp32")
    supports, _, enqueue = flash_attention_f32._variant("fp32", 3)
    assert supports(layer)
    rec = RecordingLauncher()
    enqueue(layer, rec, _tensors(layer, FP32))
    ((name, args),) = rec.launches
    assert name == "flash_attention_f32" and int(args[KV_GROUPS_ARG]) == 4


@pytest.mark.parametrize("dtype", [FP16, FP32])
@pytest.mark.parametrize("B,S,Hq,Hkv,mask", [(2, 13, 12, 4, "head"), (1, 77, 8, 1, "query"), (3, 5, 6, 3, None)])
def test_simple_kernels_meet_key_value_head_h_over_g_through_split_batch_dims(dtype, B, S, Hq, Hkv, mask):
    """Emulate the simple kernels' batch walk (flat batch -> dims innermost last -> per-tensor
    strides): batch (b, h) must read Q and the mask at (b, h), K and V at (b, h // g)."""
    D = 32
    m = None if mask is None else np.zeros((B, Hq, S, S) if mask == "head" else (S, S), np.bool_)
    layer = gqa_layer(B, S, Hq, Hkv, D, dtype, mask=m)
    rec = RecordingLauncher()
    simple.enqueue_relaid(layer, rec, _tensors(layer, dtype))
    ((name, args),) = rec.launches
    assert name.startswith("attention_tiled_")
    nb, nbd = int(args[5]), int(args[6])
    dims = [int(x) for x in args[7:7 + nbd]]
    strides = [[int(x) for x in args[15 + 8 * t: 15 + 8 * t + nbd]] for t in range(4)]  # q, k, v, mask
    assert nb == B * Hq
    g = Hq // Hkv
    for n in range(nb):
        r, offs = n, [0, 0, 0, 0]
        for d in range(nbd - 1, -1, -1):
            c, r = r % dims[d], r // dims[d]
            offs = [o + c * st[d] for o, st in zip(offs, strides)]
        b, h = divmod(n, Hq)
        assert offs[0] == (b * Hq + h) * S * D
        assert offs[1] == offs[2] == (b * Hkv + h // g) * S * D
        if mask == "head":
            assert offs[3] == (b * Hq + h) * S * S
        elif mask == "query":
            assert offs[3] == 0


# ---- GPU: every tactic against the reference ------------------------------------------------------

def _case(B, S, Hq, Hkv, D, dtype, mask, layout="bhsd"):
    kv = (B, S, Hkv, D) if layout == "bshd" else (B, Hkv, S, D)
    inputs = {"Q": rand((B, Hq, S, D), dtype), "K": rand(kv, dtype), "V": rand(kv, dtype)}
    m = mask_input(mask, B, S, dtype)
    if m is not None:
        inputs["mask"] = m
    return gqa_layer(B, S, Hq, Hkv, D, dtype, mask=m, k_layout=layout, scale=D ** -0.5), inputs


GPU_CASES = [(1, 128, 12, 4, 64), (2, 13, 8, 1, 128), (2, 77, 6, 2, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("mask", [None, "causal", "additive"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("tactic,B,S,Hq,Hkv,D", [(t, *c) for t, heads in FLASH_TACTICS.items()
                                                  for c in GPU_CASES + [(1, 33, 4, 2, 32)] if c[-1] in heads])
def test_flash_grouped_heads(mask, layout, tactic, B, S, Hq, Hkv, D):
    layer, inputs = _case(B, S, Hq, Hkv, D, FP16, mask, layout)
    check(layer, inputs, tactic, FP16, 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", [None, "causal"])
@pytest.mark.parametrize("B,S,Hq,Hkv,D", GPU_CASES)
@pytest.mark.parametrize("tactic", SM90_TACTICS)
def test_flash_sm90_grouped_heads(mask, B, S, Hq, Hkv, D, tactic):
    from polykit.runtime.cuda import driver

    if driver.current_device().arch != "sm_90":
        pytest.skip("needs compute capability 9.0")
    layer, inputs = _case(B, S, Hq, Hkv, D, BF16, mask)
    check(layer, inputs, tactic, BF16, 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", ["cuda.attention.flash_f32", "cuda.attention.simple"])
@pytest.mark.parametrize("B,S,Hq,Hkv,D", [(2, 37, 8, 2, 64), (1, 13, 6, 1, 128)])
def test_fp32_tactics_grouped_heads(tactic, B, S, Hq, Hkv, D):
    layer, inputs = _case(B, S, Hq, Hkv, D, FP32, "additive")
    check(replace(layer, precision="fp32"), inputs, tactic, FP32, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_simple_fp16_grouped_heads_through_views(layout):
    layer, inputs = _case(2, 19, 12, 4, 160, FP16, "causal", layout)  # head 160: the untiled kernel
    check(layer, inputs, "cuda.attention.simple", FP16, 3e-3)
