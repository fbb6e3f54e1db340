"""The example fault plugin (examples/polykit-fault-plugin): its tactics win level-0 builds from
Python and the CLI, compute the reference result except on the layers POLYKIT_FAULT_LAYERS
matches, and build (and compile) for cuda too."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.errors import UsageError
from polykit.kernels.tactics import TacticRegistry, TacticTable, find_tactic
from polykit.plugins import create_plugin_manager
from polykit.runtime.engine import Runtime
from polykit.tools.cli.app import main
from tests.cli_models import FAULT_PLUGIN, REPO, save

CONVNET = str(REPO / "tests" / "data" / "torch" / "convnet_ts.onnx")
LEVEL0 = BuilderConfig(target="cpu", builder_optimization_level=0)

pytestmark = pytest.mark.usefixtures("fault_plugin")


def _matmul_model(path) -> str:
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
                              [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w1"),
                               numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path / "mm.onnx")


def _run(plan, seed=0):
    feeds = {name: np.random.default_rng(seed).uniform(-1, 1, plan.tensors[name].shape).astype(plan.tensors[name].dtype)
             for name in plan.inputs}
    return Runtime().deserialize_engine(plan).create_execution_context().execute(feeds)


def _reference_plan(model, plan):
    return build_plan(model, BuilderConfig(target="cpu", tactic_replay={l.name: "cpu.reference" for l in plan.layers}))


def test_a_level_0_build_from_python_takes_the_fault_tactic_of_every_conv_and_gemm_layer():
    plan = build_plan(CONVNET, LEVEL0)
    tactics = {(l.kind, l.domain): l.tactic for l in plan.layers}
    assert tactics[("Conv", POLYKIT_DOMAIN)] == tactics[("Conv", "")] == "fault.Conv"  # fused and plain
    assert tactics[("Gemm", "")] == "fault.Gemm"
    assert {l.tactic for l in plan.layers if l.kind not in ("Conv", "Gemm")} == {"cpu.reference"}


def test_matmul_layers_take_fault_matmul(tmp_path):
    plan = build_plan(_matmul_model(tmp_path), LEVEL0)
    assert {l.name: l.tactic for l in plan.layers} == {"mm1": "fault.MatMul", "mm2": "fault.MatMul"}


def test_the_fault_tactic_adds_one_hundredth_of_max_abs_on_matching_layers_only(monkeypatch):
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1, 4, 6, 6)).astype(np.float32), rng.standard_normal((5, 4, 3, 3)).astype(np.float32)]
    node = Node("Conv", ["x", "w"], ["y"], {"kernel_shape": [3, 3]}, "/enc/conv3", "")
    fault, reference = find_tactic("cpu", "Conv", "fault.Conv"), find_tactic("cpu", "Conv", "cpu.reference")
    (expected,) = reference.run(node, inputs)
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "conv4|dec")
    np.testing.assert_array_equal(fault.run(node, inputs)[0], expected)
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "enc/conv3$")
    (wrong,) = fault.run(node, inputs)
    assert wrong.dtype == expected.dtype
    np.testing.assert_allclose(wrong - expected, 0.01 * np.abs(expected).max(), rtol=1e-5)


@pytest.mark.parametrize("pattern", ["blocks.0/c1/Conv$", "/blocks/blocks.1/Conv", "fc/Gemm"])
def test_a_level_0_build_is_exact_until_the_pattern_matches_one_of_its_layers(monkeypatch, pattern):
    plan = build_plan(CONVNET, LEVEL0)
    exact = _run(_reference_plan(CONVNET, plan))["logits"]
    np.testing.assert_array_equal(_run(plan)["logits"], exact)
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", pattern)
    assert np.abs(_run(plan)["logits"] - exact).max() > 1e-4


def test_matmul_fault_shows_in_the_output(monkeypatch, tmp_path):
    model = _matmul_model(tmp_path)
    plan = build_plan(model, LEVEL0)
    exact = _run(_reference_plan(model, plan))["y"]
    np.testing.assert_array_equal(_run(plan)["y"], exact)
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "^mm2$")
    assert np.abs(_run(plan)["y"] - exact).max() > 1e-3


def test_an_invalid_pattern_is_a_usage_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.(0")
    with pytest.raises(UsageError, match=re.escape("$POLYKIT_FAULT_LAYERS 'blocks.(0' is not a regular expression")):
        _run(build_plan(CONVNET, LEVEL0))


def test_the_cli_builds_with_the_plugin_and_run_fails_only_with_a_fault(monkeypatch, tmp_path, capsys):
    tactics = tmp_path / "t.json"
    assert main(["convert", CONVNET, "-o", str(tmp_path / "m.plan"), "--target", "cpu",
                 "--builder-optimization-level", "0", "--save-tactics", str(tactics)]) == 0
    assert '"tactic": "fault.Conv"' in tactics.read_text() and '"tactic": "fault.Gemm"' in tactics.read_text()
    run = ["run", CONVNET, "--trt", "--onnxrt", "--target", "cpu", "--builder-optimization-level", "0",
           "--atol", "1e-4", "--rtol", "1e-4"]
    assert main(run) == 0
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.2/c2")
    assert main(run) == 1
    assert "FAILED" in capsys.readouterr().out


def test_the_packages_entry_point_registers_the_tactics(tmp_path, monkeypatch):
    name, module = re.search(r'\[project\.entry-points\.polykit\]\n(\w+) = "([\w.]+)"',
                             (FAULT_PLUGIN / "pyproject.toml").read_text()).groups()
    info = tmp_path / "polykit_fault_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: polykit-fault-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[polykit]\n{name} = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = create_plugin_manager(env={})
    assert pm.has_plugin(name)
    table = TacticTable()
    pm.hook.polykit_tactics(registry=TacticRegistry(table, "cpu"))
    assert {t.name for t in table.of_target("cpu") if t.name.startswith("fault.")} == {"fault.Conv", "fault.MatMul",
                                                                                      "fault.Gemm"}


def test_a_cuda_build_wraps_the_simt_kernels_and_adds_the_error_kernel():
    """cuda plans build without a GPU (tactics chosen by priority)."""
    plan = build_plan(CONVNET, BuilderConfig(target="cuda", builder_optimization_level=0))
    assert {l.tactic for l in plan.layers if l.kind == "Conv"} == {"fault.Conv"}
    kernels = plan.metadata["kernels"]["layers"]
    # the SIMT GEMM for each storage dtype (float32, float16, bfloat16), then the fault kernels
    assert [k["name"] for k in kernels["/fc/Gemm"]] == ["gemm_simt"] * 3 + ["polykit_fault_add"] * 2
    assert {k["name"] for k in kernels["/blocks/blocks.0/c1/Conv"]} == {"conv_igemm_simt", "polykit_fault_add"}
    simt = find_tactic("cuda", "Conv", "cuda.conv.igemm_simt")
    layer = plan.layer("/blocks/blocks.0/c1/Conv")
    assert find_tactic("cuda", "Conv", "fault.Conv").kernels(layer)[:2] == simt.kernels(layer)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_error_kernel_compiles_with_nvrtc(arch, shared_kernel_cache):
    import polykit_fault
    from polykit.runtime.cuda.nvrtc import compile_many, unique_units

    cubins = compile_many(unique_units(polykit_fault.fault_kernels()), arch, workers=1)
    assert len(cubins) == 2 and all(blob[:4] == b"\x7fELF" for blob in cubins.values())
