"""Issue 35's low-precision benchmarks on the cpu target (their path without a GPU, tiny models):
benchmarks/int8_resnet.py builds fp16, INT8 and FP8 plans of a classifier, checks each against onnxruntime's
fp32 output and times them in alternating rounds; benchmarks/fp8_bert.py quantizes a BERT's linear layers
with explicit FP8 Q/DQ and checks the FP8 plan against onnxruntime's reading of the Q/DQ model."""

from __future__ import annotations

import json
import sys

import onnx

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


def test_int8_resnet_takes_one_precision_alone(tmp_path, monkeypatch):
    onnx.save(small_resnet(), tmp_path / "resnet.onnx")
    out = tmp_path / "fp8.json"
    run_main(int8_resnet, monkeypatch, "--target", "cpu", "--model", str(tmp_path / "resnet.onnx"), "--batch", "2",
             "--size", "16", "--precisions", "fp8", "--calibration-batches", "1", "--iters", "1", "--warmup", "0",
             "--rounds", "1", "--out", str(out))
    result = json.loads(out.read_text())
    assert set(result["build_s"]) == {"fp16", "fp8"} and "int8_ms" not in result and "fp8_ms" in result


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
