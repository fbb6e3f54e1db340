import json

import numpy as np
import pytest

from .passes_testkit import graph, node, op_counts, run_and_compare, scalar

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import fuse_bias_activation

RNG = np.random.default_rng(5)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_conv_plus_per_channel_constant_becomes_conv_bias():
    g = graph([node("Conv", ["x", "w", "b"], "c"), node("Add", ["bias", "c"], "y")], {"x": (1, 2, 4, 4)}, ["y"],
              {"w": _w(3, 2, 1, 1), "b": _w(3), "bias": _w(1, 3, 1, 1)})
    out, changed = run_and_compare(g, fuse_bias_activation)
    assert changed and op_counts(out) == {"Conv": 1} and out.nodes[0].outputs == ["y"]


def test_2d_matmul_plus_bias_becomes_gemm():
    g = graph([node("MatMul", ["x", "w"], "m"), node("Add", ["m", "bias"], "y")], {"x": (4, 3)}, ["y"],
              {"w": _w(3, 5), "bias": _w(5)})
    out, _ = run_and_compare(g, fuse_bias_activation)
    assert op_counts(out) == {"Gemm": 1}


def test_conv_relu_residual_relu_becomes_one_epilogue_node():
    g = graph([node("Conv", ["x", "w"], "c", name="conv0", pads=[1, 1, 1, 1]), node("Relu", ["c"], "r", name="relu0"),
               node("Add", ["r", "x"], "s", name="add0"), node("Relu", ["s"], "y", name="relu1")],
              {"x": (1, 2, 4, 4)}, ["y"], {"w": _w(2, 2, 3, 3)})
    out, _ = run_and_compare(g, fuse_bias_activation)
    (fused,) = out.nodes
    assert (fused.op_type, fused.domain) == ("Conv", POLYKIT_DOMAIN)
    assert fused.inputs == ["x", "w", "", "x"] and fused.outputs == ["y"]
    assert fused.attrs["pads"] == [1, 1, 1, 1]
    assert fused.attrs["epilogue"]["input"] == "c"
    assert [s["op"] for s in fused.attrs["epilogue"]["body"]] == ["Relu", "Add", "Relu"]
    assert fused.attrs["fused_from"] == ["conv0", "relu0", "add0", "relu1"]
    json.dumps(fused.attrs)


def test_batched_matmul_bias_and_gelu_become_a_matmul_epilogue():
    g = graph([node("MatMul", ["x", "w"], "m"), node("Add", ["m", "bias"], "a"), node("Gelu", ["a"], "y")],
              {"x": (2, 4, 3)}, ["y"], {"w": _w(3, 5), "bias": _w(5)})
    out, _ = run_and_compare(g, fuse_bias_activation)
    (fused,) = out.nodes
    assert (fused.op_type, fused.domain) == ("MatMul", POLYKIT_DOMAIN) and fused.inputs == ["x", "w", "bias"]


def test_gemm_with_clip_epilogue_reads_clip_bounds_as_inputs():
    g = graph([node("Gemm", ["x", "w"], "m"), node("Clip", ["m", "lo", "hi"], "y")], {"x": (4, 3)}, ["y"],
              {"w": _w(3, 5), "lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)})
    out, _ = run_and_compare(g, fuse_bias_activation)
    (fused,) = out.nodes
    assert fused.inputs == ["x", "w", "", "lo", "hi"]


def test_chain_stops_at_a_kept_tensor():
    g = graph([node("Conv", ["x", "w"], "c"), node("Relu", ["c"], "r"), node("Sigmoid", ["r"], "y")],
              {"x": (1, 2, 4, 4)}, ["y"], {"w": _w(2, 2, 1, 1)})
    fuse_bias_activation(g, keep=frozenset({"r"}))
    assert op_counts(g) == {f"{POLYKIT_DOMAIN}:Conv": 1, "Sigmoid": 1}
    assert g.nodes[0].outputs == ["r"]


def test_chain_stops_where_broadcasting_would_grow_the_result():
    g = graph([node("MatMul", ["x", "w"], "m"), node("Add", ["m", "big"], "y")], {"x": (4, 3), "big": (2, 4, 5)},
              ["y"], {"w": _w(3, 5)})
    assert not fuse_bias_activation(g)


def test_two_convs_feeding_one_residual_add_fuse_only_one_epilogue():
    """ResNet's downsample block: both convs' sole reader is the same Add; only one may take it."""
    import numpy as np

    from polykit.compiler.graph.evaluator import evaluate_graph
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.compiler.passes import optimize
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="main", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w2"], ["b"], name="down"),
        helper.make_node("Add", ["a", "b"], ["s"], name="res"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w1, w2])
    graph = load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    before = evaluate_graph(graph, {"x": x})["y"]
    opt = optimize(graph)
    assert sum(1 for n in opt.nodes if n.attrs.get("epilogue")) == 1
    np.testing.assert_allclose(evaluate_graph(opt, {"x": x})["y"], before, rtol=1e-5, atol=1e-5)


def test_a_dtype_changing_cast_is_not_fused_into_an_epilogue():
    """Epilogues write the base op's output buffer, so they keep its dtype (fp16 builds end in Cast)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.compiler.passes import optimize

    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((8, 5)).astype(np.float16), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT, name="cast")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], [w])
    opt = optimize(load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])))
    fused = [n for n in opt.nodes if n.attrs.get("epilogue")]
    assert len(fused) == 1
    assert [s["op"] for s in fused[0].attrs["epilogue"]["body"]] == ["Relu"]
    assert opt.value(fused[0].outputs[0]).dtype == np.float16


def test_chain_stops_before_an_op_reading_a_bool_mask():
    g = graph([node("MatMul", ["x", "w"], "m"), node("Relu", ["m"], "r"),
               node("Where", ["mask", "r", "fill"], "y")],
              {"x": (2, 3, 4), "mask": ((2, 3, 5), np.bool_)}, ["y"], {"w": _w(4, 5), "fill": _w(1)})
    out, changed = run_and_compare(g, fuse_bias_activation)
    fused = [n for n in out.nodes if n.attrs.get("epilogue")]
    assert changed and len(fused) == 1
    assert [s["op"] for s in fused[0].attrs["epilogue"]["body"]] == ["Relu"]
    assert op_counts(out)["Where"] == 1


def test_chain_stops_before_pow_with_an_integer_exponent():
    g = graph([node("MatMul", ["x", "w"], "m"), node("Pow", ["m", "e"], "y")],
              {"x": (2, 3, 4)}, ["y"], {"w": _w(4, 5), "e": np.array(2, np.int64)})
    out, changed = run_and_compare(g, fuse_bias_activation)
    assert not changed and not any(n.attrs.get("epilogue") for n in out.nodes)


def _conv_nhwc(*chain, **inits):
    conv = node("ConvNHWC", ["x", "w"], "c", name="conv0", domain=POLYKIT_DOMAIN, pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    return graph([conv, *chain], {"x": (2, 5, 6, 8), "skip": (2, 5, 6, 4)}, [chain[-1].outputs[0]],
                 {"w": _w(4, 3, 3, 8), **inits})


def test_conv_nhwc_plus_a_constant_on_the_channel_axis_becomes_its_bias():
    g = _conv_nhwc(node("Add", ["c", "bias"], "y"), bias=_w(1, 1, 1, 4))
    out, changed = run_and_compare(g, fuse_bias_activation)
    (conv,) = out.nodes
    assert changed and conv.op_type == "ConvNHWC" and conv.outputs == ["y"]
    np.testing.assert_array_equal(out.initializers[conv.inputs[2]], g.initializers["bias"].reshape(4))


def test_conv_nhwc_plus_a_constant_along_w_is_no_bias_but_an_epilogue_input():
    g = _conv_nhwc(node("Add", ["c", "along_w"], "y"), along_w=_w(6, 1))
    out, _ = run_and_compare(g, fuse_bias_activation)
    (conv,) = out.nodes
    assert conv.inputs == ["x", "w", "", "along_w"] and conv.attrs["epilogue"]["input"] == "c"

def test_conv_nhwc_relu_residual_becomes_one_nhwc_epilogue_node():
    g = _conv_nhwc(node("Relu", ["c"], "r", name="relu0"), node("Add", ["r", "skip"], "y", name="add0"))
    out, _ = run_and_compare(g, fuse_bias_activation)
    (fused,) = out.nodes
    assert (fused.op_type, fused.domain) == ("ConvNHWC", POLYKIT_DOMAIN)
    assert fused.inputs == ["x", "w", "", "skip"] and fused.attrs["epilogue"]["input"] == "c"
    assert fused.attrs["fused_from"] == ["conv0", "relu0", "add0"] and fused.attrs["kernel_shape"] == [3, 3]


# Epilogue groups that read a value more than once (a diamond): SiLU as Mul(x, Sigmoid(x)),
# HardSwish as x * HardSigmoid(x) or x * Clip(x + 3, 0, 6) / 6, GELU as x * Sigmoid(1.702 x).

def _conv_silu(*after, keep_outputs=("y",), bias=False):
    conv = node("Conv", ["x", "w"], "c", name="conv0", pads=[1, 1, 1, 1])
    nodes = [conv]
    if bias:
        nodes.append(node("Add", ["c0", "bias"], "c", name="bias0"))
        conv.outputs = ["c0"]
    nodes += [node("Sigmoid", ["c"], "s", name="sig0"), node("Mul", ["c", "s"], "silu", name="mul0"), *after]
    return graph(nodes, {"x": (2, 3, 5, 7), "skip": (2, 4, 5, 7)}, list(keep_outputs),
                 {"w": _w(4, 3, 3, 3), "bias": _w(1, 4, 1, 1), "w2": _w(4, 4, 1, 1)})


def _only_epilogue(out):
    fused = [n for n in out.nodes if n.attrs.get("epilogue")]
    assert len(fused) == 1
    return fused[0], [s["op"] for s in fused[0].attrs["epilogue"]["body"]]


def test_conv_silu_diamond_becomes_one_epilogue_node():
    g = _conv_silu(keep_outputs=("silu",))
    out, changed = run_and_compare(g, fuse_bias_activation)
    (fused,) = out.nodes
    assert changed and (fused.op_type, fused.domain) == ("Conv", POLYKIT_DOMAIN)
    assert fused.inputs == ["x", "w", ""] and fused.outputs == ["silu"]
    assert fused.attrs["epilogue"] == {"input": "c", "body": [
        {"op": "Sigmoid", "inputs": ["c"], "outputs": ["s"], "attrs": {}},
        {"op": "Mul", "inputs": ["c", "s"], "outputs": ["silu"], "attrs": {}}]}
    assert fused.attrs["fused_from"] == ["conv0", "sig0", "mul0"]
    json.dumps(fused.attrs)


def test_conv_bias_silu_and_residual_add_fuse_after_the_diamond():
    g = _conv_silu(node("Add", ["silu", "skip"], "y", name="res0"), bias=True)
    out, _ = run_and_compare(g, fuse_bias_activation)
    (fused,) = out.nodes
    assert fused.inputs[3:] == ["skip"] and fused.inputs[2]  # the bias folded into the Conv
    assert [s["op"] for s in fused.attrs["epilogue"]["body"]] == ["Sigmoid", "Mul", "Add"]


def test_conv_nhwc_silu_diamond_becomes_an_nhwc_epilogue():
    g = _conv_nhwc(node("Sigmoid", ["c"], "s"), node("Mul", ["s", "c"], "t"), node("Add", ["t", "skip"], "y"))
    out, _ = run_and_compare(g, fuse_bias_activation)
    (fused,) = out.nodes
    assert (fused.op_type, fused.inputs[3:]) == ("ConvNHWC", ["skip"])
    assert [s["op"] for s in fused.attrs["epilogue"]["body"]] == ["Sigmoid", "Mul", "Add"]


def test_gemm_hardswish_as_clip_over_six_becomes_one_epilogue():
    g = graph([node("Gemm", ["x", "w", "b"], "m", transB=1), node("Add", ["m", "three"], "a"),
               node("Clip", ["a", "zero", "six"], "r"), node("Mul", ["m", "r"], "p"), node("Div", ["p", "six"], "y")],
              {"x": (5, 3)}, ["y"], {"w": _w(6, 3), "b": _w(6), "three": scalar(3.0), "zero": scalar(0.0),
                                     "six": scalar(6.0)})
    out, _ = run_and_compare(g, fuse_bias_activation)
    (fused,) = out.nodes
    assert fused.op_type == "Gemm" and fused.inputs == ["x", "w", "b", "three", "zero", "six"]
    assert [s["op"] for s in fused.attrs["epilogue"]["body"]] == ["Add", "Clip", "Mul", "Div"]


def test_matmul_hardswish_as_hardsigmoid_and_sigmoid_gelu_fuse():
    for steps, ops in (([node("HardSigmoid", ["m"], "h", alpha=1 / 6, beta=0.5), node("Mul", ["h", "m"], "y")],
                        ["HardSigmoid", "Mul"]),
                       ([node("Mul", ["m", "k"], "a"), node("Sigmoid", ["a"], "s"), node("Mul", ["m", "s"], "y")],
                        ["Mul", "Sigmoid", "Mul"])):
        g = graph([node("MatMul", ["x", "w"], "m"), *steps], {"x": (2, 3, 4)}, ["y"],
                  {"w": _w(4, 5), "k": scalar(1.702)})
        out, _ = run_and_compare(g, fuse_bias_activation)
        (fused,) = out.nodes
        assert fused.op_type == "MatMul" and [s["op"] for s in fused.attrs["epilogue"]["body"]] == ops


def test_diamond_whose_intermediate_is_read_outside_does_not_fuse():
    g = _conv_silu(node("GlobalAveragePool", ["s"], "gate"), keep_outputs=("silu", "gate"))
    out, changed = run_and_compare(g, fuse_bias_activation)
    assert not changed and op_counts(out) == {"Conv": 1, "Sigmoid": 1, "Mul": 1, "GlobalAveragePool": 1}


def test_diamond_whose_intermediate_is_a_graph_output_or_kept_does_not_fuse():
    out, changed = run_and_compare(_conv_silu(keep_outputs=("silu", "s")), fuse_bias_activation)
    assert not changed and op_counts(out)["Sigmoid"] == 1
    g = _conv_silu(keep_outputs=("silu",))
    assert not fuse_bias_activation(g, keep=frozenset({"s"}))
    assert not fuse_bias_activation(_conv_silu(keep_outputs=("silu",)), keep=frozenset({"c"}))


def test_diamond_whose_base_output_is_read_outside_does_not_fuse():
    g = _conv_silu(node("Relu", ["c"], "r"), node("Add", ["silu", "r"], "y"), node("GlobalMaxPool", ["c"], "m"),
                   keep_outputs=("y", "m"))
    out, changed = run_and_compare(g, fuse_bias_activation)
    assert not changed and not any(n.attrs.get("epilogue") for n in out.nodes)


def test_squeeze_excitation_silu_fuses_but_the_scale_does_not():
    """EfficientNet's block: the SiLU output feeds both the squeeze (a pool) and the scale Mul, so
    the conv's epilogue ends at the SiLU; the squeeze's 1x1 conv takes its own Sigmoid gate."""
    g = _conv_silu(node("GlobalAveragePool", ["silu"], "p"), node("Conv", ["p", "w2"], "q", name="conv1"),
                   node("Sigmoid", ["q"], "gate"), node("Mul", ["silu", "gate"], "y"))
    out, _ = run_and_compare(g, fuse_bias_activation)
    epilogues = {n.name: [s["op"] for s in n.attrs["epilogue"]["body"]] for n in out.nodes if n.attrs.get("epilogue")}
    assert epilogues == {"conv0": ["Sigmoid", "Mul"], "conv1": ["Sigmoid"]}
    assert op_counts(out)["Mul"] == 1


def test_an_int8_conv_takes_a_silu_diamond_into_its_epilogue():
    """fold_qdq's INT8 layers take the same epilogue groups (epilogue_chain)."""
    from polykit.compiler.passes.fold_qdq import fold_qdq

    wq = RNG.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8)
    g = graph([node("DequantizeLinear", ["xq", "xs", "xz"], "x"), node("DequantizeLinear", ["wq", "ws", "wz"], "w"),
               node("Conv", ["x", "w"], "c", name="conv0", pads=[1, 1, 1, 1]), node("Sigmoid", ["c"], "s"),
               node("Mul", ["s", "c"], "y")],
              {"xq": ((1, 3, 5, 6), np.int8)}, ["y"],
              {"xs": scalar(0.05), "xz": np.array(0, np.int8), "wq": wq, "ws": scalar(0.01), "wz": np.array(0, np.int8)})
    out, changed = run_and_compare(g, fold_qdq)
    (layer,) = [n for n in out.nodes if n.op_type != "DequantizeLinear"]  # the DQs are dead code now
    assert changed and layer.op_type == "QConv" and [s["op"] for s in layer.attrs["epilogue"]["body"]] == ["Sigmoid", "Mul"]


def _out_proj_then_views(views, residual_shape=(1, 5, 4)):
    """Gemm [5, 4] (torchvision's out-proj at batch 1) -> `views` -> Add(., r) -> y."""
    nodes, inits, prev = [node("Gemm", ["x", "w", "b"], "g", name="out_proj")], {"w": _w(4, 4), "b": _w(4)}, "g"
    for k, (op, arg) in enumerate(views):
        out = f"v{k}"
        if op == "Reshape":
            inits[f"s{k}"] = np.array(arg, np.int64)
            nodes.append(node("Reshape", [prev, f"s{k}"], out, name=f"view{k}"))
        else:
            inits[f"a{k}"] = np.array(arg, np.int64)
            nodes.append(node(op, [prev, f"a{k}"], out, name=f"view{k}"))
        prev = out
    nodes.append(node("Add", [prev, "r"], "y", name="residual"))
    return graph(nodes, {"x": (5, 4), "r": residual_shape}, ["y"], inits)


def test_a_residual_add_behind_views_joins_the_gemm_epilogue():
    """Gemm -> Reshape [5, 1, 4] -> Unsqueeze-free size-1 move [1, 5, 4] -> Add(residual): the views
    move below the Add, which the Gemm takes as its epilogue; the residual is read as [5, 4]."""
    g = _out_proj_then_views([("Reshape", [5, 1, 4]), ("Reshape", [1, 5, 4])])
    out, changed = run_and_compare(g, fuse_bias_activation)
    assert changed
    assert op_counts(out) == {"ai.polykit:Gemm": 1, "Reshape": 2}
    fused = next(n for n in out.nodes if n.op_type == "Gemm")
    assert [s["op"] for s in fused.attrs["epilogue"]["body"]] == ["Add"]
    assert out.outputs == ["y"] and out.value("y").shape == (1, 5, 4)


def test_views_with_a_scalar_operand_and_through_unsqueeze():
    g = _out_proj_then_views([("Unsqueeze", [0])], residual_shape=())
    out, changed = run_and_compare(g, fuse_bias_activation)
    assert changed and op_counts(out) == {"ai.polykit:Gemm": 1, "Reshape": 1}


def test_views_stay_where_the_other_operand_broadcasts_or_the_view_is_read_twice():
    g = _out_proj_then_views([("Reshape", [1, 5, 4])], residual_shape=(4,))  # broadcast over rows
    out, _ = run_and_compare(g, fuse_bias_activation)
    assert op_counts(out) == {"Gemm": 1, "Reshape": 1, "Add": 1}
    g = _out_proj_then_views([("Reshape", [1, 5, 4])])
    g.outputs.append("v0")  # the view is a graph output too
    out, _ = run_and_compare(g, fuse_bias_activation)
    assert op_counts(out) == {"Gemm": 1, "Reshape": 1, "Add": 1}


# step 5: a channels-last GroupNormNHWC takes the unary activation that is its output's only reader
GN = f"{POLYKIT_DOMAIN}:GroupNormNHWC"


def _norm_then(tail: list, outputs: list[str] | None = None, x_shape=(2, 5, 3, 8), dtype=np.float32):
    """x [N, ..., 8] -> GroupNormNHWC(4 groups) "n" -> the `tail` nodes; outputs default ["y"]."""
    c = x_shape[-1]
    inits = {"s": RNG.uniform(0.5, 1.5, c).astype(dtype), "b": (RNG.standard_normal(c) * 0.1).astype(dtype)}
    norm = node("GroupNormNHWC", ["x", "s", "b"], "n", name="gn", domain=POLYKIT_DOMAIN, num_groups=4, epsilon=1e-5)
    return graph([norm, *tail], {"x": (x_shape, dtype)}, outputs or ["y"], inits)


ACTIVATION_TAILS = [
    ([node("Relu", ["n"], "y")], "relu"),
    ([node("Sigmoid", ["n"], "y")], "sigmoid"),
    ([node("Tanh", ["n"], "y")], "tanh"),
    ([node("Gelu", ["n"], "y")], "gelu"),
    ([node("Gelu", ["n"], "y", approximate="tanh")], "gelu_tanh"),
    ([node("Sigmoid", ["n"], "sg"), node("Mul", ["n", "sg"], "y")], "silu"),
    ([node("Sigmoid", ["n"], "sg"), node("Mul", ["sg", "n"], "y")], "silu"),
]


@pytest.mark.parametrize("tail,act", ACTIVATION_TAILS)
def test_group_norm_nhwc_takes_its_activation(tail, act):
    """One node left, writing the activation's output, with the same values (the references)."""
    out, changed = run_and_compare(_norm_then(tail), fuse_bias_activation, rtol=1e-6, atol=1e-6)
    assert changed and op_counts(out) == {GN: 1}
    (norm,) = out.nodes
    assert norm.attrs["activation"] == act and norm.outputs == ["y"] and norm.inputs == ["x", "s", "b"]
    assert norm.attrs["fused_from"] == ["gn", *(n.name for n in tail)]


def test_group_norm_nhwc_takes_silu_in_float16_within_one_rounding():
    """fp16: the fused reference rounds the norm's output, then SiLU once (the unfused two nodes round
    the Sigmoid too): within an fp16 ulp or two."""
    tail = [node("Sigmoid", ["n"], "sg"), node("Mul", ["n", "sg"], "y")]
    out, changed = run_and_compare(_norm_then(tail, dtype=np.float16), fuse_bias_activation, rtol=2e-3, atol=2e-3)
    assert changed and op_counts(out) == {GN: 1} and out.value("y").dtype == np.float16


@pytest.mark.parametrize("tail,outputs", [
    # the norm's output read by the activation and a residual Add: both need the plain norm
    ([node("Sigmoid", ["n"], "sg"), node("Mul", ["n", "sg"], "m"), node("Add", ["m", "n"], "y")], None),
    ([node("Relu", ["n"], "y")], ["y", "n"]),  # the norm's output is a graph output
    ([node("Sigmoid", ["n"], "sg"), node("Mul", ["n", "sg"], "y")], ["y", "sg"]),  # the Sigmoid's too
    ([node("Mul", ["n", "n"], "y")], None),  # not SiLU
    ([node("Sigmoid", ["n"], "sg"), node("Mul", ["n", "sg"], "m"), node("Relu", ["sg"], "r"),
      node("Add", ["m", "r"], "y")], None),  # the Sigmoid read outside the Mul
    ([node("Relu", ["n"], "r"), node("Tanh", ["n"], "t"), node("Add", ["r", "t"], "y")], None),  # two readers
    ([node("Cast", ["n"], "y", to=10)], None),  # not an activation
])
def test_group_norm_nhwc_keeps_a_norm_read_otherwise(tail, outputs):
    out, _ = run_and_compare(_norm_then(tail, outputs), fuse_bias_activation, rtol=1e-6, atol=1e-6)
    (norm,) = [n for n in out.nodes if n.op_type == "GroupNormNHWC"]
    assert "activation" not in norm.attrs and norm.outputs == ["n"]


def test_a_group_norm_nhwc_with_an_activation_takes_no_second_one():
    g = _norm_then([node("Relu", ["n"], "y")])
    fuse_bias_activation(g)
    g = graph(g.nodes + [node("Relu", ["y"], "z")], {"x": (2, 5, 3, 8)}, ["z"], g.initializers)
    assert not fuse_bias_activation(g)
