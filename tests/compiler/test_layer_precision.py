"""Precision controls: --fp16/--bf16/--tf32, weak and strong typing, per-layer precisions
by ONNX node name under obey/prefer/none, network outputs keeping their dtypes, and the
fp32 fallback of half layers no tactic runs."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.layer_precision import requested_precision
from polykit.compiler.plan.records import LayerDesc
from polykit.errors import BuildError, UsageError
from polykit.runtime.engine import Engine

rng = np.random.default_rng(5)
W = (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32)
M = rng.standard_normal((4, 3)).astype(np.float32)


def _model(x_type=TensorProto.FLOAT, w=W, m=M, channels=8):
    w = w[:channels, :channels]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "m"], ["y"], name="mm"),
             helper.make_node("ArgMax", ["y"], ["k"], axis=-1, name="argmax")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", x_type, [1, channels, 4, 4])],
                              [helper.make_tensor_value_info("y", x_type, [1, channels, 4, 3]),
                               helper.make_tensor_value_info("k", TensorProto.INT64, [1, channels, 4, 1])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(m, "m")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _run(plan, x):
    return Engine(plan).create_execution_context().execute({"x": x})


def _x(dtype=np.float32):
    return rng.standard_normal((1, 8, 4, 4)).astype(dtype)


def test_bf16_on_cpu_matches_fp32_within_bf16_tolerance():
    x = _x()
    want = _run(build_plan(_model(), BuilderConfig(target="cpu")), x)["y"]
    plan = build_plan(_model(), BuilderConfig(target="cpu", bf16=True))
    got = _run(plan, x)["y"]
    assert {l.precision for l in plan.layers if l.kind in ("Conv", "MatMul")} == {"bf16"}
    assert plan.tensors["w"].dtype == "bfloat16"
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2 ** -7


def test_reduced_precision_builds_keep_the_network_outputs_dtypes():
    for flag in ("fp16", "bf16"):
        plan = build_plan(_model(), BuilderConfig(target="cpu", **{flag: True}))
        out = _run(plan, _x())
        assert (out["y"].dtype, out["k"].dtype) == (np.float32, np.int64), flag
        assert (plan.tensors["y"].dtype, plan.tensors["k"].dtype) == ("float32", "int64")


def test_layer_precisions_keep_a_named_layer_in_fp32():
    plan = build_plan(_model(), BuilderConfig(target="cpu", fp16=True, layer_precisions={"conv": "fp32"}))
    conv = next(l for l in plan.layers if "conv" in l.fused_nodes)
    assert conv.precision == "fp32" and set(conv.in_dtypes) - {""} == {"float32"}
    assert plan.layer("mm").precision == "fp16"


def test_a_fused_layer_takes_the_highest_precision_its_nodes_ask_for():
    cfg = BuilderConfig(layer_precisions={"a": "bf16", "b": "fp32", "c": "fp16"})
    layer = LayerDesc("fused", "Conv", ("x",), ("y",), fused_nodes=("a", "b", "c"))
    assert requested_precision(layer, cfg) == "fp32"
    assert requested_precision(LayerDesc("l", "Conv", ("x",), ("y",), fused_nodes=("a", "c")), cfg) == "fp16"


def test_obey_fails_when_no_tactic_gives_the_requested_precision():
    with pytest.raises(BuildError, match="tf32"):
        build_plan(_model(), BuilderConfig(target="cpu", layer_precisions={"mm": "tf32"}, precision_constraints="obey"))


def test_prefer_warns_and_lets_the_builder_choose(caplog):
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = build_plan(_model(), BuilderConfig(target="cpu", layer_precisions={"mm": "tf32"},
                                                  precision_constraints="prefer"))
    assert plan.layer("mm").precision == "fp32"
    assert "layer 'mm' asks for tf32" in caplog.text


def test_tf32_on_cpu_runs_float32_layers_in_fp32():
    plan = build_plan(_model(), BuilderConfig(target="cpu", tf32=True))
    assert {l.precision for l in plan.layers} == {"fp32"}


def test_strongly_typed_follows_the_models_own_dtypes():
    model = _model(TensorProto.FLOAT16, W.astype(np.float16), M.astype(np.float16))
    plan = build_plan(model, BuilderConfig(target="cpu", strongly_typed=True))
    assert plan.layer("mm").precision == "fp16" and plan.tensors["y"].dtype == "float16"
    fp32 = build_plan(_model(), BuilderConfig(target="cpu", strongly_typed=True))
    assert {l.precision for l in fp32.layers} == {"fp32"}


def test_strongly_typed_takes_no_precision_flags():
    with pytest.raises(UsageError, match="strongly typed"):
        BuilderConfig(strongly_typed=True, fp16=True)


def test_unknown_layer_precisions_and_constraints_are_usage_errors():
    with pytest.raises(UsageError, match="fp8"):
        BuilderConfig(layer_precisions={"conv": "fp8"})
    with pytest.raises(UsageError, match="precision constraints"):
        BuilderConfig(precision_constraints="always")


def test_cuda_bf16_layers_without_a_kernel_fall_back_to_fp32(caplog):
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = build_plan(_model(channels=6), BuilderConfig(target="cuda", bf16=True, builder_optimization_level=0))
    # no cuda convolution takes bf16 storage with 6 channels (the halo-tile tactics need multiples
    # of 8); the SIMT GEMM does
    conv = plan.layer("conv")
    assert conv.precision == "fp32" and conv.in_dtypes[0] == "float32"
    assert "'conv' (ConvNHWC, bf16)" in caplog.text and "fall back to fp32" in caplog.text
    mm = plan.layer("mm")
    assert mm.precision == "bf16" and mm.tactic == "cuda.gemm.simt"


def test_cuda_bf16_without_a_kernel_under_obey_is_a_build_error():
    with pytest.raises(BuildError, match="'conv' \\(Conv(NHWC)?, bf16\\)"):
        build_plan(_model(channels=6), BuilderConfig(target="cuda", bf16=True, precision_constraints="obey"))


def test_cuda_bf16_dense_conv_with_multiples_of_8_channels_runs_on_the_halo_tile_kernel():
    plan = build_plan(_model(), BuilderConfig(target="cuda", bf16=True, builder_optimization_level=0))
    conv = plan.layer("conv")
    assert conv.precision == "bf16" and conv.tactic.startswith("cuda.conv_nhwc.halo_mma_")


def test_cuda_fp16_picks_tensor_core_tactics_and_a_pinned_layer_stays_simt():
    plan = build_plan(_model(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    assert plan.layer("mm").tactic == "cuda.gemm.mma" and plan.layer("mm").precision == "fp16"
    pinned = build_plan(_model(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                                layer_precisions={"mm": "fp32"}, precision_constraints="obey"))
    assert pinned.layer("mm").tactic == "cuda.gemm.simt" and pinned.layer("mm").precision == "fp32"


def test_to_tf32_rounds_to_ten_mantissa_bits_nearest_ties_away():
    from polykit.compiler.builder.layer_precision import to_tf32

    ulp = 2.0 ** -10  # tf32 spacing in [1, 2)
    x = np.array([1.0, 1.0 + ulp / 2, 1.0 + ulp / 2 - 2.0 ** -23, -(1.0 + ulp / 2), 3.0 + 0.3 * ulp, np.inf, np.nan],
                 np.float32)
    got = to_tf32(x)
    np.testing.assert_array_equal(got[:6], np.array([1.0, 1.0 + ulp, 1.0, -(1.0 + ulp), 3.0, np.inf], np.float32))
    assert np.isnan(got[6])
    values = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    rounded = to_tf32(values)
    assert np.all(rounded.view(np.uint32) & 0x1FFF == 0)
    assert np.max(np.abs(rounded - values) / np.abs(values)) <= 2.0 ** -11
    assert abs(np.mean((rounded - values) / np.abs(values))) < 1e-5  # unbiased, unlike truncation


def test_round_tf32_weights_rounds_only_tensor_core_operands_of_tf32_layers():
    from dataclasses import replace

    from polykit.compiler.builder.layer_precision import round_tf32_weights
    from polykit.compiler.plan.records import LayerDesc

    rng = np.random.default_rng(1)
    w = {n: rng.standard_normal(8).astype(np.float32) for n in ("w", "bias", "shared", "other")}
    layers = [replace(LayerDesc("c", "ConvNHWC", ("x", "w", "bias"), ("y",), {}), precision="tf32"),
              replace(LayerDesc("g", "Gemm", ("y", "shared"), ("z",), {}), precision="tf32"),
              replace(LayerDesc("a", "Add", ("z", "shared"), ("u",), {}), precision="fp32"),
              replace(LayerDesc("m", "MatMul", ("u", "other"), ("v",), {}), precision="fp32")]
    out = round_tf32_weights(layers, w)
    assert np.any(out["w"] != w["w"]) and np.all(out["w"].view(np.uint32) & 0x1FFF == 0)
    for kept in ("bias", "shared", "other"):  # epilogue input, read by an fp32 layer too, fp32 layer
        np.testing.assert_array_equal(out[kept], w[kept])
