"""benchmarks/fp8_gemm_one.py without a GPU: BERT's feed-forward block in FP8 builds its FFN1 as BERT's plan does (bias
in B, Gelu alone in the epilogue, an e4m3 output for FFN2) and takes each forced FP8 GEMM tactic (a stand-in sm_90
device, level 0: nothing compiled or timed); the script runs end to end on the cpu target."""

from __future__ import annotations

import sys

import pytest

from benchmarks.fp8_gemm_one import fp8_block, ffn_block, main
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from tests.compiler.test_fp8_gemm_plan import stand_in_sm90

ROWS = 64


@pytest.mark.parametrize("tactic", ["cuda.fp8.gemm_fast_sm90_128x192", "cuda.fp8.gemm_sm90_128x192",
                                    "cuda.fp8.gemm_fast_rolled_sm90_128x192"])
def test_the_fp8_block_runs_ffn1_as_berts_plan_on_the_forced_tactic(monkeypatch, tactic):
    stand_in_sm90(monkeypatch)
    plan = build_plan(fp8_block(ROWS), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                                     tactic_replay={"ffn1": tactic}))
    (ffn1,) = [layer for layer in plan.layers if layer.name == "ffn1"]
    assert ffn1.tactic == tactic and ffn1.precision == "fp8"
    assert ffn1.out_dtypes == ("float8_e4m3fn",) and ffn1.inputs[5]  # requantized for FFN2; the bias in B
    assert [step["op"] for step in ffn1.attrs["epilogue"]["body"]] == ["Gelu"]
    # FFN2 on fp8_sm90's conv tiles (kernel conv_sm90): ncu's `regex:gemm_sm90` sees FFN1 alone (gpu_first_run s28f)
    (ffn2,) = [layer for layer in plan.layers if layer.name == "ffn2"]
    assert ffn2.tactic.startswith("cuda.fp8.sm90_"), ffn2.tactic


@pytest.mark.parametrize("tactic,act", [("cuda.gemm.sm90_128x192", "gelu"), ("cuda.gemm.sm90_128x192", "none"),
                                        ("cuda.gemm.sm90_rolled_128x192", "gelu")])
def test_the_fp16_block_runs_ffn1_on_the_fp16_gemm(monkeypatch, tactic, act):
    """(Without an activation FFN1 is a Gemm with its bias as C and no epilogue, which the rolled tiles leave to
    their twins: gpu_first_run.sh's s31a forces them with the Gelu only.)"""
    stand_in_sm90(monkeypatch)
    plan = build_plan(ffn_block(ROWS, act=act), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                                              tactic_replay={"ffn1": tactic}))
    (ffn1,) = [layer for layer in plan.layers if layer.name == "ffn1"]
    assert ffn1.tactic == tactic and ffn1.out_dtypes == ("float16",)


def test_the_script_runs_on_the_cpu_target(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["fp8_gemm_one.py", "--rows", "16", "--target", "cpu", "--runs", "1",
                                      "--tactics", "cpu.int8.float64"])
    main()
    out = capsys.readouterr().out
    assert "cpu.int8.float64: M=16 FP8" in out and "ffn1" in out and "ffn2" in out


@pytest.mark.parametrize("act,body", [("relu", ["Relu"]), ("none", [])])
def test_ffn1s_activation_is_the_flags(monkeypatch, act, body):
    """--act: Relu or nothing in Gelu's place, the same GEMM otherwise (what the Gelu costs in FFN1's epilogue)."""
    stand_in_sm90(monkeypatch)
    plan = build_plan(fp8_block(ROWS, act=act), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                                              tactic_replay={"ffn1": "cuda.fp8.gemm_fast_sm90_128x192"}))
    (ffn1,) = [layer for layer in plan.layers if layer.name == "ffn1"]
    assert ffn1.tactic == "cuda.fp8.gemm_fast_sm90_128x192" and ffn1.out_dtypes == ("float8_e4m3fn",)
    assert [step["op"] for step in (ffn1.attrs.get("epilogue") or {"body": []})["body"]] == body
