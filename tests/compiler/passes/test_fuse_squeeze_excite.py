"""fuse_squeeze_excite: a squeeze-excitation block (spatial mean -> 1x1 conv + act -> 1x1 conv + gate
-> Mul with the pooled tensor) is one ai.polykit SqueezeExcite node that scales its input (`scale`).
cpu plans (NCHW and channels-last) compute what onnxruntime does on odd shapes and activations; the
chains the pass must leave alone stay; a gate read elsewhere stays the node's output, its Mul apart;
cuda fp16 plans (level 0, no GPU) run each block as one SqueezeExcite layer and no Mul."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import fuse_squeeze_excite, optimize
from polykit.runtime.engine import Runtime

#: act name -> nodes computing `out` from `inp` (extra initializers)
ACTS = {
    "silu": lambda i, o: ([helper.make_node("Sigmoid", [i], [o + "_s"]), helper.make_node("Mul", [i, o + "_s"], [o])], []),
    "relu": lambda i, o: ([helper.make_node("Relu", [i], [o])], []),
    "clip": lambda i, o: ([helper.make_node("Clip", [i, o + "_lo", o + "_hi"], [o])],
                          [numpy_helper.from_array(np.array(-0.5, np.float32), o + "_lo"),
                           numpy_helper.from_array(np.array(1.5, np.float32), o + "_hi")]),
    "erf_gelu": lambda i, o: ([helper.make_node("Div", [i, o + "_r2"], [o + "_d"]), helper.make_node("Erf", [o + "_d"], [o + "_e"]),
                               helper.make_node("Add", [o + "_e", o + "_one"], [o + "_a"]),
                               helper.make_node("Mul", [i, o + "_a"], [o + "_m"]),
                               helper.make_node("Mul", [o + "_m", o + "_half"], [o])],
                              [numpy_helper.from_array(np.array(np.sqrt(2), np.float32), o + "_r2"),
                               numpy_helper.from_array(np.array(1.0, np.float32), o + "_one"),
                               numpy_helper.from_array(np.array(0.5, np.float32), o + "_half")]),
    "sigmoid": lambda i, o: ([helper.make_node("Sigmoid", [i], [o])], []),
    "hardsigmoid": lambda i, o: ([helper.make_node("HardSigmoid", [i], [o], alpha=1 / 6, beta=0.5)], []),
    "none": lambda i, o: ([helper.make_node("Identity", [i], [o])], []),
}


def se_model(n: int, c: int, cr: int, hw: tuple[int, int], act: str = "silu", gate: str = "sigmoid", *,
             pool: str = "reducemean", conv1: dict | None = None, hidden_out: bool = False, axes=(2, 3),
             group: int = 1, bias: bool = True, seed: int = 0, swap: bool = False, other: bool = False,
             s_out: bool = False, s_read: bool = False) -> onnx.ModelProto:
    """x [n, c, *hw] -> a = Conv3x3(x), m = a * gate(conv(act(conv(mean(a))))), y = Conv1x1(m) (so a
    channels-last build runs the block on NHWC tensors); `conv1` overrides the first conv's attributes, `hidden_out` makes
    the hidden tensor a graph output too; `swap` writes the Mul as s * a; `other` scales b = Relu(a) (not
    the pooled tensor); `s_out` makes the gate s a graph output; `s_read` has a second node read it."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((cr, c // group, 1, 1)) / np.sqrt(c)).astype(np.float32)
    w2 = (rng.standard_normal((c, cr, 1, 1)) / np.sqrt(cr)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), "w0")]
    stem = helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1])
    if bias:
        inits += [numpy_helper.from_array(rng.standard_normal(cr).astype(np.float32), "b1"),
                  numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b2")]
    if pool == "gap":
        nodes = [stem, helper.make_node("GlobalAveragePool", ["a"], ["p"])]
    else:
        nodes = [stem, helper.make_node("ReduceMean", ["a"], ["p"], axes=list(axes), keepdims=1)]
    k = (conv1 or {}).pop("kernel", 1) if conv1 else 1
    if k != 1:
        inits[0] = numpy_helper.from_array(np.resize(w1, (cr, c // group, k, k)), "w1")
    nodes.append(helper.make_node("Conv", ["p", "w1"] + (["b1"] if bias else []), ["h0"], group=group, **(conv1 or {})))
    act_nodes, act_inits = ACTS[act]("h0", "h")
    gate_nodes, gate_inits = ACTS[gate]("z0", "s")
    nodes += act_nodes + [helper.make_node("Conv", ["h", "w2"] + (["b2"] if bias else []), ["z0"])] + gate_nodes
    scaled = "a"
    if other:
        nodes.append(helper.make_node("Relu", ["a"], ["b"]))
        scaled = "b"
    nodes += [helper.make_node("Mul", ["s", scaled] if swap else [scaled, "s"], ["m"]),
              helper.make_node("Conv", ["m", "wt"], ["y"])]
    inits.append(numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)).astype(np.float32), "wt"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if hidden_out:
        outputs.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, None))
    if s_out:
        outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, None))
    if s_read:
        nodes.append(helper.make_node("Neg", ["s"], ["sn"]))
        outputs.append(helper.make_tensor_value_info("sn", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, *hw])], outputs,
                          inits + act_inits + gate_inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _x(model: onnx.ModelProto, seed: int = 1) -> np.ndarray:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run_cpu(model, channels_last: bool, x):
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=channels_last))
    ctx = Runtime().deserialize_engine(plan.serialize()).create_execution_context()
    return plan, ctx.execute({"x": x})


CASES = [  # (n, c, cr, hw, act, gate, pool)
    (1, 24, 2, (7, 7), "silu", "sigmoid", "reducemean"),
    (3, 5, 1, (1, 1), "relu", "hardsigmoid", "gap"),
    (1, 3, 13, (56, 56), "clip", "sigmoid", "reducemean"),
    (3, 100, 13, (7, 7), "erf_gelu", "hardsigmoid", "reducemean"),
    (1, 100, 2, (5, 3), "none", "sigmoid", "gap"),
]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("n,c,cr,hw,act,gate,pool", CASES)
def test_cpu_plans_run_each_se_block_as_one_node_and_match_onnxruntime(n, c, cr, hw, act, gate, pool, channels_last):
    model = se_model(n, c, cr, hw, act, gate, pool=pool)
    x = _x(model)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    plan, got = _run_cpu(model, channels_last, x)
    kinds = Counter(layer.kind for layer in plan.layers)
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)
    if hw == (1, 1):  # the scaling Mul has the second conv's output shape: it joins that conv's epilogue, no gate
        assert kinds["SqueezeExcite"] == 0  # is left to fuse
        return
    assert kinds["SqueezeExcite"] == 1 and kinds["ReduceMean"] == kinds["GlobalAveragePool"] == 0
    assert sum(layer.kind in ("Conv", "ConvNHWC") for layer in plan.layers) == 2  # the stem and the tail
    assert kinds["Mul"] == kinds["Pointwise"] == 0  # the scale is the node's
    (se,) = [layer for layer in plan.layers if layer.kind == "SqueezeExcite"]
    assert se.attrs["layout"] == ("nhwc" if channels_last else "nchw") and se.attrs["scale"] == 1
    assert se.out_shapes[0] == se.in_shapes[0]  # y = x * s, x's shape


def test_the_bodies_move_unchanged_and_the_clip_bounds_are_inputs():
    g = optimize(load_onnx(se_model(1, 24, 4, (7, 7), "clip", "hardsigmoid")))
    (se,) = [n for n in g.nodes if n.op_type == "SqueezeExcite"]
    assert se.domain == POLYKIT_DOMAIN and len(se.inputs) == 7  # x, W1, b1, W2, b2, Clip's bounds
    assert [s["op"] for s in se.attrs["act"]["body"]] == ["Clip"]
    assert [s["op"] for s in se.attrs["gate"]["body"]] == ["HardSigmoid"]
    assert se.attrs["gate"]["body"][0]["attrs"]["alpha"] == pytest.approx(1 / 6)
    assert se.attrs["scale"] == 1 and se.outputs == ["m"]  # the Mul's output; the gate s is internal
    assert se.attrs["gate"]["output"] == "s" and "s" not in g.values and not any("s" in n.inputs for n in g.nodes)


def test_convs_without_bias_get_a_zero_bias():
    model = se_model(2, 8, 3, (4, 4), bias=False)
    x = _x(model)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    plan, got = _run_cpu(model, True, x)
    assert Counter(layer.kind for layer in plan.layers)["SqueezeExcite"] == 1
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["hidden_read_elsewhere", "padded_conv", "strided_conv", "channel_mean",
                                  "group_conv", "kernel_3"])
def test_chains_that_are_not_a_squeeze_excitation_stay(case):
    kw: dict = {}
    if case == "hidden_read_elsewhere":
        kw["hidden_out"] = True
    elif case == "padded_conv":  # p [1, 8, 1, 1] -> h [1, 4, 3, 3]: the Mul broadcasts a 3x3 input
        kw["conv1"] = {"pads": [1, 1, 1, 1]}
    elif case == "strided_conv":
        kw["conv1"] = {"strides": [2, 2]}
    elif case == "channel_mean":
        kw["axes"] = (1, 2)
    elif case == "group_conv":
        kw["group"] = 2
    else:
        kw["conv1"] = {"kernel": 3, "pads": [1, 1, 1, 1]}
    c, hw = 8, (5, 5)
    if case == "padded_conv":
        hw = (3, 3)
    model = se_model(1, c, 4, hw, **kw)
    if case == "channel_mean":  # the mean over C and H: [1, 1, 1, 5] then convs of 1 input channel
        model = se_model(1, 1, 4, (8, 5), axes=(1, 2))
    for channels_last in (False, True):
        g = optimize(load_onnx(model), channels_last=channels_last)
        assert not any(n.op_type == "SqueezeExcite" for n in g.nodes), (case, channels_last)
    x = _x(model)
    (want, *_) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    _, got = _run_cpu(model, True, x)
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


def test_the_pass_alone_keys_on_shapes_not_names():
    g = optimize(load_onnx(se_model(1, 16, 4, (6, 6))), fuse=False)  # convs and acts apart
    assert not fuse_squeeze_excite(g)  # no epilogue yet: the act sits between the convs
    h = optimize(load_onnx(se_model(1, 16, 4, (6, 6), act="none", gate="none")), fuse=False)
    assert fuse_squeeze_excite(h)  # ONNX Conv -> Conv with no act: one node with empty bodies
    (se,) = [n for n in h.nodes if n.op_type == "SqueezeExcite"]
    assert se.attrs["act"]["body"] == [] and se.attrs["layout"] == "nchw"


@pytest.mark.parametrize("n,c,cr,hw", [(1, 32, 8, (112, 112)), (3, 24, 13, (7, 7))])
def test_cuda_fp16_plans_run_an_se_block_as_one_layer_and_no_mul(n, c, cr, hw):
    plan = build_plan(se_model(n, c, cr, hw, "silu", "hardsigmoid"),
                      BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["SqueezeExcite"] == 1 and kinds["ReduceMean"] == 0 and kinds["ConvNHWC"] == 2  # the stem and the tail
    assert kinds["Mul"] == kinds["Pointwise"] == 0
    (se,) = [layer for layer in plan.layers if layer.kind == "SqueezeExcite"]
    assert se.tactic == "cuda.squeeze_excite" and se.out_shapes[0] == (n, *hw, c) and se.attrs["scale"] == 1
    (tail,) = [layer for layer in plan.layers if se.outputs[0] in layer.inputs]
    assert tail.kind == "ConvNHWC"  # the projection reads the scaled tensor straight from the SE layer


@pytest.mark.parametrize("case", ["s_read", "s_out", "other", "kept"])
def test_a_gate_read_elsewhere_or_scaling_another_tensor_stays_the_node_output(case):
    """The Mul stays apart (and the node writes s) when s has another reader, is a graph output or
    kept, or the Mul scales a tensor other than the pooled one; the plans still match onnxruntime."""
    model = se_model(2, 16, 4, (5, 5), "relu", "sigmoid", **({case: True} if case != "kept" else {}))
    keep = {"s"} if case == "kept" else set()
    for channels_last in (False, True):
        g = optimize(load_onnx(model), channels_last=channels_last, keep=keep)
        (se,) = [n for n in g.nodes if n.op_type == "SqueezeExcite"]
        assert "scale" not in se.attrs and se.attrs["gate"]["output"] == se.outputs[0]
        assert any(n.op_type in ("Mul", "Pointwise") and se.outputs[0] in n.inputs for n in g.nodes)
    x = _x(model)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    _, got = _run_cpu(model, True, x)
    for out, ref in zip(model.graph.output, want):
        np.testing.assert_allclose(got[out.name], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_mul_is_absorbed_in_either_operand_order(channels_last):
    model = se_model(3, 20, 5, (6, 4), "silu", "hardsigmoid", swap=True)
    g = optimize(load_onnx(model), channels_last=channels_last)
    (se,) = [n for n in g.nodes if n.op_type == "SqueezeExcite"]
    assert se.attrs["scale"] == 1 and not any(n.op_type == "Mul" for n in g.nodes)
    x = _x(model)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(_run_cpu(model, channels_last, x)[1]["y"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("n,c,cr,hw,act,gate,pool", CASES + [(1, 32, 8, (112, 112), "silu", "sigmoid", "gap")])
def test_cuda_fp16_plans_of_se_blocks_match_the_cpu(n, c, cr, hw, act, gate, pool):
    """The fused layer on the GPU against the cpu plan, run twice on one context (the lead runs it)."""
    model = se_model(n, c, cr, hw, act, gate, pool=pool)
    x = _x(model)
    want = _run_cpu(model, True, x)[1]["y"]
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True))
    # at 1x1 pixels the scaling Mul joins the second conv's epilogue first (as on the cpu target)
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["SqueezeExcite"] == (0 if hw == (1, 1) else 1)
    assert hw == (1, 1) or kinds["Mul"] == kinds["Pointwise"] == 0  # the layer scales (se_fc2_scale_<layout>)
    ctx = Runtime().deserialize_engine(plan.serialize()).create_execution_context()
    for _ in range(2):
        got = ctx.execute({"x": x})["y"]
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("swap", [False, True])
def test_cuda_fp16_plans_whose_gate_is_read_elsewhere_or_swapped_match_the_cpu(swap):
    """se_fc2 (the gate stored: a second reader) and se_fc2_scale (the Mul written s * a) on the GPU
    against the cpu plan, every graph output (the lead runs it)."""
    model = se_model(2, 40, 10, (14, 14), "silu", "sigmoid", swap=swap, s_read=not swap)
    x = _x(model)
    want = _run_cpu(model, True, x)[1]
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True))
    (se,) = [layer for layer in plan.layers if layer.kind == "SqueezeExcite"]
    assert (se.attrs.get("scale") == 1) == swap
    got = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute({"x": x})
    for name, ref in want.items():
        assert np.linalg.norm(got[name] - ref) / np.linalg.norm(ref) < 1e-2, name


def test_an_optimized_graph_with_squeeze_excite_round_trips_through_onnx():
    from polykit.compiler.graph.evaluator import evaluate_graph
    from polykit.compiler.graph.onnx_export import to_onnx

    model = se_model(2, 16, 4, (5, 5), "clip", "hardsigmoid")
    g = optimize(load_onnx(model), channels_last=True)
    back = load_onnx(to_onnx(g))
    (se,) = [n for n in back.nodes if n.op_type == "SqueezeExcite"]
    assert isinstance(se.attrs["act"], dict) and se.attrs["act"]["body"][0]["op"] == "Clip" and se.attrs["scale"] == 1
    x = _x(model)
    np.testing.assert_allclose(evaluate_graph(back, {"x": x})["y"], evaluate_graph(g, {"x": x})["y"], rtol=0, atol=0)


def test_an_edited_squeeze_excite_attribute_that_is_not_json_is_an_error_naming_node_and_attribute():
    from polykit.compiler.graph.onnx_export import to_onnx
    from polykit.errors import NodeAttributeError

    exported = to_onnx(optimize(load_onnx(se_model(2, 16, 4, (5, 5), "relu", "sigmoid")), channels_last=True))
    (se,) = [n for n in exported.graph.node if n.op_type == "SqueezeExcite"]
    for attr in se.attribute:
        if attr.name == "act":
            attr.s = b"{not json"
    with pytest.raises(NodeAttributeError, match="attribute 'act' is not JSON") as info:
        load_onnx(exported)
    assert "SqueezeExcite" in info.value.where and info.value.hint


def test_renaming_a_clip_bound_renames_it_inside_the_body():
    from polykit.compiler.ops.nn.fused import rename_fused_tensor

    g = optimize(load_onnx(se_model(1, 16, 4, (5, 5), "clip", "sigmoid")))
    (se,) = [n for n in g.nodes if n.op_type == "SqueezeExcite"]
    lo = se.inputs[5]
    rename_fused_tensor(se, lo, "bound")
    assert se.inputs[5] == "bound" and se.attrs["act"]["body"][0]["inputs"][1] == "bound"


def test_a_block_whose_weights_stay_float32_in_an_fp16_build_stays_apart():
    model = se_model(1, 16, 4, (6, 6))
    names = {n.name: n for n in load_onnx(model).nodes}
    conv1 = next(name for name, n in names.items() if n.op_type == "Conv" and n.inputs[1] == "w1")
    g = optimize(load_onnx(model), channels_last=True, fp16=True, fp32_layers=(conv1,))
    assert not any(n.op_type == "SqueezeExcite" for n in g.nodes)
    h = optimize(load_onnx(model), channels_last=True, fp16=True)
    assert sum(n.op_type == "SqueezeExcite" for n in h.nodes) == 1


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("gate", ["sigmoid", "none"])
def test_an_se_layer_renamed_for_timing_still_generates_its_kernels(gate, scaled):
    """The tuner times a layer on renamed tensors (layer_timing.renamed); the gate's holder names the
    layer's output itself when the layer writes the gate, so the rename must reach it (the GPU run of
    2026-12-05 failed here: KeyError); a scaling layer's gate is internal and keeps its name."""
    from polykit.compiler.builder.layer_timing import renamed
    from polykit.kernels.cuda.reduce import squeeze_excite as se_cuda

    plan = build_plan(se_model(1, 24, 2, (7, 7), "silu", gate, s_read=not scaled),
                      BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    (se,) = [layer for layer in plan.layers if layer.kind == "SqueezeExcite"]
    assert se_cuda.scaled(se) == scaled
    moved = renamed(se, {n: f"{n}#0" for n in (*se.inputs, *se.outputs) if n})
    assert moved.outputs == tuple(f"{n}#0" for n in se.outputs)
    want = se.attrs["gate"]["output"] if scaled else f"{se.outputs[0]}#0"
    assert moved.attrs["gate"]["output"] == want
    sources = se_cuda._kernels(moved)
    assert [s.name for s in sources] == list(se_cuda.kernel_names(moved))
    assert sources[1].name == ("se_fc2_scale_nhwc" if scaled else "se_fc2")
    assert all(s.code == t.code for s, t in zip(sources, se_cuda._kernels(se)))  # names do not reach the code


def test_an_edited_scale_attribute_that_is_not_0_or_1_is_an_error_naming_it():
    from polykit.compiler.graph.onnx_export import to_onnx
    from polykit.errors import PolykitError

    exported = to_onnx(optimize(load_onnx(se_model(2, 16, 4, (5, 5), "relu", "sigmoid")), channels_last=True))
    (se,) = [n for n in exported.graph.node if n.op_type == "SqueezeExcite"]
    (scale,) = [a for a in se.attribute if a.name == "scale"]
    assert scale.i == 1
    scale.i = 2
    with pytest.raises(PolykitError, match="'scale' is 2, not 0 or 1") as info:
        build_plan(exported, BuilderConfig(target="cpu"))
    assert info.value.hint
