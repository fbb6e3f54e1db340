"""An FP8 ResNet on the FP8 conv tiles with the promotion in pieces (kernels/cuda/int8/fp8_conv_sm90.py): a level-0
build keeps every FP8 conv on fp8_sm90's tiles, a timed level's candidates hold a piece tile for every conv that is
not a GEMM over rows and a GEMM tile (fp8_gemm_sm90.py) for every one that is (CPU: a stand-in sm_90 device, nothing
timed or compiled); a tactic replay forces them onto each piece tile, and on an H100 / H200 the forced plan computes
what the level-0 plan does (gpu)."""

from __future__ import annotations

import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.tactic_replay import build_with_tactics
from polykit.compiler.builder.tuner import LEVELS, candidate_pairs, capped
from polykit.kernels.cuda.int8 import fp8_conv_sm90
from polykit.kernels.cuda.int8.fp8_gemm_sm90 import over_rows
from polykit.kernels.cuda.int8.int8_sm90 import _geometry

from tests.conv_models import resnet
from .fp8_models import assert_forced_plan_matches, assert_replayed, skip_unless_sm90
from .int8_models import feeds_for
from .test_fp8_gemm_plan import stand_in_sm90

PIECE_TILES = [t.label for t, _, _ in fp8_conv_sm90.TILES]


@pytest.fixture(scope="module")
def fp8_resnet(tmp_path_factory):
    """A ResNet-shaped model of 16..512 channels (C % 16: every conv an FP8 QConvNHWC the sm90 tiles take) and its
    FP8 calibration cache (made on the cpu target)."""
    model = resnet(depths=(2, 1, 1, 1), width=16, image=32, batch=2)
    cache = tmp_path_factory.mktemp("fp8conv") / "fp8.cache"
    build_plan(model, BuilderConfig(target="cpu", fp8=True, calibration_cache=cache, builder_optimization_level=0,
                                    calibration_data=[feeds_for(model, seed) for seed in range(2)]))
    return model, cache


def config(cache, level: int = 0) -> BuilderConfig:
    return BuilderConfig(target="cuda", fp16=True, fp8=True, calibration_cache=cache, builder_optimization_level=level)


def fp8_convs(plan):
    return [layer for layer in plan.layers if layer.precision == "fp8" and layer.kind == "QConvNHWC"]


def test_a_level_0_fp8_resnet_keeps_the_conv_tiles_and_a_timed_level_times_the_piece_and_gemm_tiles(fp8_resnet,
                                                                                                      monkeypatch):
    model, cache = fp8_resnet
    stand_in_sm90(monkeypatch)
    plan = build_plan(model, config(cache))
    convs = fp8_convs(plan)  # 20 convs and the classifier (a 1x1 QConvNHWC over its rows)
    assert len(convs) == 21 and all(layer.tactic.startswith("cuda.fp8.sm90_") for layer in convs), \
        [(layer.name, layer.tactic) for layer in convs]
    rows = 0
    for layer in convs:
        pairs = candidate_pairs(layer, "cuda", config(cache), {}, "sm_90", 132)
        timed = {level: [p[1].name for p in capped(pairs, LEVELS[level].cap)] for level in (1, 3)}
        assert all(names[0] == layer.tactic for names in timed.values())  # the level-0 choice is timed first
        gemm = over_rows(_geometry(layer))
        rows += gemm
        if gemm:  # a GEMM over rows: the best GEMM tile at level 1, a piece tile too at level 3 (the default)
            assert any(n.startswith("cuda.fp8.gemm_sm90_") for n in timed[1]), (layer.name, timed)
            assert any(n.startswith("cuda.fp8.conv_sm90_") for n in timed[3]), (layer.name, timed)
        else:  # the stem, the 3x3 convs, the strided shortcuts: a piece tile at level 1
            assert any(n.startswith("cuda.fp8.conv_sm90_") for n in timed[1]), (layer.name, timed)
    # the stride-1 1x1 convs: each block's first and last (10), the first stage's shortcut, the classifier
    assert rows == 12


@pytest.mark.parametrize("tile", ["128x256", "128x64x2"])
def test_a_replay_moves_every_fp8_conv_onto_a_piece_tile(fp8_resnet, monkeypatch, tile):
    model, cache = fp8_resnet
    stand_in_sm90(monkeypatch)
    plan = build_plan(model, config(cache))
    name = f"cuda.fp8.conv_sm90_{tile}"
    forced = build_with_tactics(model, {layer.name: name for layer in fp8_convs(plan)}, config(cache))
    assert_replayed(plan, forced, fp8_convs, name, lambda layer: layer.kind != "QConvNHWC")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", PIECE_TILES)
def test_an_fp8_resnet_on_a_piece_tile_matches_the_level_0_plan(fp8_resnet, tile):
    skip_unless_sm90()
    model, cache = fp8_resnet
    plan = build_plan(model, config(cache))
    forced = build_with_tactics(model, {layer.name: f"cuda.fp8.conv_sm90_{tile}" for layer in fp8_convs(plan)},
                                config(cache))
    cpu = build_plan(model, BuilderConfig(target="cpu", fp16=True, fp8=True, calibration_cache=cache,
                                          builder_optimization_level=0))
    # the piece tiles sum as the level-0 tiles do (an H100, 2026-12-06: cosine 1.0 on all four); both stand
    # ~0.9985 from the cpu plan on these 20 logits of 20 FP8 layers, within FP8's own spread there (the cpu
    # plan with and without --fp16: 0.9976-0.9980)
    assert_forced_plan_matches(plan, forced, cpu, lambda seed: feeds_for(model, seed), cpu_cosine=0.995)
