"""absorb_concat: a Concat read only by Pointwise nodes disappears into them; the rewritten graph
computes what the original did (reference evaluator), the cpu plans what onnxruntime does, and
the cuda fp16 plan (level 0) has no Concat layer left where every reader is pointwise."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from .passes_testkit import graph, node, op_counts, run_and_compare

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import absorb_concat, fuse_pointwise, remove_identity
from polykit.errors import NodeAttributeError
from polykit.compiler.ops.nn.concat_operands import concat_operands
from polykit.runtime.engine import Runtime
from tests.conv_models import ModelBuilder

PW = f"{POLYKIT_DOMAIN}:Pointwise"


def _fuse_and_absorb(g):
    return fuse_pointwise(g) | absorb_concat(g)


def _pointwise(g):
    return [n for n in g.nodes if n.op_type == "Pointwise"]


# ---- graph level ------------------------------------------------------------------------------
def test_a_concat_read_by_one_pointwise_node_is_absorbed_in_the_documented_format():
    g = graph([node("Concat", ["a", "b"], "cat", axis=-1), node("Mul", ["cat", "s"], "m"), node("Relu", ["m"], "y")],
              {"a": (2, 3, 4, 5), "b": (2, 3, 4, 3), "s": (8,)}, ["y"])
    out, changed = run_and_compare(g, _fuse_and_absorb)
    (pw,) = out.nodes
    assert changed and op_counts(out) == {PW: 1}
    assert pw.inputs == ["s", "a", "b"]
    assert pw.attrs["concat"] == [{"name": "cat", "axis": 3, "first": 1, "count": 2, "extents": [5, 3]}]
    assert pw.attrs["body"][0]["inputs"] == ["cat", "s"]  # the body still reads the operand by name


def test_nchw_channel_axis_with_a_broadcast_scale():
    g = graph([node("Concat", ["a", "b"], "cat", axis=1), node("Mul", ["cat", "s"], "m"), node("Add", ["m", "t"], "n"),
               node("Relu", ["n"], "y")], {"a": (2, 3, 4, 5), "b": (2, 5, 4, 5), "s": (8, 1, 1), "t": (8, 1, 1)}, ["y"])
    out, _ = run_and_compare(g, _fuse_and_absorb)
    (pw,) = out.nodes
    assert pw.attrs["concat"][0]["axis"] == 1 and pw.attrs["concat"][0]["extents"] == [3, 5]


def test_two_pointwise_readers_each_take_the_sources():
    g = graph([node("Concat", ["a", "b", "c"], "cat", axis=0),
               node("Mul", ["cat", "s"], "m"), node("Relu", ["m"], "y"),
               node("Sigmoid", ["cat"], "g"), node("Mul", ["g", "cat"], "z")],
              {"a": (1, 6), "b": (2, 6), "c": (3, 6), "s": (6,)}, ["y", "z"])
    out, _ = run_and_compare(g, _fuse_and_absorb)
    assert op_counts(out) == {PW: 2}
    for pw in out.nodes:
        assert pw.inputs[-3:] == ["a", "b", "c"] and pw.attrs["concat"][0]["extents"] == [1, 2, 3]


def test_a_concat_with_a_non_pointwise_reader_stays():
    g = graph([node("Concat", ["a", "b"], "cat", axis=1), node("Mul", ["cat", "s"], "m"), node("Relu", ["m"], "y"),
               node("ReduceSum", ["cat"], "r", keepdims=1)], {"a": (2, 3), "b": (2, 5), "s": (8,)}, ["y", "r"])
    out, _ = run_and_compare(g, _fuse_and_absorb)
    assert op_counts(out) == {"Concat": 1, PW: 1, "ReduceSum": 1}
    assert "concat" not in _pointwise(out)[0].attrs


@pytest.mark.parametrize("why", ["output", "int", "plain_reader"])
def test_concats_that_must_stay(why):
    shape = (2, 3) if why != "int" else ((2, 3), np.int64)
    nodes = [node("Concat", ["a", "b"], "cat", axis=0), node("Mul", ["cat", "cat"], "m"), node("Neg", ["m"], "y")]
    if why == "plain_reader":  # a single elementwise op is no Pointwise node
        nodes = nodes[:1] + [node("Neg", ["cat"], "y")]
    g = graph(nodes, {"a": shape, "b": shape}, ["y", "cat"] if why == "output" else ["y"])
    out, _ = run_and_compare(g, _fuse_and_absorb)
    assert op_counts(out)["Concat"] == 1


def test_a_growing_chain_flattens_and_every_concat_is_absorbed():
    """x = Concat(x, y) per layer (each read by the next Concat and by its BatchNorm + ReLU):
    every reader ends up reading the features themselves."""
    nodes, feats, inputs = [], "f0", {"f0": (1, 2, 2, 5), "s": (1,)}
    for k in range(1, 5):
        inputs[f"f{k}"] = (1, 2, 2, 3)
        nodes += [node("Concat", [feats, f"f{k}"], f"cat{k}", axis=3), node("Mul", [f"cat{k}", "s"], f"m{k}"),
                  node("Relu", [f"m{k}"], f"y{k}")]
        feats = f"cat{k}"
    g = graph(nodes, inputs, [f"y{k}" for k in range(1, 5)])
    out, _ = run_and_compare(g, _fuse_and_absorb)
    assert op_counts(out) == {PW: 4}
    for k, pw in enumerate(sorted(_pointwise(out), key=lambda n: len(n.inputs)), start=1):
        assert pw.inputs[1:] == [f"f{j}" for j in range(k + 1)]
        assert pw.attrs["concat"][0]["extents"] == [5] + [3] * k


def test_a_one_input_concat_is_an_identity_for_any_reader():
    g = graph([node("Concat", ["a"], "cat", axis=1), node("ReduceSum", ["cat"], "y", keepdims=1)], {"a": (2, 3)}, ["y"])
    out, changed = run_and_compare(g, remove_identity)
    assert changed and op_counts(out) == {"ReduceSum": 1} and out.nodes[0].inputs == ["a"]


def test_a_pointwise_node_reading_the_operand_twice_and_a_source_directly():
    g = graph([node("Concat", ["a", "b"], "cat", axis=0), node("Mul", ["cat", "cat"], "m"), node("Add", ["m", "a2"], "n"),
               node("Sub", ["n", "b"], "y")], {"a": (1, 6), "b": (1, 6), "a2": (2, 6)}, ["y"])
    out, _ = run_and_compare(g, _fuse_and_absorb)
    (pw,) = out.nodes
    assert pw.inputs.count("b") == 2  # a plain input and a source: both positions stay


def test_malformed_concat_attributes_are_node_attribute_errors():
    for bad in ([{"name": "c", "axis": 0, "first": 1, "count": 3, "extents": [1, 1, 1]}],  # past the inputs
                [{"name": "c", "axis": -1, "first": 0, "count": 2, "extents": [1, 1]}],
                [{"name": "c", "axis": 0, "first": 0, "count": 2, "extents": [1]}],
                "nope"):
        with pytest.raises(NodeAttributeError):
            concat_operands({"concat": bad}, 3, "node x")


# ---- models: cpu plans vs onnxruntime, the cuda plan's layers -----------------------------------
def _model(b: ModelBuilder, outs: list[tuple[str, tuple]], image: tuple) -> onnx.ModelProto:
    names = []
    for k, (out, _) in enumerate(outs):
        b.nodes.append(helper.make_node("Identity", [out], [f"y{k}"], name=f"y{k}_out"))
        names.append(f"y{k}")
    g = helper.make_graph(b.nodes, "catpw", [helper.make_tensor_value_info("image", TensorProto.FLOAT, image)],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, (_, s) in zip(names, outs)],
                          b.inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model



def _bn_relu(b: ModelBuilder, x: str, c: int) -> str:
    params = [b.rng.uniform(0.5, 1.5, c), b.rng.standard_normal(c) * 0.1, b.rng.standard_normal(c) * 0.1,
              b.rng.uniform(0.5, 1.5, c)]
    return b.node("Relu", [b.node("BatchNormalization", [x] + [b.init(p, "bn") for p in params], epsilon=1e-5)])


def dense_block(c0: int = 24, growth: int = 32, layers: int = 3) -> onnx.ModelProto:
    """torchvision's DenseNet form: every layer concatenates all features so far (the first a
    one-input Concat), BatchNorm + ReLU, a 1x1 then a 3x3 convolution; the block's last Concat
    feeds BatchNorm + ReLU and a 1x1 convolution."""
    b = ModelBuilder(29)
    feats, c = [b.conv("image", 3, c0, 3)], c0
    for _ in range(layers):
        x = b.node("Concat", list(feats), axis=1)
        y = b.conv(_bn_relu(b, b.conv(_bn_relu(b, x, c), c, 8), 8), 8, growth, 3)
        feats.append(y)
        c += growth
    out = b.conv(_bn_relu(b, b.node("Concat", list(feats), axis=1), c), c, 5)
    return _model(b, [(out, (2, 5, 6, 7))], (2, 3, 6, 7))


def shared_concat(c: tuple = (3, 5)) -> onnx.ModelProto:
    """A Concat of two odd-channel convolutions read by two pointwise groups (one output each)
    and, in a second Concat, by a MaxPool too."""
    b = ModelBuilder(30)
    a, d = b.conv("image", 3, c[0]), b.conv("image", 3, c[1])
    cat = b.node("Concat", [a, d], axis=1)
    scale, shift = (b.init(b.rng.uniform(0.5, 1.5, (sum(c), 1, 1)), "p") for _ in range(2))
    y0 = b.node("Relu", [b.node("Add", [b.node("Mul", [cat, scale]), shift])])
    y1 = b.node("Mul", [b.node("Sigmoid", [cat]), cat])
    kept = b.node("Concat", [d, a], axis=1)
    y2 = b.node("Add", [b.node("MaxPool", [kept], kernel_shape=[1, 1]), b.node("Tanh", [kept])])
    s = (2, sum(c), 5, 4)
    return _model(b, [(y0, s), (y1, s), (y2, s)], (2, 3, 5, 4))


MODELS = {"dense_24_32": dense_block, "dense_odd": lambda: dense_block(5, 3, 4), "shared": shared_concat}


def _run(plan, image):
    ctx = Runtime().deserialize_engine(plan).create_execution_context()
    return ctx.execute({"image": image})


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_cpu_plan_matches_onnxruntime(name, channels_last):
    model = MODELS[name]()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    image = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"image": image})
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=channels_last))
    if channels_last or name == "shared":  # NCHW cpu plans keep BatchNormalization layers, which read a Concat
        assert sum(len(layer.attrs.get("concat", ())) for layer in plan.layers) >= 2
    got = _run(plan.serialize(), image)  # the concat attributes survive the plan file
    for k, w in enumerate(want):
        np.testing.assert_allclose(got[f"y{k}"], w, rtol=1e-4, atol=1e-4)


def test_cuda_fp16_dense_block_reads_every_concatenation_from_its_sources():
    plan = build_plan(dense_block(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["Concat"] == 0
    readers = [layer for layer in plan.layers if layer.attrs.get("concat")]
    assert sorted(e["count"] for lay in readers for e in lay.attrs["concat"]) == [2, 3, 4]  # the one-input Concat went
    assert all(lay.tactic == "cuda.pointwise.rows" and lay.attrs["concat"][0]["axis"] == 3 for lay in readers)
    assert [lay.attrs["concat"][0]["extents"] for lay in readers][-1] == [24, 32, 32, 32]


def test_cuda_fp16_plan_keeps_the_concat_a_maxpool_reads():
    plan = build_plan(shared_concat(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    assert Counter(layer.kind for layer in plan.layers)["Concat"] == 1
    assert sum(len(layer.attrs.get("concat", ())) for layer in plan.layers) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_fp16_plan_matches_the_cpu(name):
    model = MODELS[name]()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    image = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    want = _run(build_plan(model, BuilderConfig(target="cpu")), image)
    got = _run(build_plan(model, BuilderConfig(target="cuda", fp16=True)), image)
    for key, w in want.items():
        assert np.linalg.norm(got[key] - w) / np.linalg.norm(w) < 1e-2, key


def test_renaming_a_tensor_to_the_operand_name_moves_the_operand_aside():
    from polykit.compiler.ops.nn.fused import rename_fused_tensor

    g = graph([node("Concat", ["a", "b"], "cat", axis=0), node("Mul", ["cat", "s"], "m"), node("Relu", ["m"], "y")],
              {"a": (1, 4), "b": (2, 4), "s": (4,)}, ["y"])
    _fuse_and_absorb(g)
    (pw,) = g.nodes
    rename_fused_tensor(pw, "s", "cat")
    entry = pw.attrs["concat"][0]
    assert entry["name"] != "cat" and pw.attrs["body"][0]["inputs"] == [entry["name"], "cat"]
