"""GPU: shape-tensor values go to their device region in one copy from pinned blocks staged once
per shape set (polykit.runtime.cuda.staging); the copy is asynchronous, so enqueue does not wait
for the GPU, and an evicted block is freed only after its copies finished."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_staged_values_reach_the_region_for_every_key_past_the_cache_bound():
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.memory import download
    from polykit.runtime.cuda.staging import MAX_STAGED, StagedValues
    from polykit.runtime.cuda.stream import Stream

    driver.current_device(0)
    staged, stream = StagedValues({"a": 0, "b": 48}, 64), Stream()
    try:
        for round_ in range(2):  # the second round re-stages keys evicted in the first
            for k in range(MAX_STAGED + 3):
                values = {"a": np.arange(k, k + 5, dtype=np.int64), "b": np.full(3, -k - round_, dtype=np.float32)}
                staged.copy(("shape", k), values, stream.handle)
                stream.synchronize()
                np.testing.assert_array_equal(download(staged.pointer("a"), (5,), np.int64), values["a"])
                np.testing.assert_array_equal(download(staged.pointer("b"), (3,), np.float32), values["b"])
        assert len(staged._blocks) == MAX_STAGED
    finally:
        staged.free()
        stream.close()


def test_a_dynamic_plan_enqueue_does_not_wait_for_the_stream():
    """Behind a 1 s hold kernel on the stream, a replayed dynamic-shape enqueue returns while
    the hold still runs: before staging, the pageable copies of the shape
    values waited for the stream to drain."""
    import time

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.kernels.cuda.hold import HOLD
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher
    from polykit.runtime.cuda.memory import DeviceBuffer, download, upload
    from polykit.runtime.cuda.stream import Stream
    from polykit.runtime.engine import Runtime
    from tests.runtime.test_dynamic_shapes import CASES

    make, profile, shapes, feeds_of = CASES["encoder"]
    plan = build_plan(make(), BuilderConfig(target="cuda", profiles=[profile]))
    feeds = feeds_of(np.random.default_rng(0), *shapes[2])
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        assert any(t.value for t in engine.plan.tensors.values()), "the case must have host-computed shape values"
        stream, bufs = Stream(), {}
        for name, value in feeds.items():
            ctx.set_input_shape(name, value.shape)
            bufs[name] = DeviceBuffer(value.nbytes)
            upload(bufs[name].ptr, value)
        out = engine.plan.outputs[0]
        out_shape = ctx.get_tensor_shape(out)
        bufs[out] = DeviceBuffer(int(np.prod(out_shape)) * engine.get_tensor_dtype(out).itemsize)
        ptrs = {n: b.ptr for n, b in bufs.items()}
        expected = ctx.execute(feeds)[out]
        engine_modules = ctx._ctx.engine.modules
        engine_modules.load([HOLD])
        for run in range(4):  # eager, capture, replays
            CudaLauncher(engine_modules, stream.handle, lambda n: 0, "hold").launch(HOLD, (1,), (1,), [1_000_000_000])
            start = time.perf_counter()
            ctx.enqueue(ptrs, stream.handle)
            host_s = time.perf_counter() - start
            busy, = driver.drv().cuStreamQuery(stream.handle)
            assert run < 2 or (int(busy) == int(driver.drv().CUresult.CUDA_ERROR_NOT_READY) and host_s < 0.5), \
                f"enqueue took {host_s:.3f} s behind a 1 s hold: it waited for the stream"
            stream.synchronize()
            np.testing.assert_array_equal(download(bufs[out].ptr, out_shape, engine.get_tensor_dtype(out)), expected)
        for b in bufs.values():
            b.free()
        stream.close()
