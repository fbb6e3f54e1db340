"""Ops and tactics register through the same pluggy hooks as runners: built-ins and plugins
alike, seen by build_plan() from Python exactly as by the CLI; misspelt hooks fail loudly."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.plugins import PluginError, create_plugin_manager, reset_plugin_manager
from polykit.runtime.engine import Engine

PLUGIN = '''
import numpy as np
from polykit.kernels.cpu.base import CpuTactic
from polykit.plugins import hookimpl


def twice_rule(ctx):
    return [(ctx.dtype(0), ctx.shape(0))]


def twice(node, inputs):
    return [inputs[0] * 2]


def plugin_matmul(node, inputs):
    return [np.matmul(inputs[0].astype(np.float64), inputs[1]).astype(inputs[0].dtype)]


MATMUL = CpuTactic("cpu", "MatMul", "plugin.matmul", priority=100, run_fn=plugin_matmul,
                   workspace_fn=lambda layer, tensors, sm_count: 1 << 20)


@hookimpl
def polykit_ops(registry):
    registry.shape_rule("Twice", domain="test.plugin")(twice_rule)
    registry.reference("Twice", domain="test.plugin")(twice)


@hookimpl
def polykit_tactics(registry):
    if registry.target == "cpu":
        registry.register(MATMUL)
'''

W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "polykit_test_ops_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("POLYKIT_PLUGINS", "polykit_test_ops_plugin")
    reset_plugin_manager()
    yield
    reset_plugin_manager()


def _model():
    nodes = [helper.make_node("Twice", ["x"], ["t"], name="twice", domain="test.plugin"),
             helper.make_node("MatMul", ["t", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("test.plugin", 1)])


def test_builtins_register_ops_and_tactics_through_the_hooks():
    pm = create_plugin_manager(env={})
    assert pm.has_plugin("polykit.kernels.builtin")
    assert {"polykit_ops", "polykit_tactics"} <= {name for name in dir(pm.hook) if name.startswith("polykit_")}


def test_build_plan_from_python_uses_plugin_ops_and_tactics(plugin):
    plan = build_plan(_model(), BuilderConfig(target="cpu", builder_optimization_level=0, fuse=False))
    assert {layer.name: layer.tactic for layer in plan.layers} == {"twice": "cpu.reference", "mm": "plugin.matmul"}
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = Engine(plan).create_execution_context().execute({"x": x})
    np.testing.assert_allclose(out["y"], (2 * x) @ W, rtol=1e-6)


def test_plan_records_the_workspace_of_the_chosen_tactic(plugin):
    plan = build_plan(_model(), BuilderConfig(target="cpu", builder_optimization_level=0, fuse=False))
    assert plan.metadata["workspace"]["layers"] == {"mm": 1 << 20}
    memory = plan.metadata["device_memory"]
    assert memory["workspace_bytes"] == 1 << 20
    assert memory["total_bytes"] == memory["arena_bytes"] + memory["weight_bytes"] + (1 << 20)


def test_a_workspace_limit_declines_tactics_that_need_more(plugin):
    plan = build_plan(_model(), BuilderConfig(target="cpu", builder_optimization_level=0, fuse=False,
                                              workspace_limit=1000))
    assert plan.layer("mm").tactic == "cpu.reference" and plan.metadata["workspace"]["layers"] == {}


def test_a_misspelt_hook_is_a_plugin_error(tmp_path, monkeypatch):
    (tmp_path / "polykit_typo_plugin.py").write_text(textwrap.dedent('''
        from polykit.plugins import hookimpl

        @hookimpl
        def polykit_tactic(registry):
            pass
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="polykit_tactic") as info:
        create_plugin_manager(env={"POLYKIT_PLUGINS": "polykit_typo_plugin"})
    assert "polykit_typo_plugin" in str(info.value)


def test_a_plugin_registering_a_taken_tactic_name_is_a_plugin_error(tmp_path, monkeypatch):
    (tmp_path / "polykit_clash_tactic.py").write_text(textwrap.dedent('''
        from polykit.kernels.cpu.base import CpuTactic
        from polykit.plugins import hookimpl

        @hookimpl
        def polykit_tactics(registry):
            registry.register(CpuTactic(registry.target, "Conv", "cpu.conv.direct"))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("POLYKIT_PLUGINS", "polykit_clash_tactic")
    reset_plugin_manager()
    try:
        from polykit.kernels.tactics import all_tactics

        with pytest.raises(PluginError, match="cpu.conv.direct"):
            all_tactics("cpu")
    finally:
        reset_plugin_manager()


def test_a_second_shape_rule_for_a_registered_op_is_a_plugin_error():
    from polykit.compiler.ops.registry import OpRegistry, find_shape_rule

    assert find_shape_rule("", "Relu") is not None
    with pytest.raises(PluginError, match="shape rule of ai.onnx::Relu"):
        OpRegistry.shape_rule("Relu")(lambda ctx: [])


def test_polykit_help_imports_neither_cuda_python_nor_the_kernels(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    code = ("import sys; from polykit.tools.cli.app import main; main(['--help']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cuda' or m.startswith(('polykit.kernels.cpu', "
            "'polykit.kernels.cuda', 'polykit.compiler'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(repo), "POLYKIT_PLUGINS": ""})
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr
