"""In-place I/O on the cpu target: I/O tensors bound with set_tensor_address are read and written
in the caller's memory (bit-identical to the copied path), bad buffers are refused naming the
tensor, and the input-consumed event is signalled right after the last layer reading an input."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import RuntimeInputError, UsageError
from polykit.runtime.engine import MAX_IN_PLACE_SETS, Engine

W = np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(8, 4)


def _plan():
    """x[2,8] -> matmul -> a -> relu -> b -> neg -> c -> exp -> y[2,4], and z = a + 1: x's last reader is layer 0."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="matmul"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Neg", ["b"], ["c"], name="neg"),
             helper.make_node("Exp", ["c"], ["y"], name="exp"),
             helper.make_node("Add", ["a", "one"], ["z"], name="add")]
    graph = helper.make_graph(nodes, "inplace", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.float32(1.0), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return build_plan(model, BuilderConfig(target="cpu", fuse=False))


def _x(seed):
    return np.random.default_rng(seed).standard_normal((2, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def engine():
    with Engine(_plan()) as engine:
        yield engine


def _bound(ctx):
    """Fresh NaN-filled output buffers bound to y and z."""
    y, z = np.full((2, 4), np.nan, np.float32), np.full((2, 4), np.nan, np.float32)
    ctx.set_tensor_address("y", y)
    ctx.set_tensor_address("z", z)
    return y, z


def test_bound_buffers_are_read_and_written_in_place_bit_identical_to_copies(engine):
    with engine.create_execution_context() as ctx:
        copied = [ctx.execute({"x": _x(s)}) for s in range(3)]
        x = _x(0)
        ctx.set_tensor_address("x", x)
        y, z = _bound(ctx)
        for seed in range(3):
            x[...] = _x(seed)  # the same buffer, refilled: read where it is, not a stale copy
            ctx.enqueue()
            np.testing.assert_array_equal(y, copied[seed]["y"])
            np.testing.assert_array_equal(z, copied[seed]["z"])


def test_rebinding_moves_the_outputs_to_the_new_buffers(engine):
    with engine.create_execution_context() as ctx:
        x = _x(4)
        ctx.set_tensor_address("x", x.ctypes.data)  # a raw address works as well as the array
        first = _bound(ctx)
        ctx.enqueue()
        second = _bound(ctx)
        ctx.enqueue()
        want = ctx.execute({"x": x})
        for y, z in (first, second):
            np.testing.assert_array_equal(y, want["y"])
            np.testing.assert_array_equal(z, want["z"])


def test_bindings_passed_to_enqueue_are_copied_and_the_rest_used_in_place(engine):
    with engine.create_execution_context() as ctx:
        x, y_copy = _x(5), np.zeros((2, 4), np.float32)
        ctx.set_tensor_address("x", x)
        _, z = _bound(ctx)
        ctx.enqueue({"y": y_copy})
        want = ctx.execute({"x": x})
        np.testing.assert_array_equal(y_copy, want["y"])
        np.testing.assert_array_equal(z, want["z"])


def test_unbinding_asks_for_the_buffer_again(engine):
    with engine.create_execution_context() as ctx:
        ctx.set_tensor_address("x", _x(0))
        _bound(ctx)
        ctx.set_tensor_address("y", None)
        assert ctx.get_tensor_address("y") is None
        with pytest.raises(RuntimeInputError, match="'y'"):
            ctx.enqueue()


@pytest.mark.parametrize("buffer,match", [
    (np.zeros((2, 9), np.float32), "shape"),
    (np.zeros((2, 8), np.float64), "float64"),
    (np.zeros((8, 2), np.float32).T, "contiguous"),
    (np.zeros(4 * 16 + 1, np.uint8)[1:].view(np.float32).reshape(2, 8), "aligned"),  # one byte off
])
def test_a_bad_buffer_is_a_runtime_input_error_naming_the_tensor(engine, buffer, match):
    with engine.create_execution_context() as ctx:
        ctx.set_tensor_address("x", buffer)
        _bound(ctx)
        with pytest.raises(RuntimeInputError, match=match) as info:
            ctx.enqueue()
        assert info.value.where == "tensor 'x'"


def test_binding_a_tensor_the_engine_lacks_is_a_usage_error(engine):
    with engine.create_execution_context() as ctx, pytest.raises(UsageError, match="'a'"):
        ctx.set_tensor_address("a", np.zeros((2, 4), np.float32))


def test_the_input_consumed_point_is_after_the_last_reader_of_the_inputs(engine):
    assert engine.input_consumed_layer == 0  # only the matmul reads x


class Overwriter:
    """A consumed event whose set() refills the input buffer with garbage (the caller reusing it
    at once) and notes whether the outputs were written yet."""

    def __init__(self, x, outputs):
        self.x, self.outputs, self.seen = x, outputs, []

    def set(self):
        self.seen.append([bool(np.isnan(out).all()) for out in self.outputs])
        self.x[...] = 1e30


def test_the_input_consumed_event_is_set_after_the_last_reader_and_before_later_layers(engine):
    with engine.create_execution_context() as ctx:
        want = ctx.execute({"x": _x(6)})
        x = _x(6)
        ctx.set_tensor_address("x", x)
        outputs = _bound(ctx)
        event = Overwriter(x, outputs)
        ctx.set_input_consumed_event(event)
        ctx.enqueue()
        assert event.seen == [[True, True]]  # neither output written when the event was set
        np.testing.assert_array_equal(outputs[0], want["y"])  # the overwritten input was never read again
        np.testing.assert_array_equal(outputs[1], want["z"])


def test_execute_sets_the_input_consumed_event_too(engine):
    with engine.create_execution_context() as ctx:
        event = threading.Event()
        ctx.set_input_consumed_event(event)
        ctx.execute({"x": _x(7)})
        assert event.is_set()
        assert ctx.get_input_consumed_event() is event


def test_an_input_that_is_also_an_output_is_consumed_after_the_outputs_are_copied():
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"], name="neg")], "passthrough",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])])
    plan = build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                      BuilderConfig(target="cpu"))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        assert engine.input_consumed_layer == engine.num_layers
        x, y = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
        ctx.set_tensor_address("x", x)
        ctx.set_tensor_address("y", y)
        event = threading.Event()
        ctx.set_input_consumed_event(event)
        ctx.enqueue()
        assert event.is_set()
        np.testing.assert_array_equal(y, -np.arange(4, dtype=np.float32))


def test_a_bound_tensor_moves_with_the_views_of_its_slot_and_conflicts_are_copied():
    """The cuda target's placement (runtime.io_binding.place_in_caller_memory), on a cuda plan
    built without a device: v is a view of input x, f a view of output y (I/O are never views)."""
    from polykit.runtime.io_binding import place_in_caller_memory

    nodes = [helper.make_node("Reshape", ["x", "shape"], ["v"], name="view_x"),
             helper.make_node("Relu", ["v"], ["y"], name="relu"),
             helper.make_node("Flatten", ["y"], ["f"], name="view_y", axis=0),
             helper.make_node("Neg", ["f"], ["z"], name="neg")]
    graph = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 24])],
                              [numpy_helper.from_array(np.array([6, 4], np.int64), "shape")])
    plan = build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                      BuilderConfig(target="cuda", builder_optimization_level=0, fuse=False))
    assert plan.memory.aliases == {"v": "x", "f": "y"}
    placed, copies = place_in_caller_memory(plan, ["x", "y", "z"])
    assert {name: set(group) for name, group in placed.items()} == {"x": {"x", "v"}, "y": {"y", "f"}, "z": {"z"}}
    assert copies == set()
    placed, copies = place_in_caller_memory(plan, ["y", "z"], elsewhere=["f"])  # f outside the arena
    assert set(placed) == {"z"} and copies == {"y"}
    plan.outputs.append("x")  # an input that is an output too: copied out of the input's bytes
    assert place_in_caller_memory(plan, ["x", "y"])[1] == {"x"}


def test_a_bound_output_takes_the_source_whose_view_it_is_into_the_callers_memory():
    """r -> Reshape -> y, y an output: r shares y's slot (its producer writes the output), so
    binding y moves r with it and the Relu writes the caller's buffer."""
    from polykit.runtime.io_binding import place_in_caller_memory

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="view_r")]
    graph = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4])],
                              [numpy_helper.from_array(np.array([6, 4], np.int64), "shape")])
    plan = build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                      BuilderConfig(target="cuda", builder_optimization_level=0, fuse=False))
    assert plan.memory.aliases == {"r": "y"}
    placed, copies = place_in_caller_memory(plan, ["x", "y"])
    assert {name: set(group) for name, group in placed.items()} == {"x": {"x"}, "y": {"y", "r"}} and not copies


def test_where_graphs_are_replayed_a_set_of_addresses_runs_in_place_from_its_second_run():
    """y is written by layer 0 and x read last by layer 1: when the consumed event is set, y is
    already in the caller's buffer if the run is in place, not yet if it is copied out at the end."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Neg", ["x"], ["z"], name="neg")]
    graph = helper.make_graph(nodes, "early", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])
    plan = build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                      BuilderConfig(target="cpu", fuse=False))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        assert engine.input_consumed_layer == 1
        x = np.arange(4, dtype=np.float32) - 2
        ctx.set_tensor_address("x", x)
        seen, held = [], []
        for _ in range(MAX_IN_PLACE_SETS + 1):
            y, z = np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32)  # fresh buffers each round,
            held.append((y, z))  # kept, so that no later round gets their addresses again
            ctx.set_tensor_address("y", y)
            ctx.set_tensor_address("z", z)
            event = Overwriter(np.zeros(1, np.float32), [y])
            ctx.set_input_consumed_event(event)
            for _ in range(2):  # new addresses: copied; the same addresses again: in place
                ctx._replay_wanted = True  # as on a target that captures (cuda): the policy under test
                y[...] = np.nan
                ctx.enqueue()
            seen.append(event.seen)
            np.testing.assert_array_equal(y, np.maximum(x, 0))
        # y still NaN at the event when copied, written when in place; past MAX_IN_PLACE_SETS sets, always copied
        assert seen == [[[True], [False]]] * MAX_IN_PLACE_SETS + [[[True], [True]]]


def test_replays_on_caller_addresses_and_on_the_contexts_memory_never_push_each_other_out(engine):
    from polykit.runtime.engine import MAX_REPLAYS

    class Replay:
        closed = False

        def close(self):
            self.closed = True

    with engine.create_execution_context() as ctx:
        own = [Replay() for _ in range(MAX_REPLAYS + 1)]
        bound = [Replay() for _ in range(MAX_IN_PLACE_SETS)]
        for k, replay in enumerate(bound):
            ctx._keep_replay((k, (("x", 4096 * (k + 1)),), 0), replay)  # shapes key + (addresses, event)
        for k, replay in enumerate(own):  # one more than the bound: the oldest of its own kind goes
            ctx._keep_replay((k, (), 0), replay)
        assert [r.closed for r in own] == [True] + [False] * MAX_REPLAYS
        assert not any(r.closed for r in bound)
        ctx._replays.clear()


class Counted:
    """A host buffer that counts how often its address is asked for (its __array_interface__)."""

    def __init__(self, array):
        self.array, self.asked = array, 0

    @property
    def __array_interface__(self):
        self.asked += 1
        return self.array.__array_interface__


def test_a_bound_buffer_is_checked_once_per_shape_and_again_once_rebound(engine):
    """Serving binds the same buffers run after run: their checks are not on the host's path to
    every launch. Rebinding (the object may hold new memory now) checks again."""
    with engine.create_execution_context() as ctx:
        x = Counted(_x(6))
        ctx.set_tensor_address("x", x)
        y, z = _bound(ctx)
        ctx.enqueue()
        once = x.asked
        for _ in range(3):
            ctx.enqueue()
        assert once > 0 and x.asked == once
        want = ctx.execute({"x": x.array})
        np.testing.assert_array_equal(y, want["y"])
        x.array = _x(7)  # new memory behind the same object: used once it is bound again
        ctx.set_tensor_address("x", x)
        ctx.enqueue()
        assert x.asked == 2 * once
        np.testing.assert_array_equal(z, ctx.execute({"x": x.array})["z"])


def test_the_cuda_placement_is_redone_only_when_the_bound_addresses_change(monkeypatch):
    """CudaContext.bind_addresses on a cuda plan built without a device: the same addresses bound
    again leave every tensor where it is; new ones move the group there and the old back home."""
    import types

    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.runtime.cuda import target
    from polykit.runtime.io_binding import place_in_caller_memory, view_groups

    nodes = [helper.make_node("Reshape", ["x", "shape"], ["v"], name="view_x"),
             helper.make_node("Relu", ["v"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4])],
                              [numpy_helper.from_array(np.array([6, 4], np.int64), "shape")])
    plan = build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                      BuilderConfig(target="cuda", builder_optimization_level=0, fuse=False))
    home = {name: 0x1000 * (i + 1) for i, name in enumerate(plan.tensors)}
    ctx = types.SimpleNamespace(engine=types.SimpleNamespace(plan=plan), _elsewhere=set(), _moved={},
                                _view_groups=view_groups(plan.memory.aliases), _placed_key=(),
                                _placed_copies=frozenset(),
                                tensors={n: DeviceTensor(home[n], tuple(d.shape), d.np_dtype) for n, d in plan.tensors.items()})
    calls = []
    monkeypatch.setattr(target, "place_in_caller_memory", lambda *a: calls.append(a) or place_in_caller_memory(*a))
    bind = target.CudaContext.bind_addresses
    assert bind(ctx, {}) == set() and calls == []  # nothing bound, nothing moved
    for _ in range(3):
        assert bind(ctx, {"x": 0xA000, "y": 0xB000}) == set()
    assert len(calls) == 1
    assert {n: t.ptr for n, t in ctx.tensors.items() if n in ("x", "v", "y")} == {"x": 0xA000, "v": 0xA000, "y": 0xB000}
    bind(ctx, {"x": 0xC000})
    assert len(calls) == 2
    assert (ctx.tensors["x"].ptr, ctx.tensors["v"].ptr, ctx.tensors["y"].ptr) == (0xC000, 0xC000, home["y"])
    bind(ctx, {})
    assert all(t.ptr == home[n] for n, t in ctx.tensors.items())
