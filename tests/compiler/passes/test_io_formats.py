"""I/O formats (--input-io-formats / --output-io-formats): the engine's edge tensors take the dtype
and layout asked, and the Cast / Transpose layers at the edges disappear where they match the build."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.compiler.passes.io_formats import IoFormat, cancel_round_trip_casts, formats_by_name
from polykit.errors import BuildError, UsageError
from polykit.runtime.engine import Engine

RNG = np.random.default_rng(0)
W1 = (RNG.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
W2 = (RNG.standard_normal((8, 16, 1, 1)) * 0.2).astype(np.float32)


def _model():
    """conv 3x3 -> relu -> conv 1x1: x[2,8,6,6] -> y[2,8,6,6]."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"], name="relu1"),
             helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "io", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 6, 6])],
                              [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _x():
    return np.random.default_rng(1).standard_normal((2, 8, 6, 6)).astype(np.float32)


def _run(plan, x):
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        return ctx.execute({"x": x})["y"]


def _edge_kinds(plan):
    """The kinds of the layers reading an engine input or writing an engine output."""
    return {layer.kind for layer in plan.layers
            if set(layer.inputs) & set(plan.inputs) or set(layer.outputs) & set(plan.outputs)}


def test_io_formats_parse_as_trtexec_spells_them():
    assert IoFormat.parse("fp16:chw") == IoFormat("float16", "chw")
    assert IoFormat.parse("BF16:HWC") == IoFormat("bfloat16", "hwc")
    assert str(IoFormat.parse("int8")) == "int8:chw"
    assert formats_by_name(["fp16:chw"], ["a", "b"], "input") == {"a": IoFormat("float16"), "b": IoFormat("float16")}
    with pytest.raises(UsageError, match="DTYPE:FORMAT"):
        IoFormat.parse("fp64:chw")
    with pytest.raises(UsageError, match="2 input I/O formats for 3 inputs"):
        formats_by_name(["fp16:chw", "fp32:chw"], ["a", "b", "c"], "input")


def test_an_fp16_io_plan_has_no_cast_at_its_edges_and_matches_the_fp32_io_plan():
    fp32_io = build_plan(_model(), BuilderConfig(target="cpu", fp16=True))
    fp16_io = build_plan(_model(), BuilderConfig(target="cpu", fp16=True, input_io_formats="fp16:chw",
                                                 output_io_formats="fp16:chw"))
    assert "Cast" in _edge_kinds(fp32_io) and "Cast" not in _edge_kinds(fp16_io)
    assert (fp16_io.tensors["x"].dtype, fp16_io.tensors["y"].dtype) == ("float16", "float16")
    want = _run(fp32_io, _x())
    got = _run(fp16_io, _x().astype(np.float16))
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def test_fp16_io_of_an_fp32_build_is_cast_once_at_each_edge():
    plan = build_plan(_model(), BuilderConfig(target="cpu", input_io_formats="fp16:chw", output_io_formats="fp16:chw"))
    casts = [layer for layer in plan.layers if layer.kind == "Cast"]
    assert len(casts) == 2 and plan.tensors["x"].dtype == "float16"
    x = _x().astype(np.float16)
    reference = build_plan(_model(), BuilderConfig(target="cpu"))
    np.testing.assert_array_equal(_run(plan, x), _run(reference, x.astype(np.float32)).astype(np.float16))


def test_hwc_io_is_the_nchw_result_transposed():
    plan = build_plan(_model(), BuilderConfig(target="cpu", input_io_formats="fp32:hwc", output_io_formats="fp32:hwc"))
    assert plan.tensors["x"].shape == (2, 6, 6, 8) and plan.tensors["y"].shape == (2, 6, 6, 8)
    reference = build_plan(_model(), BuilderConfig(target="cpu"))
    got = _run(plan, np.ascontiguousarray(_x().transpose(0, 2, 3, 1)))
    np.testing.assert_array_equal(got, _run(reference, _x()).transpose(0, 2, 3, 1))


def test_a_cuda_fp16_plan_with_fp16_io_has_no_cast_at_its_edges():
    """Built structurally (level 0: first-priority tactics, nothing timed, no GPU needed)."""
    default = build_plan(_model(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    chw = build_plan(_model(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                             input_io_formats="fp16:chw", output_io_formats="fp16:chw"))
    hwc = build_plan(_model(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                             input_io_formats="fp16:hwc", output_io_formats="fp16:hwc"))
    # the default plan converts at its edges: fp32 NCHW in -> fp16 NHWC (a Reformat: Cast, Transpose and
    # channel Pad in one layer) and fp16 NHWC -> fp32 NCHW out; the fp16 I/O plans convert no dtype
    converting = [layer for layer in default.layers if layer.kind in ("Cast", "Reformat")
                  and layer.in_dtypes[0] != layer.out_dtypes[0]]
    assert {layer.kind for layer in converting} <= _edge_kinds(default) and len(converting) == 2
    assert "Cast" not in _edge_kinds(chw) | _edge_kinds(hwc)
    assert all(layer.in_dtypes[0] == layer.out_dtypes[0] for plan in (chw, hwc) for layer in plan.layers
               if layer.kind == "Reformat")
    assert "Transpose" not in _edge_kinds(hwc)  # the channels-last convolutions read and write NHWC I/O directly
    assert [plan.tensors["x"].dtype for plan in (default, chw, hwc)] == ["float32", "float16", "float16"]


def test_int8_io_of_a_float_tensor_is_refused():
    with pytest.raises(BuildError, match="quantization scale") as info:
        build_plan(_model(), BuilderConfig(target="cpu", input_io_formats="int8:chw"))
    assert info.value.where == "tensor 'x'"


def test_hwc_io_of_a_tensor_that_is_not_rank_4_is_refused():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "flat",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(BuildError, match="rank-4"):
        build_plan(model, BuilderConfig(target="cpu", input_io_formats="fp32:hwc"))


def test_only_an_exact_widening_and_its_inverse_cancel():
    def graph(first, second):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
        dt = {1: f32, 10: f16}
        src = f16 if first == 1 else f32
        return Graph([Node("Cast", ["x"], ["m"], {"to": first}, name="c1"), Node("Cast", ["m"], ["b"], {"to": second}, name="c2"),
                      Node("Relu", ["b"], ["y"], name="r")], ["x"], ["y"],
                     values={"x": Value("x", src, (4,)), "m": Value("m", dt[first], (4,)),
                             "b": Value("b", dt[second], (4,)), "y": Value("y", dt[second], (4,))})

    exact = graph(1, 10)  # fp16 -> fp32 -> fp16
    assert cancel_round_trip_casts(exact) and exact.nodes[2].inputs == ["x"]
    lossy = graph(10, 1)  # fp32 -> fp16 -> fp32 rounds
    assert not cancel_round_trip_casts(lossy) and lossy.nodes[2].inputs == ["b"]
