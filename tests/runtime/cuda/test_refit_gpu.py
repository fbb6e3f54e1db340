"""GPU: refit of cuda plans (polykit.compiler.builder.refit). A live cuda engine refitted in place
(the weight buffer rewritten under its contexts and captured CUDA graphs) computes bit for bit
what an engine of a plan built from the new weights with the same tactics computes, for fp32,
tf32 and fp16 builds (NHWC packing and half casts of the weights), and an offline refit gives
that plan's weights."""

from __future__ import annotations

from dataclasses import replace

import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.refit import Refitter, record_of, refit_plan
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.runtime.engine import Engine
from tests.compiler import refit_models as models

pytestmark = pytest.mark.gpu

CUDA = BuilderConfig(target="cuda", refittable=True)
CASES = {
    "conv_bn_fp32": (models.conv_bn, CUDA),
    "conv_bn_tf32": (models.conv_bn, replace(CUDA, tf32=True)),
    "conv_bn_fp16": (models.conv_bn, replace(CUDA, fp16=True)),
    "mlp_fp16": (models.mlp, replace(CUDA, fp16=True)),
    "folded_chain": (models.folded_chain, CUDA),
    "packed_projections_fp16": (models.projections, replace(CUDA, fp16=True)),
}


def new_values(plan, model) -> dict:
    names = record_of(plan)["weights"]
    return {n: a for n, a in load_onnx(model).initializers.items() if n in names}


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[n].tobytes() == b[n].tobytes() for n in a)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_live_cuda_engine_refits_in_place_to_the_outputs_of_a_build_from_the_new_weights(case):
    make, config = CASES[case]
    model_a, model_b = make(0), make(1)
    plan_a = build_plan(model_a, config)
    plan_b = build_plan(model_b, replace(config, tactic_replay={layer.name: layer.tactic for layer in plan_a.layers}))
    feeds = models.feeds(model_a)
    with Engine(plan_b).create_execution_context() as ctx:
        expected = ctx.execute(feeds)
    engine = Engine(plan_a)
    with engine.create_execution_context() as ctx:
        before = ctx.execute(feeds)
        ctx.execute(feeds)  # a captured graph replays from here on
        refitter = Refitter(engine)
        for name, array in new_values(plan_a, model_b).items():
            refitter.set_named_weights(name, array)
        assert refitter.refit_cuda_engine()
        assert same_bits(ctx.execute(feeds), expected)
        assert same_bits(ctx.execute(feeds), expected)
    assert not same_bits(before, expected)


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_offline_refit_of_a_cuda_plan_gives_the_weights_of_a_build_from_the_new_weights(case):
    make, config = CASES[case]
    plan_a = build_plan(make(0), config)
    plan_b = build_plan(make(1), replace(config, tactic_replay={layer.name: layer.tactic for layer in plan_a.layers}))
    assert same_bits(refit_plan(plan_a, new_values(plan_a, make(1))).weights, plan_b.weights)
