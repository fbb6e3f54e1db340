"""GPU: the serving runtime API on the cuda target. Buffers bound with set_tensor_address give
outputs bit-identical to the copied path, eager and graph-replayed (with the graph re-captured
when the addresses change); an input buffer overwritten right after the input-consumed event
never corrupts results; two contexts sharing one scratch run one after the other correctly; the
allocator hook sees every device allocation and its free."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(0)
W1 = (RNG.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
W2 = (RNG.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32)


def _model():
    """conv -> relu -> conv -> relu -> global pool, and a reshape (a view) of the first activation."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"], name="relu1"),
             helper.make_node("Conv", ["b", "w2"], ["c"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["d"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["d"], ["y"], name="pool"),
             helper.make_node("Flatten", ["b"], ["z"], name="flat", axis=1)]
    graph = helper.make_graph(nodes, "serve", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 1, 1]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 16 * 16 * 16])],
                              [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def plan():
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    return build_plan(_model(), BuilderConfig(target="cuda"))


def _x(seed):
    return np.random.default_rng(seed).standard_normal((2, 8, 16, 16)).astype(np.float32)


class Buffers:
    """Device buffers for x, y, z (NaN-poisoned outputs), freed on exit."""

    def __init__(self, engine):
        from polykit.runtime.cuda.memory import DeviceBuffer, fill_bytes

        self.engine = engine
        self.buf = {n: DeviceBuffer(engine.plan.tensors[n].nbytes, what=n) for n in engine.io_tensors}
        for name in engine.plan.outputs:
            fill_bytes(self.buf[name].ptr, self.buf[name].nbytes)

    def ptr(self, name):
        return self.buf[name].ptr

    def put(self, x):
        from polykit.runtime.cuda.memory import upload

        upload(self.ptr("x"), x)

    def get(self, name):
        from polykit.runtime.cuda.memory import download

        desc = self.engine.plan.tensors[name]
        return download(self.ptr(name), tuple(desc.shape), desc.np_dtype)

    def bind(self, ctx):
        for name in self.engine.io_tensors:
            ctx.set_tensor_address(name, self.ptr(name))

    def close(self):
        for b in self.buf.values():
            b.free()


def _sync():
    from polykit.runtime.cuda import driver

    driver.call("cuCtxSynchronize")


def test_bound_copied_and_graph_replayed_outputs_are_bit_identical(plan):
    from polykit.runtime.engine import Engine

    with Engine(plan) as engine, engine.create_execution_context(cuda_graph=True) as ctx:
        copied = [ctx.execute({"x": _x(s)}) for s in (1, 1, 2)]  # eager, then replayed
        first, second = Buffers(engine), Buffers(engine)
        try:
            for bufs in (first, second, first):  # new addresses: copied once, then captured in place; then replayed
                bufs.bind(ctx)
                for seed in (1, 2, 2):
                    bufs.put(_x(seed))
                    ctx.enqueue()
                    _sync()
                    want = copied[0] if seed == 1 else copied[2]
                    for name in ("y", "z"):
                        np.testing.assert_array_equal(bufs.get(name), want[name], err_msg=name)
            copy_out = Buffers(engine)
            copy_out.put(_x(2))
            ctx.enqueue({n: copy_out.ptr(n) for n in engine.io_tensors})  # the copied enqueue path
            _sync()
            for name in ("y", "z"):
                np.testing.assert_array_equal(copy_out.get(name), copied[2][name], err_msg=name)
            copy_out.close()
        finally:
            first.close()
            second.close()


def test_an_input_overwritten_after_the_consumed_event_never_corrupts_results(plan):
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.memory import fill_bytes
    from polykit.runtime.cuda.stream import Event, Stream
    from polykit.runtime.engine import Engine

    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        want = ctx.execute({"x": _x(3)})
        bufs, work, refill, event = Buffers(engine), Stream(), Stream(), Event()
        try:
            bufs.bind(ctx)
            ctx.set_input_consumed_event(event)
            for _ in range(3):  # copied (new addresses), captured in place, replayed in place
                bufs.put(_x(3))
                ctx.enqueue(stream=work.handle)
                driver.call("cuStreamWaitEvent", refill.handle, event.handle, 0)
                fill_bytes(bufs.ptr("x"), bufs.buf["x"].nbytes, 0xFF, refill.handle)  # the next request's bytes
                _sync()
                for name in ("y", "z"):
                    np.testing.assert_array_equal(bufs.get(name), want[name], err_msg=name)
        finally:
            event.close()
            refill.close()
            work.close()
            bufs.close()


def test_two_contexts_sharing_one_scratch_run_one_after_the_other_correctly(plan):
    from polykit.runtime.cuda.memory import DeviceBuffer
    from polykit.runtime.engine import Engine

    with Engine(plan) as engine:
        with engine.create_execution_context() as owned:
            want = {s: owned.execute({"x": _x(s)}) for s in (4, 5)}
        with DeviceBuffer(engine.device_memory_size, what="shared scratch") as scratch:
            a = engine.create_execution_context(device_memory=None)
            b = engine.create_execution_context(device_memory=None)
            for ctx in (a, b):
                ctx.set_device_memory(scratch.ptr, scratch.nbytes)
            for _ in range(3):  # eager, then graph replays, alternating
                for ctx, seed in ((a, 4), (b, 5)):
                    got = ctx.execute({"x": _x(seed)})
                    for name in ("y", "z"):
                        np.testing.assert_array_equal(got[name], want[seed][name], err_msg=name)
            a.close()
            b.close()


class Recording:
    """An allocator hook over cuMemAlloc / cuMemFree that records what it serves."""

    def __init__(self):
        self.allocs, self.frees = [], []

    def alloc(self, size, alignment):
        from polykit.runtime.cuda import driver

        ptr = int(driver.call("cuMemAlloc", size))
        self.allocs.append((ptr, size))
        return ptr

    def free(self, ptr):
        from polykit.runtime.cuda import driver

        driver.call("cuMemFree", ptr)
        self.frees.append(ptr)


def test_the_allocator_sees_every_device_allocation_and_its_free(plan):
    from polykit.runtime.engine import Engine

    hook = Recording()
    with Engine(plan, allocator=hook) as engine:
        assert any(size >= W1.nbytes + W2.nbytes for _, size in hook.allocs)  # the weights
        with engine.create_execution_context() as ctx:
            assert engine.device_memory_size in [size for _, size in hook.allocs]  # the scratch
            got = ctx.execute({"x": _x(6)})
            ctx.execute({"x": _x(6)})  # a graph replay: no new allocation
        with engine.create_execution_context(device_memory=None):
            pass
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        want = ctx.execute({"x": _x(6)})
    for name in ("y", "z"):
        np.testing.assert_array_equal(got[name], want[name])
    assert sorted(hook.frees) == sorted(ptr for ptr, _ in hook.allocs)


def test_a_bound_buffer_of_the_wrong_size_or_alignment_names_the_tensor(plan):
    from polykit.errors import RuntimeInputError
    from polykit.runtime.engine import Engine

    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        bufs = Buffers(engine)
        try:
            bufs.bind(ctx)
            ctx.set_tensor_address("x", bufs.ptr("x") + 4)
            with pytest.raises(RuntimeInputError, match="aligned") as info:
                ctx.enqueue()
            assert info.value.where == "tensor 'x'"
        finally:
            bufs.close()


def test_a_runtime_loads_on_the_device_asked_and_refuses_one_that_does_not_exist(plan):
    from polykit.errors import DeviceError
    from polykit.runtime.cuda import driver
    from polykit.runtime.engine import Engine, Runtime

    with Runtime(device=0).deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute({"x": _x(7)})
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        want = ctx.execute({"x": _x(7)})
    for name in ("y", "z"):
        np.testing.assert_array_equal(got[name], want[name])
    count = driver.call("cuDeviceGetCount")
    with pytest.raises(DeviceError, match="does not exist"):
        Runtime(device=count).deserialize_engine(plan)


def test_bench_runs_with_io_in_place_and_with_copies_on_the_device_asked(tmp_path, capsys):
    import json

    import onnx

    from polykit.tools.cli.app import main

    path = str(tmp_path / "serve.onnx")
    onnx.save(_model(), path)
    fast = ["--warm-up", "0", "--duration", "0", "--iterations", "3", "--json", "--device", "0"]
    for mode in ("--io-in-place", "--io-copies"):
        assert main(["bench", path, "--target", "cuda", "--fp16", *fast, mode]) == 0
        assert json.loads(capsys.readouterr().out)["target"] == "cuda"


def test_nvtx_ranges_come_from_eager_runs_and_the_capture_not_from_replays(plan, monkeypatch):
    from polykit.runtime import engine as engine_module
    from polykit.runtime.engine import Engine

    pushed = []

    class Recorder:
        def push(self, label):
            pushed.append(label.decode())
            return 0

        def pop(self):
            return 0

    monkeypatch.setattr(engine_module, "load_nvtx", lambda: Recorder())
    with Engine(plan) as engine, engine.create_execution_context(cuda_graph=True) as ctx:
        ctx.execute({"x": _x(8)})  # eager
        eager = list(pushed)
        ctx.execute({"x": _x(8)})  # captured, then replayed
        ctx.execute({"x": _x(8)})  # replayed: no host launch, no range
    assert eager == [layer.name for layer in plan.layers]
    assert pushed == eager * 2


def test_outputs_bound_in_place_are_written_within_their_bytes(plan):
    """Bound inside a larger poisoned buffer: a kernel that counted on the arena slot's slack
    past a tensor's last byte would write into the caller's neighbouring memory."""
    from polykit.runtime.cuda.memory import ALIGN, DeviceBuffer, align_up, download, fill_bytes, upload
    from polykit.runtime.engine import Engine

    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        want = ctx.execute({"x": _x(9)})
        sizes = {n: engine.plan.tensors[n].nbytes for n in engine.io_tensors}
        pad = 4 * ALIGN
        starts, offset = {}, 0
        for name, size in sizes.items():  # [pad | tensor | slack to ALIGN | pad] each
            starts[name] = offset + pad
            offset += pad + align_up(size) + pad
        with DeviceBuffer(offset, what="padded bindings") as big:
            fill_bytes(big.ptr, big.nbytes, 0xA5)
            for name in sizes:
                ctx.set_tensor_address(name, big.ptr + starts[name])
            upload(big.ptr + starts["x"], _x(9))
            for _ in range(3):  # copied (new addresses), captured in place, replayed in place
                ctx.enqueue()
            _sync()
            everything = download(big.ptr, (big.nbytes,), np.uint8)
        for name, size in sizes.items():
            start = starts[name]
            assert (everything[start - pad:start] == 0xA5).all(), f"{name}: bytes written before it"
            assert (everything[start + size:start + align_up(size) + pad] == 0xA5).all(), f"{name}: bytes written after it"
        for name in ("y", "z"):
            desc = engine.plan.tensors[name]
            got = everything[starts[name]:starts[name] + desc.nbytes].view(desc.np_dtype).reshape(desc.shape)
            np.testing.assert_array_equal(got, want[name], err_msg=name)


def test_stable_addresses_run_in_place_and_changing_ones_through_copies():
    """In place, the layers write the caller's buffer and not the arena slot of the output: a
    poisoned slot stays poisoned (no slot reuse in this plan, so only y's writer could write
    it). A set of addresses seen once is copied through that slot."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.cuda.memory import download, fill_bytes
    from polykit.runtime.engine import Engine

    plan = build_plan(_model(), BuilderConfig(target="cuda", memory_strategy="none"))

    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        want = ctx.execute({"x": _x(10)})
        desc = engine.plan.tensors["y"]
        slot = ctx._ctx.arena.at(desc.offset)  # (the context's own memory, read for the proof)
        stable = Buffers(engine)
        try:
            stable.bind(ctx)
            stable.put(_x(10))
            for _ in range(3):  # copied, captured in place, replayed in place
                ctx.enqueue()
            _sync()
            fill_bytes(slot, desc.nbytes, 0xA5)
            ctx.enqueue()
            _sync()
            assert (download(slot, (desc.nbytes,), np.uint8) == 0xA5).all(), "in place: the arena slot is not written"
            np.testing.assert_array_equal(stable.get("y"), want["y"])
            fresh = Buffers(engine)  # a new set of addresses: its first run is copied through the slot
            fresh.bind(ctx)
            fresh.put(_x(10))
            ctx.enqueue()
            _sync()
            np.testing.assert_array_equal(download(slot, tuple(desc.shape), desc.np_dtype), want["y"])
            np.testing.assert_array_equal(fresh.get("y"), want["y"])
            fresh.close()
        finally:
            stable.close()
