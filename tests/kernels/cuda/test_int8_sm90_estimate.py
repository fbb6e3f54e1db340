"""The INT8 sm90 tiles' cost model (int8_sm90._estimate): the tuner times only the best-predicted
tiles, so the short-K 1x1 layers, whose time is the epilogue, must predict 128x64x2 (four consumer
warpgroups an SM) ahead of 128x128 (H100: 95 vs 121 us on 1x1 64 -> 256, 32x56x56)."""

from __future__ import annotations

import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.compiler.builder.tuner import by_estimate
from polykit.kernels.cuda.int8 import int8_sm90

pytest.importorskip("cuda.core")

TACTICS = {f"cuda.int8.sm90_{t.label}": int8_sm90._estimate(t) for t in int8_sm90.TILES}


def conv(nb, h, w, c, n, k):
    shapes = ((nb, h, w, c), (), (n, k, k, c))
    return LayerDesc("conv", "QConvNHWC", ("X", "XZ", "W"), ("Y",), {"kernel_shape": [k, k], "pads": [k // 2] * 4},
                     domain="ai.polykit", in_shapes=shapes, out_shapes=((nb, h, w, n),))


@pytest.mark.parametrize("shape", [(32, 56, 56, 64, 256, 1), (32, 28, 28, 128, 512, 1), (32, 56, 56, 256, 128, 1)],
                         ids=["layer1_conv3", "layer2_conv3", "layer2_conv1"])
def test_short_k_1x1_layers_predict_the_two_block_128x64_tile_first(shape):
    costs = {name: estimate(conv(*shape), 132) for name, estimate in TACTICS.items()}
    assert min(costs, key=costs.get) == "cuda.int8.sm90_128x64x2", costs


def test_the_tuner_orders_sm90_candidates_by_that_estimate():
    from polykit.kernels.tactics import find_tactic

    layer = conv(32, 56, 56, 64, 256, 1)
    pairs = by_estimate([(layer, find_tactic("cuda", "QConvNHWC", name)) for name in TACTICS], 132)
    assert pairs[0][1].name == "cuda.int8.sm90_128x64x2", [t.name for _, t in pairs]
