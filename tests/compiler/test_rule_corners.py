"""Tactics for a layer whose sizes a shape-tensor value decides (rule symbols) must serve every
value, not just the opt one the profile corners give them: selection also stamps the layer with
every rule symbol at shape_rules.RULE_CORNER_VALUES (small_rule_corners), where a tactic that
bakes such a size into its kernels, or needs it aligned, is refused (tuner.serves_corners)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.kernels.profile_tactics import profile_groups, profile_views
from polykit.compiler.graph.shape_rules import RULE_CORNER_VALUES
from polykit.compiler.builder.tuner import serves_corners
from polykit.compiler.builder.value_ranges import ruled_profile
from polykit.kernels.cuda.base import KernelSource
from polykit.kernels.tactics import all_tactics


def _topk_plan():
    g = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1)], "topk",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8]),
                           helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    graph = load_onnx(helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)]))
    feeds = {"x": np.ones((2, 3, 8), np.float32), "k": np.array([4])}
    shapes = {n: v.shape for n, v in feeds.items()}
    return build_plan(graph, BuilderConfig(target="cuda", input_shapes=shapes,
                                           profiles=[ruled_profile(graph, shapes, feeds)]))


def test_selection_sees_rule_symbols_at_other_values_than_opt():
    plan = _topk_plan()
    (group,) = profile_groups(plan.profiles)
    ks = sorted({env["rule(y)[2]"] for env in group})
    assert ks == sorted({4, *RULE_CORNER_VALUES}), f"the corners give k only {ks}"


def test_a_tactic_that_bakes_or_aligns_a_rule_decided_size_is_not_eligible():
    plan = _topk_plan()
    topk = next(l for l in plan.layers if l.kind == "TopK")
    every, _ = profile_views(plan.tensors, profile_groups(plan.profiles))
    bitonic = next(t for t in all_tactics("cuda") if t.name == "cuda.topk.bitonic")
    assert serves_corners(bitonic, topk, every.corners, every.generic), "the real tactic reads k at run time"
    baked = replace(bitonic, kernels_fn=lambda layer: [KernelSource("topk", defines=(("K", str(layer.out_shapes[0][2])),))])
    assert not serves_corners(baked, topk, every.corners, every.generic), "k baked into the kernel at its opt value"
    even = replace(bitonic, supports=lambda layer: layer.out_shapes[0][2] % 4 == 0)
    assert not serves_corners(even, topk, every.corners, every.generic), "k = 4 at opt, but any k may come"
