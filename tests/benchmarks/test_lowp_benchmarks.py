"""Issue 35's low-precision benchmarks on the cpu target (their path without a GPU, tiny models):
benchmarks/int8_resnet.py builds fp16, INT8 and FP8 plans of a classifier, checks each against onnxruntime's
fp32 output and times them in alternating rounds; benchmarks/fp8_bert.py quantizes a BERT's linear layers
with explicit FP8 Q/DQ and checks the FP8 plan against onnxruntime's reading of the Q/DQ model."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import pytest

from benchmarks import fp8_bert, int8_resnet
from tests.compiler.int8_models import small_resnet
from tests.dynamic_models import tiny_bert


def run_main(module, monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", [module.__file__, *args])
    module.main()


def test_int8_resnet_builds_checks_and_times_fp16_int8_and_fp8_on_the_cpu(tmp_path, monkeypatch):
    onnx.save(small_resnet(), tmp_path / "resnet.onnx")  # input x [2, 3, 16, 16]
    out = tmp_path / "lowp.json"
    run_main(int8_resnet, monkeypatch, "--target", "cpu", "--model", str(tmp_path / "resnet.onnx"), "--batch", "2",
             "--size", "16", "--calibration-batches", "2", "--iters", "1", "--warmup", "0", "--rounds", "2",
             "--cache", str(tmp_path / "caches"), "--out", str(out))
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and set(result["build_s"]) == {"fp16", "int8", "fp8"}
    for name in ("int8", "fp8"):
        assert result[f"{name}_ms"] > 0 and result[f"speedup_{name}_vs_fp16"] > 0
        assert result[f"{name}_faster_in_rounds"].endswith(" of 2") and len(result["rounds_ms"][name]) == 2
        # every product quantized: 17 convolutions and the classifier, none left in fp16 or float
        products = result["products_by_tactic"][name]
        assert sum(products.values()) == 18 and all(f" {name} " in key for key in products), products
        assert sum(result[f"{name}_layers_by_tactic"].values()) == 18
        assert (tmp_path / "caches" / f"resnet50.{name}.cache").is_file()
    assert all(" fp16 " in key for key in result["products_by_tactic"]["fp16"])
    assert all(c >= 0.99 for c in result["cosine_vs_onnxruntime_fp32"].values()), result["cosine_vs_onnxruntime_fp32"]
    # the builds' phases from the build log: the quantized builds calibrated (a fresh cache), the fp16 one did not
    phases = result["build_phases_s"]
    assert "calibrate_s" not in phases["fp16"]
    for name in ("int8", "fp8"):
        assert 0 <= phases[name]["calibrate_s"] <= result["build_s"][name] + 0.1, phases


def test_int8_resnet_takes_one_precision_alone(tmp_path, monkeypatch):
    onnx.save(small_resnet(), tmp_path / "resnet.onnx")
    out = tmp_path / "fp8.json"
    run_main(int8_resnet, monkeypatch, "--target", "cpu", "--model", str(tmp_path / "resnet.onnx"), "--batch", "2",
             "--size", "16", "--precisions", "fp8", "--calibration-batches", "1", "--iters", "1", "--warmup", "0",
             "--rounds", "1", "--out", str(out))
    result = json.loads(out.read_text())
    assert set(result["build_s"]) == {"fp16", "fp8"} and "int8_ms" not in result and "fp8_ms" in result


def test_int8_resnet_refuses_torch_timing_on_the_cpu_target(tmp_path, monkeypatch, capsys):
    onnx.save(small_resnet(), tmp_path / "resnet.onnx")
    out = tmp_path / "never.json"
    with pytest.raises(SystemExit) as info:
        run_main(int8_resnet, monkeypatch, "--target", "cpu", "--model", str(tmp_path / "resnet.onnx"), "--torch",
                 "eager", "--out", str(out))
    assert info.value.code == 2 and "--target cuda" in capsys.readouterr().err and not out.exists()


def test_fp8_bert_quantizes_the_linear_layers_and_matches_onnxruntime_on_the_cpu(tmp_path, monkeypatch):
    onnx.save(tiny_bert(), tmp_path / "bert.onnx")  # 2 layers of hidden 64: 12 linear layers
    out, qdq = tmp_path / "bert.json", tmp_path / "bert_fp8.onnx"
    run_main(fp8_bert, monkeypatch, "--target", "cpu", "--model", str(tmp_path / "bert.onnx"), "--vocab", "1000",
             "--batch", "2", "--seq", "16", "--calibration-batches", "2", "--iters", "1", "--warmup", "0",
             "--rounds", "2", "--save-qdq", str(qdq), "--out", str(out))
    result = json.loads(out.read_text())
    assert result["fp8_ms"] > 0 and result["fp16_ms"] > 0 and result["fp8_faster_in_rounds"].endswith(" of 2")
    # every linear layer in an FP8 layer (each layer's Q, K and V packed into one); the fp16 plan has no quantized layer
    fp8 = result["products_by_tactic"]["fp8"]
    assert sum(fp8.values()) == 8 and all(key.startswith("QMatMul fp8 ") for key in fp8), fp8
    assert not any(" fp8 " in key for key in result["products_by_tactic"]["fp16"])
    ops = [n.op_type for n in onnx.load(str(qdq)).graph.node]
    assert ops.count("DequantizeLinear") == 12 + result["quantized_inputs"] == 12 + ops.count("QuantizeLinear")
    checks = result["checks"]
    # the FP8 plan computes what onnxruntime reads in the Q/DQ model (its other layers in fp16)
    assert checks["fp8_vs_onnxruntime_qdq"]["cosine"] >= 0.9995, checks
    assert checks["fp8_vs_fp16_plan"]["cosine"] >= 0.99 and checks["fp16_vs_onnxruntime_fp32"]["cosine"] >= 0.9995


def test_fp8_bert_save_only_writes_both_models_and_builds_nothing(tmp_path, monkeypatch, capsys):
    onnx.save(tiny_bert(), tmp_path / "bert.onnx")
    qdq, flt, out = tmp_path / "q.onnx", tmp_path / "f.onnx", tmp_path / "never.json"
    run_main(fp8_bert, monkeypatch, "--target", "cpu", "--model", str(tmp_path / "bert.onnx"), "--vocab", "1000",
             "--batch", "2", "--seq", "16", "--calibration-batches", "1", "--save-qdq", str(qdq), "--save-float",
             str(flt), "--save-only", "--out", str(out))
    assert "nothing built" in capsys.readouterr().out and not out.exists()
    float_ops = [n.op_type for n in onnx.load(str(flt)).graph.node]
    assert "QuantizeLinear" not in float_ops and float_ops == [n.op_type for n in tiny_bert().graph.node]
    assert [n.op_type for n in onnx.load(str(qdq)).graph.node].count("DequantizeLinear") >= 12


def test_fp8_tactics_counts_launched_layers_and_the_fp8_bert_launches_as_many_as_the_fp16_one(monkeypatch):
    """benchmarks/fp8_tactics.py's summary of cuda plans built as for sm_90 (nothing timed or compiled): a tiny BERT
    with explicit FP8 Q/DQ launches as many layers as its fp16 plan (Q, K, V one FP8 GEMM; the LayerNorms write
    e4m3) but for its attentions' two QuantizeLinear layers: its heads of 16 have no flash kernel, so the
    attention runs on cuda.attention.simple and its QuantizeLinear stays (the builder's fallback); views are
    counted apart."""
    from benchmarks import fp8_tactics
    from benchmarks.dynamic_vs_static import pretend_gpu
    from polykit.compiler.builder import builder as builder_module
    from polykit.compiler.builder import tuner as tuner_module
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq

    shapes = {"input_ids": (2, 16), "attention_mask": (2, 16)}
    feeds = {"input_ids": np.arange(32, dtype=np.int64).reshape(2, 16), "attention_mask": np.ones((2, 16), np.int64)}
    model = tiny_bert()
    qdq = insert_fp8_qdq(model, calibrate_fp8(model, [feeds], input_shapes=shapes))
    monkeypatch.setattr(builder_module, "build_device", builder_module.build_device)
    monkeypatch.setattr(tuner_module.Tuner, "device", tuner_module.Tuner.device)
    pretend_gpu(fp8_tactics.ARCH)
    config = BuilderConfig(target="cuda", fp16=True, input_shapes=shapes, builder_optimization_level=0)
    fp8 = fp8_tactics.summary(build_plan(qdq, config), 0.0, layers=True)
    fp16 = fp8_tactics.summary(build_plan(model, config), 0.0, layers=False, fp8=False)
    assert fp8["products"] == fp8["products_on_fp8_sm90"] == fp16["products"] == 8  # 2 layers: QKV, out, 2 MLP
    assert fp8["non_view_layers"] == fp16["non_view_layers"] + 2 and fp8["non_view_layers"] < fp8["layers"]
    others = fp8["other_layers_by_tactic"]
    assert others["QuantizeLinear fp16 cuda.quantize"] == 2 and others["LayerNormQuantize fp16 cuda.norm.warp"] == 4
    assert not any(key.startswith("AttentionQuantize") for key in others)
    assert fp8["kernel_units"] > 0


def test_fp8_tactics_counts_every_fp8_tensor_core_family_as_fp8():
    """benchmarks/fp8_tactics.py's `products_on_fp8_sm90` counts a product on any FP8 tensor-core tactic: the conv
    tiles, the GEMM tiles over rows (their rolled variants too) and the conv tiles with pieces (a timed plan picks the
    latter two), and no other QConvNHWC tactic (INT8's)."""
    from benchmarks import fp8_tactics
    import polykit.kernels.cuda  # noqa: F401  (registers the cuda tactics)
    from polykit.kernels.tactics import all_tactics

    names = [t.name for t in all_tactics("cuda") if t.kind == "QConvNHWC"]
    fp8 = [n for n in names if n.startswith("cuda.fp8.")]
    assert {n.split("cuda.fp8.")[1].rsplit("_", 1)[0] for n in fp8} >= {"sm90", "gemm_sm90", "conv_sm90",
                                                                       "gemm_fast_sm90", "conv_fast_sm90",
                                                                       "gemm_fast_rolled_sm90"}
    assert all(n.startswith(fp8_tactics.FP8_TACTIC) for n in fp8), fp8
    assert not any(n.startswith(fp8_tactics.FP8_TACTIC) for n in names if n not in fp8)


def test_compare_layers_puts_each_layer_beside_its_namesakes_and_the_largest_loss_first():
    times = {"fp16": [("stem", 0.10), ("conv_a", 0.05), ("conv_b", 0.02), ("cast_out", 0.01)],
             "int8": [("quantize_in", 0.03), ("stem", 0.12), ("conv_a", 0.04), ("conv_b", 0.05)],
             "fp8": [("stem", 0.09), ("conv_a", 0.08), ("conv_b", 0.02)]}
    tactics = {"fp16": {"stem": "t16", "conv_a": "a16", "conv_b": "b16", "cast_out": "c16"},
               "int8": {"quantize_in": "q8", "stem": "t8", "conv_a": "a8", "conv_b": "b8"},
               "fp8": {"stem": "tf8", "conv_a": "af8", "conv_b": "bf8"}}
    cmp = int8_resnet.compare_layers(times, tactics)
    # the largest loss of any plan against fp16: conv_a (fp8 +0.03) ties conv_b (int8 +0.03), then the stem
    assert [row["layer"] for row in cmp["rows"]][2:] == ["stem", "cast_out"]
    assert {row["layer"] for row in cmp["rows"][:2]} == {"conv_a", "conv_b"}
    stem = next(row for row in cmp["rows"] if row["layer"] == "stem")
    assert stem == {"layer": "stem", "fp16_ms": 0.1, "fp16_tactic": "t16", "int8_ms": 0.12, "int8_tactic": "t8",
                    "fp8_ms": 0.09, "fp8_tactic": "tf8"}
    cast = next(row for row in cmp["rows"] if row["layer"] == "cast_out")
    assert cast["int8_ms"] is None and cast["fp8_tactic"] is None
    assert cmp["unmatched_ms"] == {"int8": 0.03, "fp8": 0.0, "fp16": 0.01}
    assert cmp["unmatched_layers"] == {"int8": 1, "fp8": 0, "fp16": 1}
    assert cmp["total_ms"] == {"fp16": 0.18, "int8": 0.24, "fp8": 0.19}
    int8_resnet.print_comparison(cmp, 2, "test")  # prints without a KeyError on a missing namesake
    int8_resnet.print_comparison(cmp, 4, "test")


def test_build_phases_reads_the_calibration_and_tuning_lines_of_the_build_log():
    import logging

    with int8_resnet.BuildPhases() as phases:
        log = logging.getLogger("polykit.compiler.builder.tuner")
        log.info("calibration: %d %s tensors (%s) in %.1f s", 54, "int8", "entropy", 31.25)
        log.info("tuning (level %d): timed %d tactics of %d layers; compiling took %.2f s, timing %.2f s", 3, 200, 60,
                 12.5, 20.25)
        logging.getLogger("polykit").info("something else took 9.0 s")
    assert phases.seconds == {"calibrate_s": 31.2, "compile_s": 12.5, "time_s": 20.2}
    assert logging.getLogger("polykit").handlers.count(phases) == 0  # removed on exit


def test_fp8_bert_save_only_without_a_path_is_a_usage_error(tmp_path, monkeypatch, capsys):
    onnx.save(tiny_bert(), tmp_path / "bert.onnx")
    with pytest.raises(SystemExit) as info:
        run_main(fp8_bert, monkeypatch, "--target", "cpu", "--model", str(tmp_path / "bert.onnx"), "--save-only")
    assert info.value.code == 2 and "--save-qdq" in capsys.readouterr().err
