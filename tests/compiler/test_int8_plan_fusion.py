"""INT8 plans keep activations 8-bit between INT8 layers (docs/INT8.md, "No float round trips"):
a layer's requantization, a residual read as int8, MaxPool on int8; no standalone QuantizeLinear
between INT8 convolutions. The fused plan computes the quantized model as written."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.calibrate import calibrate
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import Graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes.insert_qdq import constant_tensors, int8_candidates
from polykit.runtime.engine import Runtime
from tests.conv_models import resnet

from .int8_models import feeds_for


def two_block_resnet():
    """ResNet-50's structure with two blocks in the first stages: an identity-shortcut block (the
    residual is the previous block's output) after each downsampling one."""
    return resnet(depths=(2, 2, 1, 1), width=8, image=16, batch=2)


def ranges(graph: Graph) -> dict[str, tuple[float, float]]:
    names = list(dict.fromkeys(x for _, x in int8_candidates(graph, constant_tensors(graph))))
    batches = [feeds_for(two_block_resnet(), seed) for seed in range(3)]
    scales = calibrate(graph, names, batches, "cpu", "minmax")
    return {name: (-127 * s, 127 * s) for name, s in scales.items()}


def run(plan, feeds):
    with Runtime(plan.target).deserialize_engine(plan) as engine:
        return next(iter(engine.create_execution_context().execute(feeds).values()))


@pytest.fixture(scope="module")
def resnet_int8():
    graph = load_onnx(two_block_resnet())
    config = dict(target="cpu", int8=True, tensor_ranges=ranges(graph), channels_last=True)
    return graph, config, build_plan(graph, BuilderConfig(**config))


def test_no_quantize_layer_sits_between_int8_convolutions(resnet_int8):
    _, _, plan = resnet_int8
    kinds = [layer.kind for layer in plan.layers]
    producers = {out: layer for layer in plan.layers for out in layer.outputs}
    quantizers = [layer for layer in plan.layers if layer.kind in ("QuantizeLinear", "QuantizeNHWC")]
    # only the image (quantized to NHWC, padded: fuse_quantize_nhwc) and the classifier's input (after
    # the average pool) are quantized by a layer
    assert [(q.kind, producers.get(q.inputs[0]) and producers[q.inputs[0]].kind) for q in quantizers] == [
        ("QuantizeNHWC", None), ("QuantizeLinear", "Flatten")]
    # 23 convolutions and the classifier's GEMM (a 1x1 conv over its rows: symmetric INT8)
    assert "DequantizeLinear" not in kinds and kinds.count("QConvNHWC") == 24 and "QMatMul" not in kinds


def test_max_pool_runs_on_int8_written_by_the_stem(resnet_int8):
    _, _, plan = resnet_int8
    pool = next(layer for layer in plan.layers if layer.kind == "MaxPoolNHWC")
    stem = next(layer for layer in plan.layers if layer.outputs[0] == pool.inputs[0])
    assert stem.kind == "QConvNHWC" and stem.out_dtypes == ("int8",) and pool.out_dtypes == ("int8",)


def test_identity_blocks_read_their_residual_as_int8_and_write_int8(resnet_int8):
    _, _, plan = resnet_int8
    residual = [layer for layer in plan.layers
                if layer.kind == "QConvNHWC" and "Cast" in [s["op"] for s in layer.attrs.get("epilogue", {}).get("body", [])]]
    assert len(residual) == 2  # the second block of stages 1 and 2
    dtypes = dict(zip((n for layer in plan.layers for n in layer.outputs),
                      (d for layer in plan.layers for d in layer.out_dtypes)))
    for layer in residual:
        assert [s["op"] for s in layer.attrs["epilogue"]["body"]] == ["Cast", "Mul", "Add", "Relu"]
        assert dtypes[layer.inputs[8]] == "int8" and layer.out_dtypes == ("int8",)


def test_the_fused_int8_plan_computes_the_quantized_model_as_written(resnet_int8, monkeypatch):
    # the reference: the same quantized graph with no INT8 layer folded (every Q and DQ a layer, the
    # convs in float); the INT8 layers' integer sums differ from float convs of dequantized values
    # only by float rounding, which may move a requantized value by one step now and then
    import polykit.compiler.builder.layer_precision as layer_precision

    graph, config, plan = resnet_int8
    runs = layer_precision.has_tactic
    monkeypatch.setattr(layer_precision, "has_tactic",
                        lambda layer, *a, **k: layer.domain != "ai.polykit" and runs(layer, *a, **k))
    as_written = build_plan(graph, BuilderConfig(**config))
    assert {"QuantizeLinear", "DequantizeLinear", "ConvNHWC"} <= {layer.kind for layer in as_written.layers}
    assert not {"QConv", "QConvNHWC", "QMatMul"} & {layer.kind for layer in as_written.layers}
    for seed in (5, 6):
        feeds = feeds_for(two_block_resnet(), seed)
        got, want = run(plan, feeds), run(as_written, feeds)
        cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
        assert cosine > 0.99999 and np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (cosine, got - want)


def shortcut_dtypes(plan) -> list[str]:
    """The dtype of each residual a QConvNHWC's epilogue reads beside its own sums (the input after the
    layer's 8 quantized operands), in plan order."""
    from polykit.compiler.ops.quant.int8 import QUANT_ARITY

    dtype_of = {name: d for layer in plan.layers for name, d in zip(layer.outputs, layer.out_dtypes)}
    return [dtype_of[layer.inputs[QUANT_ARITY]] for layer in plan.layers
            if layer.kind == "QConvNHWC" and "Add" in [s["op"] for s in layer.attrs.get("epilogue", {}).get("body", [])]]


def test_downsampling_blocks_read_their_shortcut_conv_as_int8_when_calibrated(tmp_path):
    """A calibrating build also calibrates each residual Add's later quantized layer output (insert_qdq's
    residual_candidates: the downsampling shortcut convs' outputs), so those convs requantize and the block's
    last conv reads them as int8, like an identity block's input; a cache written without those scales still
    builds and leaves them float32; the int8 plan stays close to the float model either way."""
    from polykit.compiler.builder.calibration_cache import (CalibrationCache, read_calibration_cache,
                                                            write_calibration_cache)

    model = two_block_resnet()
    cache = tmp_path / "int8.cache"
    calibrated = BuilderConfig(target="cpu", int8=True, channels_last=True, calibration_cache=cache,
                               calibration_data=[feeds_for(model, seed) for seed in range(3)])
    plan = build_plan(model, calibrated)
    assert shortcut_dtypes(plan) == ["int8"] * 6  # 2 identity blocks, 4 downsampling ones
    shortcuts = [layer for layer in plan.layers if layer.kind == "QConvNHWC" and layer.out_dtypes == ("int8",)
                 and not layer.attrs.get("epilogue")]
    assert len(shortcuts) == 4, [(layer.name, layer.out_dtypes) for layer in plan.layers]
    saved = read_calibration_cache(cache)
    graph = load_onnx(model)
    needed = {x for _, x in int8_candidates(graph, constant_tensors(graph))}
    extra = set(saved.scales) - needed
    assert len(extra) == 4  # the shortcuts' outputs (named as imported: their batch norms')
    old = tmp_path / "old.cache"  # as a build before residual_candidates wrote it
    write_calibration_cache(old, CalibrationCache(saved.calibrator, {k: v for k, v in saved.scales.items()
                                                                     if k in needed}, type=saved.type))
    older = build_plan(model, BuilderConfig(target="cpu", int8=True, channels_last=True, calibration_cache=old))
    assert sorted(shortcut_dtypes(older)) == ["float32"] * 4 + ["int8"] * 2
    floats = build_plan(model, BuilderConfig(target="cpu"))
    for seed in (5, 6):
        feeds = feeds_for(model, seed)
        want = run(floats, feeds)
        for got in (run(plan, feeds), run(older, feeds)):
            cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
            assert cosine > 0.99, cosine
