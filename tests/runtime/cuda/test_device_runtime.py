"""GPU: device memory, launches, streams, events and CUDA graphs of the cuda runtime."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource

pytestmark = pytest.mark.gpu

AXPY = KernelSource("axpy", code='extern "C" __global__ void axpy(float* y, const float* x, float a, long long n) {'
                                ' long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;'
                                ' if (i < n) y[i] = a * x[i] + y[i]; }')


@pytest.fixture
def device():
    from polykit.runtime.cuda import driver

    return driver.current_device()


def test_upload_download_round_trip(device):
    from polykit.runtime.cuda.memory import DeviceBuffer, download, upload

    x = np.random.default_rng(0).standard_normal((7, 13)).astype(np.float32)
    with DeviceBuffer(x.nbytes) as buf:
        upload(buf.ptr, x)
        np.testing.assert_array_equal(download(buf.ptr, x.shape, x.dtype), x)


def test_poison_fill_reads_back_as_nan(device):
    from polykit.runtime.cuda.memory import DeviceBuffer, download, fill_bytes

    with DeviceBuffer(64) as buf:
        fill_bytes(buf.ptr, 64)
        assert np.isnan(download(buf.ptr, (16,), np.float32)).all()


def test_out_of_memory_reports_requested_and_free_bytes(device):
    from polykit.runtime.cuda.memory import DeviceBuffer

    with pytest.raises(DeviceError) as info:
        DeviceBuffer(1 << 52, what="huge test buffer")
    assert str(1 << 52) in str(info.value) and "free" in str(info.value)


def _axpy_once(stream_handle, modules, y, x, n):
    from polykit.runtime.cuda.launcher import CudaLauncher

    launcher = CudaLauncher(modules, stream_handle, lambda nbytes: 0, "axpy-layer")
    launcher.launch(AXPY, ((n + 127) // 128,), (128,),
                    [DeviceTensor(y, (n,), np.dtype(np.float32)), DeviceTensor(x, (n,), np.dtype(np.float32)),
                     np.float32(2.0), n])


def test_launch_graph_capture_and_replay(device):
    from polykit.runtime.cuda.launcher import KernelModules
    from polykit.runtime.cuda.memory import DeviceBuffer, download, upload
    from polykit.runtime.cuda.stream import CudaGraph, Event, Stream

    n = 1000
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    y = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    modules = KernelModules(device.arch)
    modules.load([AXPY])
    stream = Stream()
    try:
        with DeviceBuffer(x.nbytes) as bx, DeviceBuffer(y.nbytes) as by:
            upload(bx.ptr, x)
            upload(by.ptr, y)
            _axpy_once(stream.handle, modules, by.ptr, bx.ptr, n)
            graph = CudaGraph(stream, lambda s: _axpy_once(s.handle, modules, by.ptr, bx.ptr, n))
            start, end = Event(), Event()
            start.record(stream)
            graph.launch(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            assert end.elapsed_ms(start) >= 0.0
            np.testing.assert_allclose(download(by.ptr, (n,), np.float32), y + 3 * 2.0 * x, rtol=1e-6, atol=1e-6)
            graph.close()
            start.close()
            end.close()
    finally:
        stream.close()
        modules.close()


def test_launching_an_undeclared_kernel_is_an_error(device):
    from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules

    launcher = CudaLauncher(KernelModules(device.arch), 0, lambda n: 0, "layer-x")
    with pytest.raises(DeviceError, match="not declared"):
        launcher.launch(AXPY, (1,), (32,), [0, 0, np.float32(1.0), 1])


def test_run_layer_poisons_outputs_and_returns_them(device):
    from polykit.compiler.plan.records import LayerDesc
    from polykit.runtime.cuda.harness import run_layer

    layer = LayerDesc("mm", "MatMul", ("A", "B"), ("Y",))
    a = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    b = np.random.default_rng(4).standard_normal((5, 6)).astype(np.float32)
    out = run_layer(layer, {"A": a, "B": b}, tactic="cuda.gemm.simt")
    np.testing.assert_allclose(out["Y"], a @ b, rtol=1e-5, atol=1e-5)
