"""Attention reading Q, K, V as strided views of one packed projection (q_view / k_view / v_view):
the launch arguments each cuda tactic derives (CPU: the flash kernels' pointers and strides, checked
by emulating their index math on the host against the reference's view of the packed array; the
sm90 kernel's TMA maps; the simple kernel's relay), and every tactic against the reference (GPU)."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.fused import OperandView, dense_strides
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.attention import attention as simple
from polykit.kernels.cuda.attention.flash_attention import _supports, flash_geometry, flash_launch, head_view
from polykit.kernels.cuda.attention.flash_attention_sm90 import SHAPES as SM90_SHAPES
from polykit.kernels.cuda.attention.flash_attention_sm90 import _supports as sm90_supports
from polykit.kernels.cuda.attention.flash_attention_sm90 import tensor_map, tma_layout
from polykit.kernels.cuda.base import DeviceTensor
from tests.kernels.cuda.test_flash_attention import FLASH_TACTICS

rng = np.random.default_rng(11)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
SM90_TACTICS = [s.name for s in SM90_SHAPES]


def packed_views(form: str, B: int, S: int, H: int, D: int):
    """(packed shape, [q, k, v] views) of the packed projections exporters write:
    "bs3hd" [B, S, 3*H*D] read as [B, S, 3, H, D] (ViT, timm, GPT-2's split), "sb3e" torchvision's
    [S, B, 3*E] (batch second), "gqa" [B, S, (H + 2) * D] with one key/value head (multi-query)."""
    E = H * D
    if form == "bs3hd":
        shape = (B, S, 3 * E)
        views = [OperandView(i * E, (B, H, S, D), (S * 3 * E, D, 3 * E, 1)) for i in range(3)]
    elif form == "sb3e":
        shape = (S, B, 3 * E)
        views = [OperandView(i * E, (B, H, S, D), (3 * E, D, B * 3 * E, 1)) for i in range(3)]
    else:
        shape = (B, S, E + 2 * D)
        views = [OperandView(0, (B, H, S, D), (S * (E + 2 * D), D, E + 2 * D, 1))]
        views += [OperandView(E + i * D, (B, 1, S, D), (S * (E + 2 * D), 0, E + 2 * D, 1)) for i in range(2)]
    return shape, [OperandView(v.offset, v.shape, tuple(0 if n == 1 else s for n, s in zip(v.shape, v.strides)))
                   for v in views]


def view_layer(shape, views, dtype, out_shape, mask=None, **attrs) -> LayerDesc:
    attrs = dict(attrs, **{a: v.encode() for a, v in zip(("q_view", "k_view", "v_view"), views)})
    names, dtypes, shapes = ["QKV"] * 3, [np.dtype(dtype).name] * 3, [tuple(shape)] * 3
    if mask is not None:
        names.append("mask")
        dtypes.append(np.dtype(mask.dtype).name)
        shapes.append(tuple(mask.shape))
    return LayerDesc("att", "Attention", tuple(names), ("Y",), attrs, domain="ai.polykit", in_dtypes=tuple(dtypes),
                     out_dtypes=(np.dtype(dtype).name,), in_shapes=tuple(shapes), out_shapes=(tuple(out_shape),))


def reference(layer: LayerDesc, inputs: dict) -> np.ndarray:
    node = Node(layer.kind, list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name, layer.domain)
    wide = {n: a.astype(np.float64) if a.dtype != np.bool_ else a for n, a in inputs.items()}
    return run_reference(node, [wide[n] for n in layer.inputs])[0]


def rand(shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


# ---- CPU: geometry and launch arguments --------------------------------------------------------

@pytest.mark.parametrize("form", ["bs3hd", "sb3e", "gqa"])
@pytest.mark.parametrize("B,S,H,D", [(1, 197, 12, 64), (2, 13, 3, 32), (3, 50, 2, 128)])
def test_flash_launch_addresses_the_views_of_the_packed_tensor(form, B, S, H, D):
    """Emulate the flash kernels' index math (pointer + b qb + h qh + s qs + d, in elements) over
    the packed array's bytes: it must read exactly the reference's view of Q, K and V."""
    shape, views = packed_views(form, B, S, H, D)
    packed = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    layer = view_layer(shape, views, FP16, (B, H, S, D))
    assert _supports(layer) and flash_geometry(layer) == ("float16", D)
    base = 1 << 20
    tensors = {"QKV": DeviceTensor(base, shape, FP16), "Y": DeviceTensor(1 << 30, (B, H, S, D), FP16)}
    run = flash_launch(layer, tensors)
    assert run.grid == (-(-S // 64), H, B) and run.head == D
    flat = packed.reshape(-1)
    b, h, s, d = np.meshgrid(*(np.arange(n) for n in (B, H, S, D)), indexing="ij")
    node = Node("Attention", ["QKV"] * 3, ["Y"], dict(layer.attrs), "att", "ai.polykit")
    from polykit.compiler.ops.nn.fused_reference import _operand

    for i in range(3):
        ptr = run.args[i].ptr
        assert (ptr - base) % 2 == 0
        qb, qh, qs = (int(x) for x in run.args[7 + 3 * i: 10 + 3 * i])
        got = flat[(ptr - base) // 2 + b * qb + h * qh + s * qs + d]  # stride 0: a broadcast dim
        want = np.broadcast_to(_operand(node, i, packed), (B, H, S, D))
        np.testing.assert_array_equal(got, want)
    # the output: contiguous [B, H, S, D]
    assert tuple(int(x) for x in run.args[16:19]) == dense_strides((B, H, S, D))[:3]


def test_views_off_16_byte_rows_leave_the_flash_kernels_for_the_simple_kernel():
    shape = (2, 9, 3 * 64 + 4)  # rows of 196 halves: not whole 16 bytes
    views = [OperandView(4 + i * 64, (2, 1, 9, 64), (9 * 196, 0, 196, 1)) for i in range(3)]
    layer = view_layer(shape, views, FP16, (2, 1, 9, 64))
    assert not _supports(layer) and not sm90_supports(layer)
    aligned = [OperandView(i * 64, (2, 1, 9, 64), (9 * 200, 0, 200, 1)) for i in range(3)]
    assert _supports(view_layer((2, 9, 200), aligned, FP16, (2, 1, 9, 64)))


def test_a_view_past_its_tensor_is_no_geometry():
    shape, views = packed_views("bs3hd", 1, 8, 2, 64)
    late = [OperandView(v.offset + 64, v.shape, v.strides) for v in views]  # V's last row runs off the end
    assert head_view({"v_view": late[2].encode()}, 2, shape) is None
    assert not _supports(view_layer(shape, late, FP16, (1, 2, 8, 64)))


@pytest.mark.parametrize("B", [1, 2])
def test_sm90_maps_packed_views_with_their_strides_and_refuses_dims_that_do_not_nest(B):
    S, H, D = 77, 4, 64
    shape, views = packed_views("bs3hd", B, S, H, D)
    assert sm90_supports(view_layer(shape, views, FP16, (B, H, S, D)))
    x = DeviceTensor(4096 + views[1].offset * 2, shape, FP16)
    spec, bits = tensor_map(x, head_view({"k_view": views[1].encode()}, 1, shape), 64)
    # [B, S, 3, H, D]: head before seq; a row of 3 H D halves; batch one whole [S, 3 E]
    assert spec.dims == (D, H, S, B) and spec.strides == (D * 2, 3 * H * D * 2, S * 3 * H * D * 2)
    assert spec.box == (64, 1, 64, 1) and bits == 1 | (int(B == 1) << 1)
    shape, views = packed_views("sb3e", B, S, H, D)
    # batch second: the batch stride (3 E) is inside a sequence row; TMA maps nest, so only batch 1 maps
    assert sm90_supports(view_layer(shape, views, FP16, (B, H, S, D))) is (B == 1)
    assert (tma_layout(head_view({"q_view": views[0].encode()}, 0, shape), 2) is None) is (B > 1)


def test_simple_tactic_relays_each_view_through_the_workspace():
    shape, views = packed_views("sb3e", 2, 13, 3, 24)
    layer = view_layer(shape, views, np.float32, (2, 3, 13, 24))
    tensors = {"QKV": DeviceTensor(4096, shape, np.dtype(np.float32)),
               "Y": DeviceTensor(1 << 20, (2, 3, 13, 24), np.dtype(np.float32))}
    relaid = simple._views(layer, tensors)
    assert [i for i, _ in relaid] == [0, 1, 2] and [v.offset for _, v in relaid] == [0, 72, 144]
    assert simple._relayout_bytes(layer, tensors, 1) == 3 * (-(-2 * 3 * 13 * 24 * 4 // 256) * 256)
    assert any(k.name.startswith("copy") or "movement" in k.file for k in simple._kernels(layer))

    class Recorder:
        def __init__(self):
            self.calls, self.next = [], 1 << 24

        def workspace(self, nbytes):
            self.next += -(-nbytes // 256) * 256
            return self.next - -(-nbytes // 256) * 256

        def launch(self, kernel, grid, block, args, shared_mem=0):
            self.calls.append((kernel.name, args))

    rec = Recorder()
    simple.enqueue_relaid(layer, rec, tensors)
    names = [name for name, _ in rec.calls]
    assert len(names) == 4 and names[-1].startswith("attention_tiled_f32")  # three gathers, then attention
    # Q, K and V (views of one packed tensor) are read from their own copies (the first GPU run found all
    # three read from the last one)
    copies = [args[1].ptr for _, args in rec.calls[:3]]
    assert len(set(copies)) == 3 and [a.ptr for a in rec.calls[3][1][:3]] == copies


# ---- GPU: every tactic against the reference ------------------------------------------------------

def run(layer, inputs, tactic, dtype):
    from polykit.runtime.cuda.harness import run_layer

    return run_layer(layer, inputs, tactic=tactic, output_specs={"Y": (layer.out_shapes[0], dtype)})["Y"]


def check(layer, inputs, tactic, dtype, tol):
    out = np.asarray(run(layer, inputs, tactic, dtype), np.float64)
    ref = reference(layer, inputs)
    assert out.shape == ref.shape
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err <= tol, f"relative error {err:.3g}"


def mask_input(mask, B, S, dtype):
    """A causal bool keep-mask [S, S], an additive padding mask [B, 1, 1, S] or None."""
    if mask == "causal":
        return np.tril(np.ones((S, S), bool))
    return (rng.standard_normal((B, 1, 1, S)) * 2).astype(dtype) if mask == "additive" else None


def _case(form, B, S, H, D, dtype, mask):
    shape, views = packed_views(form, B, S, H, D)
    inputs = {"QKV": rand(shape, dtype)}
    m = mask_input(mask, B, S, dtype)
    if m is not None:
        inputs["mask"] = m
    return view_layer(shape, views, dtype, (B, H, S, D), mask=m, scale=D ** -0.5), inputs


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["bs3hd", "sb3e", "gqa"])
@pytest.mark.parametrize("mask", [None, "causal", "additive"])
@pytest.mark.parametrize("tactic,B,S,H,D", [(t, *c) for t, heads in FLASH_TACTICS.items()
                                             for c in [(1, 197, 12, 64), (2, 13, 3, 128), (2, 77, 2, 32)]
                                             if c[-1] in heads])
def test_flash_reads_packed_views(form, mask, tactic, B, S, H, D):
    layer, inputs = _case(form, B, S, H, D, FP16, mask)
    check(layer, inputs, tactic, FP16, 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["bs3hd", "gqa"])
@pytest.mark.parametrize("mask", [None, "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("tactic", SM90_TACTICS)
def test_flash_sm90_reads_packed_views(form, mask, D, tactic):
    from polykit.runtime.cuda import driver

    if driver.current_device().arch != "sm_90":
        pytest.skip("needs compute capability 9.0")
    layer, inputs = _case(form, 2, 131, 3, D, BF16, mask)
    check(layer, inputs, tactic, BF16, 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", ["cuda.attention.flash_f32", "cuda.attention.simple"])
@pytest.mark.parametrize("form", ["bs3hd", "sb3e"])
def test_fp32_tactics_read_packed_views(tactic, form):
    from dataclasses import replace

    layer, inputs = _case(form, 2, 37, 2, 64, np.dtype(np.float32), "additive")
    check(replace(layer, precision="fp32"), inputs, tactic, np.dtype(np.float32), 1e-5)


@pytest.mark.parametrize("hint,masked,want", [(None, True, "none"), (0, True, 0), (-3, True, -3), (5, False, "none")])
def test_the_causal_hint_reaches_the_launch_only_with_its_mask(hint, masked, want):
    """flash_launch's causal offset (after kv_groups): the layer's `mask_causal` where it has the mask the hint
    describes, else NO_CAUSAL (every key tile)."""
    from polykit.kernels.cuda.attention.flash_attention import NO_CAUSAL, OUTER_ARGS, causal_offset

    attrs = {} if hint is None else {"mask_causal": hint}
    layer = LayerDesc("att", "Attention", ("Q", "K", "V", "M") if masked else ("Q", "K", "V"), ("Y",), attrs,
                      domain="ai.polykit")
    assert causal_offset(layer, masked) == (NO_CAUSAL if want == "none" else want)
    shapes = {"Q": (1, 2, 70, 64), "K": (1, 2, 90, 64), "V": (1, 2, 90, 64), "Y": (1, 2, 70, 64), "M": (1, 1, 70, 90)}
    tensors = {n: DeviceTensor(1 << 20, s, np.dtype(np.bool_ if n == "M" else np.float16)) for n, s in shapes.items()}
    run = flash_launch(replace(layer, in_shapes=tuple(shapes[n] for n in layer.inputs), out_shapes=((1, 2, 70, 64),)),
                       tensors)
    assert int(run.args[-1 - OUTER_ARGS]) == causal_offset(layer, masked)
