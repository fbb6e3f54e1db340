"""Achieved bandwidth of the memory-bound CUDA kernel families (pointwise, softmax, norm, reduce,
movement, gather, attention) on the device: `PYTHONPATH=. python3 benchmarks/cuda_kernel_families.py`.
Kernel time = CUDA-graph replays of 20 enqueues; numbers are recorded in docs/CUDA_KERNELS.md."""
import numpy as np
from polykit.compiler.plan_records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.harness import resolve_tactic, infer_output_specs
from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules
from polykit.runtime.cuda.memory import DeviceBuffer, upload, copy_device
from polykit.runtime.cuda.stream import Stream, Event, CudaGraph

rng = np.random.default_rng(0)

def timed(fn, reps=30):
    for _ in range(3): fn()
    ts = []
    for _ in range(reps):
        a, b = Event(), Event(); a.record(stream); fn(); b.record(stream); b.synchronize(); ts.append(b.elapsed_ms(a))
    return float(np.median(ts))

def bench(name, layer, feeds, nbytes_fn=None):
    t = resolve_tactic(layer); mods = KernelModules(info.arch); mods.load(t.kernels(layer))
    specs = infer_output_specs(layer, feeds); bufs = []; tens = {}
    for n, a in feeds.items():
        b = DeviceBuffer(a.nbytes); upload(b.ptr, np.ascontiguousarray(a)); bufs.append(b); tens[n] = DeviceTensor(b.ptr, a.shape, a.dtype)
    for n, (s, d) in specs.items():
        nb = int(np.prod(s)) * np.dtype(d).itemsize; b = DeviceBuffer(max(nb, 1)); bufs.append(b); tens[n] = DeviceTensor(b.ptr, s, np.dtype(d))
    L = CudaLauncher(mods, stream.handle, lambda n: 0, layer.name)
    host = timed(lambda: t.enqueue(layer, L, tens), reps=10)
    g = CudaGraph(stream, lambda s_: [t.enqueue(layer, L, tens) for _ in range(20)])
    ms = timed(lambda: g.launch(stream), reps=10) / 20
    g.close()
    nbytes = sum(a.nbytes for a in feeds.values()) + sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in specs.values())
    print(f"{name:36s} {ms*1e3:8.1f} us {nbytes/1e6:7.1f} MB {nbytes/ms/1e6:6.0f} GB/s  (eager enqueue {host*1e3:7.1f} us)")
    for b in bufs: b.free()

def main():
    global info, stream
    info = driver.current_device()
    stream = Stream()
    n = 1 << 24
    a = DeviceBuffer(4 * n); b = DeviceBuffer(4 * n)
    ms = timed(lambda: copy_device(b.ptr, a.ptr, 4 * n, stream.handle))
    print(f"{'cuMemcpyDtoD 64MB (ceiling)':34s} {ms*1e3:9.1f} us  {8*n/1e6:8.1f} MB  {8*n/ms/1e6:7.0f} GB/s")
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
    bench("Add fp32 16M (vector path)", LayerDesc("a", "Add", ("A", "B"), ("Y",)), {"A": f32(n), "B": f32(n)})
    bench("Add fp32 4096x4096 + [4096] (bcast)", LayerDesc("a", "Add", ("A", "B"), ("Y",)), {"A": f32(4096, 4095), "B": f32(4095)})
    bench("Gelu fp16 16M", LayerDesc("g", "Gelu", ("A",), ("Y",), precision="fp16"), {"A": f32(n).astype(np.float16)})
    bench("Softmax fp32 (12288,128) row", LayerDesc("s", "Softmax", ("X",), ("Y",), {"axis": -1}), {"X": f32(12288, 128)})
    bench("LayerNorm fp32 (16384,768)", LayerDesc("l", "LayerNormalization", ("X", "S", "B"), ("Y",), {"axis": -1}), {"X": f32(16384, 768), "S": f32(768), "B": f32(768)})
    bench("ReduceSum fp32 (4096,4096) last", LayerDesc("r", "ReduceSum", ("X", "ax"), ("Y",)), {"X": f32(4096, 4096), "ax": np.array([1])})
    bench("ReduceSum fp32 (4096,4096) first", LayerDesc("r", "ReduceSum", ("X", "ax"), ("Y",)), {"X": f32(4096, 4096), "ax": np.array([0])})
    bench("Transpose fp32 (64,512,512) 021", LayerDesc("t", "Transpose", ("X",), ("Y",), {"perm": [0, 2, 1]}), {"X": f32(64, 512, 512)})
    bench("Transpose fp32 (8,128,12,64) 0213", LayerDesc("t", "Transpose", ("X",), ("Y",), {"perm": [0, 2, 1, 3]}), {"X": f32(8, 128, 12, 64)})
    bench("Gather fp32 (30522,768)[8,128]", LayerDesc("g", "Gather", ("D", "I"), ("Y",)), {"D": f32(30522, 768), "I": rng.integers(0, 30522, (8, 128))})
    bench("Attention fp32 (8,12,128,64)", LayerDesc("at", "Attention", ("Q", "K", "V"), ("Y",), domain="ai.polykit"), {"Q": f32(8, 12, 128, 64), "K": f32(8, 12, 128, 64), "V": f32(8, 12, 128, 64)})


if __name__ == '__main__':
    main()
