"""GPU: a whole plan on the cuda target (weights once, arena, CUDA graph replay, profiling,
enqueue on device buffers) against the same model on the cpu target."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(3)


def small_cnn(fuse_friendly: bool = True) -> onnx.ModelProto:
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32) * 0.3, "w2")
    fc = numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "fc")
    fb = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "fb")
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=8, pads=[1, 1, 1, 1], name="dw"),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="residual"),
        helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "fc"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "fb"], ["y"], name="bias"),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], [w1, b1, w2, fc, fb])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def build(model, target, **cfg):
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    return build_plan(model, BuilderConfig(target=target, **cfg))


def run_plan(plan, feeds, **options):
    from polykit.runtime.engine import Engine

    with Engine(plan) as engine, engine.create_execution_context(**options) as ctx:
        first = ctx.execute(feeds)
        second = ctx.execute(feeds)
        return first, second, ctx.profile


@pytest.mark.parametrize("fuse", [False, True])
def test_cuda_plan_matches_cpu_plan_with_graph_replay(fuse):
    model = small_cnn()
    x = {"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32)}
    want, _, _ = run_plan(build(model, "cpu", fuse=fuse), x)
    first, replayed, _ = run_plan(build(model, "cuda", fuse=fuse), x)
    np.testing.assert_allclose(first["y"], want["y"], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(replayed["y"], first["y"])


def test_cuda_plan_without_graph_and_with_profile():
    model = small_cnn()
    x = {"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32)}
    plan = build(model, "cuda")
    eager, _, _ = run_plan(plan, x, cuda_graph=False)
    profiled, _, profile = run_plan(plan, x, profile=True)
    np.testing.assert_array_equal(eager["y"], profiled["y"])
    assert [name for name, _ in profile] == [layer.name for layer in plan.layers]
    assert all(ms >= 0 for _, ms in profile)


def test_profile_times_gpu_work_not_the_hosts_launch_gaps():
    # 40 tiny unfused layers: each kernel runs for a few microseconds, while polykit's Python
    # enqueue of a layer takes tens; behind the stream hold the events see only the kernels
    nodes = [helper.make_node("Neg" if i % 2 else "Relu", [f"t{i}"], [f"t{i + 1}"], name=f"op{i}") for i in range(40)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1024])],
                              [helper.make_tensor_value_info("t40", TensorProto.FLOAT, [1024])])
    plan = build(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), "cuda", fuse=False)
    x = {"t0": rng.standard_normal(1024).astype(np.float32)}
    out, _, profile = run_plan(plan, x, profile=True)
    want = x["t0"]
    for i in range(40):
        want = -want if i % 2 else np.maximum(want, 0)
    np.testing.assert_array_equal(out["t40"], want)
    assert len(profile) == len(plan.layers) >= 20
    assert np.median([ms for _, ms in profile]) < 0.02


def test_fp16_plan_matches_cpu_within_half_tolerance():
    model = small_cnn()
    x = {"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32)}
    want, _, _ = run_plan(build(model, "cpu"), x)
    got, _, _ = run_plan(build(model, "cuda", fp16=True), x)
    err = np.linalg.norm(got["y"] - want["y"]) / np.linalg.norm(want["y"])
    assert err < 1e-2


def test_enqueue_on_torch_tensors_and_stream():
    torch = pytest.importorskip("torch")
    from polykit.runtime.engine import Engine

    model = small_cnn()
    xs = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    plan = build(model, "cuda")
    want, _, _ = run_plan(build(model, "cpu"), {"x": xs})
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        x_dev = torch.from_numpy(xs).cuda()
        y_dev = torch.full((2, 5), float("nan"), device="cuda")
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(3):  # eager, capture, replay
                ctx.enqueue({"x": x_dev, "y": y_dev}, stream)
        stream.synchronize()
        np.testing.assert_allclose(y_dev.cpu().numpy(), want["y"], rtol=1e-4, atol=1e-4)


def test_no_gpu_message_suggests_cpu_target(monkeypatch):
    from polykit.errors import DeviceError
    from polykit.runtime.cuda import driver

    monkeypatch.setattr(driver, "_primary", {})
    with pytest.raises(DeviceError, match="--target cpu"):
        driver.current_device(ordinal=999)
