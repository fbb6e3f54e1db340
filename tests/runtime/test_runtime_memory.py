"""Context memory: contexts without memory run on the caller's scratch (several may share one),
and an allocator hook sees every allocation the runtime makes and its free (cpu target, host
memory standing in for device memory)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import DeviceError, RuntimeInputError, UsageError
from polykit.runtime.engine import Engine, Runtime
from polykit.runtime.memory import NumpyAllocator

W = np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(8, 4)


def _plan():
    """x[2,8] @ w -> relu -> neg -> exp -> y[2,4]: activations whose slots the memory plan reuses."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="matmul"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Neg", ["b"], ["c"], name="neg"),
             helper.make_node("Exp", ["c"], ["y"], name="exp")]
    graph = helper.make_graph(nodes, "memory", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(W, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return build_plan(model, BuilderConfig(target="cpu", fuse=False))


def _expected(x):
    return np.exp(-np.maximum(x @ W, 0))


def aligned(nbytes, fill=0):
    """A numpy byte buffer whose address is a multiple of 256 (what scratch must be)."""
    raw = np.full(nbytes + 256, fill, np.uint8)
    start = -raw.ctypes.data % 256
    return raw[start:start + nbytes]


def _x(seed):
    return np.random.default_rng(seed).standard_normal((2, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def plan():
    return _plan()


def test_device_memory_size_is_the_plans_arena_for_every_profile(plan):
    engine = Engine(plan)
    assert engine.device_memory_size >= plan.memory.arena_bytes > 0
    assert engine.get_device_memory_size_for_profile(0) == engine.device_memory_size
    with pytest.raises(UsageError):
        engine.get_device_memory_size_for_profile(1)


def test_a_context_without_memory_refuses_to_run_until_given_some(plan):
    with Engine(plan) as engine, engine.create_execution_context(device_memory=None) as ctx:
        with pytest.raises(RuntimeInputError, match="set_device_memory"):
            ctx.execute({"x": _x(0)})
        scratch = aligned(engine.device_memory_size)
        ctx.set_device_memory(scratch)
        np.testing.assert_allclose(ctx.execute({"x": _x(0)})["y"], _expected(_x(0)), rtol=1e-6)


def test_the_activations_live_in_the_scratch_given(plan):
    with Engine(plan) as engine, engine.create_execution_context(device_memory=None) as ctx:
        scratch = aligned(engine.device_memory_size, 0xFF)  # NaN in every float slot
        ctx.set_device_memory(scratch.ctypes.data, scratch.nbytes)
        y = ctx.execute({"x": _x(1)})["y"]
        np.testing.assert_allclose(y, _expected(_x(1)), rtol=1e-6)
        offset = plan.tensors["c"].offset  # the last intermediate written
        np.testing.assert_array_equal(scratch[offset:offset + 32].view(np.float32).reshape(2, 4),
                                      -np.maximum(_x(1) @ W, 0))


def test_two_contexts_sharing_one_scratch_run_one_after_the_other_correctly(plan):
    with Engine(plan) as engine:
        scratch = aligned(engine.device_memory_size, 0xFF)
        a = engine.create_execution_context(device_memory=None)
        b = engine.create_execution_context(device_memory=None)
        for ctx in (a, b):
            ctx.set_device_memory(scratch)
        for step in range(3):
            for ctx, seed in ((a, 10 + step), (b, 20 + step)):
                np.testing.assert_allclose(ctx.execute({"x": _x(seed)})["y"], _expected(_x(seed)), rtol=1e-6)
        a.close()
        b.close()


@pytest.mark.parametrize("size,shift,match", [(-1, 0, "needs"), (0, 8, "aligned")])
def test_scratch_too_small_or_misaligned_is_refused(plan, size, shift, match):
    with Engine(plan) as engine, engine.create_execution_context(device_memory=None) as ctx:
        raw = np.zeros(engine.device_memory_size + 512, np.uint8)
        ptr = raw.ctypes.data + (-raw.ctypes.data % 256) + shift
        with pytest.raises(RuntimeInputError, match=match):
            ctx.set_device_memory(ptr, engine.device_memory_size + size)


def test_device_memory_option_must_be_owned_or_none(plan):
    with Engine(plan) as engine, pytest.raises(UsageError, match="owned"):
        engine.create_execution_context(device_memory="mine")


class Recording(NumpyAllocator):
    """An allocator hook that records every allocation and free."""

    def __init__(self):
        super().__init__()
        self.allocs: list[tuple[int, int, int]] = []
        self.frees: list[int] = []

    def alloc(self, size, alignment):
        ptr = super().alloc(size, alignment)
        self.allocs.append((ptr, size, alignment))
        return ptr

    def free(self, ptr):
        self.frees.append(ptr)
        super().free(ptr)


def test_the_allocator_sees_every_allocation_and_its_free(plan):
    hook = Recording()
    runtime = Runtime("cpu", allocator=hook)
    engine = runtime.deserialize_engine(plan)
    weights = list(hook.allocs)
    assert len(weights) == 1 and weights[0][1] >= W.nbytes  # the weights, copied into the hook's memory
    ctx = engine.create_execution_context()
    assert len(hook.allocs) == 2 and hook.allocs[1][1] == engine.device_memory_size
    np.testing.assert_allclose(ctx.execute({"x": _x(2)})["y"], _expected(_x(2)), rtol=1e-6)
    shared = engine.create_execution_context(device_memory=None)  # no allocation: the caller gives memory
    assert len(hook.allocs) == 2
    shared.close()
    ctx.close()
    engine.close()
    assert sorted(hook.frees) == sorted(ptr for ptr, _, _ in hook.allocs)
    assert all(ptr % alignment == 0 for ptr, _, alignment in hook.allocs)


def test_the_weights_are_read_from_the_allocators_memory(plan):
    hook = Recording()
    with Engine(plan, allocator=hook) as engine, engine.create_execution_context() as ctx:
        ptr, size, _ = hook.allocs[0]
        held = hook._held[ptr]
        start = ptr - held.ctypes.data
        held[start:start + size].view(np.float32)[:W.size] = 0  # the weights now zero: y = exp(0)
        np.testing.assert_array_equal(ctx.execute({"x": _x(3)})["y"], np.ones((2, 4), np.float32))


def test_an_allocator_returning_no_address_is_a_device_error(plan):
    class Broken(NumpyAllocator):
        def alloc(self, size, alignment):
            return 0

    with pytest.raises(DeviceError, match="aligned"):
        Engine(plan, allocator=Broken())
