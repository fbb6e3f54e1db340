"""INT8 calibration with dynamic shapes (issue 35, point 4): a build with optimization profiles
calibrates at its calibration profile (the last profile, as Polygraphy sets it, or
BuilderConfig.calibration_profile),
one scale set serves the plan at every shape of its profiles, and the cache it writes serves the
next build without data."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.calibration_cache import read_calibration_cache
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.profiles import Profile
from polykit.errors import UsageError
from polykit.runtime.engine import Runtime
from polykit.tools.cli.app import main
from tests.compiler.int8_models import images
from tests.dynamic_models import convnet, mlp

#: INT8 against fp32: the cosine the implicit INT8 tests hold (docs/INT8.md)
COSINE = 0.99
IMAGE_PROFILE = Profile({"image": ((1, 3, 16, 16), (2, 3, 32, 32), (4, 3, 48, 48))})
#: min, an odd shape inside, max
IMAGE_SHAPES = ((1, 3, 16, 16), (3, 3, 24, 40), (4, 3, 48, 48))


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def image_feeds(seed: int, shape) -> dict[str, np.ndarray]:
    n, c, h, w = shape
    return {"image": np.ascontiguousarray(images(seed, n, max(h, w), c)[:, :, :h, :w])}


def outputs(plan: Plan, feeds) -> list[np.ndarray]:
    with Runtime(plan.target).deserialize_engine(plan) as engine:
        context = engine.create_execution_context()
        try:
            return [context.execute(f)["logits" if "logits" in plan.outputs else plan.outputs[0]] for f in feeds]
        finally:
            context.close()


@pytest.fixture(scope="module")
def conv_model() -> onnx.ModelProto:
    return convnet()


@pytest.fixture(scope="module")
def fp32_conv(conv_model) -> Plan:
    return build_plan(load_onnx(conv_model), BuilderConfig(target="cpu", profiles=(IMAGE_PROFILE,)))


def test_a_calibrated_conv_plan_serves_its_profile_close_to_fp32(conv_model, fp32_conv):
    batches = [image_feeds(seed, (2, 3, 32, 32)) for seed in range(4)]
    plan = build_plan(load_onnx(conv_model), BuilderConfig(target="cpu", int8=True, calibration_data=batches,
                                                           profiles=(IMAGE_PROFILE,)))
    kinds = [layer.kind for layer in plan.layers]
    assert kinds.count("QConv") >= 8 and "QMatMul" in kinds and "Conv" not in kinds
    assert plan.profiles is not None and len(plan.profiles.ranges) == 1
    feeds = [image_feeds(100 + i, shape) for i, shape in enumerate(IMAGE_SHAPES)]
    for shape, got, want in zip(IMAGE_SHAPES, outputs(plan, feeds), outputs(fp32_conv, feeds)):
        assert got.shape == want.shape == (shape[0], 10)
        assert cosine(got, want) >= COSINE
        assert not np.array_equal(got, want)  # it is INT8, not float


def test_batches_of_several_shapes_inside_the_profile_calibrate(conv_model, fp32_conv):
    batches = [image_feeds(seed, shape) for seed, shape in enumerate(IMAGE_SHAPES)]
    plan = build_plan(load_onnx(conv_model), BuilderConfig(target="cpu", int8=True, calibration_data=batches,
                                                           calibrator="minmax", profiles=(IMAGE_PROFILE,)))
    feeds = [image_feeds(200, (2, 3, 40, 24))]
    assert cosine(outputs(plan, feeds)[0], outputs(fp32_conv, feeds)[0]) >= COSINE


def test_a_batch_outside_the_calibration_profile_says_so(conv_model):
    batches = [image_feeds(0, (2, 3, 32, 32)), image_feeds(1, (8, 3, 32, 32))]
    with pytest.raises(UsageError, match="calibration batch 2 .* outside") as info:
        build_plan(load_onnx(conv_model), BuilderConfig(target="cpu", int8=True, calibration_data=batches,
                                                        profiles=(IMAGE_PROFILE,)))
    assert "calibration_profile" in info.value.hint


def test_with_several_profiles_the_last_one_calibrates(conv_model):
    small = Profile({"image": ((1, 3, 16, 16), (1, 3, 16, 16), (2, 3, 32, 32))})
    large = Profile({"image": ((3, 3, 16, 16), (6, 3, 32, 32), (8, 3, 48, 48))})
    cfg = {"target": "cpu", "int8": True, "calibrator": "minmax", "profiles": (small, large)}
    plan = build_plan(load_onnx(conv_model), BuilderConfig(**cfg, calibration_data=[image_feeds(0, (6, 3, 32, 32))]))
    assert len(plan.profiles.ranges) == 2 and "QConv" in kinds_of(plan)
    with pytest.raises(UsageError, match="calibration batch 1"):
        build_plan(load_onnx(conv_model), BuilderConfig(**cfg, calibration_data=[image_feeds(0, (1, 3, 16, 16))]))


def kinds_of(plan: Plan) -> set[str]:
    return {layer.kind for layer in plan.layers}


def test_the_calibration_profile_may_differ_from_the_plan_profiles(conv_model):
    """TensorRT's setCalibrationProfile: batches of 8 calibrate a plan whose profiles stop at 4."""
    batches = [image_feeds(seed, (8, 3, 32, 32)) for seed in range(2)]
    calibration = Profile({"image": ((8, 3, 32, 32), (8, 3, 32, 32), (8, 3, 32, 32))})
    cfg = BuilderConfig(target="cpu", int8=True, calibration_data=batches, calibrator="minmax",
                        profiles=(IMAGE_PROFILE,), calibration_profile=calibration)
    plan = build_plan(load_onnx(conv_model), cfg)
    fp32 = build_plan(load_onnx(conv_model), BuilderConfig(target="cpu", profiles=(IMAGE_PROFILE,)))
    feeds = [image_feeds(300, (4, 3, 48, 48))]
    assert cosine(outputs(plan, feeds)[0], outputs(fp32, feeds)[0]) >= COSINE
    assert "calibration_profile" not in plan.metadata["builder_config"]  # a side input, like the data


def test_the_cache_of_a_dynamic_build_serves_the_next_build_without_data(conv_model, tmp_path):
    cache = tmp_path / "conv.cache"
    batches = [image_feeds(seed, (2, 3, 32, 32)) for seed in range(3)]
    untimed = {"target": "cpu", "int8": True, "builder_optimization_level": 0}  # tactics by priority: same bytes
    cfg = BuilderConfig(**untimed, calibration_data=batches, calibration_cache=str(cache), profiles=(IMAGE_PROFILE,))
    first = build_plan(load_onnx(conv_model), cfg)
    assert cache.is_file() and read_calibration_cache(cache).scales
    again = build_plan(load_onnx(conv_model), BuilderConfig(**untimed, calibration_cache=str(cache),
                                                            profiles=(IMAGE_PROFILE,)))
    assert again.serialize() == first.serialize()
    # one scale set: a static build of the same model reads the same cache
    static = build_plan(load_onnx(conv_model), BuilderConfig(target="cpu", int8=True, calibration_cache=str(cache),
                                                             input_shapes={"image": (3, 3, 24, 40)}))
    feeds = [image_feeds(400, (3, 3, 24, 40))]
    np.testing.assert_array_equal(outputs(static, feeds)[0], outputs(first, feeds)[0])


def test_a_matmul_model_with_dynamic_batch_and_tokens_calibrates_and_serves_its_profile():
    model = load_onnx(mlp())
    profile = Profile({"x": ((1, 1, 16), (2, 8, 16), (4, 13, 16))})
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((2, 8, 16)).astype(np.float32)} for _ in range(4)]
    plan = build_plan(model, BuilderConfig(target="cpu", int8=True, calibration_data=batches, profiles=(profile,)))
    assert [layer.kind for layer in plan.layers].count("QMatMul") == 2
    fp32 = build_plan(model, BuilderConfig(target="cpu", profiles=(profile,)))
    feeds = [{"x": rng.standard_normal(shape).astype(np.float32)} for shape in ((1, 1, 16), (3, 5, 16), (4, 13, 16))]
    for f, got, want in zip(feeds, outputs(plan, feeds), outputs(fp32, feeds)):
        assert got.shape == f["x"].shape[:2] + (8,)
        assert cosine(got, want) >= COSINE


def test_convert_int8_with_profiles_builds_one_plan_serving_them(conv_model, fp32_conv, tmp_path):
    path, folder, out = tmp_path / "conv.onnx", tmp_path / "calibration", tmp_path / "conv.plan"
    onnx.save(conv_model, str(path))
    folder.mkdir()
    for seed in range(3):
        np.savez(folder / f"{seed}.npz", **image_feeds(seed, (2, 3, 32, 32)))
    cache = tmp_path / "conv.cache"
    argv = ["convert", str(path), "-o", str(out), "--target", "cpu", "--int8", "--calibration-data", str(folder),
            "--calibration-cache", str(cache), "--builder-optimization-level", "0", "--trt-min-shapes", "image:[1,3,16,16]",
            "--trt-opt-shapes", "image:[2,3,32,32]", "--trt-max-shapes", "image:[4,3,48,48]"]
    assert main(argv) == 0
    plan = Plan.load(out)
    assert "QConv" in {layer.kind for layer in plan.layers} and len(plan.profiles.ranges) == 1
    feeds = [image_feeds(500 + i, shape) for i, shape in enumerate(IMAGE_SHAPES)]
    for got, want in zip(outputs(plan, feeds), outputs(fp32_conv, feeds)):
        assert cosine(got, want) >= COSINE
    rebuilt = tmp_path / "again.plan"
    argv_cached = [a if a != str(out) else str(rebuilt) for a in argv]
    del argv_cached[argv_cached.index("--calibration-data"):argv_cached.index("--calibration-data") + 2]
    assert main(argv_cached) == 0  # the cache alone: nothing calibrates
    assert rebuilt.read_bytes() == out.read_bytes()
