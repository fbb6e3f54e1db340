"""GPU: the builder times cuda tactics through the target protocol (CUDA events behind the
stream hold), keeps the choice that computes the model, reuses a warm timing cache, and the
context allocates the workspace the plan records once, up front."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(21)


def _gemm_model(m=64, k=1024, n=96):
    w = numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"), helper.make_node("Relu", ["t"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _cnn_model():
    w1 = numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((16, 1, 3, 3)) * 0.3).astype(np.float32), "w2")
    fc = numpy_helper.from_array(rng.standard_normal((16, 5)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], group=16, pads=[1, 1, 1, 1], name="dw"),
             helper.make_node("MaxPool", ["c2"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], [w1, w2, fc])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _build(model, target, **cfg):
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    return build_plan(model, BuilderConfig(target=target, **cfg))


def _run(plan, feeds):
    from polykit.runtime.engine import Engine

    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        return ctx.execute(feeds)


def test_time_candidates_measures_every_gemm_pair_on_the_gpu():
    from polykit.compiler.builder.layer_timing import RUNS, time_candidates
    from polykit.kernels.tactics import find_tactic

    plan = _build(_gemm_model(), "cuda", fp16=True, builder_optimization_level=0, fuse=False)
    layer = plan.layer("mm")
    pairs = [(layer, find_tactic("cuda", "MatMul", "cuda.gemm.mma")), (layer, find_tactic("cuda", "MatMul", "cuda.gemm.simt"))]
    measured = time_candidates("cuda", layer, pairs, plan.tensors, plan.weights, RUNS["cuda"])
    assert measured.errors == ["", ""], measured.errors
    assert all(0 < ms < 100 for ms in measured.ms), measured.ms
    assert measured.compile_s > 0 and measured.time_s > 0


def test_an_fp16_gemm_is_timed_and_the_chosen_tactic_computes_it():
    x = {"x": rng.standard_normal((64, 1024)).astype(np.float32)}
    model = _gemm_model()  # once: each call draws new weights
    want = _run(_build(model, "cpu"), x)["y"]
    plan = _build(model, "cuda", fp16=True)
    assert plan.metadata["tuning"]["timed_layers"] >= 1
    assert plan.layer("mm").tactic.startswith("cuda.gemm.")
    got = _run(plan, x)["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


def test_level_5_times_every_cuda_layer():
    model = _cnn_model()  # once: each call draws new weights
    plan = _build(model, "cuda", builder_optimization_level=5)
    tuning = plan.metadata["tuning"]
    assert tuning["timed_layers"] + tuning["untimeable_layers"] == len(plan.layers)
    x = {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    np.testing.assert_allclose(_run(plan, x)["y"], _run(_build(model, "cpu"), x)["y"], rtol=1e-4, atol=1e-4)


def test_a_second_cuda_build_with_a_warm_timing_cache_times_nothing(tmp_path):
    cache = tmp_path / "timing.json"
    first = _build(_cnn_model(), "cuda", fp16=True, builder_optimization_level=5, save_timing_cache=cache)
    second = _build(_cnn_model(), "cuda", fp16=True, builder_optimization_level=5, load_timing_cache=cache,
                    error_on_timing_cache_miss=True)
    assert first.metadata["tuning"]["timed_tactics"] > 0
    assert second.metadata["tuning"]["timed_tactics"] == 0
    assert second.metadata["tuning"]["cache_hits"] == first.metadata["tuning"]["cache_misses"]
    assert [l.tactic for l in second.layers] == [l.tactic for l in first.layers]


def test_split_k_workspace_is_planned_and_allocated_once_up_front():
    from polykit.runtime.engine import Engine

    # K % 8 != 0: no TMA (sm90) tactic takes it, so the SIMT split-K kernels run it
    x = {"x": rng.standard_normal((32, 4100)).astype(np.float32)}
    model = _gemm_model(32, 4100, 64)  # once: each call draws new weights
    plan = _build(model, "cuda", builder_optimization_level=0)
    need = plan.metadata["workspace"]["layers"].get(plan.layers[0].name, 0)
    assert need > 0 and plan.metadata["device_memory"]["workspace_bytes"] == need
    want = _run(_build(model, "cpu"), x)["y"]
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        pool = ctx._ctx._workspace
        assert len(pool.chunks) == 1 and pool.nbytes >= need
        for _ in range(3):  # eager, graph capture (the pool must not grow), replay
            got = ctx.execute(x)["y"]
        assert len(pool.chunks) == 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_workspace_limit_declines_split_k_tactics():
    from polykit.errors import BuildError

    # on a GPU with many SMs every GEMM tactic splits K for this shape (K % 8 != 0: no sm90
    # tactic, which needs no workspace, takes it): none fits in no workspace
    with pytest.raises(BuildError, match="workspace:0"):
        _build(_gemm_model(32, 4100, 64), "cuda", builder_optimization_level=0, workspace_limit=0)
