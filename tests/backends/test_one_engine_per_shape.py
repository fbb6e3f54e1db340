"""The ONNX backend serves every input *value* of these models from one engine per shape signature
(issue 13): split sizes, If conditions and Loop trip counts fed as inputs are bound at run time, not
baked into an engine per value. Each test runs several values through one rep, compares with
onnxruntime, and asserts one build. The cuda variants are gpu-marked."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import polykit.backends.onnx_backend as backend

TARGETS = ["CPU", pytest.param("CUDA", marks=pytest.mark.gpu)]


def _model(nodes, inputs, outputs, opset=18):
    g = helper.make_graph(nodes, "m", inputs, outputs)
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", opset)])


def _run_values(model, device: str, feeds: list[dict[str, np.ndarray]], what: str) -> None:
    """Run every feed through one rep; compare each output with onnxruntime; one engine built."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rep = backend.prepare(model, device)
    for feed in feeds:
        got = rep.run(dict(feed))
        want = session.run(None, feed)
        assert len(got) == len(want), f"{what} {feed}: {len(got)} outputs, onnxruntime gives {len(want)}"
        for g, w in zip(got, want):
            g = [np.asarray(x) for x in g] if isinstance(w, list) else [np.asarray(g)]
            w = w if isinstance(w, list) else [w]
            assert [x.shape for x in g] == [x.shape for x in w], f"{what} {feed}: shapes differ"
            for a, b in zip(g, w):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"{what} {feed}")
    assert rep.builds == 1, f"{what}: {rep.builds} engines built for {len(feeds)} values (one expected)"


@pytest.mark.parametrize("device", TARGETS)
def test_split_to_sequence_of_sizes_fed_as_an_input_builds_once(device):
    model = _model([helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=1)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6]),
                    helper.make_tensor_value_info("split", TensorProto.INT64, [3])],
                   [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)])
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    feeds = [{"x": x, "split": np.array(s, np.int64)} for s in ([1, 2, 3], [6, 0, 0], [2, 2, 2], [0, 5, 1])]
    _run_values(model, device, feeds, "SplitToSequence")


@pytest.mark.parametrize("device", TARGETS)
def test_a_ruled_split_read_through_identities_builds_once(device):
    # remove_identity renames the Split's outputs to the graph's: the plan's rules follow the new names
    model = _model([helper.make_node("Split", ["x", "split"], ["a", "b"], axis=0),
                    helper.make_node("Identity", ["a"], ["y0"]), helper.make_node("Identity", ["b"], ["y1"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6]),
                    helper.make_tensor_value_info("split", TensorProto.INT64, [2])],
                   [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("y1", TensorProto.FLOAT, None)])
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    feeds = [{"x": x, "split": np.array(s, np.int64)} for s in ([1, 2], [3, 0], [0, 3])]
    _run_values(model, device, feeds, "Split + Identity")


@pytest.mark.parametrize("device", TARGETS)
def test_an_if_on_an_input_condition_whose_branches_give_sequences_builds_once(device):
    def branch(name, op):  # a sequence of two elements computed from the captured x
        return helper.make_graph(
            [helper.make_node(op, ["x"], [f"{name}_a"]), helper.make_node("Neg", ["x"], [f"{name}_b"]),
             helper.make_node("SequenceConstruct", [f"{name}_a", f"{name}_b"], [f"{name}_out"])], name, [],
            [helper.make_tensor_sequence_value_info(f"{name}_out", TensorProto.FLOAT, [2, 3])])

    model = _model([helper.make_node("If", ["cond"], ["res"], then_branch=branch("then", "Relu"),
                                     else_branch=branch("else", "Abs"))],
                   [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                   [helper.make_tensor_sequence_value_info("res", TensorProto.FLOAT, None)])
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    feeds = [{"cond": np.array(c), "x": x} for c in (True, False, True)]
    _run_values(model, device, feeds, "If over sequences")


def test_an_if_whose_branches_give_sequences_of_other_lengths_still_runs_per_value():
    def branch(name, count):
        items = [f"{name}_{i}" for i in range(count)]
        return helper.make_graph(
            [helper.make_node("Relu", ["x"], [i]) for i in items] +
            [helper.make_node("SequenceConstruct", items, [f"{name}_out"])], name, [],
            [helper.make_tensor_sequence_value_info(f"{name}_out", TensorProto.FLOAT, [2])])

    model = _model([helper.make_node("If", ["cond"], ["res"], then_branch=branch("then", 1),
                                     else_branch=branch("else", 2))],
                   [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_sequence_value_info("res", TensorProto.FLOAT, None)])
    rep = backend.prepare(model, "CPU")
    x = np.array([1.5, -2.0], np.float32)
    for cond, length in ((True, 1), (False, 2)):
        (res,) = rep.run({"cond": np.array(cond), "x": x})
        assert len(res) == length, f"cond={cond}: {len(res)} elements"
        np.testing.assert_array_equal(res[0], np.maximum(x, 0))
    assert rep.builds == 3  # the sequence's length is the condition's: a failed try, then an engine per value


def _range_loop_model(dtype=TensorProto.FLOAT):
    """ONNX's Range function body: a Loop whose trip count ceil((limit - start) / delta) is computed
    from the inputs, whose scan output collects start, start + delta, ..."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["prev", "delta"], ["current"]),
         helper.make_node("Identity", ["prev"], ["item"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("prev", dtype, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("current", dtype, []),
         helper.make_tensor_value_info("item", dtype, [])])
    nodes = [helper.make_node("Sub", ["limit", "start"], ["span"]),
             helper.make_node("Cast", ["span"], ["span_f"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["delta"], ["delta_f"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["span_f", "delta_f"], ["steps"]),
             helper.make_node("Ceil", ["steps"], ["ceil"]), helper.make_node("Relu", ["ceil"], ["count"]),
             helper.make_node("Cast", ["count"], ["trip"], to=TensorProto.INT64),
             helper.make_node("Cast", ["count"], ["go"], to=TensorProto.BOOL),
             helper.make_node("Loop", ["trip", "go", "start"], ["last", "out"], body=body)]
    return _model(nodes, [helper.make_tensor_value_info(n, dtype, []) for n in ("start", "limit", "delta")],
                  [helper.make_tensor_value_info("out", dtype, None)], opset=21)


@pytest.mark.parametrize("device", TARGETS)
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT32], ids=["float32", "int32"])
def test_a_loop_whose_trip_count_is_computed_from_inputs_builds_once(dtype, device):
    model = _range_loop_model(dtype)
    np_dtype = np.float32 if dtype == TensorProto.FLOAT else np.int32
    values = [(1, 5, 2), (10, 4, -3), (0.5 if dtype == TensorProto.FLOAT else 0, 40, 3), (3, 3, 1), (7, 2, 1),
              (-100, 100, 1), (2, 9, 2)]  # a long run, then a short one: the outputs are the run's, no stale rows
    feeds = [{k: np.array(v, np_dtype) for k, v in zip(("start", "limit", "delta"), triple)} for triple in values]
    _run_values(model, device, feeds, "Range's Loop")  # 2, 2, 14, 0, 0, 200 and 4 iterations


def test_a_loop_output_the_run_sizes_survives_the_plan_file_and_is_held_to_no_reserved_bytes():
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.file import Plan
    from polykit.runtime.engine import Runtime

    plan = build_plan(_range_loop_model(), BuilderConfig(target="cpu"))
    assert plan.profiles.sized == frozenset({"data(out)[0]"}), plan.profiles
    assert plan.tensors["out"].nbytes == 4  # the build plans one element; the run sizes it
    loaded = Plan.deserialize(plan.serialize())
    assert loaded.profiles.sized == plan.profiles.sized
    with Runtime("cpu").deserialize_engine(loaded) as engine, engine.create_execution_context() as ctx:
        for start, limit, delta in ((0, 100, 1), (2, 3, 0.25)):
            feeds = {"start": np.float32(start), "limit": np.float32(limit), "delta": np.float32(delta)}
            out = ctx.execute({k: np.array(v) for k, v in feeds.items()})["out"]
            np.testing.assert_allclose(out, np.arange(start, limit, delta, dtype=np.float32), rtol=1e-6)
            assert ctx.get_tensor_shape("out") == out.shape


def test_a_target_that_cannot_size_outputs_at_run_time_would_refuse_such_a_loop():
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.ops.data_dims import refuse_sized_target
    from polykit.errors import BuildError

    plan = build_plan(_range_loop_model(), BuilderConfig(target="cuda"))  # cuda's Loop sizes it
    assert plan.profiles.sized == frozenset({"data(out)[0]"}) and plan.tensors["out"].nbytes == 4
    with pytest.raises(BuildError, match=r"data\(out\)\[0\].*other target cannot allocate"):
        refuse_sized_target(plan.profiles.sized, "other")


@pytest.mark.parametrize("device", TARGETS)
def test_layers_after_a_loop_output_the_run_sizes_get_its_real_size(device):
    model = _range_loop_model()
    nodes = list(model.graph.node) + [helper.make_node("Mul", ["out", "out"], ["sq"]),
                                      helper.make_node("ReduceSum", ["sq"], ["total"], keepdims=0),
                                      helper.make_node("Shape", ["out"], ["n"])]
    model = _model(nodes, list(model.graph.input),
                   [helper.make_tensor_value_info("total", TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("n", TensorProto.INT64, None)], opset=21)
    feeds = [{"start": np.float32(a), "limit": np.float32(b), "delta": np.float32(c)}
             for a, b, c in ((0.5, 9, 0.5), (1, 2, 1), (4, 1, 1), (-3, 30, 2), (0, 3, 1), (-3, 30, 2))]
    _run_values(model, device, [{k: np.array(v) for k, v in f.items()} for f in feeds], "Loop -> Mul/ReduceSum/Shape")


def _if_of_shapes_model():
    """If(cond) gives x's first two rows, else x's transpose: each branch a shape of its own."""
    def branch(name, node):
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)])

    starts = helper.make_tensor("starts", TensorProto.INT64, [1], [0])
    ends = helper.make_tensor("ends", TensorProto.INT64, [1], [2])
    model = _model([helper.make_node("If", ["cond"], ["y"], then_branch=branch(
                        "then", helper.make_node("Slice", ["x", "starts", "ends"], ["then_y"])),
                                     else_branch=branch("else", helper.make_node("Transpose", ["x"], ["else_y"]))),
                    helper.make_node("Relu", ["y"], ["z"])],
                   [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model.graph.initializer.extend([starts, ends])
    return model


@pytest.mark.parametrize("device", TARGETS)
def test_an_if_whose_branches_give_other_shapes_builds_once(device):
    x = np.random.default_rng(5).standard_normal((3, 5)).astype(np.float32)
    feeds = [{"cond": np.array(c), "x": x} for c in (True, False, True, False)]
    _run_values(_if_of_shapes_model(), device, feeds, "If of two shapes")  # [2, 5], then [5, 3]


@pytest.mark.parametrize("device", TARGETS)
def test_split_to_sequence_of_a_chunk_size_fed_as_an_input_builds_once(device):
    # the chunk size decides the sequence's length: the plan holds 6 pieces and a length computed per run
    model = _model([helper.make_node("SplitToSequence", ["x", "chunk"], ["seq"], axis=1),
                    helper.make_node("SequenceLength", ["seq"], ["n"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6]),
                    helper.make_tensor_value_info("chunk", TensorProto.INT64, [])],
                   [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("n", TensorProto.INT64, None)])
    x = np.random.default_rng(6).standard_normal((3, 6)).astype(np.float32)
    feeds = [{"x": x, "chunk": np.array(c, np.int64)} for c in (2, 4, 1, 6, 9, 2)]
    _run_values(model, device, feeds, "SplitToSequence by chunks")


def test_a_chunk_size_outside_its_domain_is_refused_naming_the_input():
    from polykit.errors import RuntimeInputError

    model = _model([helper.make_node("SplitToSequence", ["x", "chunk"], ["seq"], axis=0)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2]),
                    helper.make_tensor_value_info("chunk", TensorProto.INT64, [])],
                   [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)])
    rep = backend.prepare(model, "CPU")
    x = np.ones((4, 2), np.float32)
    assert [p.shape for p in rep.run({"x": x, "chunk": np.array(3)})[0]] == [(3, 2), (1, 2)]
    with pytest.raises(RuntimeInputError, match="chunk"):
        rep.run({"x": x, "chunk": np.array(0)})


def _if_of_an_optional_model():
    """test_if_opt's form with data: then gives an empty optional, else an optional sequence of
    Relu(x) and x's first row; a second output, Relu(x) + 1, both branches give."""
    seq_type = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    opt_type = helper.make_optional_type_proto(seq_type)
    then = helper.make_graph([helper.make_node("Optional", [], ["none"], type=seq_type),
                              helper.make_node("Relu", ["x"], ["r1"]), helper.make_node("Add", ["r1", "one"], ["t2"])],
                             "then", [], [helper.make_value_info("none", opt_type),
                                          helper.make_tensor_value_info("t2", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("Gather", ["x", "zero"], ["row"], axis=0),
                               helper.make_node("SequenceConstruct", ["r", "row"], ["s"]),
                               helper.make_node("Optional", ["s"], ["some"]),
                               helper.make_node("Add", ["r", "one"], ["e2"])],
                              "else", [], [helper.make_value_info("some", opt_type),
                                           helper.make_tensor_value_info("e2", TensorProto.FLOAT, None)])
    model = _model([helper.make_node("If", ["cond"], ["opt", "y"], then_branch=then, else_branch=other)],
                   [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                   [helper.make_value_info("opt", opt_type), helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model.graph.initializer.extend([helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
                                    helper.make_tensor("zero", TensorProto.INT64, [], [0])])
    return model


@pytest.mark.parametrize("device", TARGETS)
def test_an_if_that_gives_an_optional_in_one_branch_only_builds_once(device):
    # the run decides the optional's presence: a flag and placeholder elements (passes.sequence_if)
    x = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    rep = backend.prepare(_if_of_an_optional_model(), device)
    for cond in (True, False, True, False):
        opt, y = rep.run({"cond": np.array(cond), "x": x})
        np.testing.assert_allclose(y, np.maximum(x, 0) + 1, rtol=1e-6, err_msg=f"cond={cond}: y")
        if cond:
            assert opt is None, f"cond=True gives an empty optional, got {opt!r}"
        else:
            assert isinstance(opt, list) and [a.shape for a in opt] == [(3, 4), (4,)], f"cond=False: {opt!r}"
            np.testing.assert_allclose(opt[0], np.maximum(x, 0), rtol=1e-6, err_msg="cond=False: element 0")
            np.testing.assert_allclose(opt[1], x[0], rtol=1e-6, err_msg="cond=False: element 1")
    assert rep.builds == 1, f"{rep.builds} engines built for two conditions (one expected)"


def test_an_optional_whose_presence_the_run_decides_cannot_be_unwrapped_at_build_time():
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.errors import BuildError

    model = _if_of_an_optional_model()
    model.graph.node.append(helper.make_node("OptionalGetElement", ["opt"], ["seq"]))
    model.graph.output[0].CopyFrom(helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None))
    with pytest.raises(BuildError, match="whether .opt. holds an element is known only at run time"):
        build_plan(model, BuilderConfig(target="cpu", input_shapes={"cond": (), "x": (3, 4)}))
