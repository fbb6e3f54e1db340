"""The tuner compiles every kernel it will time before timing anything (one parallel NVRTC
batch), exactly the kernels each layer's timing plan then loads. No GPU is needed: the device
is a stand-in H100 and the timing records what it would have loaded."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder import builder as builder_module
from polykit.compiler.builder import tuner as tuner_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.layer_timing import Measured, timing_plan
from polykit.kernels.cuda.hold import HOLD
from polykit.runtime.cuda import nvrtc
from polykit.runtime.cuda.driver import DeviceInfo

H100 = DeviceInfo(0, "stand-in H100", "sm_90a", 132, 80 << 30, 227 << 10)
rng = np.random.default_rng(5)


def _model():
    """fp16 GEMM -> relu -> GEMM: several cuda candidates each."""
    w1 = numpy_helper.from_array((rng.standard_normal((256, 512)) * 0.1).astype(np.float16), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((512, 128)) * 0.1).astype(np.float16), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [64, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [64, 128])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_the_tuner_compiles_what_it_times_in_one_batch_before_timing(monkeypatch):
    batches, loaded = [], {}

    def fake_compile_many(sources, arch, **kw):
        assert arch == "sm_90a" and not loaded, "prefetch must come before any timing"
        batches.append({s.key() for s in sources})
        return {}

    def fake_time(target, layer, pairs, tensors, weights, runs, device=None):
        plan, _, _ = timing_plan(target, layer, pairs, tensors, weights, runs)  # what a timing run loads
        keys = set()
        for l in plan.layers:
            tactic = next(t for _, t in pairs if t.name == l.tactic)
            keys |= {s.key() for s in tactic.kernels(l)}
        loaded[layer.name] = keys
        return Measured([1.0 + i for i in range(len(pairs))], [""] * len(pairs))

    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: H100)
    monkeypatch.setattr(tuner_module.Tuner, "device", lambda self: H100)
    monkeypatch.setattr(nvrtc, "compile_many", fake_compile_many)
    monkeypatch.setattr(tuner_module, "time_candidates", fake_time)
    plan = build_plan(_model(), BuilderConfig(target="cuda"))
    assert plan.metadata["tuning"]["timed_layers"] == len(loaded) >= 2
    assert len(batches) == 1
    timed = set().union(*loaded.values())
    assert batches[0] == timed  # everything timed was prefetched, and nothing else


def test_a_warm_timing_cache_prefetches_nothing(monkeypatch, tmp_path):
    batches = []
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: H100)
    monkeypatch.setattr(tuner_module.Tuner, "device", lambda self: H100)
    monkeypatch.setattr(nvrtc, "compile_many", lambda sources, arch, **kw: batches.append(len(sources)) or {})
    monkeypatch.setattr(tuner_module, "time_candidates",
                        lambda target, layer, pairs, *a: Measured([1.0] * len(pairs), [""] * len(pairs)))
    cache = tmp_path / "timing.json"
    build_plan(_model(), BuilderConfig(target="cuda", save_timing_cache=str(cache)))
    assert batches and batches[0] > 0
    batches.clear()
    build_plan(_model(), BuilderConfig(target="cuda", load_timing_cache=str(cache)))
    assert batches == []


def _plan_keys(plan):
    from polykit.runtime.tactic_check import plan_kernels

    return {s.key() for layer in plan.layers for s in plan_kernels(plan, layer)}


def test_compile_candidates_compiles_what_a_build_would_without_timing_anything(monkeypatch):
    """What a build compiles (its prefetch batch and the final plan's kernels) is what
    compile_candidates compiles up front, and it times nothing."""
    batches = []
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: H100)
    monkeypatch.setattr(tuner_module.Tuner, "device", lambda self: H100)
    monkeypatch.setattr(nvrtc, "compile_many", lambda sources, arch, **kw: batches.append({s.key() for s in sources}) or {})
    monkeypatch.setattr(tuner_module, "time_candidates",  # the last candidate fastest: not the first by priority
                        lambda target, layer, pairs, *a: Measured([9.0 - i for i in range(len(pairs))], [""] * len(pairs)))
    timed = build_plan(_model(), BuilderConfig(target="cuda"))
    first = build_plan(_model(), BuilderConfig(target="cuda", builder_optimization_level=0))
    # and the timer's stream hold, which every timed pass launches first (runtime/cuda/target.py)
    built = batches[0] | _plan_keys(timed) | _plan_keys(first) | {HOLD.key()}
    assert _plan_keys(timed) != _plan_keys(first)  # the timed build chose other tactics than the heuristic

    def no_timing(*a, **k):
        raise AssertionError("compile_candidates timed a layer")

    monkeypatch.setattr(tuner_module, "time_candidates", no_timing)
    batches.clear()
    did = builder_module.compile_candidates(_model(), BuilderConfig(target="cuda"), workers=2)
    assert len(batches) == 1 and batches[0] == built
    assert did["kernels"] == len(built) and did["layers"] == len(timed.layers)


def test_compile_candidates_fills_the_kernel_cache_with_nvrtc(monkeypatch, tmp_path):
    """Real NVRTC, no GPU: the heuristic's kernels (a build without a device has no others) land in
    the cache a later build loads from."""
    from polykit.runtime.cuda.nvrtc import _cached_path
    from polykit.runtime.tactic_check import plan_kernels

    monkeypatch.setenv("POLYKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: None)
    did = builder_module.compile_candidates(_model(), BuilderConfig(target="cuda", fp16=True), arch="sm_90", workers=2)
    plan = build_plan(_model(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    sources = {s.key(): s for layer in plan.layers for s in plan_kernels(plan, layer)} | {HOLD.key(): HOLD}
    assert did["kernels"] == len(sources) >= 3
    assert all(_cached_path(s, "sm_90").is_file() for s in sources.values())


def test_compile_candidates_refuses_the_cpu_target_and_a_missing_arch(monkeypatch):
    import pytest

    from polykit.errors import UsageError

    with pytest.raises(UsageError, match="cuda builds"):
        builder_module.compile_candidates(_model(), BuilderConfig(target="cpu"))
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: None)
    with pytest.raises(UsageError, match="architecture"):
        builder_module.compile_candidates(_model(), BuilderConfig(target="cuda"))
