"""cancel_transposes: Transpose pairs compose, Transposes sink through elementwise ops."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes import cancel_transposes, optimize, run_passes

from .passes_testkit import feeds_for, graph, node, op_counts, run_and_compare
from .test_pass_manager import DATA

rng = np.random.default_rng(5)


def _transposes(g):
    return [n for n in g.nodes if n.op_type == "Transpose"]


def test_inverse_pair_is_removed():
    g = graph([node("Transpose", ["x"], "t", perm=[0, 2, 1]), node("Transpose", ["t"], "u", perm=[0, 2, 1]),
               node("Relu", ["u"], "y")], {"x": (2, 3, 4)}, ["y"])
    out, changed = run_and_compare(g, cancel_transposes)
    assert changed and op_counts(out) == {"Relu": 1}
    assert out.nodes[0].inputs == ["x"]


def test_pair_composes_into_one_transpose():
    g = graph([node("Transpose", ["x"], "t", perm=[0, 2, 3, 1]), node("Transpose", ["t"], "y", perm=[0, 1, 3, 2])],
              {"x": (2, 3, 4, 5)}, ["y"])
    out, changed = run_and_compare(g, cancel_transposes)
    (t,) = _transposes(out)
    assert changed and t.inputs == ["x"] and t.attrs["perm"] == [0, 2, 1, 3]


def test_default_perm_reverses_axes_when_composing():
    g = graph([node("Transpose", ["x"], "t"), node("Transpose", ["t"], "u"), node("Neg", ["u"], "y")],
              {"x": (2, 3, 4)}, ["y"])
    out, _ = run_and_compare(g, cancel_transposes)
    assert op_counts(out) == {"Neg": 1}


def test_identity_pair_on_a_graph_output_keeps_the_name():
    g = graph([node("Transpose", ["x"], "t", perm=[1, 0]), node("Transpose", ["t"], "y", perm=[1, 0])],
              {"x": (3, 4)}, ["y"])
    out, _ = run_and_compare(g, cancel_transposes)
    assert out.outputs == ["y"] and out.producers()["y"].attrs["perm"] == [0, 1]


def test_first_transpose_read_elsewhere_stays():
    g = graph([node("Transpose", ["x"], "t", perm=[1, 0]), node("Transpose", ["t"], "u", perm=[1, 0]),
               node("Add", ["u", "x"], "y"), node("Exp", ["t"], "z")], {"x": (3, 4)}, ["y", "z"])
    out, _ = run_and_compare(g, cancel_transposes)
    assert len(_transposes(out)) == 1 and out.producers()["y"].inputs == ["x", "x"]


def test_elementwise_op_of_two_transposed_inputs_takes_one_transpose():
    g = graph([node("Transpose", ["a"], "ta", perm=[0, 2, 1]), node("Transpose", ["b"], "tb", perm=[0, 2, 1]),
               node("Add", ["ta", "tb"], "y")], {"a": (2, 3, 4), "b": (2, 3, 4)}, ["y"])
    out, changed = run_and_compare(g, cancel_transposes)
    assert changed and len(_transposes(out)) == 1 and out.producers()["y"].op_type == "Transpose"


def test_transpose_sinks_through_a_chain_and_cancels():
    c = rng.standard_normal((4, 1)).astype(np.float32)
    g = graph([node("Transpose", ["x"], "t", perm=[0, 2, 1]), node("Mul", ["t", "c"], "m"),
               node("Sigmoid", ["m"], "s"), node("Transpose", ["s"], "y", perm=[0, 2, 1])],
              {"x": (2, 3, 4)}, ["y"], {"c": c})
    out, changed = run_and_compare(g, cancel_transposes)
    assert changed and not _transposes(out)
    mul = next(n for n in out.nodes if n.op_type == "Mul")
    assert out.initializers[mul.inputs[1]].shape == (1, 1, 4)


def test_single_transposed_input_without_a_transpose_after_is_left_alone():
    g = graph([node("Transpose", ["x"], "t", perm=[1, 0]), node("Relu", ["t"], "y")], {"x": (3, 4)}, ["y"])
    out, changed = run_and_compare(g, cancel_transposes)
    assert not changed and [n.op_type for n in out.nodes] == ["Transpose", "Relu"]


def test_mixed_perms_do_not_sink():
    g = graph([node("Transpose", ["a"], "ta", perm=[0, 2, 1]), node("Transpose", ["b"], "tb", perm=[1, 0, 2]),
               node("Add", ["ta", "tb"], "y")], {"a": (3, 3, 3), "b": (3, 3, 3)}, ["y"])
    _, changed = run_and_compare(g, cancel_transposes)
    assert not changed



def test_transpose_sinks_through_an_op_read_by_a_transpose_and_another_op():
    g = graph([node("Transpose", ["x"], "t", perm=[0, 2, 1]), node("Relu", ["t"], "r"),
               node("Transpose", ["r"], "y", perm=[0, 2, 1]), node("Exp", ["r"], "z")], {"x": (2, 3, 4)}, ["y", "z"])
    out, changed = run_and_compare(g, cancel_transposes)
    (t,) = _transposes(out)
    assert changed and out.producers()["y"].op_type == "Relu" and t.inputs == ["y"]


def test_residual_block_between_transposes_keeps_none():
    # a conv chain's shape: r feeds both the next layer (through a Transpose) and a residual Add
    g = graph([node("Transpose", ["a"], "ta", perm=[0, 2, 1]), node("Relu", ["ta"], "r"),
               node("Transpose", ["r"], "z", perm=[0, 2, 1]), node("Transpose", ["b"], "tb", perm=[0, 2, 1]),
               node("Add", ["r", "tb"], "s"), node("Transpose", ["s"], "y", perm=[0, 2, 1])],
              {"a": (2, 3, 4), "b": (2, 3, 4)}, ["y", "z"])
    out, changed = run_and_compare(g, cancel_transposes)
    assert changed and not _transposes(out) and op_counts(out) == {"Relu": 1, "Add": 1}


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax"])
def test_reduction_over_the_moved_axes_without_keepdims_needs_no_transpose(op):
    g = graph([node("Transpose", ["x"], "t", perm=[0, 2, 3, 1]), node(op, ["t", "axes"], "y", keepdims=0)],
              {"x": (2, 3, 4, 5)}, ["y"], {"axes": np.array([1, -2], dtype=np.int64)})
    out, changed = run_and_compare(g, cancel_transposes)
    (reduce,) = out.nodes
    assert changed and reduce.inputs[0] == "x" and out.initializers[reduce.inputs[1]].tolist() == [2, 3]


def test_reduction_with_keepdims_transposes_its_smaller_result():
    g = graph([node("Transpose", ["x"], "t", perm=[0, 2, 3, 1]), node("ReduceSum", ["t", "axes"], "y")],
              {"x": (2, 3, 4, 5)}, ["y"], {"axes": np.array([1], dtype=np.int64)})
    out, _ = run_and_compare(g, cancel_transposes)
    (t,) = _transposes(out)
    assert out.producers()[t.inputs[0]].op_type == "ReduceSum" and out.value(t.inputs[0]).shape == (2, 3, 1, 5)


def test_transpose_of_unit_dims_into_flatten_is_dropped():
    g = graph([node("Transpose", ["x"], "t", perm=[0, 3, 1, 2]), node("Flatten", ["t"], "y")], {"x": (2, 1, 1, 4)},
              ["y"])
    out, changed = run_and_compare(g, cancel_transposes)
    assert changed and op_counts(out) == {"Flatten": 1} and out.nodes[0].inputs == ["x"]


@pytest.mark.parametrize("reader,inputs", [("Flatten", {}), ("Reshape", {"shape": np.array([0, -1], np.int64)})])
def test_transpose_of_unit_dims_stays_where_the_reader_would_see_other_dims(reader, inputs):
    # Flatten(axis=1) of [5, 1] is [5, 1], of the untransposed [1, 5] it is [1, 5]; Reshape's 0 copies a dim
    g = graph([node("Transpose", ["x"], "t", perm=[1, 0]), node(reader, ["t", *inputs], "y")], {"x": (1, 5)}, ["y"],
              inputs)
    out, changed = run_and_compare(g, cancel_transposes)
    assert not changed and len(_transposes(out)) == 1


TORCH = ["bert_tiny_ts.onnx", "bert_tiny_dynamo.onnx", "gpt2_tiny_ts.onnx", "vit_tiny_dynamo.onnx", "convnet_ts.onnx"]


def _torch_model(name):
    if not (DATA / name).is_file():
        pytest.skip(f"{name} is not in tests/data")
    return load_onnx(DATA / name)


@pytest.mark.parametrize("name", TORCH)
def test_torch_exports_are_numerically_unchanged_by_cancel_transposes(name):
    g = _torch_model(name)
    feeds = {k: np.abs(v) % 4 if v.dtype.kind in "iu" else v for k, v in feeds_for(g, 2).items()}
    h = optimize(g, fuse=False)
    run_passes(h, [cancel_transposes])
    before, after = evaluate_graph(g, feeds), evaluate_graph(h, feeds)
    for key in before:
        np.testing.assert_allclose(after[key], before[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_attention_key_transposes_compose_in_the_optimized_bert():
    out = optimize(_torch_model("bert_tiny_ts.onnx"), fuse=False)
    perms = [n.attrs.get("perm") for n in out.nodes if n.op_type == "Transpose"]
    assert len(perms) == 8 and [0, 2, 3, 1] not in perms


def test_the_optimized_bert_keeps_no_head_transposes_they_fold_into_attention():
    out = optimize(_torch_model("bert_tiny_ts.onnx"))
    assert [n for n in out.nodes if n.op_type == "Transpose"] == []
    attention = [n for n in out.nodes if n.op_type == "Attention"]
    assert len(attention) == 2
    for node in attention:  # q, k, v: views of the packed projection (pack_gemms) or "bshd" layouts
        assert all(node.attrs.get(f"{t}_layout") == "bshd" or node.attrs.get(f"{t}_view") is not None for t in "qkv")
        assert node.attrs.get("out_layout") == "bshd"


def test_transposes_sink_through_per_tensor_quantize_and_dequantize():
    # NHWC -> Q -> DQ -> NCHW -> NHWC: the INT8 chain between two channels-last layers keeps its layout
    inits = {"s": np.array(0.05, np.float32), "z": np.array(3, np.uint8)}
    g = graph([node("Transpose", ["x"], "t", perm=[0, 3, 1, 2]), node("QuantizeLinear", ["t", "s", "z"], "q"),
               node("DequantizeLinear", ["q", "s", "z"], "d"), node("Transpose", ["d"], "y", perm=[0, 2, 3, 1])],
              {"x": (2, 4, 5, 3)}, ["y"], inits)
    out, changed = run_and_compare(g, cancel_transposes)
    assert changed and op_counts(out) == {"QuantizeLinear": 1, "DequantizeLinear": 1}


def test_per_axis_quantize_blocks_the_sinking():
    inits = {"s": np.full(3, 0.05, np.float32), "z": np.zeros(3, np.uint8)}
    g = graph([node("Transpose", ["x"], "t", perm=[0, 3, 1, 2]), node("QuantizeLinear", ["t", "s", "z"], "q", axis=1),
               node("Transpose", ["q"], "y", perm=[0, 2, 3, 1])], {"x": (2, 4, 5, 3)}, ["y"], inits)
    out, _ = run_and_compare(g, cancel_transposes)
    assert op_counts(out)["Transpose"] == 2
