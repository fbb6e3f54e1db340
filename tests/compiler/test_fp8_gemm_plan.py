"""A BERT-like explicit FP8 plan on the FP8 GEMM tiles (kernels/cuda/int8/fp8_gemm_sm90.py): a level-0 build keeps
every FP8 layer on fp8_sm90's conv tiles (CPU: a stand-in sm_90 device, nothing timed or compiled), a tactic replay
forces them onto the GEMM tiles, and on an H100 / H200 the forced plan computes what the conv-tile plan does
(gpu)."""

from __future__ import annotations

import pytest

from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.tactic_replay import build_with_tactics
from polykit.compiler.builder.builder import build_plan
from polykit.kernels.tactics import find_tactic
from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq

from tests.dynamic_models import tiny_bert
from .fp8_models import assert_forced_plan_matches, assert_replayed, skip_unless_sm90
from .passes.test_absorb_quantized_casts import SHAPES, bert_feeds

GEMM_TILES = ("128x192", "128x256", "128x160", "128x128", "64x96")


@pytest.fixture(scope="module")
def fp8_bert():
    model = tiny_bert()
    return insert_fp8_qdq(model, calibrate_fp8(model, [bert_feeds(s) for s in range(2)], input_shapes=SHAPES))


def fp8_layers(plan):
    return [layer for layer in plan.layers if layer.precision == "fp8" and layer.kind == "QConvNHWC"]


def on_gemm_tiles(plan, tile: str) -> dict[str, str]:
    """Each FP8 layer of `plan` on the GEMM tactic of `tile` (all of them are GEMMs over rows)."""
    name = f"cuda.fp8.gemm_sm90_{tile}"
    layers = fp8_layers(plan)
    assert layers and all(find_tactic("cuda", "QConvNHWC", name).supports(layer) for layer in layers)
    return {layer.name: name for layer in layers}


def stand_in_sm90(monkeypatch):
    from polykit.compiler.builder import builder
    from polykit.runtime.cuda.driver import DeviceInfo

    monkeypatch.setattr(builder, "build_device",
                        lambda target, device=None: DeviceInfo(0, "stand-in sm_90", "sm_90", 132, 80 << 30, 232448))


CONFIG = BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0, input_shapes=SHAPES)


@pytest.mark.parametrize("tile", ["128x192", "64x96"])
def test_a_level_0_fp8_bert_keeps_the_conv_tiles_and_a_replay_moves_it_onto_the_gemm_tiles(fp8_bert, monkeypatch,
                                                                                            tile):
    stand_in_sm90(monkeypatch)
    plan = build_plan(fp8_bert, CONFIG)
    layers = fp8_layers(plan)
    # Q, K, V (fused or not), the attention output, FFN1, FFN2 of each encoder layer
    assert len(layers) >= 4 and all(layer.tactic.startswith("cuda.fp8.sm90_") for layer in layers), \
        [(layer.name, layer.tactic) for layer in layers]
    forced = build_with_tactics(fp8_bert, on_gemm_tiles(plan, tile), CONFIG)
    assert_replayed(plan, forced, fp8_layers, f"cuda.fp8.gemm_sm90_{tile}", lambda layer: layer.precision != "fp8")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", GEMM_TILES)
def test_an_fp8_bert_on_the_gemm_tiles_matches_the_conv_tile_plan(fp8_bert, tile):
    skip_unless_sm90()
    plan = build_plan(fp8_bert, CONFIG)
    forced = build_with_tactics(fp8_bert, on_gemm_tiles(plan, tile), CONFIG)
    cpu = build_plan(fp8_bert, BuilderConfig(target="cpu", fp16=True, input_shapes=SHAPES))
    assert_forced_plan_matches(plan, forced, cpu, bert_feeds, cpu_cosine=0.999)


def test_an_fp8_ffn1_with_an_e4m3_output_takes_the_16_bit_gelu(fp8_bert, monkeypatch):
    """BERT's FFN1 in an FP8 plan: bias, Gelu, then e4m3 for FFN2. Its GELU is stored in 8 bits, so the kernel
    takes pointwise.cuh's 16-bit form (PK_GELU16, epilogue.py; a float32 output keeps erff's:
    tests/kernels/cuda/test_epilogue_classes.py)."""
    stand_in_sm90(monkeypatch)
    plan = build_plan(fp8_bert, CONFIG)
    ffn1 = [layer for layer in fp8_layers(plan) if layer.out_dtypes[0] == "float8_e4m3fn"
            and "Gelu" in str(layer.attrs.get("epilogue"))]
    assert ffn1, [(layer.name, layer.out_dtypes) for layer in fp8_layers(plan)]
    for tile in ("cuda.fp8.gemm_sm90_128x192", "cuda.fp8.gemm_fast_sm90_128x192", ffn1[0].tactic):
        tactic = find_tactic("cuda", "QConvNHWC", tile)
        assert tactic.supports(ffn1[0])
        assert all("#define PK_GELU16 1" in k.render() for k in tactic.kernels(ffn1[0]))
