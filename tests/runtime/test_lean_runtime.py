"""The lean runtime (issue 36, point 4): running a saved plan needs numpy (and cuda-python for the
cuda target), not the toolkit's onnx, onnxruntime or pluggy, nor ml_dtypes (bfloat16 and float8
plans aside). A child process whose imports of those raise ImportError (a meta-path finder ahead
of every other) loads plans built here, with the full toolkit, and gives the outputs computed here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.evaluator import evaluate_model
from polykit.runtime.engine import Runtime

REPO = Path(__file__).resolve().parents[2]
#: what `pip install polykit` leaves out (the `toolkit` extra, and ml_dtypes, which onnx brings)
TOOLKIT = ("onnx", "onnxruntime", "pluggy", "typer", "rich", "ml_dtypes")

#: run first in the child: imports of the toolkit's packages fail as they would where they are not installed
BLOCKER = f"""
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {TOOLKIT!r}:
            raise ImportError(f"No module named {{name!r}} (blocked: the lean runtime)", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


def _convnet():
    """Conv -> Relu -> Flatten -> Gemm -> Softmax: convolution, GEMM and a reduction on the cpu target."""
    rng = np.random.default_rng(36)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name) for name, shape in
               (("w", (4, 3, 3, 3)), ("wb", (4,)), ("g", (4 * 6 * 6, 10)), ("gb", (10,)))]
    nodes = [helper.make_node("Conv", ["x", "w", "wb"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "g", "gb"], ["l"], name="fc"),
             helper.make_node("Softmax", ["l"], ["y"], name="softmax")]
    graph = helper.make_graph(nodes, "lean", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run_lean(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "POLYKIT_PLUGINS": ""}
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=300)


def test_a_saved_cpu_plan_runs_without_onnx_onnxruntime_or_pluggy(tmp_path):
    model = _convnet()
    plan = build_plan(model, BuilderConfig(target="cpu"))
    plan.save(tmp_path / "m.plan")
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    with Runtime().load_engine(tmp_path / "m.plan") as engine, engine.create_execution_context() as ctx:
        expected = ctx.execute({"x": x})["y"]
    np.testing.assert_allclose(expected, evaluate_model(model, {"x": x})["y"], rtol=1e-5, atol=1e-6)

    proc = _run_lean("""
import json, sys
import numpy as np
from polykit.runtime.engine import Runtime
with Runtime().load_engine("m.plan") as engine, engine.create_execution_context() as ctx:
    np.save("y.npy", ctx.execute({"x": np.load("x.npy")})["y"])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"onnx", "onnxruntime", "pluggy", "typer", "rich",
                                                                   "ml_dtypes"})))
""", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)  # the same plan: the same bits


def test_a_cuda_plans_tactics_and_kernels_check_without_the_toolkit(tmp_path):
    """The cuda target's side of loading (tactic table, kernels regenerated and compared with the
    plan's record) imports none of the toolkit either; the device itself is a GPU test's."""
    config = BuilderConfig(target="cuda", builder_optimization_level=0)
    build_plan(_convnet(), config).save(tmp_path / "m.plan")
    proc = _run_lean("""
from polykit.compiler.plan.file import Plan
from polykit.runtime.tactic_check import check_tactics, plan_kernels
import polykit.runtime.cuda.target  # the target's module imports without the toolkit
plan = Plan.load("m.plan")
check_tactics(plan, "m.plan")
print(sum(len(plan_kernels(plan, layer)) for layer in plan.layers))
""", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.splitlines()[-1]) >= len(_convnet().graph.node) - 2  # kernels regenerated per layer


def test_the_cli_without_the_toolkit_says_what_to_install(tmp_path):
    proc = _run_lean("import sys; from polykit.tools.cli import main; sys.exit(main(['--help']))", tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "polykit[toolkit]" in proc.stderr


@pytest.mark.gpu
def test_a_saved_cuda_plan_runs_without_the_toolkit(tmp_path):
    from polykit.runtime.cuda import driver

    if not driver.is_available():
        pytest.skip("needs a CUDA GPU")
    model = _convnet()
    build_plan(model, BuilderConfig(target="cuda")).save(tmp_path / "m.plan")
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    with Runtime().load_engine(tmp_path / "m.plan") as engine, engine.create_execution_context() as ctx:
        expected = ctx.execute({"x": x})["y"]
    proc = _run_lean("""
import numpy as np
from polykit.runtime.engine import Runtime
with Runtime().load_engine("m.plan") as engine, engine.create_execution_context() as ctx:
    np.save("y.npy", ctx.execute({"x": np.load("x.npy")})["y"])
""", tmp_path)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)


def test_a_bfloat16_plan_without_ml_dtypes_names_the_package(tmp_path):
    build_plan(_convnet(), BuilderConfig(target="cpu", bf16=True)).save(tmp_path / "m.plan")
    proc = _run_lean("""
import sys
from polykit.errors import PlanError
from polykit.runtime.engine import Runtime
try:
    Runtime().load_engine("m.plan")
except PlanError as exc:
    print(exc.what)
    sys.exit(2)
""", tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "'bfloat16' needs the ml_dtypes package" in proc.stdout


def test_without_pluggy_a_plugins_tactics_register_and_a_misspelt_hook_fails(tmp_path):
    """polykit.lean_plugins stands in for pluggy: a plugin module marked with polykit.plugins.hookimpl
    adds its tactics as under pluggy, with its origin; a hook name polykit lacks is a PluginError."""
    (tmp_path / "lean_plugin.py").write_text('''
__version__ = "1.2"
from polykit.plugins import hookimpl
from polykit.kernels.cpu.base import CpuTactic

@hookimpl
def polykit_tactics(registry):
    if registry.target == "cpu":
        registry.register(CpuTactic("cpu", "Relu", "lean_plugin.relu", run_fn=lambda node, inputs: inputs))
''')
    (tmp_path / "misspelt_plugin.py").write_text('''
from polykit.plugins import hookimpl

@hookimpl
def polykit_tactcs(registry):
    pass
''')
    code = """
import os
from polykit.kernels.tactics import find_tactic, tactic_origin
from polykit.plugins import PluginError, create_plugin_manager
tactic = find_tactic("cpu", "Relu", "lean_plugin.relu")
print(tactic_origin(tactic).to_json())
try:
    create_plugin_manager({"POLYKIT_PLUGINS": "misspelt_plugin"})
except PluginError as exc:
    print("PluginError:", exc.what)
"""
    env_code = "import os, sys; sys.path.insert(0, os.getcwd()); os.environ['POLYKIT_PLUGINS'] = 'lean_plugin'\n"
    proc = _run_lean(env_code + code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "{'plugin': 'lean_plugin', 'version': '1.2'}"
    assert lines[1].startswith("PluginError:") and "polykit_tactcs" in lines[1]
