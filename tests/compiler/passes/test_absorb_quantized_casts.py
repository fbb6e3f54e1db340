"""absorb_quantized_casts: an --fp16 build's Casts after INT8 / FP8 layers and before FP8 layers become their
epilogues' last and first steps; the plans compute what they computed with the Casts as layers, bit for bit (cpu
target)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler import passes
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ops.quant.int8 import QUANT_ARITY
from polykit.runtime.engine import Engine
from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq

from ..int8_models import feeds_for
from tests.conv_models import resnet
from tests.dynamic_models import tiny_bert

SHAPE = (2, 16)
SHAPES = {"input_ids": SHAPE, "attention_mask": SHAPE}


def bert_feeds(seed: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, 1000, SHAPE).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones(SHAPE, np.int64)}


@pytest.fixture(scope="module")
def fp8_bert():
    model = tiny_bert()
    return insert_fp8_qdq(model, calibrate_fp8(model, [bert_feeds(s) for s in range(2)], input_shapes=SHAPES))


def outputs(plan, feeds):
    return Engine(plan).create_execution_context().execute(feeds)


def without_the_pass(monkeypatch):
    monkeypatch.setattr(passes, "absorb_quantized_casts", lambda graph, keep=(): False)


def test_an_explicit_fp8_bert_in_fp16_keeps_no_cast_around_its_fp8_layers_and_the_same_outputs(fp8_bert, monkeypatch):
    config = BuilderConfig(target="cpu", fp16=True, input_shapes=SHAPES, builder_optimization_level=0)
    plan = build_plan(fp8_bert, config)
    fp8 = [layer for layer in plan.layers if layer.precision == "fp8"]
    assert len(fp8) == 8  # 12 linear layers: each layer's Q, K and V packed into one (pack_quantized_gemms)
    # every FP8 layer writes float16 (but the intermediate dense's, requantized to e4m3), residuals read as float16
    assert {layer.out_dtypes[0] for layer in fp8} == {"float16", "float8_e4m3fn"}
    assert sum(layer.out_dtypes[0] == "float16" for layer in fp8) == 6
    residuals = [layer for layer in fp8 if "float16" in layer.in_dtypes[QUANT_ARITY:]]
    assert len(residuals) == 4  # the attention output and output denses of both layers
    casts = [layer for layer in plan.layers if layer.kind == "Cast"]
    produced = {out: layer for layer in plan.layers for out in layer.outputs}
    assert not any(produced.get(c.inputs[0]) in fp8 for c in casts)
    assert not any(c.outputs[0] in layer.inputs for c in casts for layer in fp8)
    without_the_pass(monkeypatch)
    before = build_plan(fp8_bert, config)
    assert sum(layer.kind == "Cast" for layer in before.layers) == len(casts) + 10
    for seed in (3, 4):
        feeds = bert_feeds(seed)
        got, want = outputs(plan, feeds), outputs(before, feeds)
        np.testing.assert_array_equal(got["out"], want["out"])


def test_a_channels_last_fp8_resnet_in_fp16_reads_and_writes_half_around_its_convs_as_the_casts_did(tmp_path,
                                                                                                       monkeypatch):
    model = resnet(depths=(2, 1, 1, 1), width=8, image=16, batch=2)
    config = BuilderConfig(target="cpu", fp16=True, fp8=True, channels_last=True, builder_optimization_level=0,
                           calibration_data=[feeds_for(model, s) for s in range(2)],
                           calibration_cache=tmp_path / "fp8.cache")
    plan = build_plan(model, config)
    convs = [layer for layer in plan.layers if layer.kind == "QConvNHWC"]
    # the stem writes e4m3 for the max pool (quantize_pools: e4m3 pools between FP8 layers), the last block's conv
    # float16 for the global pool (its Cast in the epilogue)
    pool = next(layer for layer in plan.layers if layer.kind == "MaxPoolNHWC")
    assert convs[0].out_dtypes[0] == "float8_e4m3fn" and pool.in_dtypes[0] == "float8_e4m3fn"
    last = convs[-2]  # (convs[-1]: the classifier, float32 logits)
    assert last.out_dtypes[0] == "float16" and last.attrs["epilogue"]["body"][-1]["op"] == "Cast"
    assert "Cast" not in {layer.kind for layer in plan.layers}
    without_the_pass(monkeypatch)
    before = build_plan(model, config)
    assert "Cast" in {layer.kind for layer in before.layers}
    feeds = feeds_for(model, 7)
    np.testing.assert_array_equal(outputs(plan, feeds)["logits"], outputs(before, feeds)["logits"])


def test_a_channels_last_int8_resnet_in_fp16_writes_half_for_its_pool_as_the_cast_did(tmp_path, monkeypatch):
    """The last block's INT8 conv writes float32 for the float16 global pool: the Cast after it becomes its
    epilogue's last step (the cuda INT8 kernels store float16: int8_out.cuh Y_OUT 3), no Cast layer is left, and
    the logits are the ones the Cast layer gave, bit for bit."""
    model = resnet(depths=(1, 1, 1, 1), width=8, image=16, batch=2)
    config = BuilderConfig(target="cpu", fp16=True, int8=True, channels_last=True, builder_optimization_level=0,
                           calibration_data=[feeds_for(model, s) for s in range(2)],
                           calibration_cache=tmp_path / "int8.cache")
    plan = build_plan(model, config)
    convs = [layer for layer in plan.layers if layer.kind == "QConvNHWC" and layer.precision == "int8"]
    last = convs[-2]  # (convs[-1]: the classifier, float32 logits)
    assert last.out_dtypes[0] == "float16" and last.attrs["epilogue"]["body"][-1]["op"] == "Cast"
    assert all(layer.out_dtypes[0] in ("int8", "float32") for layer in convs[:-2]), [l.out_dtypes for l in convs]
    assert "Cast" not in {layer.kind for layer in plan.layers}
    without_the_pass(monkeypatch)
    before = build_plan(model, config)
    assert "Cast" in {layer.kind for layer in before.layers}
    for seed in (7, 8):
        feeds = feeds_for(model, seed)
        np.testing.assert_array_equal(outputs(plan, feeds)["logits"], outputs(before, feeds)["logits"])
