"""Rank-5 (windowed) attention on the flash kernels: Q, K, V views [B, W, H, N, D] of one packed
projection [B*W, N, 3*H*D], a mask [1, W, H, N, N] broadcast over the batch, the output written
"bshd" ([B, W, N, H, D], the out-projection's rows). The grid's z runs over B * W and the kernels
split it into an outer index (its own strides, the launch's trailing arguments) and an inner one.
CPU: the flash kernels' index math emulated over the packed array, mask and output; GPU: every
tactic against the reference."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.fused import OperandView, dense_strides
from polykit.compiler.ops.nn.fused_reference import _from_layout, _operand
from polykit.kernels.cuda.attention.flash_attention import (OUTER_ARGS, _supports, flash_geometry, flash_launch,
                                                            split_batch)
from polykit.kernels.cuda.attention.flash_attention_sm90 import _supports as sm90_supports
from polykit.kernels.cuda.base import DeviceTensor

from tests.kernels.cuda.test_attention_views import FP16, check, rand, view_layer
from tests.kernels.cuda.test_flash_attention import FLASH_TACTICS

rng = np.random.default_rng(23)


def window_views(B: int, W: int, N: int, H: int, D: int):
    """(packed shape, q/k/v views): [B*W, N, 3, H, D] read as [B, W, H, N, D]."""
    E = H * D
    shape = (B * W, N, 3 * E)
    return shape, [OperandView(i * E, (B, W, H, N, D), (W * N * 3 * E, N * 3 * E, D, 3 * E, 1)) for i in range(3)]


def window_layer(B, W, N, H, D, dtype, mask_dtype=None):
    shape, views = window_views(B, W, N, H, D)
    mask = None
    if mask_dtype is not None:
        mask = (rng.random((1, W, H, N, N)) > 0.3) if mask_dtype == np.bool_ else \
            np.where(rng.random((1, W, H, N, N)) > 0.3, 0.0, -100.0) + rng.standard_normal((1, W, H, N, N))
        mask = mask.astype(mask_dtype)
        mask[..., 0] = True if mask_dtype == np.bool_ else 0.0  # no row fully masked
    layer = view_layer(shape, views, dtype, (B, W, N, H, D), mask=mask, out_layout="bshd", scale=D ** -0.5)
    inputs = {"QKV": rand(shape, dtype)}
    if mask is not None:
        inputs["mask"] = mask
    return layer, inputs


@pytest.mark.parametrize("B, W, N, H, D", [(2, 3, 49, 3, 32), (3, 5, 13, 2, 64), (1, 4, 7, 1, 32)])
def test_flash_launch_splits_the_grid_into_batch_and_window_and_addresses_every_tensor(B, W, N, H, D):
    """Emulate the kernel: z = blockIdx.z, zo = z / B2, b = z % B2; Q, K, V at pointer + b qb + zo qbo
    + h qh + s qs + d, the mask at b mb + zo mbo + h mh + q mq + k mk, O alike: each must be the
    reference's element."""
    layer, _ = window_layer(B, W, N, H, D, FP16, FP16)
    assert _supports(layer) and flash_geometry(layer) == ("float16", D)
    assert split_batch(layer) is (B > 1) and not (B > 1 and sm90_supports(layer))
    shape = layer.in_shapes[0]
    base, obase, mbase = 1 << 20, 1 << 30, 1 << 32
    tensors = {"QKV": DeviceTensor(base, shape, FP16), "Y": DeviceTensor(obase, (B, W, N, H, D), FP16),
               "mask": DeviceTensor(mbase, (1, W, H, N, N), FP16)}
    run = flash_launch(layer, tensors)
    assert run.grid == (-(-N // 64), H, B * W) and run.head == D
    B2, *outer = (int(x) for x in run.args[-OUTER_ARGS:])
    assert B2 == W
    z = np.arange(B * W)
    zo, zb = (z // B2).reshape(-1, 1, 1, 1), (z % B2).reshape(-1, 1, 1, 1)
    h, s, d = np.meshgrid(*(np.arange(n) for n in (H, N, D)), indexing="ij")
    packed = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    node = Node("Attention", ["QKV"] * 3, ["Y"], dict(layer.attrs), "att", "ai.polykit")
    for i in range(3):
        qb, qh, qs = (int(x) for x in run.args[7 + 3 * i: 10 + 3 * i])
        got = packed.reshape(-1)[(run.args[i].ptr - base) // 2 + zb * qb + zo * outer[i] + h * qh + s * qs + d]
        np.testing.assert_array_equal(got, _operand(node, i, packed).reshape(B * W, H, N, D))
    ob, oh, os_ = (int(x) for x in run.args[16:19])
    stored = np.arange(B * W * N * H * D, dtype=np.int64).reshape(B, W, N, H, D)
    got = stored.reshape(-1)[(run.args[3].ptr - obase) // 2 + zb * ob + zo * outer[3] + h * oh + s * os_ + d]
    np.testing.assert_array_equal(got, _from_layout(stored, "bshd").reshape(B * W, H, N, D))
    mb, mh, mq, mk = (int(x) for x in run.args[19:23])
    mask = np.arange(W * H * N * N, dtype=np.int64).reshape(1, W, H, N, N)
    hq, qq, kk = np.meshgrid(*(np.arange(n) for n in (H, N, N)), indexing="ij")
    got = mask.reshape(-1)[zb * mb + zo * outer[4] + hq * mh + qq * mq + kk * mk]
    np.testing.assert_array_equal(got, np.broadcast_to(mask, (B, W, H, N, N)).reshape(B * W, H, N, N))


def test_rank4_launches_keep_one_batch_dim_and_no_outer_strides():
    shape = (2, 3, 17, 64)
    layer = replace(view_layer(shape, [OperandView(0, shape, dense_strides(shape))] * 3, FP16, shape), attrs={},
                    inputs=("Q", "K", "V"))
    tensors = {n: DeviceTensor(1 << 20, shape, FP16) for n in ("Q", "K", "V", "Y")}
    run = flash_launch(layer, tensors)
    assert run.grid == (1, 3, 2) and [int(x) for x in run.args[-OUTER_ARGS:]] == [2, 0, 0, 0, 0, 0]
    assert not split_batch(layer)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", [np.float16, np.bool_])
@pytest.mark.parametrize("B, W, N, H, D", [(2, 3, 49, 3, 32), (3, 5, 13, 2, 64)])
@pytest.mark.parametrize("tactic", FLASH_TACTICS)
def test_flash_runs_windowed_attention(mask, B, W, N, H, D, tactic):
    layer, inputs = window_layer(B, W, N, H, D, FP16, mask)
    check(layer, inputs, tactic, FP16, 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", ["cuda.attention.flash_f32", "cuda.attention.simple"])
def test_fp32_tactics_run_windowed_attention(tactic):
    layer, inputs = window_layer(2, 3, 49, 2, 64, np.dtype(np.float32), np.float32)
    check(replace(layer, precision="fp32"), inputs, tactic, np.dtype(np.float32), 1e-5)
