"""fuse_output_quantize: a LayerNorm whose output an e4m3 QuantizeLinear reads writes the e4m3 tensor itself
(ai.polykit LayerNormQuantize), and its float output too where others read it (the residual); an Attention
whose output reaches such a QuantizeLinear through views writes e4m3 (AttentionQuantize) and the views reshape
that; plans compute bit for bit what the separate QuantizeLinear layers computed (cpu target), in float32 and
in fp16."""

from __future__ import annotations

import numpy as np
import pytest

import polykit.compiler.passes as passes
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ops.quant.attention_quantize import KIND as ATTENTION_KIND
from polykit.compiler.ops.quant.layernorm_quantize import KIND
from polykit.compiler.passes import fuse_output_quantize
from polykit.kernels.tactics import find_tactic
from polykit.runtime.engine import Engine
from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq
from tests.compiler.passes.passes_testkit import graph, node, op_counts, run_and_compare
from tests.compiler.passes.test_pack_quantized_gemms import attention_block, feeds
from tests.compiler.fp8_models import E4M3

FUSED = f"ai.polykit:{KIND}"  # op_counts' key of a node of the ai.polykit domain


@pytest.fixture(scope="module")
def fp8_block():
    model = attention_block()
    return insert_fp8_qdq(model, calibrate_fp8(model, [feeds(0)]))


@pytest.mark.parametrize("fp16", [False, True])
def test_the_block_s_layer_norm_and_attention_write_e4m3_and_the_outputs_stay_the_same(fp8_block, monkeypatch, fp16):
    config = BuilderConfig(target="cpu", fp16=fp16)
    plan = build_plan(fp8_block, config)
    (fused,) = [layer for layer in plan.layers if layer.kind == KIND]
    # read by the packed Q/K/V GEMM (e4m3) and by the residual Add in the output projection's epilogue (float)
    assert fused.out_dtypes == ("float8_e4m3fn", "float16" if fp16 else "float32")
    # the attention writes e4m3 [B, S, H, D]; the merge of its heads is a view of that
    (attention,) = [layer for layer in plan.layers if layer.kind == ATTENTION_KIND]
    assert attention.out_dtypes == ("float8_e4m3fn",) and attention.attrs.get("out_layout") == "bshd"
    assert not any(layer.kind == "QuantizeLinear" for layer in plan.layers)
    with monkeypatch.context() as m:
        m.setattr(passes, "fuse_output_quantize", lambda graph, **_: False)
        before = build_plan(fp8_block, config)
    assert sum(layer.kind == "QuantizeLinear" for layer in before.layers) == 2
    assert len(before.layers) == len(plan.layers) + 2
    for seed in (1, 2):
        got = Engine(plan).create_execution_context().execute(feeds(seed))
        want = Engine(before).create_execution_context().execute(feeds(seed))
        np.testing.assert_array_equal(got["y"], want["y"])


def norm_then_quantize(zero=np.zeros((), E4M3), saturate=1, also=False):
    """x -> LayerNorm -> y -> QuantizeLinear(scale 0.01, `zero`) -> q [; y -> Relu -> r when `also`]."""
    nodes = [node("LayerNormalization", ["x", "g", "b"], "y", axis=-1),
             node("QuantizeLinear", ["y", "s", "z"], "q", saturate=saturate)]
    outputs = ["q"]
    if also:
        nodes.append(node("Relu", ["y"], "r"))
        outputs.append("r")
    inits = {"g": np.linspace(0.5, 1.5, 16).astype(np.float32), "b": np.linspace(-0.2, 0.2, 16).astype(np.float32),
             "s": np.array(0.01, np.float32), "z": zero}
    return graph(nodes, {"x": (3, 16)}, outputs, inits)


def test_a_quantize_alone_on_the_norm_makes_one_output():
    g, changed = run_and_compare(norm_then_quantize(), fuse_output_quantize)
    assert changed and op_counts(g) == {FUSED: 1}
    assert g.nodes[0].outputs == ["q"] and g.nodes[0].inputs[3:] == ["s", "z"]


def test_another_reader_of_the_norm_keeps_its_float_output():
    g, changed = run_and_compare(norm_then_quantize(also=True), fuse_output_quantize)
    assert changed and op_counts(g) == {FUSED: 1, "Relu": 1}
    assert next(n for n in g.nodes if n.op_type == KIND).outputs == ["q", "y"]


@pytest.mark.parametrize("model", [norm_then_quantize(zero=np.zeros((), np.int8)),    # int8: not this form
                                   norm_then_quantize(saturate=0),                     # e4m3 without saturation
                                   norm_then_quantize(zero=np.full((), -0.0, E4M3))])  # a -0 zero point
def test_other_quantizations_stay_as_written(model):
    assert not fuse_output_quantize(model)


def test_a_fused_layer_no_cuda_tactic_runs_is_left_as_its_producer_and_quantize_linear(fp8_block, monkeypatch, caplog):
    """A float32 cuda build (as for sm_90, nothing compiled): no cuda tactic runs a float32 AttentionQuantize
    (the flash kernels store 16-bit types), so the attention and its QuantizeLinear stay layers, with a warning;
    the float32 LayerNorm's e4m3 output stage runs on cuda.norm.warp and stays."""
    from benchmarks.dynamic_vs_static import pretend_gpu

    with monkeypatch.context() as m:
        from polykit.compiler.builder import builder as builder_module
        from polykit.compiler.builder import tuner as tuner_module

        m.setattr(builder_module, "build_device", builder_module.build_device)
        m.setattr(tuner_module.Tuner, "device", tuner_module.Tuner.device)
        pretend_gpu("sm_90")
        plan = build_plan(fp8_block, BuilderConfig(target="cuda", builder_optimization_level=0))
    kinds = [layer.kind for layer in plan.layers]
    assert KIND in kinds and ATTENTION_KIND not in kinds and "Attention" in kinds and "QuantizeLinear" in kinds
    assert "no cuda quantized-output tactic runs" in caplog.text


def test_the_fp8_attention_takes_the_sm90_flash_tactics_where_the_fp16_one_does(monkeypatch):
    """Heads of 64 (E 128, 2 heads) built for cuda as for sm_90, nothing timed or compiled: at level 0 the
    AttentionQuantize layer gets the tactic the fp16 model's Attention gets; every flash_sm90 tactic that takes
    that Attention takes it too (FLASH_Q8 kernels), so a timed build can pick them, and a replay forcing
    flash_sm90 builds."""
    from polykit.compiler.builder import builder as builder_module
    from polykit.compiler.builder.tactic_replay import build_with_tactics
    from polykit.kernels.tactics import candidates
    from polykit.runtime.cuda.driver import DeviceInfo

    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: DeviceInfo(
        0, "stand-in sm_90", "sm_90", 132, 80 << 30, 232448))
    dims = (2, 24, 128, 2)
    model = attention_block(dims=dims)
    fp8 = insert_fp8_qdq(model, calibrate_fp8(model, [feeds(0, dims[:3])]))
    config = BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0)
    (quantized,) = [layer for layer in build_plan(fp8, config).layers if layer.kind == ATTENTION_KIND]
    (plain,) = [layer for layer in build_plan(model, config).layers if layer.kind == "Attention"]
    assert quantized.tactic == plain.tactic
    sm90 = [t.name for t in candidates("cuda", "Attention", plain, arch="sm_90") if "sm90" in t.name]
    assert len(sm90) == 4
    assert [t.name for t in candidates("cuda", ATTENTION_KIND, quantized, arch="sm_90") if "sm90" in t.name] == sm90
    for name in sm90:
        (kernel,) = find_tactic("cuda", ATTENTION_KIND, name).kernels(quantized)
        assert dict(kernel.defines)["FLASH_Q8"] == "1" and kernel.arch == "sm_90a"
    forced = build_with_tactics(fp8, {quantized.name: "cuda.attention.flash_sm90"}, config)
    assert [layer.tactic for layer in forced.layers if layer.kind == ATTENTION_KIND] == ["cuda.attention.flash_sm90"]
