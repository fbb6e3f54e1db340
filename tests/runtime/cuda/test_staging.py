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


#: one thread sleeps until *gate is nonzero, or `ns` have passed (only a gate never opened: an
#: enqueue that waited for the stream returns then, and the check below fails instead of hanging)
GATE = r"""
typedef unsigned long long u64;
extern "C" __global__ void hold_until_opened(const volatile unsigned* gate, u64 ns) {
  u64 t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (*gate == 0 && t - t0 < ns);
}
"""


def test_a_dynamic_plan_enqueue_does_not_wait_for_the_stream():
    """Behind a kernel that holds the stream until the test opens its gate (from another stream,
    after enqueue returned), a replayed dynamic-shape enqueue returns and the stream is still
    busy: it did not wait for the stream (before staging, the pageable copies of the shape values
    waited for it to drain). No clock decides: a waiting enqueue would only return once the
    gate's 60 s bound passed, leaving the stream idle."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.kernels.cuda.base import KernelSource
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher
    from polykit.runtime.cuda.memory import DeviceBuffer, download, fill_bytes, upload
    from polykit.runtime.cuda.stream import Stream
    from polykit.runtime.engine import Runtime
    from tests.runtime.test_dynamic_shapes import CASES

    hold = KernelSource("hold_until_opened", code=GATE)
    make, profile, shapes, feeds_of = CASES["encoder"]
    plan = build_plan(make(), BuilderConfig(target="cuda", profiles=[profile]))
    feeds = feeds_of(np.random.default_rng(0), *shapes[2])
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        assert any(t.value for t in engine.plan.tensors.values()), "the case must have host-computed shape values"
        stream, opener, bufs = Stream(), Stream(), {}
        for name, value in feeds.items():
            ctx.set_input_shape(name, value.shape)
            bufs[name] = DeviceBuffer(value.nbytes)
            upload(bufs[name].ptr, value)
        out = engine.plan.outputs[0]
        out_shape = ctx.get_tensor_shape(out)
        bufs[out] = DeviceBuffer(int(np.prod(out_shape)) * engine.get_tensor_dtype(out).itemsize)
        gate = DeviceBuffer(4)
        ptrs = {n: b.ptr for n, b in bufs.items()}
        expected = ctx.execute(feeds)[out]
        engine_modules = ctx._ctx.engine.modules
        engine_modules.load([hold])
        for run in range(4):  # eager and capture (which may wait for the stream), then replays
            if run >= 2:
                fill_bytes(gate.ptr, 4, 0)  # closed (finished on return; the stream is idle)
                CudaLauncher(engine_modules, stream.handle, lambda n: 0, "hold").launch(
                    hold, (1,), (1,), [gate.ptr, 60_000_000_000])
            ctx.enqueue(ptrs, stream.handle)
            busy, = driver.drv().cuStreamQuery(stream.handle)
            if run >= 2:
                fill_bytes(gate.ptr, 4, 1, opener.handle)  # open: the hold ends, the layers run
                opener.synchronize()
                assert int(busy) == int(driver.drv().CUresult.CUDA_ERROR_NOT_READY), \
                    "the stream was idle when enqueue returned: enqueue waited for the stream"
            stream.synchronize()
            np.testing.assert_array_equal(download(bufs[out].ptr, out_shape, engine.get_tensor_dtype(out)), expected)
        for b in (*bufs.values(), gate):
            b.free()
        stream.close()
        opener.close()
