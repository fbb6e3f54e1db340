"""The graph evaluator: whole graphs and ONNX models on the reference kernels (the debug tools'
in-process reference, the pass tests' oracle), streaming and bounded memory, errors naming the
node, and the partial evaluation constant folding and shape inference share."""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import shape_inference

from polykit.compiler.graph.evaluator import Partial, evaluate_graph, evaluate_model, evaluate_nodes, run_node, try_node
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.ops.registry import SHAPE_RULES
from polykit.errors import PolykitError, RuntimeInputError, UsageError
from polykit.compiler.ops.references import REFERENCE

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"
F32 = np.dtype(np.float32)


def _feeds(sess: ort.InferenceSession, seed: int = 0) -> dict[str, np.ndarray]:
    """Random non-zero feeds of a model: token ids and an all-ones mask, or normal floats."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "attention_mask":
            feeds[i.name] = np.ones(i.shape, np.int64)
        elif "int" in i.type:
            feeds[i.name] = rng.integers(1, 100, i.shape).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(i.shape).astype(np.float32)
    return feeds


def _chain(n: int, shape: tuple[int, ...] = (256, 256)) -> Graph:
    """x -> Neg -> Neg -> ... (n nodes) -> y"""
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["y"]
    nodes = [Node("Neg", [a], [b], name=f"neg{i}") for i, (a, b) in enumerate(zip(names, names[1:]))]
    return Graph(nodes, ["x"], ["y"], {}, {"x": Value("x", F32, shape)})


# ---- whole models against onnxruntime ----------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2_tiny_ts.onnx", "bert_tiny_dynamo.onnx", "convnet_extdata_dynamo.onnx"])
def test_evaluate_model_outputs_match_onnxruntime_on_a_real_export(name):
    sess = ort.InferenceSession(str(DATA / name), providers=["CPUExecutionProvider"])
    feeds = _feeds(sess)
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    got = evaluate_model(str(DATA / name), feeds)
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_every_streamed_tensor_matches_onnxruntime_marking_all_of_them():
    model = shape_inference.infer_shapes(onnx.load(str(DATA / "gpt2_tiny_ts.onnx")))
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(vi for vi in model.graph.value_info if vi.name not in outputs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = _feeds(sess)
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    seen: dict[str, tuple[np.ndarray, str]] = {}
    evaluate_model(model, feeds,
                   on_tensor=lambda name, value, node: seen.__setitem__(name, (value.copy(), node.op_type)))
    assert len(seen) > 150 and set(seen) <= set(want)
    for name, (value, op) in seen.items():
        assert value.shape == want[name].shape, (name, op)
        np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} ({op})")


def test_evaluate_model_takes_a_path_a_model_proto_or_an_imported_graph():
    path = str(DATA / "convnet_ts.onnx")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = _feeds(sess, seed=1)
    results = [evaluate_model(source, feeds) for source in (path, onnx.load(path), load_onnx(path))]
    for other in results[1:]:
        for key in results[0]:
            np.testing.assert_array_equal(other[key], results[0][key])


def test_asked_for_intermediate_tensors_come_back_with_their_onnx_names():
    path = str(DATA / "convnet_ts.onnx")
    graph = load_onnx(path)
    middle = graph.nodes[len(graph.nodes) // 2].outputs[0]
    feeds = _feeds(ort.InferenceSession(path, providers=["CPUExecutionProvider"]))
    everything = evaluate_graph(graph, feeds, keep_all=True)
    got = evaluate_model(graph, feeds, outputs=[middle, graph.outputs[0]])
    assert list(got) == [middle, graph.outputs[0]]
    np.testing.assert_array_equal(got[middle], everything[middle])


# ---- streaming and memory ------------------------------------------------------------------------
def test_tensors_are_dropped_after_their_last_reader():
    graph = _chain(12)
    refs: list[weakref.ref] = []
    live_counts = []

    def watch(name, value, node):
        live_counts.append(sum(r() is not None for r in refs))
        refs.append(weakref.ref(value))

    out = evaluate_graph(graph, {"x": np.ones((256, 256), np.float32)}, on_tensor=watch)
    assert max(live_counts) <= 1  # only the producing node's input is still alive
    np.testing.assert_array_equal(out["y"], np.ones((256, 256)))  # an even number of negations


def test_keep_all_holds_every_tensor_and_keep_names_only_those():
    graph = _chain(4)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    graph.set_value(Value("x", F32, (2, 3)))
    assert set(evaluate_graph(graph, {"x": x}, keep_all=True)) == {"x", "t0", "t1", "t2", "y"}
    kept = evaluate_nodes(graph.nodes, {"x": x}, keep=["t1"])
    assert list(kept) == ["t1"]
    np.testing.assert_array_equal(kept["t1"], x)


# ---- errors --------------------------------------------------------------------------------------
def test_a_failing_kernel_is_a_polykit_error_naming_the_node(monkeypatch):
    def boom(node, inputs):
        raise ValueError("kernel failure")

    monkeypatch.setitem(REFERENCE, ("", "Boom"), boom)
    graph = Graph([Node("Neg", ["x"], ["a"], name="neg"), Node("Boom", ["a"], ["y"], name="the_boom")], ["x"], ["y"])
    with pytest.raises(PolykitError, match="the_boom.*ValueError: kernel failure") as info:
        evaluate_graph(graph, {"x": np.ones(3, np.float32)})
    assert "the_boom" in info.value.where


def test_a_kernel_returning_too_few_outputs_is_reported(monkeypatch):
    monkeypatch.setitem(REFERENCE, ("", "Half"), lambda node, inputs: [inputs[0]])
    with pytest.raises(PolykitError, match="gave 1 output"):
        run_node(Node("Half", ["x"], ["a", "b"], name="half"), [np.ones(2)])


@pytest.mark.parametrize("feeds, message", [
    ({}, "no feed for graph input"),
    ({"x": np.ones((2, 3), np.float32), "z": np.ones(1)}, "'z' is not an input"),
    ({"x": np.ones((2, 3), np.float64)}, "dtype float64"),
    ({"x": np.ones((3, 2), np.float32)}, r"shape \(3, 2\)"),
])
def test_bad_feeds_are_runtime_input_errors(feeds, message):
    graph = _chain(2, (2, 3))
    with pytest.raises(RuntimeInputError, match=message):
        evaluate_graph(graph, feeds)


def test_symbolic_dims_take_any_size():
    graph = _chain(2, ("batch", 3))
    assert evaluate_graph(graph, {"x": np.ones((5, 3), np.float32)})["y"].shape == (5, 3)


def test_an_unknown_output_name_is_a_usage_error_before_anything_runs(monkeypatch):
    monkeypatch.setitem(REFERENCE, ("", "Neg"), lambda node, inputs: pytest.fail("ran"))
    with pytest.raises(UsageError, match="no tensor named 'nope'"):
        evaluate_graph(_chain(2, (2, 3)), {"x": np.ones((2, 3), np.float32)}, outputs=["nope"])


def test_a_node_reading_an_unknown_value_is_named():
    with pytest.raises(RuntimeInputError, match="node 'neg1' .*reads 't0'"):
        evaluate_nodes(_chain(3).nodes[1:], {"x": np.ones(2, np.float32)})


# ---- partial evaluation (constant folding, shape inference) ------------------------------------
def test_partial_walk_evaluates_only_what_known_values_determine():
    nodes = [Node("Mul", ["a", "a"], ["aa"], name="mul"), Node("Add", ["x", "aa"], ["y"], name="add")]
    graph = Graph(nodes, ["x"], ["y"], {"a": np.arange(3, dtype=np.float32)}, {"x": Value("x", F32, (3,))})
    infer_shapes(graph)
    seen = []
    values = evaluate_nodes(graph.nodes, graph.initializers, partial=Partial(graph, 16),
                            on_tensor=lambda name, value, node: seen.append(name))
    assert seen == ["aa"] and "y" not in values
    np.testing.assert_array_equal(values["aa"], [0.0, 1.0, 4.0])


def test_materialized_outputs_may_grow_only_up_to_the_limit():
    node = Node("Expand", ["one", "shape"], ["big"], name="expand")
    graph = Graph([node], [], ["big"], {"one": np.ones((1, 1), np.float32), "shape": np.array([64, 64], np.int64)})
    infer_shapes(graph)
    known = dict(graph.initializers)
    assert try_node(node, known, Partial(graph, 1000, materialize=True)) is None
    (big,) = try_node(node, known, Partial(graph, 4096, materialize=True))
    assert big.shape == (64, 64) and big.flags.owndata


def test_shape_of_a_static_tensor_is_evaluated_without_its_value():
    node = Node("Shape", ["x"], ["s"], name="shape")
    graph = Graph([node], ["x"], ["s"], {}, {"x": Value("x", F32, (2, 5, 7))})
    infer_shapes(graph)
    (s,) = try_node(node, {}, Partial(graph, 16))
    np.testing.assert_array_equal(s, [2, 5, 7])


def test_random_ops_and_training_dropout_are_never_evaluated_ahead():
    graph = Graph([], ["x"], [], {"k": np.ones(3, np.float32), "p": np.array(0.5, np.float32),
                                  "train": np.array(True)})
    known = dict(graph.initializers)
    partial = Partial(graph, 1 << 20, materialize=True)
    assert try_node(Node("RandomUniformLike", ["k"], ["r"], name="rand"), known, partial) is None
    assert try_node(Node("Dropout", ["k", "p", "train"], ["d"], name="drop"), known, partial) is None
    (d,) = try_node(Node("Dropout", ["k", "p"], ["d"], name="drop"), known, partial)
    np.testing.assert_array_equal(d, known["k"])


def test_inference_learns_a_value_dependent_shape_from_the_evaluated_value():
    mask = np.array([[1, 0, 3], [0, 5, 0]], np.float32)
    graph = Graph([Node("NonZero", ["m"], ["idx"], name="nz"), Node("Transpose", ["idx"], ["y"], name="t")],
                  [], ["y"], {"m": mask})
    infer_shapes(graph)
    assert graph.value("idx").shape == (2, 3) and graph.value("y").shape == (3, 2)


def test_inference_sees_a_castlike_of_a_constant_through_its_target_dtype():
    """CastLike reads only its target's dtype: a Reshape whose shape goes through one gets an exact shape."""
    nodes = [Node("CastLike", ["target", "like"], ["shape"], name="cast"),
             Node("Reshape", ["x", "shape"], ["y"], name="r")]
    graph = Graph(nodes, ["x", "like"], ["y"], {"target": np.array([3, -1], np.float32)},
                  {"x": Value("x", F32, (2, 6)), "like": Value("like", np.dtype(np.int64), ("n",))})
    infer_shapes(graph)
    assert graph.value("y").shape == (3, 4)


def test_a_failing_kernel_leaves_the_node_unevaluated(monkeypatch):
    def boom(node, inputs):
        raise ValueError("kernel failure")

    monkeypatch.setitem(SHAPE_RULES, ("", "Boom"), lambda ctx: [(ctx.dtype(0), ctx.shape(0))])
    monkeypatch.setitem(REFERENCE, ("", "Boom"), boom)
    node = Node("Boom", ["a"], ["r"], name="boom")
    graph = Graph([node], [], ["r"], {"a": np.ones(2, np.float32)})
    infer_shapes(graph)
    assert try_node(node, dict(graph.initializers), Partial(graph, 16)) is None
