"""NVTX ranges around layer launches: what each says at each profiling verbosity, that they are
balanced, and that a context may lower the plan's verbosity but not raise it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import PlanError, PolykitError, UsageError
from polykit.runtime import engine as engine_module
from polykit.runtime.engine import Engine, run_layers
from polykit.runtime.nvtx import layer_labels, load_nvtx


def _plan(verbosity="layer_names_only"):
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="neg"), helper.make_node("Exp", ["a"], ["y"], name="exp")]
    graph = helper.make_graph(nodes, "ranges", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return build_plan(model, BuilderConfig(target="cpu", fuse=False, profiling_verbosity=verbosity))


class Recorder:
    """An NVTX stand-in that records the ranges pushed and popped."""

    def __init__(self):
        self.events = []

    def push(self, label):
        self.events.append(("push", label.decode()))

    def pop(self):
        self.events.append(("pop",))


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(engine_module, "load_nvtx", lambda: rec)
    return rec


def _run(plan, verbosity=None):
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        if verbosity is not None:
            ctx.nvtx_verbosity = verbosity
        ctx.execute({"x": np.ones(3, np.float32)})


def test_detailed_ranges_name_each_layer_with_its_kind_and_tactic(recorder):
    _run(_plan("detailed"))
    assert recorder.events == [("push", "neg [Neg: cpu.reference]"), ("pop",),
                               ("push", "exp [Exp: cpu.reference]"), ("pop",)]


def test_the_default_verbosity_names_the_layers_only(recorder):
    plan = _plan()
    assert Engine(plan).profiling_verbosity == "layer_names_only"
    _run(plan)
    assert recorder.events == [("push", "neg"), ("pop",), ("push", "exp"), ("pop",)]


def test_verbosity_none_emits_no_range(recorder):
    _run(_plan("none"))
    assert recorder.events == []


def test_a_context_may_lower_the_plans_verbosity_but_not_raise_it(recorder):
    _run(_plan("detailed"), "layer_names_only")
    assert [e for e in recorder.events if e[0] == "push"] == [("push", "neg"), ("push", "exp")]
    with Engine(_plan()) as engine, engine.create_execution_context() as ctx:
        with pytest.raises(UsageError, match="--profiling-verbosity detailed"):
            ctx.nvtx_verbosity = "detailed"
        with pytest.raises(UsageError, match="not one of"):
            ctx.nvtx_verbosity = "loud"


def test_a_failing_launch_still_closes_its_range():
    plan, rec = _plan(), Recorder()

    class Failing:
        def launch(self, index, stream):
            raise ZeroDivisionError("bad input")

    with pytest.raises(PolykitError, match="ZeroDivisionError"):
        run_layers(Failing(), plan.layers, None, ranges=(rec, layer_labels(plan.layers, "layer_names_only")))
    assert rec.events == [("push", "neg"), ("pop",)]


def test_the_verbosity_is_checked_in_the_config_and_in_the_plan():
    with pytest.raises(UsageError, match="not one of"):
        BuilderConfig(profiling_verbosity="loud")
    assert "profiling_verbosity" not in BuilderConfig().to_json()  # the default leaves older plans' bytes alone
    plan = _plan("detailed")
    assert plan.metadata["builder_config"]["profiling_verbosity"] == "detailed"
    plan.metadata["builder_config"]["profiling_verbosity"] = "loud"
    with pytest.raises(PlanError, match="profiling verbosity"):
        Engine(plan).profiling_verbosity


def test_the_library_is_looked_for_under_the_cuda_toolkit_too(monkeypatch):
    from polykit.runtime.nvtx import _candidates

    monkeypatch.setenv("CUDA_HOME", "/opt/toolkit")
    paths = _candidates()
    assert paths[:2] == ["libnvtx3interop.so.1", "libnvToolsExt.so.1"]  # the loader's search path first
    assert "/opt/toolkit/lib64/libnvtx3interop.so.1" in paths and "/opt/toolkit/lib/libnvToolsExt.so.1" in paths


def test_the_nvtx_library_found_here_opens_and_closes_ranges():
    nvtx = load_nvtx()
    if nvtx is None:
        pytest.skip("no NVTX library on this machine (libnvtx3interop.so.1 or libnvToolsExt.so.1)")
    depth = nvtx.push(b"polykit test range")  # its depth, or negative with no tool attached
    assert nvtx.pop() == depth and load_nvtx() is nvtx


def test_the_library_is_looked_for_in_the_nvidia_pip_wheels(monkeypatch, tmp_path):
    from polykit.runtime import nvtx as nvtx_module

    for wheel, name in (("nvtx", "libnvToolsExt.so.1"), ("cu13", "libnvtx3interop.so.1"), ("cublas", "libcublas.so.13")):
        (tmp_path / wheel / "lib").mkdir(parents=True)
        (tmp_path / wheel / "lib" / name).write_bytes(b"")
    monkeypatch.setattr(nvtx_module, "_wheel_roots", lambda: [str(tmp_path)])
    paths = nvtx_module._candidates()
    assert paths[:2] == ["libnvtx3interop.so.1", "libnvToolsExt.so.1"]  # the loader's search path still first
    assert str(tmp_path / "cu13" / "lib" / "libnvtx3interop.so.1") in paths
    assert str(tmp_path / "nvtx" / "lib" / "libnvToolsExt.so.1") in paths
    assert not any("libcublas" in p for p in paths)



def test_describe_says_which_library_or_why_there_are_no_ranges(monkeypatch):
    from polykit.runtime import nvtx as nvtx_module

    assert nvtx_module.describe("none").startswith("none (profiling verbosity none)")
    monkeypatch.setattr(nvtx_module, "load_nvtx", lambda: None)
    missing = nvtx_module.describe("detailed")
    assert missing.startswith("none: no NVTX library found") and "nvidia-nvtx" in missing

    class Lib:
        nvtxRangePushA = staticmethod(lambda label: 0)
        nvtxRangePop = staticmethod(lambda: 0)

    monkeypatch.setattr(nvtx_module, "load_nvtx", lambda: nvtx_module.Nvtx(Lib(), "/w/nvidia/nvtx/lib/libnvToolsExt.so.1"))
    assert nvtx_module.describe("detailed") == "detailed (/w/nvidia/nvtx/lib/libnvToolsExt.so.1)"
