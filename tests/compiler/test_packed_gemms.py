"""Horizontal GEMM fusion end to end (passes.pack_gemms): attention blocks with separate q, k, v
projections (bias on all, none, or q and v only; odd sequence lengths and head sizes; masks) and
a gated MLP (whose gate and up stay apart: SiLU(gate) * up is the up GEMM's epilogue). The cpu plan
against onnxruntime; the cuda fp16 plan (level 0, no GPU needed) runs one GEMM for q, k, v, its
readers read column slices of it as views (no Split, Slice or copy layer); the gpu test runs the
cuda plan against the cpu plan."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder import builder as builder_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from tests.compiler.packed_gemm_models import attention_block, feeds, gated_mlp

#: layers that would copy a slice of the packed projection
COPIES = {"Transpose", "Gather", "Split", "Slice", "PermutedCopy", "Copy"}
GEMMS = {"MatMul", "Gemm"}
CUDA_FP16 = BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0)

BLOCKS = {
    "bert": lambda: attention_block(2, 13, 3, 32, "additive"),
    "bert_head_24": lambda: attention_block(1, 13, 3, 24, "additive"),  # no flash kernel: attention.simple
    "whisper_k_no_bias": lambda: attention_block(1, 17, 2, 64, None, bias="qv", q_scale=True),  # 0.125 folds
    "t5_no_bias_rope": lambda: attention_block(2, 9, 4, 32, "causal", bias="none", rope=True),
    "gated_mlp": lambda: gated_mlp(2, 11, 48, 136),
}


def _run(plan, f):
    from polykit.runtime.engine import Engine

    with Engine(plan).create_execution_context() as ctx:
        return ctx.execute(f)["y"]


def _gemm_widths(plan) -> list[int]:
    return [layer.out_shapes[0][-1] for layer in plan.layers if layer.kind in GEMMS]


@pytest.mark.parametrize("case", sorted(BLOCKS))
def test_cpu_plan_of_a_packed_block_matches_onnxruntime(case):
    model = BLOCKS[case]()
    f = feeds(model)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]
    plan = build_plan(model, BuilderConfig(target="cpu"))
    np.testing.assert_allclose(_run(plan, f), want, rtol=1e-4, atol=1e-5)
    widths = _gemm_widths(plan)
    if case == "gated_mlp":  # gate, up (its epilogue SiLU(gate) * up), down
        assert widths == [136, 136, 48], widths
        return
    e = model.graph.input[0].type.tensor_type.shape.dim[-1].dim_value
    assert widths == [3 * e, e], widths  # one packed projection, then the output projection
    packed = next(layer for layer in plan.layers if layer.kind in GEMMS)
    assert {"q_proj", "k_proj", "v_proj"} <= set(packed.fused_nodes), packed.fused_nodes  # precisions name them


@pytest.mark.parametrize("case", sorted(BLOCKS))
@pytest.mark.parametrize("arch", [None, "sm_90"])
def test_cuda_fp16_plan_runs_one_projection_gemm_and_reads_its_slices_as_views(case, arch, monkeypatch):
    from polykit.runtime.cuda.driver import DeviceInfo

    gpu = None if arch is None else DeviceInfo(0, f"test GPU {arch}", arch, 132, 80 << 30, 227 * 1024)
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: gpu)
    plan = build_plan(BLOCKS[case](), CUDA_FP16)
    kinds = Counter(layer.kind for layer in plan.layers)
    assert sum(kinds[k] for k in COPIES) == 0, kinds
    assert sum(kinds[k] for k in GEMMS) == (3 if case == "gated_mlp" else 2), kinds
    packed = next(layer for layer in plan.layers if layer.kind in GEMMS)
    readers = [layer for layer in plan.layers if packed.outputs[0] in layer.inputs]
    if case == "gated_mlp":  # the gate GEMM (SiLU epilogue) is read by the up GEMM's epilogue: no Pointwise
        assert kinds["Pointwise"] == 0 and [r.kind for r in readers] == ["MatMul"], kinds
    else:
        (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
        assert att.tactic.startswith("cuda.attention.simple" if case == "bert_head_24" else "cuda.attention.flash")
        assert att.inputs[2] == packed.outputs[0] and att.attrs.get("v_view") is not None  # V: a view of the pack
        if case == "t5_no_bias_rope":  # q through its elementwise RoPE Mul, which reads q's slice as a view
            (pw,) = [layer for layer in readers if layer.kind == "Pointwise"]
            assert pw.attrs.get("view"), pw.attrs
        else:  # Whisper's q scale is folded into q's columns: no Pointwise left
            assert att.inputs[0] == att.inputs[1] == packed.outputs[0] and kinds["Pointwise"] == 0, kinds


def test_a_build_without_fusion_keeps_the_projections_apart():
    from dataclasses import replace

    plan = build_plan(BLOCKS["bert"](), replace(CUDA_FP16, fuse=False))
    assert sum(1 for layer in plan.layers if layer.kind in GEMMS) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(BLOCKS))
def test_cuda_fp16_plan_of_a_packed_block_matches_the_cpu_plan(case):
    model = BLOCKS[case]()
    f = feeds(model)
    want = _run(build_plan(model, BuilderConfig(target="cpu")), f)
    got = _run(build_plan(model, BuilderConfig(target="cuda", fp16=True)), f)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2)
