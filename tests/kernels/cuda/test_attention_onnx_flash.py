"""ONNX Attention on the flash kernels (attention_onnx_flash.py): which variants take the route (stamped
layers, no GPU), the flash launch it builds (recorded), and the whole route on the host emulation of
its kernels -- present copies, causal band, flash_attention.cu -- against the ONNX reference (outputs
poisoned). The GPU cases are in test_attention_onnx.py."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.attention import attention_onnx_flash
from polykit.kernels.cuda.attention.flash_attention import NO_CAUSAL
from polykit.kernels.cuda.base import DeviceTensor, KernelSource
from polykit.kernels.tactics import candidates, find_tactic
from tests.kernels.cuda.test_flash_attention import BF16, TOL

from .recording_launcher import RecordingLauncher

F16 = np.dtype(np.float16)
NAMES = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
OUTS = ("Y", "present_key", "present_value", "qk")
ROUTE = "cuda.attention_onnx.flash"
rng = np.random.default_rng(31)


def rand(*shape, dtype=F16):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def onnx_layer(feeds, attrs, n_out=1) -> LayerDesc:
    """The ONNX Attention layer of `feeds` (by NAMES), stamped as the builder stamps it."""
    names = tuple(n if n in feeds else "" for n in NAMES)
    while not names[-1]:
        names = names[:-1]
    outs = OUTS[:n_out]
    specs = reference(LayerDesc("att", "Attention", names, outs, dict(attrs)), feeds, wide=False)
    return LayerDesc("att", "Attention", names, outs, dict(attrs),
                     in_dtypes=tuple(np.dtype(feeds[n].dtype).name if n else "" for n in names),
                     in_shapes=tuple(tuple(feeds[n].shape) if n else () for n in names),
                     out_dtypes=tuple(np.dtype(a.dtype).name for a in specs.values()),
                     out_shapes=tuple(tuple(a.shape) for a in specs.values()))


def reference(layer, feeds, wide=True) -> dict[str, np.ndarray]:
    """The ONNX reference's outputs (float64 inputs when `wide`: the exact result to measure against)."""
    node = Node("Attention", list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name)
    arrays = [feeds[n] if n else None for n in layer.inputs]
    if wide:
        arrays = [a.astype(np.float64) if a is not None and a.dtype != np.bool_ else a for a in arrays]
    return dict(zip(layer.outputs, run_reference(node, arrays)))


def gqa_with_past(dtype=F16, head=64, **attrs):
    """4-D, 8 query heads on 2 key/value heads, 5 queries after 6 cached keys and 7 new ones."""
    feeds = {"Q": rand(2, 8, 5, head, dtype=dtype), "K": rand(2, 2, 7, head, dtype=dtype),
             "V": rand(2, 2, 7, head, dtype=dtype), "past_key": rand(2, 2, 6, head, dtype=dtype),
             "past_value": rand(2, 2, 6, head, dtype=dtype)}
    return feeds, {"is_causal": 1, **attrs}


# ---- which variants take the route -------------------------------------------------------

def route_names(feeds, attrs, n_out=1, arch=None):
    return [t.name for t in candidates("cuda", "Attention", onnx_layer(feeds, attrs, n_out), arch=arch)
            if t.name.startswith("cuda.attention_onnx.flash")]


@pytest.mark.parametrize("case", ["gqa_causal_past", "mqa_3d_cross", "bool_mask_2d", "additive_mask_bf16",
                                  "present_outputs_no_past", "head_256", "causal_and_mask"])
def test_fitting_variants_take_the_mma_flash_route(case):
    feeds, attrs, n_out = *gqa_with_past(), 3
    if case == "mqa_3d_cross":
        feeds = {"Q": rand(2, 9, 4 * 64), "K": rand(2, 30, 64), "V": rand(2, 30, 64)}
        attrs, n_out = {"q_num_heads": 4, "kv_num_heads": 1}, 1
    elif case == "bool_mask_2d":
        feeds = {"Q": rand(1, 2, 9, 32), "K": rand(1, 2, 13, 32), "V": rand(1, 2, 13, 32),
                 "attn_mask": rng.random((9, 13)) > 0.3}
        attrs, n_out = {"scale": 0.3}, 1
    elif case == "additive_mask_bf16":
        feeds = {"Q": rand(2, 2, 9, 128, dtype=BF16), "K": rand(2, 2, 13, 128, dtype=BF16),
                 "V": rand(2, 2, 13, 128, dtype=BF16), "attn_mask": rand(2, 1, 1, 13, dtype=BF16)}
        attrs, n_out = {}, 1
    elif case == "present_outputs_no_past":
        feeds = {n: feeds[n] for n in ("Q", "K", "V")}
    elif case == "causal_and_mask":
        feeds["attn_mask"] = rng.random((2, 1, 1, 13)) > 0.3
    elif case == "head_256":
        feeds = {"Q": rand(1, 2, 9, 256), "K": rand(1, 2, 13, 256), "V": rand(1, 2, 13, 256)}
        attrs, n_out = {"is_causal": 1}, 1
    assert ROUTE in route_names(feeds, attrs, n_out)


@pytest.mark.parametrize("change", ["softcap", "window", "qk_output", "nonpad", "short_mask", "mask_dtype",
                                    "head_48", "dv_differs", "fp64", "fp32_head_32", "mixed_past"])
def test_variants_the_flash_kernels_do_not_compute_keep_generic(change):
    feeds, attrs = gqa_with_past()
    n_out = 3
    if change == "softcap":
        attrs["softcap"] = 2.0
    elif change == "window":
        attrs["left_window_size"] = 2
    elif change == "qk_output":
        n_out = 4
    elif change == "nonpad":
        feeds = {n: feeds[n] for n in ("Q", "K", "V")}
        feeds["nonpad_kv_seqlen"], n_out, attrs = np.array([5, 7], np.int64), 1, {}
    elif change == "short_mask":
        feeds["attn_mask"], attrs = rng.random((5, 10)) > 0.3, {}  # 13 keys with the past
    elif change == "mask_dtype":
        feeds["attn_mask"], attrs = rand(5, 13, dtype=np.float32), {}
    elif change == "head_48":
        feeds, _ = gqa_with_past(head=48)
    elif change == "dv_differs":
        feeds["V"], feeds["past_value"] = rand(2, 2, 7, 32), rand(2, 2, 6, 32)
    elif change == "fp64":
        feeds = {n: a.astype(np.float64) for n, a in feeds.items()}
    elif change == "fp32_head_32":
        feeds, _ = gqa_with_past(np.float32, head=32)
    else:
        feeds["past_key"] = feeds["past_key"].astype(BF16)
    names = [t.name for t in candidates("cuda", "Attention", onnx_layer(feeds, attrs, n_out))]
    assert not [n for n in names if n.startswith("cuda.attention_onnx.flash")] and "cuda.attention_onnx.generic" in names


def test_fp32_takes_the_f32_flash_kernels_and_sm90_its_own():
    feeds, attrs = gqa_with_past(np.float32)
    assert route_names(feeds, attrs, 3) == ["cuda.attention_onnx.flash_f32"]
    half, attrs = gqa_with_past(head=128)
    assert "cuda.attention_onnx.flash_sm90" in route_names(half, attrs, 3, arch="sm_90")
    assert "cuda.attention_onnx.flash_sm90" not in route_names(half, attrs, 3, arch="sm_80")


def test_a_level_0_order_puts_the_flash_route_before_fused_and_generic():
    """The route has its flash tactic's priority, above `fused` (10) and `generic` (0)."""
    feeds = {"Q": rand(1, 2, 9, 64), "K": rand(1, 2, 13, 64), "V": rand(1, 2, 13, 64)}
    names = [t.name for t in candidates("cuda", "Attention", onnx_layer(feeds, {"is_causal": 1}), arch="sm_80")]
    assert names[0] == ROUTE and names.index("cuda.attention_onnx.fused") > names.index(ROUTE)


def opset23_model(B=2, S=9, past=5, hq=8, hkv=2, D=64):
    """One ONNX Attention (3-D GQA, causal, a cache in and out) as an exporter writes it, float32; B, S
    and past may be dim names (the present outputs' shapes are then left to shape inference)."""
    from onnx import TensorProto, helper

    def io(name, *shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))

    static = all(isinstance(d, int) for d in (B, S, past))
    present = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, hkv, past + S, D] if static else None)
               for n in ("present_key", "present_value")]
    node = helper.make_node("Attention", ["q", "k", "v", "", "past_key", "past_value"], ["y", "present_key", "present_value"],
                            is_causal=1, q_num_heads=hq, kv_num_heads=hkv)
    graph = helper.make_graph([node], "attention", [io("q", B, S, hq * D), io("k", B, S, hkv * D), io("v", B, S, hkv * D),
                                                    io("past_key", B, hkv, past, D), io("past_value", B, hkv, past, D)],
                              [io("y", B, S, hq * D), *present])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


@pytest.mark.parametrize("fp16,tactic", [(True, ROUTE), (False, "cuda.attention_onnx.flash_f32")])
def test_a_level_0_cuda_build_runs_an_exported_attention_on_the_flash_route(fp16, tactic):
    """Built for cuda without a GPU: the Attention layer takes the route and enqueues (recorded) the
    present copies, the causal band and one flash launch with the cache's length as the causal hint."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    plan = build_plan(opset23_model(), BuilderConfig(target="cuda", fp16=fp16, builder_optimization_level=0))
    (att,) = [lay for lay in plan.layers if lay.kind == "Attention"]
    assert att.tactic == tactic
    tensors = {n: DeviceTensor(0x10000 * (i + 1), s, np.dtype(d)) for i, (n, s, d) in
               enumerate(zip(att.inputs + att.outputs, att.in_shapes + att.out_shapes, att.in_dtypes + att.out_dtypes)) if n}
    launcher = RecordingLauncher()
    find_tactic("cuda", "Attention", att.tactic).enqueue(att, launcher, tensors)
    flash = [a for n, a in launcher.launches if n.startswith("flash_attention")]
    assert len(flash) == 1 and flash[0][27] == 5 and flash[0][26] == 4  # causal hint = past; kv_groups 8 / 2


def test_a_profile_build_with_a_growing_cache_takes_the_route_at_every_corner():
    """Batch, length and cache length dynamic (a cache of 0 at the min corner): the route serves every
    corner with the kernels of its opt shape (tuner.serves_corners), so the profile plan keeps it."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.profiles import Profile

    def dims(*rows):
        return tuple(tuple(r) for r in rows)

    lo, opt, hi = (1, 1, 0), (2, 16, 32), (4, 64, 128)
    profile = Profile({**{n: dims(*[(b, s, h * 64) for b, s, _ in (lo, opt, hi)]) for n, h in (("q", 8), ("k", 2), ("v", 2))},
                       **{n: dims(*[(b, 2, p, 64) for b, _, p in (lo, opt, hi)]) for n in ("past_key", "past_value")}})
    model = opset23_model("b", "s", "p")
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0, profiles=[profile]))
    (att,) = [lay for lay in plan.layers if lay.kind == "Attention"]
    assert att.tactic == ROUTE


# ---- the launch it builds ------------------------------------------------------------------

def recorded(feeds, attrs, n_out, tactic=ROUTE):
    layer = onnx_layer(feeds, attrs, n_out)
    specs = reference(layer, feeds, wide=False)
    tensors = {n: DeviceTensor(0x10000 * (i + 1), a.shape, a.dtype)
               for i, (n, a) in enumerate([*feeds.items(), *specs.items()])}
    launcher = RecordingLauncher(workspace_ptr=0x900000)
    find_tactic("cuda", "Attention", tactic).enqueue(layer, launcher, tensors)
    return launcher, tensors


def flash_args(launcher):
    (args,) = [a for name, a in launcher.launches if name == "flash_attention"]
    # Q, K, V, O, mask, S, Skv, 4 x (b, h, s) strides, mask (b, h, q, k) strides, scale, kind, nan, groups, causal
    return dict(ptrs=args[:5], S=args[5], Skv=args[6], strides=[args[7 + 3 * i: 10 + 3 * i] for i in range(4)],
                mask=args[19:23], scale=args[23], kind=args[24], nan_to_zero=args[25], groups=args[26], causal=args[27])


def test_causal_gqa_with_past_reads_present_through_the_band_and_skips_past_the_diagonal():
    feeds, attrs = gqa_with_past()
    launcher, tensors = recorded(feeds, attrs, 3)
    names = [n for n, _ in launcher.launches]
    assert names[-2:] == ["attention_onnx_causal_mask", "flash_attention"]
    band = [a for n, a in launcher.launches if n == "attention_onnx_causal_mask"][0]
    assert band[1:] == [1, 5 + 13 - 1, 5 - 1 + 6]  # one row of Sq + Skv - 1 flags, j <= Sq - 1 + past
    run = flash_args(launcher)
    assert [p.ptr for p in run["ptrs"][:4]] == [tensors[n].ptr for n in ("Q", "present_key", "present_value", "Y")]
    assert run["ptrs"][4].ptr == 0x900000 + 4 and run["mask"] == [0, 0, -1, 1]  # band[Sq - 1 - q + k]
    assert (run["S"], run["Skv"], run["groups"], run["causal"], run["kind"]) == (5, 13, 4, 6, 2)
    assert [tuple(s) for s in run["strides"][1:3]] == [(2 * 13 * 64, 13 * 64, 64)] * 2
    assert run["nan_to_zero"] == 1 and np.isclose(run["scale"], 1 / 8)


def test_present_is_the_past_then_the_new_keys():
    feeds, attrs = gqa_with_past()
    launcher, tensors = recorded(feeds, attrs, 3)
    copies = [(n, a) for n, a in launcher.launches if n.startswith("copy_strided")]
    assert len(copies) == 4
    for (_, past), (name, new), (src, out) in zip(copies[::2], copies[1::2], (("K", "present_key"), ("V", "present_value"))):
        assert (past[0].ptr, past[1].ptr, past[-1]) == (tensors["past_" + out[8:]].ptr, tensors[out].ptr, 0)
        assert (new[0].ptr, new[1].ptr) == (tensors[src].ptr, tensors[out].ptr)
        elem_bytes = int(name.rsplit("_", 1)[1])  # widened elements of this many bytes
        assert new[-1] * elem_bytes == 6 * 64 * 2  # dst_base: after Spast = 6 rows of D = 64 halves


def test_without_a_past_flash_reads_k_and_v_while_present_is_still_written():
    feeds, attrs = gqa_with_past()
    feeds = {n: feeds[n] for n in ("Q", "K", "V")}
    launcher, tensors = recorded(feeds, attrs, 3)
    copies = [a for n, a in launcher.launches if n.startswith("copy_strided")]
    assert [(a[0].ptr, a[1].ptr) for a in copies] == [(tensors["K"].ptr, tensors["present_key"].ptr),
                                                      (tensors["V"].ptr, tensors["present_value"].ptr)]
    run = flash_args(launcher)
    assert [p.ptr for p in run["ptrs"][:3]] == [tensors[n].ptr for n in ("Q", "K", "V")] and run["causal"] == 0
    assert launcher.workspaces == [5 + 7 - 1]  # the band only


def test_3d_inputs_are_read_in_place_as_bshd_and_masks_through_their_broadcast_strides():
    feeds = {"Q": rand(2, 9, 4 * 64), "K": rand(2, 30, 64), "V": rand(2, 30, 64), "attn_mask": rand(2, 1, 9, 30)}
    launcher, tensors = recorded(feeds, {"q_num_heads": 4, "kv_num_heads": 1, "scale": 0.25}, 1)
    assert [n for n, _ in launcher.launches] == ["flash_attention"] and launcher.workspaces == []
    run = flash_args(launcher)
    assert [p.ptr for p in run["ptrs"]] == [tensors[n].ptr for n in ("Q", "K", "V", "Y", "attn_mask")]
    assert [tuple(s) for s in run["strides"]] == [(9 * 256, 64, 256), (30 * 64, 0, 64), (30 * 64, 0, 64),
                                                  (9 * 256, 64, 256)]
    assert run["mask"] == [9 * 30, 0, 30, 1] and run["kind"] == 1 and run["groups"] == 4
    assert run["causal"] == NO_CAUSAL and np.isclose(run["scale"], 0.25) and (run["S"], run["Skv"]) == (9, 30)


def test_causal_with_a_mask_merges_them_in_workspace_with_the_masks_batch_and_head_dims():
    feeds, attrs = gqa_with_past()
    feeds["attn_mask"] = rand(2, 1, 1, 13)  # per-batch padding, additive
    launcher, tensors = recorded(feeds, attrs, 3)
    (merge,) = [a for n, a in launcher.launches if n == "attention_onnx_causal_merge_2"]
    assert merge[0].ptr == tensors["attn_mask"].ptr and merge[1].shape == (2, 1, 5, 13)
    assert merge[2:] == [2, 1, 5, 13, 13, 0, 0, 1, 6, 0xFC00]  # shape, the mask's strides, past, -inf's bits
    run = flash_args(launcher)
    assert run["ptrs"][4].ptr == merge[1].ptr and run["mask"] == [5 * 13, 0, 13, 1]
    assert (run["kind"], run["causal"]) == (1, 6)
    assert launcher.workspaces[-1] == 2 * 5 * 13 * 2


def test_workspace_holds_present_without_outputs_and_the_band():
    feeds, attrs = gqa_with_past()
    layer = onnx_layer(feeds, attrs, 1)
    tensors = {n: DeviceTensor(0, a.shape, a.dtype) for n, a in feeds.items()}
    tensors["Y"] = DeviceTensor(0, (2, 8, 5, 64), F16)
    need = find_tactic("cuda", "Attention", ROUTE).workspace(layer, tensors, 132)
    assert need == 2 * (2 * 2 * 13 * 64 * 2) + 256  # present K and V (256-byte multiples), the 17-byte band
    launcher, _ = recorded(feeds, attrs, 1)
    assert launcher.workspaces == [2 * 2 * 13 * 64 * 2] * 2 + [17]


def test_kernels_are_the_wrapped_tactics_and_the_copies_and_band_it_launches():
    feeds, attrs = gqa_with_past()
    kernels = find_tactic("cuda", "Attention", ROUTE).kernels(onnx_layer(feeds, attrs, 3))
    assert kernels[0].name == "flash_attention" and kernels[-1] == attention_onnx_flash.CAUSAL_KERNEL
    assert any(k.name == "copy_strided_2" for k in kernels)
    plain = {n: feeds[n] for n in ("Q", "K", "V")}
    assert [k.name for k in find_tactic("cuda", "Attention", ROUTE).kernels(onnx_layer(plain, {}, 1))] == \
        ["flash_attention"]


# ---- the route on the host emulation of its kernels ---------------------------------------

#: movement.cu's copy kernels by element size: their element type (a macro's parameter list)
COPY_TYPES = {"1": "u8", "2": "u16", "4": "u32", "8": "u64", "16": "Vec16"}


class RouteLauncher:
    """A Launcher running every kernel the route launches on the host emulation (block_emulation.py),
    each compiled for its own parameter list, with workspace from poisoned host buffers."""

    stream = None
    communicator = None
    sm_count = 132

    def __init__(self, build_dir, cxx):
        from tests.kernels.cuda.block_emulation import EmulatedLauncher, precompiled_prelude

        prelude = precompiled_prelude(build_dir, cxx)
        self.make = lambda params, args: EmulatedLauncher(build_dir, cxx, params, args, prelude=prelude)
        self.kernels: dict[str, object] = {}
        self.buffers: list[np.ndarray] = []
        self.launched: list[str] = []

    def _launcher(self, kernel: KernelSource):
        from tests.kernels.cuda.block_emulation import kernel_signature

        if kernel.name not in self.kernels:
            if kernel.name.startswith("copy_strided_"):
                strides = [f"{c}{i}" for c in "dst" for i in range(8)]
                elem = COPY_TYPES[kernel.name.rsplit("_", 1)[1]]
                params = (f"const {elem}* src, {elem}* dst, i64 n, i64 rank, " + ", ".join(f"i64 {s}" for s in strides)
                          + ", i64 src_base, i64 dst_base")
                args = "src, dst, n, rank, " + ", ".join(strides) + ", src_base, dst_base"
            else:
                params, args = kernel_signature(kernel.file, kernel.name)
            self.kernels[kernel.name] = self.make(params, args)
        return self.kernels[kernel.name]

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.launched.append(kernel.name)
        self._launcher(kernel).launch(kernel, grid, block, args, shared_mem)

    def workspace(self, nbytes: int) -> int:
        buf = np.full(nbytes + 256, 0x55, np.uint8)  # nonzero: a flag left unwritten reads as "keep"
        self.buffers.append(buf)
        return buf.ctypes.data + (-buf.ctypes.data) % 256


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    import shutil

    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    from tests.kernels.cuda.block_emulation import run_builds

    build = run_builds(tmp_path_factory)  # the run's one build folder: each kernel compiles once a run
    return lambda: RouteLauncher(build, cxx)


def run_route(launcher, layer, feeds, tactic=ROUTE) -> dict[str, np.ndarray]:
    outs = {n: np.full(s, np.nan, np.dtype(d)) for n, s, d in zip(layer.outputs, layer.out_shapes, layer.out_dtypes)}
    tensors = {n: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for n, a in [*feeds.items(), *outs.items()]}
    find_tactic("cuda", "Attention", tactic).enqueue(layer, launcher, tensors)
    return outs


def error(out: np.ndarray, ref: np.ndarray) -> float:
    out = out.astype(np.float64)
    assert not np.isnan(out).any(), "unwritten (NaN) outputs"
    return float(np.linalg.norm(out - ref) / (np.linalg.norm(ref) or 1.0))


def check_route(launcher, feeds, attrs, n_out=1, tactic=ROUTE):
    layer = onnx_layer(feeds, attrs, n_out)
    got, want = run_route(launcher, layer, feeds, tactic), reference(layer, feeds)
    dtype = np.dtype(feeds["Q"].dtype)
    assert error(got["Y"], want["Y"]) <= TOL[dtype], error(got["Y"], want["Y"])
    for name in layer.outputs[1:]:  # present: past and new, exactly
        np.testing.assert_array_equal(got[name], want[name].astype(dtype))
    return launcher


def test_emulated_causal_gqa_with_past_and_present_outputs(emulated):
    feeds, attrs = gqa_with_past(head=32)
    launched = check_route(emulated(), feeds, attrs, 3).launched
    assert launched.count("flash_attention") == 1 and "attention_onnx_causal_mask" in launched


def test_emulated_causal_with_past_in_workspace_skips_tiles_and_matches(emulated):
    """70 queries after 40 cached keys (110 keys, two key tiles of 64): the first query block needs
    keys up to 63 + 40 only, both tiles; a 3-D bf16 layout, present in workspace."""
    feeds = {"Q": rand(1, 70, 2 * 64, dtype=BF16), "K": rand(1, 70, 64, dtype=BF16), "V": rand(1, 70, 64, dtype=BF16),
             "past_key": rand(1, 1, 40, 64, dtype=BF16), "past_value": rand(1, 1, 40, 64, dtype=BF16)}
    check_route(emulated(), feeds, {"is_causal": 1, "q_num_heads": 2, "kv_num_heads": 1})


def test_emulated_causal_square_skips_the_key_tile_past_the_diagonal(emulated):
    """Sq = Skv = 130 (three key tiles): rows 0..63 read one tile, and still match the causal reference."""
    feeds = {"Q": rand(1, 1, 130, 64), "K": rand(1, 1, 130, 64), "V": rand(1, 1, 130, 64)}
    check_route(emulated(), feeds, {"is_causal": 1}, tactic="cuda.attention_onnx.flash_kv128")


@pytest.mark.parametrize("kind", ["bool", "add"])
def test_emulated_cross_attention_3d_multi_query_with_masks(emulated, kind):
    feeds = {"Q": rand(2, 9, 3 * 32), "K": rand(2, 21, 32), "V": rand(2, 21, 32)}
    if kind == "bool":
        mask = rng.random((2, 1, 9, 21)) > 0.4
        mask[1, 0, 4] = False  # a fully masked row: 0, as ONNX says
        feeds["attn_mask"] = mask
    else:
        feeds["attn_mask"] = (rng.standard_normal((9, 21)) * 2).astype(np.float16)
    check_route(emulated(), feeds, {"q_num_heads": 3, "kv_num_heads": 1, "scale": 0.2})


def test_emulated_additive_mask_with_past_covers_past_and_new_keys(emulated):
    feeds, _ = gqa_with_past(BF16, head=32)
    feeds["attn_mask"] = np.where(rng.random((2, 8, 5, 13)) > 0.2, 0.0, -np.inf).astype(BF16)
    check_route(emulated(), feeds, {}, 3)


def test_emulated_onnxruntime_causal_term_with_the_hint_gives_what_reading_every_key_gives(emulated):
    """com.microsoft `unidirectional` (attention_ms.py): the causal term is the lowest finite value added
    to -10000 padding terms, not -inf; with mask_causal 0 the kernel skips the tiles past the diagonal and
    the result is the mask's own, left-padded rows (first keys padded) included."""
    from tests.kernels.cuda.test_flash_attention import layer_for
    from tests.kernels.cuda.test_flash_attention import reference as flash_reference

    S = 130
    inputs = {"Q": rand(2, 1, S, 64, dtype=BF16), "K": rand(2, 1, S, 64, dtype=BF16), "V": rand(2, 1, S, 64, dtype=BF16)}
    padding = np.zeros((2, 1, 1, S), np.float32)
    padding[1, ..., :3] = -10000.0  # left padding: rows 0..2 of batch 1 see only padded keys
    lowest = float(np.finfo(np.float32).min) / 1.004  # bf16's lowest finite (float32's rounds to -inf in bf16)
    causal = np.where(np.arange(S)[None, :] > np.arange(S)[:, None], lowest, 0.0)
    inputs["mask"] = (padding + causal).astype(BF16)
    assert np.isfinite(inputs["mask"].astype(np.float32)).all()
    hinted = layer_for(inputs, (2, 1, S, 64), mask_causal=0)
    out = np.full((2, 1, S, 64), np.nan, BF16)
    tensors = {n: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for n, a in [*inputs.items(), ("Y", out)]}
    launcher = emulated()
    find_tactic("cuda", "Attention", "cuda.attention.flash").enqueue(hinted, launcher, tensors)
    assert error(out, flash_reference(layer_for(inputs, (2, 1, S, 64)), inputs)) <= TOL[BF16]


@pytest.mark.parametrize("kind", ["bool", "add"])
def test_emulated_causal_with_a_padding_mask_and_past(emulated, kind):
    """is_causal and a [B, 1, 1, Spast + Skv] key mask (an LLM's prefill over a padded batch, a cache)."""
    feeds = {"Q": rand(2, 2, 70, 32), "K": rand(2, 1, 70, 32), "V": rand(2, 1, 70, 32),
             "past_key": rand(2, 1, 10, 32), "past_value": rand(2, 1, 10, 32)}
    keep = rng.random((2, 1, 1, 80)) > 0.25
    keep[1, ..., :12] = False  # left padding: the first rows of batch 1 see no key: 0
    feeds["attn_mask"] = keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float16)
    launched = check_route(emulated(), feeds, {"is_causal": 1}, 3).launched
    assert "attention_onnx_causal_merge_" + ("1" if kind == "bool" else "2") in launched
