"""A BERT-style block with dynamic batch and sequence (profile builds): pack_gemms packs q, k, v into
one GEMM and the Attention reads them as views of the packed projection whose outer strides are
expressions of its bound shape (`#k` entries, fold_attention_layouts / ops/nn/fused.decode_view).
The cpu plan against onnxruntime at min, odd and max shapes; the cuda fp16 plan (level 0, no GPU
needed) has the static plan's layers; the flash kernel's strides at two bound shapes (host
emulation: null pointers); the view algebra's refusals; the gpu test against the cpu plan."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder import builder as builder_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.symbolic import SymInt, symbol
from polykit.compiler.ops.nn.fused import ViewError, decode_view, operand_view
from polykit.compiler.plan.profiles import Profile
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.attention.flash_attention import flash_launch
from tests.compiler.packed_gemm_models import attention_block
from tests.compiler.packed_qkv_models import padding_mask

H, D = 3, 32
E = H * D
GEMMS = {"MatMul", "Gemm"}
COPIES = {"Transpose", "Gather", "Split", "Slice", "PermutedCopy", "Copy"}
#: (batch, sequence) at min, an odd shape and max of PROFILE
SHAPES = ((1, 5), (3, 17), (6, 40))
PROFILE = Profile({"x": ((1, 5, E), (4, 32, E), (6, 40, E)), "m": ((1, 1, 1, 5), (4, 1, 1, 32), (6, 1, 1, 40))})
CUDA_FP16 = dict(target="cuda", fp16=True, builder_optimization_level=0)


def _model(rope: bool = False):
    return attention_block("batch", "seq", H, D, "additive", rope=rope)


def _feeds(B: int, S: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 7 * B + S)
    return {"x": rng.standard_normal((B, S, E)).astype(np.float32), "m": padding_mask(rng, B, S)}


def _attention(plan):
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    return att


def _sm90(monkeypatch) -> None:
    from polykit.runtime.cuda.driver import DeviceInfo

    gpu = DeviceInfo(0, "test GPU sm_90", "sm_90", 132, 80 << 30, 227 * 1024)
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: gpu)


def test_cpu_profile_plan_packs_q_k_v_and_matches_onnxruntime_at_min_odd_and_max():
    model = _model()
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[PROFILE]))
    widths = [layer.out_shapes[0][-1] for layer in plan.layers if layer.kind in GEMMS]
    assert widths == [3 * E, E], widths  # one packed projection, then the output projection
    assert not COPIES & {layer.kind for layer in plan.layers}, [layer.kind for layer in plan.layers]
    att = _attention(plan)
    assert len(set(att.inputs[:3])) == 1, "Q, K and V read one packed tensor"
    assert att.attrs["q_view"] == [0, "#0", H, "#1", D, ["*", 3 * E, "#1"], D, 3 * E, 1]
    assert [att.attrs[a][0] for a in ("q_view", "k_view", "v_view")] == [0, E, 2 * E]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    from polykit.runtime.engine import Engine

    with Engine(plan).create_execution_context() as ctx:
        for B, S in SHAPES:
            f = _feeds(B, S)
            np.testing.assert_allclose(ctx.execute(f)["y"], session.run(None, f)[0], rtol=1e-5, atol=1e-5)


def test_profile_plan_with_views_round_trips_through_its_file():
    from polykit.compiler.plan.file import Plan

    plan = build_plan(_model(), BuilderConfig(target="cpu", profiles=[PROFILE]))
    loaded = Plan.deserialize(plan.serialize())
    assert _attention(loaded).attrs["k_view"] == _attention(plan).attrs["k_view"]


@pytest.mark.parametrize("entry, match", [(["*", 288, "#1", 2], "past the"), ("#7", "does not have")])
def test_a_dynamic_view_that_does_not_fit_is_a_plan_error_at_load(entry, match):
    from polykit.compiler.plan.file import Plan, decode_plan, encode_plan
    from polykit.errors import PlanError

    plan = build_plan(_model(), BuilderConfig(target="cpu", profiles=[PROFILE]))
    header, doc, blob = decode_plan(plan.serialize())
    att = next(entry for entry in doc["layers"] if entry["kind"] == "Attention")
    att["attrs"]["v_view"][5] = entry  # V's batch stride twice the projection's rows, or a dim it lacks
    data = encode_plan(doc, bytes(blob), header["target"], header["gpu_arch"])
    with pytest.raises(PlanError, match=f"v_view of input 2: .*{match}"):
        Plan.deserialize(data, where="m.plan")


@pytest.mark.parametrize("arch", [None, "sm_90"])
def test_cuda_fp16_profile_plan_has_the_static_plans_layers(arch, monkeypatch):
    if arch:
        _sm90(monkeypatch)
    else:
        monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: None)
    dyn = build_plan(_model(), BuilderConfig(profiles=[PROFILE], **CUDA_FP16))
    static = build_plan(attention_block(4, 32, H, D, "additive"), BuilderConfig(**CUDA_FP16))
    assert [layer.kind for layer in dyn.layers] == [layer.kind for layer in static.layers]
    assert [layer.tactic for layer in dyn.layers] == [layer.tactic for layer in static.layers]
    assert sum(1 for layer in dyn.layers if layer.kind in GEMMS) == 2
    att = _attention(dyn)
    assert att.tactic.startswith("cuda.attention.flash") and len(set(att.inputs[:3])) == 1
    assert all(isinstance(att.attrs[a][5], list) for a in ("q_view", "k_view", "v_view"))  # b stride: S * 3E


def test_flash_kernel_strides_follow_the_bound_shape(monkeypatch):
    _sm90(monkeypatch)
    plan = build_plan(_model(), BuilderConfig(profiles=[PROFILE], **CUDA_FP16))
    att = _attention(plan)
    packed, mask, out = att.inputs[0], att.inputs[3], att.outputs[0]
    for B, S in ((2, 7), (6, 40)):
        tensors = {packed: DeviceTensor(1 << 20, (B, S, 3 * E), np.dtype(np.float16)),
                   mask: DeviceTensor(1 << 24, (B, 1, 1, S), np.dtype(np.float16)),
                   out: DeviceTensor(1 << 28, tuple(plan.tensors[out].shape[:0]) + (B, S, H, D), np.dtype(np.float16))}
        run = flash_launch(att, tensors)
        q, k, v = (view for view in run.views[:3])
        assert (q.shape, k.shape, v.shape) == ((B, H, S, D),) * 3
        assert q.strides == k.strides == v.strides == (S * 3 * E, D, 3 * E)
        assert [x.offset for x in (q, k, v)] == [0, E, 2 * E]
        assert [a.ptr for a in run.args[:3]] == [(1 << 20) + 2 * o for o in (0, E, 2 * E)]  # fp16: 2 bytes
        assert run.views[3].strides == (S * E, D, E)  # the output written [B, S, H, D]
        assert run.grid == (1, H, B)


def test_rope_on_q_keeps_q_apart_in_a_profile_build():
    """An elementwise reader of q's heads (RoPE) would read its column slice through absorb_views,
    which is static-shape only (the Split would stay a copy): q stays apart, k and v pack."""
    model = _model(rope=True)
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[PROFILE]))
    widths = sorted(layer.out_shapes[0][-1] for layer in plan.layers if layer.kind in GEMMS)
    assert widths == [E, E, 2 * E], widths
    assert "Split" not in {layer.kind for layer in plan.layers}  # k and v: views of their packed GEMM
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    from polykit.runtime.engine import Engine

    with Engine(plan).create_execution_context() as ctx:
        f = _feeds(3, 17)
        np.testing.assert_allclose(ctx.execute(f)["y"], session.run(None, f)[0], rtol=1e-5, atol=1e-5)


def _flattened_block():
    """q, k, v projections of x flattened to [batch * seq, E], their heads reshaped to [batch, seq,
    H, D] by a target read from Shape(x): a view of the packed [batch * seq, 3E] would have to split
    a merged dynamic dim."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = {f"w{n}": (rng.standard_normal((E, E)) / np.sqrt(E)).astype(np.float32) for n in "qkv"}
    inits.update(flat=np.array([-1, E], np.int64), heads=np.array([H, D], np.int64), zero=np.array([0], np.int64),
                 two=np.array([2], np.int64), scale=np.array(D ** -0.5, np.float32))
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["x2"]), helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Slice", ["xs", "zero", "two"], ["bs"]),
             helper.make_node("Concat", ["bs", "heads"], ["target"], axis=0)]
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x2", f"w{n}"], [f"{n}m"], name=f"{n}_proj"),
                  helper.make_node("Reshape", [f"{n}m", "target"], [f"{n}4"]),
                  helper.make_node("Transpose", [f"{n}4"], [f"{n}h"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s1"]),
              helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "vh"], ["y"])]
    graph = helper.make_graph(nodes, "flattened", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", E])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_projections_of_a_merged_dynamic_dim_stay_apart():
    model = _flattened_block()
    profile = Profile({"x": ((1, 5, E), (4, 32, E), (6, 40, E))})
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[profile]))
    assert sorted(layer.out_shapes[0][-1] for layer in plan.layers if layer.kind in GEMMS) == [E, E, E]
    assert "Split" not in {layer.kind for layer in plan.layers}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    from polykit.runtime.engine import Engine

    with Engine(plan).create_execution_context() as ctx:
        f = {"x": _feeds(3, 17)["x"]}
        np.testing.assert_allclose(ctx.execute(f)["y"], session.run(None, f)[0], rtol=1e-5, atol=1e-5)


def test_symbolic_view_of_a_column_slice_and_its_refusals():
    from polykit.compiler.ir.symbolic import mul
    from polykit.compiler.passes.fold_attention_layouts import _symbolic_view

    b, s = SymInt(4, symbol("batch")), SymInt(8, symbol("seq"))
    heads = [("reshape", (b, s, 3, 32)), ("transpose", (0, 2, 1, 3))]
    assert _symbolic_view((b, s, 288), [("slice", 2, 96, 96, 1), *heads]) == \
        [96, "#0", 3, "#1", 32, ["*", 288, "#1"], 32, 288, 1]
    merged = SymInt(32, mul(symbol("batch"), symbol("seq")))  # [B*S, 3E]: B and S are no source dim
    assert _symbolic_view((merged, 288), [("slice", 1, 96, 96, 1), *heads]) is None
    # [B, S, 96] -> [8, B, 96] holds at opt (B 4, S 8) only: 8 * B is no B * S
    assert _symbolic_view((b, s, 96), [("reshape", (8, b, 3, 32)), ("transpose", (0, 2, 1, 3))]) is None
    assert _symbolic_view((b, b, 96), [("reshape", (b, b, 3, 32))]) is None  # two dims of one expression


def test_a_dynamic_view_evaluates_at_bound_shapes_and_at_build_symbols():
    raw = [96, "#0", 3, "#1", 32, ["*", 288, "#1"], 32, 288, 1]
    view = decode_view(raw, (2, 7, 288))
    assert (view.offset, view.shape, view.strides) == (96, (2, 3, 7, 32), (7 * 288, 32, 288, 1))
    b, s = SymInt(4, symbol("batch")), SymInt(32, symbol("seq"))
    built = operand_view({"k_view": raw}, 1, (b, s, 288))
    assert [str(getattr(d, "expr", d)) for d in built.shape] == ["batch", "3", "seq", "32"]
    assert int(built.strides[0]) == 32 * 288


@pytest.mark.parametrize("raw, shape, match", [
    ([0, "#2", 3, 5, 32, ["*", 288, "#1"], 32, 288, 1], (2, 7, 288), "past the"),  # #2 = 288 rows of 7
    ([0, "#3", 3, 7, 32, 2016, 32, 288, 1], (2, 7, 288), "does not have"),
    ([0, "b", 3, 7, 32, 2016, 32, 288, 1], (2, 7, 288), "no int"),
    ([0, ["-", "#0", 1], 3, 7, 32, 2016, 32, 288, 1], (2, 7, 288), "not an integer"),
])
def test_malformed_dynamic_views_are_refused(raw, shape, match):
    with pytest.raises(ViewError, match=match):
        operand_view({"q_view": raw}, 0, shape)


@pytest.mark.gpu
def test_cuda_fp16_profile_plan_of_the_block_matches_the_cpu_plan():
    from polykit.runtime.engine import Engine

    cpu = build_plan(_model(), BuilderConfig(target="cpu", profiles=[PROFILE]))
    cuda = build_plan(_model(), BuilderConfig(target="cuda", fp16=True, profiles=[PROFILE]))
    assert sum(1 for layer in cuda.layers if layer.kind in GEMMS) == 2
    with Engine(cpu).create_execution_context() as want, Engine(cuda).create_execution_context() as got:
        for B, S in SHAPES:
            f = _feeds(B, S)
            np.testing.assert_allclose(got.execute(f)["y"].astype(np.float32), want.execute(f)["y"],
                                       rtol=2e-2, atol=2e-2)
