"""Runtime / Engine / ExecutionContext: I/O metadata, feed checks, threads, plan loading."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import PlanError, RuntimeInputError, UsageError
from polykit.runtime.engine import Engine, Runtime

W = np.linspace(-1.0, 2.0, 12, dtype=np.float32).reshape(3, 4)


def _model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    m = helper.make_tensor_value_info("m", TensorProto.INT64, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    z = helper.make_tensor_value_info("z", TensorProto.BOOL, None)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["t"], name="mul"),
        helper.make_node("Exp", ["t"], ["e"], name="exp"),
        helper.make_node("Sub", ["e", "x"], ["y"], name="sub"),
        helper.make_node("Cast", ["m"], ["mf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Greater", ["y", "mf"], ["z"], name="gt"),
    ]
    graph = helper.make_graph(nodes, "engine_test", [x, m], [y, z], [numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _expected(x, m):
    y = np.exp(x * W) - x
    return y, y > m.astype(np.float32)


@pytest.fixture(scope="module")
def engine() -> Engine:
    plan = build_plan(_model(), BuilderConfig(target="cpu", input_shapes={"x": (3, 4)}))
    return Runtime().deserialize_engine(plan.serialize())


def _feeds(seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((3, 4)).astype(np.float32), "m": rng.integers(0, 3, (3, 4)).astype(np.int64)}


def test_engine_lists_inputs_then_outputs(engine):
    assert engine.io_tensors == ["x", "m", "y", "z"]


def test_engine_reports_shapes_dtypes_and_modes(engine):
    assert engine.get_tensor_shape("x") == (3, 4)
    assert engine.get_tensor_dtype("m") == np.int64
    assert engine.get_tensor_dtype("z") == np.bool_
    assert [engine.get_tensor_mode(n) for n in engine.io_tensors] == ["input", "input", "output", "output"]
    assert list(engine.input_metadata) == ["x", "m"] and list(engine.output_metadata) == ["y", "z"]
    assert engine.output_metadata["y"].shape == (3, 4)


def test_engine_counts_its_layers(engine):
    assert engine.num_layers >= 1


def test_unknown_tensor_name_is_a_usage_error(engine):
    with pytest.raises(UsageError, match="no input or output 't_nope'"):
        engine.get_tensor_shape("t_nope")


def test_execute_matches_numpy(engine):
    feeds = _feeds()
    with engine.create_execution_context() as ctx:
        out = ctx.execute(feeds)
    y, z = _expected(feeds["x"], feeds["m"])
    np.testing.assert_allclose(out["y"], y, rtol=1e-6)
    np.testing.assert_array_equal(out["z"], z)


def test_missing_feed_names_the_input(engine):
    feeds = _feeds()
    del feeds["m"]
    with pytest.raises(RuntimeInputError, match="'m' is missing"):
        engine.create_execution_context().execute(feeds)


def test_unknown_feed_names_the_tensor(engine):
    with pytest.raises(RuntimeInputError, match="'q' is not an input"):
        engine.create_execution_context().execute({**_feeds(), "q": np.zeros(1)})


def test_wrong_dtype_says_what_was_expected(engine):
    feeds = _feeds()
    feeds["x"] = feeds["x"].astype(np.float64)
    with pytest.raises(RuntimeInputError, match="'x' has dtype float64, the engine expects float32"):
        engine.create_execution_context().execute(feeds)


def test_wrong_shape_says_what_was_expected(engine):
    feeds = _feeds()
    feeds["x"] = np.ones((2, 4), np.float32)
    with pytest.raises(RuntimeInputError, match=r"'x' has shape \(2, 4\), the engine expects \(3, 4\)"):
        engine.create_execution_context().execute(feeds)


def test_non_array_feed_is_rejected(engine):
    with pytest.raises(RuntimeInputError, match="numpy array"):
        engine.create_execution_context().execute({**_feeds(), "x": object()})


def test_closed_context_refuses_to_run(engine):
    ctx = engine.create_execution_context()
    ctx.close()
    with pytest.raises(UsageError, match="closed"):
        ctx.execute(_feeds())


def test_contexts_on_threads_give_identical_results(engine):
    feeds = [_feeds(seed) for seed in range(4)]
    expected = [engine.create_execution_context().execute(f) for f in feeds]
    results: dict[tuple[int, int], dict] = {}

    def work(tid: int) -> None:
        ctx = engine.create_execution_context()
        for rep in range(20):
            results[(tid, rep)] = ctx.execute(feeds[(tid + rep) % 4])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 80
    for (tid, rep), out in results.items():
        want = expected[(tid + rep) % 4]
        np.testing.assert_array_equal(out["y"], want["y"])
        np.testing.assert_array_equal(out["z"], want["z"])


def test_outputs_do_not_alias_the_feeds():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 21)])
    engine = Runtime("cpu").deserialize_engine(build_plan(model, BuilderConfig(target="cpu", fold_constants=False)))
    feed = np.array([1.0, 2.0], np.float32)
    out = engine.create_execution_context().execute({"x": feed})
    out["y"][0] = 9.0
    assert feed[0] == 1.0


def test_runtime_with_another_target_rejects_the_plan():
    plan = build_plan(_model(), BuilderConfig(target="cpu", input_shapes={"x": (3, 4)}))
    with pytest.raises(PlanError, match="built for target 'cpu'"):
        Runtime("cuda").deserialize_engine(plan.serialize())
    with pytest.raises(PlanError, match="built for target 'cpu'"):
        Runtime("cuda").deserialize_engine(plan)


def test_load_engine_from_a_file(tmp_path):
    path = build_plan(_model(), BuilderConfig(target="cpu", input_shapes={"x": (3, 4)})).save(tmp_path / "m.plan")
    engine = Runtime().load_engine(path)
    feeds = _feeds(3)
    np.testing.assert_allclose(engine.create_execution_context().execute(feeds)["y"], _expected(**feeds)[0], rtol=1e-6)


def test_closed_engine_creates_no_contexts():
    engine = Runtime().deserialize_engine(build_plan(_model(), BuilderConfig(target="cpu", input_shapes={"x": (3, 4)})))
    engine.close()
    with pytest.raises(UsageError, match="closed"):
        engine.create_execution_context()


DATA = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "torch"


@pytest.mark.parametrize("model", ["convnet_ts", "convnet_extdata_dynamo", "bert_tiny_dynamo", "gpt2_tiny_ts",
                                   "vit_tiny_ts"])
def test_exported_models_run_on_cpu_like_onnxruntime(model):
    ort = pytest.importorskip("onnxruntime")
    path = DATA / f"{model}.onnx"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    session = ort.InferenceSession(str(path))
    shapes = {i.name: tuple(d if isinstance(d, int) else 2 for d in i.shape) for i in session.get_inputs()}
    rng = np.random.default_rng(11)
    feeds = {}
    for i in session.get_inputs():
        if i.type == "tensor(float)":
            feeds[i.name] = rng.standard_normal(shapes[i.name]).astype(np.float32)
        else:
            feeds[i.name] = rng.integers(0, 50, shapes[i.name]).astype(np.int64)
    plan = build_plan(str(path), BuilderConfig(target="cpu", input_shapes=shapes))
    engine = Runtime().deserialize_engine(plan.serialize())
    assert engine.io_tensors == [i.name for i in session.get_inputs()] + [o.name for o in session.get_outputs()]
    out = engine.create_execution_context().execute(feeds)
    for name, want in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
        np.testing.assert_allclose(out[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
    assert plan.memory.arena_bytes < plan.memory.no_reuse_bytes


def test_enqueue_on_the_cpu_target_copies_host_buffers_in_and_out():
    import numpy as np
    from onnx import TensorProto, helper

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Runtime

    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    plan = build_plan(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), BuilderConfig(target="cpu"))
    x, y = np.array([1.5, -2.0], np.float32), np.zeros(2, np.float32)
    with Runtime("cpu").deserialize_engine(plan).create_execution_context() as ctx:
        ctx.enqueue({"x": x, "y": y})
    np.testing.assert_array_equal(y, -x)


def test_the_targets_a_plan_may_name_are_the_runtimes_targets():
    from polykit.compiler.plan.records import TARGETS as PLAN_TARGETS
    from polykit.runtime.target import TARGETS

    assert set(PLAN_TARGETS) == set(TARGETS)
