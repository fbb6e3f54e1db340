"""fuse_squeeze_excite in a profile build: a squeeze-excitation block over a dynamic batch and image
size is one SqueezeExcite node, as in a static build (EfficientNet-B0's and MobileNetV3-Large's dynamic
plans ran pool, FC1 and the scaling Mul as three layers each: benchmarks/dynamic_vs_static.py). The
cpu plan matches onnxruntime at the profile's corners and between them; the cuda plan (level 0, no
GPU) runs each block on cuda.squeeze_excite; on a GPU it matches the cpu plan at those shapes. Dims
with the same opt value but another expression are not the same shape."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.symbolic import SymInt, same_dims, symbol
from polykit.compiler.plan.profiles import Profile
from polykit.runtime.engine import Runtime
from tests.compiler.passes.test_fuse_squeeze_excite import se_model

C, CR = 24, 6
PROFILE = Profile({"x": ((1, C, 5, 5), (2, C, 12, 12), (4, C, 16, 16))})
#: min, odd shapes between the corners, max
SHAPES = [(1, C, 5, 5), (3, C, 7, 11), (2, C, 9, 6), (4, C, 16, 16)]


def dynamic_se_model(**kwargs):
    """se_model with x [batch, C, height, width]."""
    model = se_model(2, C, CR, (12, 12), "silu", "hardsigmoid", **kwargs)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for axis, name in ((0, "batch"), (2, "height"), (3, "width")):
        dims[axis].dim_param = name
    return model


def _x(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("pool", ["reducemean", "gap"])
def test_a_profile_build_runs_each_se_block_as_one_node_and_matches_onnxruntime(pool, channels_last):
    model = dynamic_se_model(pool=pool)
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=channels_last, profiles=[PROFILE]))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["SqueezeExcite"] == 1 and kinds["ReduceMean"] == kinds["GlobalAveragePool"] == 0
    assert kinds["Mul"] == kinds["Pointwise"] == 0  # the node scales
    assert sum(layer.kind in ("Conv", "ConvNHWC") for layer in plan.layers) == 2  # the stem and the tail
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for shape in SHAPES:
            x = _x(shape)
            (want,) = session.run(None, {"x": x})
            np.testing.assert_allclose(ctx.execute({"x": x})["y"], want, rtol=1e-4, atol=1e-5, err_msg=str(shape))


def test_a_cuda_profile_plan_runs_the_block_on_the_squeeze_excite_tactic():
    plan = build_plan(dynamic_se_model(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                                        profiles=[PROFILE]))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["SqueezeExcite"] == 1 and kinds["ReduceMean"] == kinds["Mul"] == kinds["Pointwise"] == 0
    (se,) = [layer for layer in plan.layers if layer.kind == "SqueezeExcite"]
    assert se.tactic == "cuda.squeeze_excite" and se.attrs["scale"] == 1
    assert plan.tensors[se.inputs[0]].dims  # its input is dynamic: the kernels read the sizes at run time


def test_the_gate_stays_the_node_output_when_the_mul_scales_another_tensor_of_a_profile_build():
    """`other`: the Mul scales Relu(a), a tensor of a's dims; the node keeps writing the gate."""
    plan = build_plan(dynamic_se_model(other=True), BuilderConfig(target="cpu", profiles=[PROFILE]))
    (se,) = [layer for layer in plan.layers if layer.kind == "SqueezeExcite"]
    assert se.attrs.get("scale", 0) == 0


def test_dims_equal_at_opt_but_of_other_expressions_are_not_the_same_shape():
    batch, height = SymInt(4, symbol("batch")), SymInt(4, symbol("height"))
    assert batch == height  # as ints, at opt
    assert same_dims((batch, 3), (SymInt(4, symbol("batch")), 3))
    assert not same_dims((batch, 3), (height, 3)) and not same_dims((batch, 3), (4, 3))
    assert not same_dims((batch,), (batch, 3))


@pytest.mark.gpu
def test_a_cuda_profile_plan_of_an_se_block_matches_the_cpu_plan_across_the_profile():
    model = dynamic_se_model()
    cpu = build_plan(model, BuilderConfig(target="cpu", profiles=[PROFILE]))
    cuda = build_plan(model, BuilderConfig(target="cuda", fp16=True, profiles=[PROFILE]))
    assert Counter(layer.kind for layer in cuda.layers)["SqueezeExcite"] == 1
    with Runtime().deserialize_engine(cpu) as want_engine, want_engine.create_execution_context() as want_ctx, \
            Runtime().deserialize_engine(cuda.serialize()) as engine, engine.create_execution_context() as ctx:
        for shape in SHAPES + SHAPES[:1]:  # back to min: a cached shape set
            x = _x(shape)
            want, got = want_ctx.execute({"x": x})["y"], ctx.execute({"x": x})["y"]
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2, shape
