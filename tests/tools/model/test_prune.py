"""`polykit surgeon prune` (polykit.tools.model.prune): Polygraphy's SparsityPruner walk (which
initializers, along which axis) and its 2:4 magnitude pruning; the pruned model still runs in
onnxruntime and its layers are eligible for --sparsity enable."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.plan.sparse24 import has_pattern, prune
from polykit.tools.cli.app import main
from polykit.tools.model.prune import PruneTarget, prune_model, prune_targets

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def walk_model() -> onnx.ModelProto:
    """Conv (weight along axis 1), MatMul whose B comes through Cast and Transpose (perm [1, 0]:
    axis 0 -> 1), Gemm transB (axis 1), a MatMul B of 6 rows (not a multiple of 4: skipped), an
    int64 MatMul weight (not float: skipped) and a Mul's weight (no GEMM: untouched)."""
    rng = np.random.default_rng(0)
    inits = {
        "conv_w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
        "mm_w": rng.standard_normal((12, 8)).astype(np.float16),  # transposed to [8, 12]: K = 8
        "fc_w": rng.standard_normal((5, 12)).astype(np.float32),  # transB: [N=5, K=12]
        "odd_w": rng.standard_normal((6, 4)).astype(np.float32),
        "int_w": np.ones((8, 2), np.int64),
        "scale": rng.standard_normal((4,)).astype(np.float32),
        "zero": np.array([0], np.int64), "six": np.array([6], np.int64), "eight": np.array([8], np.int64),
        "one": np.array([1], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "conv_w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Cast", ["mm_w"], ["mm_w32"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Transpose", ["mm_w32"], ["mm_wt"], perm=[1, 0], name="tr"),
        helper.make_node("MatMul", ["f", "mm_wt"], ["h"], name="mm"),
        helper.make_node("Gemm", ["h", "fc_w"], ["y"], transB=1, name="fc"),
        helper.make_node("Slice", ["h", "zero", "six", "one"], ["h6"], name="slice6"),
        helper.make_node("MatMul", ["h6", "odd_w"], ["z0"], name="odd"),
        helper.make_node("Mul", ["z0", "scale"], ["z"], name="mul"),
        helper.make_node("Slice", ["h", "zero", "eight", "one"], ["h8"], name="slice8"),
        helper.make_node("Cast", ["h8"], ["h8i"], to=TensorProto.INT64, name="to_int"),
        helper.make_node("MatMul", ["h8i", "int_w"], ["zi"], name="int_mm"),
    ]
    graph = helper.make_graph(nodes, "walk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in
                               (("y", TensorProto.FLOAT, [1, 5]), ("z", TensorProto.FLOAT, [1, 4]),
                                ("zi", TensorProto.INT64, [1, 2]))],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def arrays(model) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_the_walk_finds_polygraphys_weights_and_axes():
    assert prune_targets(walk_model()) == [PruneTarget("conv_w", 1), PruneTarget("mm_w", 1), PruneTarget("fc_w", 1)]


def test_pruning_zeroes_two_of_every_four_by_magnitude_and_leaves_the_rest():
    before = arrays(walk_model())
    model, targets = prune_model(walk_model())
    after = arrays(model)
    for target in targets:
        assert after[target.name].dtype == before[target.name].dtype
        np.testing.assert_array_equal(after[target.name], prune(before[target.name], target.axis))
        assert has_pattern(after[target.name], target.axis)
    for name in ("odd_w", "int_w", "scale"):
        np.testing.assert_array_equal(after[name], before[name])


def test_the_cli_writes_a_model_that_onnxruntime_runs_and_the_builder_finds_eligible(tmp_path, caplog):
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    src, out = tmp_path / "walk.onnx", tmp_path / "pruned.onnx"
    onnx.save(walk_model(), src)
    assert main(["surgeon", "prune", str(src), "-o", str(out)]) == 0
    pruned = onnx.load(out)
    onnx.checker.check_model(pruned)
    x = np.random.default_rng(1).standard_normal((1, 4, 5, 5)).astype(np.float32)
    y = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    assert y.shape == (1, 5) and np.isfinite(y).all()
    # eligible: the sparse GEMM needs K a multiple of 32 -- a 64 -> 48 MatMul pruned by the CLI
    rng = np.random.default_rng(2)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 48])],
                              [numpy_helper.from_array(rng.standard_normal((64, 48)).astype(np.float32), "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "mm.onnx")
    assert main(["surgeon", "prune", str(tmp_path / "mm.onnx"), "-o", str(tmp_path / "mm_pruned.onnx")]) == 0
    with caplog.at_level(logging.INFO, logger="polykit"):
        build_plan(str(tmp_path / "mm_pruned.onnx"), BuilderConfig(target="cpu", sparsity="enable"))
    assert "Layers eligible for sparse math: mm" in caplog.text
