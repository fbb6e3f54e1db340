"""channel_movement: selections of channel shuffles compose into Gathers, channel Pads move into their
producers, and a convnet's entry (Cast -> Transpose -> Pad) and exit (Transpose -> Cast) are one
Reformat. Rewritten graphs compute what the originals did (reference evaluator), cpu plans what
onnxruntime does, and the cuda fp16 plans (level 0, no GPU) have the layer structure."""

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
from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.passes import compose_concat_gathers, compose_gathers, compose_reformats, pad_into_producers
from polykit.runtime.engine import Runtime
from tests.conv_models import ModelBuilder

I64 = np.int64


# ---- compose_gathers ---------------------------------------------------------------------------------
def _shuffle_halves(c: int, readers: list[Node], extra_outputs: tuple[str, ...] = ()):
    order = np.arange(c).reshape(2, c // 2).T.reshape(-1)  # ShuffleNet's shuffle of 2 groups, channels last
    nodes = [node("Gather", ["x", "order"], "s", axis=3),
             node("Slice", ["s", "lo", "mid", "ax"], "a"), node("Slice", ["s", "mid", "hi", "ax"], "b"), *readers]
    inits = {"order": order.astype(I64), "lo": np.array([0], I64), "mid": np.array([c // 2], I64),
             "hi": np.array([c], I64), "ax": np.array([3], I64), "two": np.array([2], I64)}
    return graph(nodes, {"x": (1, 3, 5, c)}, ["ya", "yb", *extra_outputs], inits)


@pytest.mark.parametrize("c", [116, 10, 58])
def test_the_halves_of_a_channel_shuffle_are_two_gathers(c):
    g = _shuffle_halves(c, [node("Relu", ["a"], "ya"), node("Neg", ["b"], "yb")])
    out, changed = run_and_compare(g, lambda h: compose_gathers(h))
    assert changed and op_counts(out) == {"Gather": 2, "Relu": 1, "Neg": 1}
    assert all(n.input(0) == "x" for n in out.nodes if n.op_type == "Gather")


def test_a_gather_with_another_reader_stays_for_it_and_the_slices_still_compose():
    g = _shuffle_halves(12, [node("Relu", ["a"], "ya"), node("Neg", ["b"], "yb"), node("Abs", ["s"], "z")], ("z",))
    out, changed = run_and_compare(g, lambda h: compose_gathers(h))
    assert changed and op_counts(out)["Gather"] == 3 and op_counts(out)["Slice"] == 0


def test_strided_slices_and_gathers_of_a_gather_compose_and_other_axes_stay():
    nodes = [node("Gather", ["x", "order"], "s", axis=1), node("Slice", ["s", "one", "big", "ax1", "two"], "a"),
             node("Gather", ["s", "pick"], "b", axis=1), node("Slice", ["s", "one", "three", "ax2"], "c")]
    inits = {"order": np.array([4, 0, 3, 1, 2, -1], I64), "one": np.array([1], I64), "big": np.array([99], I64),
             "ax1": np.array([1], I64), "two": np.array([2], I64), "pick": np.array([5, 0, 0, -2], I64),
             "three": np.array([3], I64), "ax2": np.array([2], I64)}
    g = graph(nodes, {"x": (2, 6, 4)}, ["a", "b", "c"], inits)
    out, changed = run_and_compare(g, lambda h: compose_gathers(h))
    assert changed and op_counts(out) == {"Gather": 3, "Slice": 1}  # the Slice of axis 2 reads the Gather
    (cut,) = [n for n in out.nodes if n.op_type == "Slice"]
    assert cut.input(0) == "s"


# ---- compose_concat_gathers ---------------------------------------------------------------------------
@pytest.mark.parametrize("sizes,axis", [((29, 29), 3), ((3, 5, 2), -1), ((2, 1, 4, 3), 1)])
def test_a_gather_of_a_concat_reads_its_sources(sizes, axis):
    names = [f"x{k}" for k in range(len(sizes))]
    shape = lambda n: (2, n, 3, 4) if axis == 1 else (1, 3, 5, n)  # noqa: E731
    total = sum(sizes)
    order = np.random.default_rng(len(sizes)).permutation(total)
    nodes = [node("Concat", names, "c", axis=axis), node("Gather", ["c", "lo"], "a", axis=axis),
             node("Gather", ["c", "hi"], "b", axis=axis)]
    inits = {"lo": order[: total // 2].astype(I64), "hi": np.concatenate([order[total // 2:], [-1, 0]]).astype(I64)}
    g = graph(nodes, {n: shape(s) for n, s in zip(names, sizes)}, ["a", "b"], inits)
    out, changed = run_and_compare(g, lambda h: compose_concat_gathers(h), rtol=0, atol=0)
    assert changed and op_counts(out) == {f"{POLYKIT_DOMAIN}:ConcatGather": 2}
    assert all(n.inputs[1:] == names for n in out.nodes)


def test_a_concat_read_elsewhere_stays_and_one_of_too_many_sources_is_left_alone():
    nodes = [node("Concat", ["x", "y"], "c", axis=3), node("Gather", ["c", "i"], "a", axis=3), node("Neg", ["c"], "n")]
    g = graph(nodes, {"x": (1, 2, 2, 3), "y": (1, 2, 2, 4)}, ["a", "n"], {"i": np.array([6, 0, 3], I64)})
    out, changed = run_and_compare(g, lambda h: compose_concat_gathers(h), rtol=0, atol=0)
    assert changed and op_counts(out) == {"Concat": 1, f"{POLYKIT_DOMAIN}:ConcatGather": 1, "Neg": 1}
    five = graph([node("Concat", list("abcde"), "cat", axis=3), node("Gather", ["cat", "i"], "y", axis=3)],
                 {k: (1, 2, 2, 1) for k in "abcde"}, ["y"], {"i": np.array([4, 0], I64)})
    assert not compose_concat_gathers(five)
    other_axis = graph([node("Concat", ["x", "y"], "c", axis=2), node("Gather", ["c", "i"], "a", axis=3)],
                       {"x": (1, 2, 2, 3), "y": (1, 2, 2, 3)}, ["a"], {"i": np.array([2, 0], I64)})
    assert not compose_concat_gathers(other_axis)


# ---- pad_into_producers ------------------------------------------------------------------------------
def _nhwc_conv(name: str, x: str, w: np.ndarray, b: np.ndarray | None, out: str, group: int = 1,
               epilogue: list[str] = ()) -> Node:
    attrs = {"kernel_shape": list(w.shape[1:3]), "strides": [1, 1], "dilations": [1, 1], "group": group,
             "pads": [w.shape[1] // 2] * 2 + [w.shape[2] // 2] * 2}
    if epilogue:
        body, prev = [], "raw"
        for k, op in enumerate(epilogue):
            step_out = out if k == len(epilogue) - 1 else f"{out}_e{k}"
            body.append({"op": op, "inputs": [prev], "outputs": [step_out], "attrs": {}})
            prev = step_out
        attrs["epilogue"] = {"input": "raw", "body": body}
    return Node("ConvNHWC", [x, f"{name}_w", f"{name}_b" if b is not None else ""], [out], attrs, name=name,
                domain=POLYKIT_DOMAIN)


def _pad_chain(c: int = 29, pad_to: int = 32, epilogue: tuple[str, ...] = ("Relu",), reader_zero: bool = True,
               seed: int = 3):
    """x [1, 6, 7, 8] -> 1x1 ConvNHWC (8 -> c, epilogue) -> depthwise 3x3 ConvNHWC (c) -> zero Pad of the
    channels to pad_to -> 1x1 ConvNHWC (weights zero on the padded channels unless not reader_zero)."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.standard_normal((c, 1, 1, 8)).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    wd, bd = rng.standard_normal((c, 3, 3, 1)).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    w2 = rng.standard_normal((5, 1, 1, pad_to)).astype(np.float32)
    if reader_zero:
        w2[..., c:] = 0
    nodes = [_nhwc_conv("c1", "x", w1, b1, "h", epilogue=list(epilogue)), _nhwc_conv("dw", "h", wd, bd, "d", group=c),
             node("Pad", ["d", "pads"], "p"), _nhwc_conv("c2", "p", w2, None, "y")]
    inits = {"c1_w": w1, "c1_b": b1, "dw_w": wd, "dw_b": bd, "c2_w": w2,
             "pads": np.array([0, 0, 0, 0, 0, 0, 0, pad_to - c], I64)}
    return graph(nodes, {"x": (1, 6, 7, 8)}, ["y"], inits)


@pytest.mark.parametrize("epilogue", [("Relu",), ("Sigmoid",), ()])
def test_a_channel_pad_moves_into_the_depthwise_conv_and_its_producer(epilogue):
    out, changed = run_and_compare(_pad_chain(epilogue=epilogue), lambda h: pad_into_producers(h), rtol=1e-4, atol=1e-5)
    assert changed and "Pad" not in op_counts(out)
    conv1, dw, _ = out.nodes
    assert out.initializers[conv1.input(1)].shape[0] == 32 and dw.attrs["group"] == 32
    assert out.value("h").shape == (1, 6, 7, 32) and not np.any(out.initializers[dw.input(1)][29:])


@pytest.mark.parametrize("epilogue", [("Log",), ("Reciprocal",)])
def test_a_pad_after_an_epilogue_that_is_not_finite_at_zero_stays(epilogue):
    g = _pad_chain(epilogue=epilogue)
    assert not pad_into_producers(g)
    assert op_counts(g)["Pad"] == 1


def test_a_pad_whose_reader_uses_the_padded_channels_stays():
    g = _pad_chain(reader_zero=False)
    assert not pad_into_producers(g)


def test_a_pad_of_a_tensor_read_twice_stays_unless_a_selection_makes_it():
    g = _pad_chain()
    g.nodes.append(node("Neg", ["d"], "z"))
    g.outputs.append("z")
    g.toposort()
    assert not pad_into_producers(g)


def test_a_gather_read_twice_gets_a_wider_copy_for_the_pad():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 1, 1, 8)).astype(np.float32)
    w[..., 6:] = 0
    nodes = [node("Gather", ["x", "order"], "g", axis=3), node("Pad", ["g", "pads"], "p"),
             _nhwc_conv("c", "p", w, None, "y"), node("Neg", ["g"], "z")]
    g = graph(nodes, {"x": (1, 3, 5, 6)}, ["y", "z"], {"order": np.array([5, 3, 1, 0, 2, 4], I64), "c_w": w,
                                                        "pads": np.array([0] * 7 + [2], I64)})
    out, changed = run_and_compare(g, lambda h: pad_into_producers(h))
    assert changed and op_counts(out) == {"Gather": 2, f"{POLYKIT_DOMAIN}:ConvNHWC": 1, "Neg": 1}


# ---- compose_reformats -------------------------------------------------------------------------------
def _entry(c: int = 3, pad: int = 5, dtype=np.float16):
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [node("Cast", ["x"], "h", to=to), node("Transpose", ["h"], "t", perm=[0, 2, 3, 1]),
             node("Pad", ["t", "pads"], "y")]
    return graph(nodes, {"x": (2, c, 5, 7)}, ["y"], {"pads": np.array([0] * 7 + [pad], I64)})


@pytest.mark.parametrize("c,pad,dtype", [(3, 5, np.float16), (5, 3, np.float16), (3, 1, np.float32)])
def test_the_entry_cast_transpose_pad_is_one_reformat(c, pad, dtype):
    out, changed = run_and_compare(_entry(c, pad, dtype), lambda h: compose_reformats(h), rtol=0, atol=0)
    assert changed and op_counts(out) == {f"{POLYKIT_DOMAIN}:Reformat": 1}
    (r,) = out.nodes
    assert r.attrs["pad"] == pad and out.value("y").shape == (2, 5, 7, c + pad)


def test_the_exit_transpose_cast_is_one_reformat_and_wide_tensors_stay():
    exit_ = graph([node("Transpose", ["x"], "t", perm=[0, 3, 1, 2]), node("Cast", ["t"], "y", to=TensorProto.FLOAT)],
                  {"x": ((1, 4, 6, 21), np.float16)}, ["y"])
    out, changed = run_and_compare(exit_, lambda h: compose_reformats(h), rtol=0, atol=0)
    assert changed and op_counts(out) == {f"{POLYKIT_DOMAIN}:Reformat": 1}
    wide = graph([node("Transpose", ["x"], "t", perm=[0, 3, 1, 2]), node("Cast", ["t"], "y", to=TensorProto.FLOAT)],
                 {"x": ((1, 4, 6, 65), np.float16)}, ["y"])
    assert not compose_reformats(wide)


def test_integer_entries_stay_for_their_own_passes():
    g = graph([node("Transpose", ["x"], "t", perm=[0, 2, 3, 1]), node("Pad", ["t", "pads"], "y")],
              {"x": ((1, 3, 4, 4), np.int8)}, ["y"], {"pads": np.array([0] * 7 + [13], I64)})
    assert not compose_reformats(g)


def test_a_transpose_read_twice_keeps_its_readers():
    g = graph([node("Transpose", ["x"], "t", perm=[0, 2, 3, 1]), node("Pad", ["t", "pads"], "y"),
               node("Neg", ["t"], "z")], {"x": (1, 3, 4, 4)}, ["y", "z"], {"pads": np.array([0] * 7 + [5], I64)})
    assert not compose_reformats(g)


# ---- models: a ShuffleNet-like chain of units ----------------------------------------------------------
def shuffle_units(c: int = 58, units: int = 2, image: tuple = (1, 5, 12, 12)) -> onnx.ModelProto:
    """A stem conv (image channels -> c), then `units` ShuffleNetV2 units of c channels (halves by
    Slice, a 1x1 -> depthwise 3x3 -> 1x1 branch, Concat, channel shuffle by Reshape -> Transpose ->
    Reshape), then a 1x1 conv to 7 and a global pool."""
    b = ModelBuilder(29)
    x = b.conv_bn("image", image[1], c, 3)
    half = c // 2
    consts = {k: b.init(np.array(v), k) for k, v in (("lo", [0]), ("mid", [half]), ("hi", [c]), ("ax", [1]))}
    for k in consts:  # int64 bounds (ModelBuilder.init stores float32)
        b.inits[[t.name for t in b.inits].index(consts[k])] = onnx.numpy_helper.from_array(
            np.array([{"lo": 0, "mid": half, "hi": c, "ax": 1}[k]], I64), consts[k])
    split = b.init(np.array([image[0], 2, half, image[2], image[3]]), "split")
    merge = b.init(np.array([image[0], c, image[2], image[3]]), "merge")
    for name in (split, merge):
        i = [t.name for t in b.inits].index(name)
        b.inits[i] = onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(b.inits[i]).astype(I64), name)
    for _ in range(units):
        x1 = b.node("Slice", [x, consts["lo"], consts["mid"], consts["ax"]])
        x2 = b.node("Slice", [x, consts["mid"], consts["hi"], consts["ax"]])
        y = b.conv_bn(x2, half, half, 1)
        y = b.conv_bn(y, half, half, 3, relu=False, group=half)
        y = b.conv_bn(y, half, half, 1)
        cat = b.node("Concat", [x1, y], axis=1)
        x = b.node("Reshape", [b.node("Transpose", [b.node("Reshape", [cat, split])], perm=[0, 2, 1, 3, 4]), merge])
    out = b.node("GlobalAveragePool", [b.conv_bn(x, c, 7, 1)])
    g = helper.make_graph(b.nodes, "shuffle", [helper.make_tensor_value_info("image", TensorProto.FLOAT, image)],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, (image[0], 7, 1, 1))], b.inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _image(model: onnx.ModelProto) -> np.ndarray:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(5).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("c,image", [(58, (1, 5, 12, 12)), (116, (2, 3, 9, 7)), (10, (1, 3, 6, 6))])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_plan_of_shuffle_units_matches_onnxruntime(c, image, channels_last):
    model = shuffle_units(c, 2, image)
    x = _image(model)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"image": x})
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=channels_last))
    kinds = Counter(layer.kind for layer in plan.layers)
    if channels_last:  # the shuffles are Gathers (fold_axis_permutations) whose halves compose and read
        # the Concat's sources; the first unit's halves of the stem conv: one Slice, one Gather that
        # pads (no room to grow)
        assert kinds["Slice"] == 1 and kinds["Pad"] == 0 and kinds["Gather"] == 1 and kinds["Concat"] == 0
        assert kinds["ConcatGather"] == 3
    ctx = Runtime().deserialize_engine(plan.serialize()).create_execution_context()
    (got,) = ctx.execute({"image": x}).values()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_cuda_fp16_plan_of_shuffle_units_has_no_slice_pad_or_entry_copies():
    plan = build_plan(shuffle_units(58, 3), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["Slice"] == 1 and kinds["Pad"] == 0 and kinds["Cast"] == 1 and kinds["Transpose"] == 0
    assert plan.layers[0].kind == "Reformat" and plan.layers[0].tactic == "cuda.movement.reformat"
    assert plan.layers[0].attrs["pad"] == 3 and plan.layers[0].out_shapes[0] == (1, 12, 12, 8)
    # two halves of each of two shuffles and the last shuffle whole, each reading its Concat's sources
    assert kinds["ConcatGather"] == 5 and kinds["Concat"] == 0 and kinds["Gather"] == 1  # the padded half
    gathers = [layer for layer in plan.layers if layer.kind == "ConcatGather"]
    assert all(layer.tactic == "cuda.gather.concat" for layer in gathers)
    assert sorted(layer.out_shapes[0][3] for layer in gathers) == [29, 29, 32, 32, 64]  # padded for the convs


def test_the_reference_evaluator_agrees_on_the_optimized_shuffle_graph():
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.compiler.passes import optimize

    model = shuffle_units(58, 2)
    g = load_onnx(model)
    x = _image(model)
    want = evaluate_graph(g, {"image": x})
    out = optimize(g, channels_last=True, fp16=False)
    got = evaluate_graph(out, {"image": x})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_a_segmentation_exit_transpose_resize_cast_is_a_reformat_then_a_float32_resize():
    nodes = [node("Transpose", ["x"], "t", perm=[0, 3, 1, 2]), node("Resize", ["t", "", "scales"], "r", mode="linear"),
             node("Cast", ["r"], "y", to=TensorProto.FLOAT)]
    g = graph(nodes, {"x": ((1, 4, 5, 21), np.float16)}, ["y"], {"scales": np.array([1, 1, 4, 4], np.float32)})
    out, changed = run_and_compare(g, lambda h: compose_reformats(h), rtol=2e-3, atol=2e-3)  # no fp16 rounding now
    assert changed and [n.op_type for n in out.nodes] == ["Reformat", "Resize"]
    assert out.value("y").dtype == np.float32 and out.nodes[1].input(0) == out.nodes[0].outputs[0]
    want = evaluate_graph(g, feeds := {"x": np.random.default_rng(2).standard_normal((1, 4, 5, 21)).astype(np.float16)})
    exact = np.transpose(feeds["x"].astype(np.float32), (0, 3, 1, 2))
    got = evaluate_graph(out, feeds)["y"]
    assert got.shape == want["y"].shape == (1, 21, 16, 20) and np.abs(got).max() <= np.abs(exact).max() + 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("c,image", [(58, (1, 5, 12, 12)), (116, (2, 3, 9, 7))])
def test_cuda_fp16_plan_of_shuffle_units_matches_the_cpu(c, image):
    """The widened convs, the composed Gathers and the entry Reformat on the GPU (the lead runs it)."""
    model = shuffle_units(c, 3, image)
    x = _image(model)

    def run(plan):
        (y,) = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute({"image": x}).values()
        return y

    want = run(build_plan(model, BuilderConfig(target="cpu")))
    got = run(build_plan(model, BuilderConfig(target="cuda", fp16=True)))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
