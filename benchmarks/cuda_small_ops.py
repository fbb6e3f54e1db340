"""ResNet-50's (and BERT's) non-convolution layers at their model shapes, each tactic against the torch
equivalent in the same run: `PYTHONPATH=. python3 benchmarks/cuda_small_ops.py [--reps N]`.

polykit: CUDA-graph replays of 20 enqueues of the layer (CUDA events, median over reps), so launch
gaps do not count; torch: 20 calls between CUDA events (median over reps), its own kernels. GB/s
counts the bytes each op must read and write once (inputs + outputs)."""
from __future__ import annotations

import argparse

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.harness import infer_output_specs, resolve_tactic
from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules
from polykit.runtime.cuda.memory import DeviceBuffer, upload
from polykit.runtime.cuda.stream import CudaGraph, Event, Stream

REPEAT = 20
rng = np.random.default_rng(0)


def median_ms(run, stream, reps: int) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(reps):
        a, b = Event(), Event()
        a.record(stream)
        run()
        b.record(stream)
        b.synchronize()
        times.append(b.elapsed_ms(a))
    return float(np.median(times))


def polykit_us(layer: LayerDesc, feeds: dict, tactic: str, stream, reps: int) -> tuple[float, int]:
    """(microseconds per layer run, bytes in + out)."""
    chosen = resolve_tactic(layer, tactic)
    modules = KernelModules(driver.current_device().arch)
    modules.load(chosen.kernels(layer))
    bufs, tensors, nbytes = [], {}, 0
    specs = {n: (tuple(s), np.dtype(d)) for n, (s, d) in infer_output_specs(layer, feeds).items()}
    arrays = {n: np.ascontiguousarray(a) for n, a in feeds.items()}
    for name, (shape, dtype) in [(n, (a.shape, a.dtype)) for n, a in arrays.items()] + list(specs.items()):
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buf = DeviceBuffer(max(size, 1))
        bufs.append(buf)
        if name in arrays:
            upload(buf.ptr, arrays[name])
        tensors[name] = DeviceTensor(buf.ptr, tuple(shape), dtype)
        nbytes += size
    launcher = CudaLauncher(modules, stream.handle, lambda n: 0, layer.name)
    graph = CudaGraph(stream, lambda s: [chosen.enqueue(layer, launcher, tensors) for _ in range(REPEAT)])
    try:
        return median_ms(lambda: graph.launch(stream), stream, reps) / REPEAT * 1e3, nbytes
    finally:
        graph.close()
        for buf in bufs:
            buf.free()
        modules.close()


def torch_us(fn, reps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    from benchmarks.cuda_timing import time_cuda_queued

    return time_cuda_queued(fn, torch, 3, reps, REPEAT) * 1e3


def stamped(kind, feeds, attrs, domain="", precision="fp32"):
    layer = LayerDesc(kind.lower(), kind, tuple(feeds), ("Y",), attrs, domain=domain, precision=precision)
    (shape, dtype), = infer_output_specs(layer, feeds).values()
    return LayerDesc(layer.name, kind, tuple(feeds), ("Y",), attrs, domain=domain, precision=precision,
                     in_dtypes=tuple(np.asarray(a).dtype.name for a in feeds.values()),
                     in_shapes=tuple(np.shape(a) for a in feeds.values()), out_dtypes=(np.dtype(dtype).name,),
                     out_shapes=(tuple(shape),))


def cases():
    """(label, layer, feeds, tactics, torch op factory taking the torch module)."""
    half = lambda *s: rng.standard_normal(s).astype(np.float16)
    pool_x = half(32, 112, 112, 64)
    pool_attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    gap = {"X": half(32, 7, 7, 2048), "axes": np.array([1, 2], np.int64)}
    rows = {"X": half(8, 128, 768), "axes": np.array([-1], np.int64)}
    rows32 = {"X": rng.standard_normal((8, 128, 768)).astype(np.float32), "axes": np.array([-1], np.int64)}
    stem = {"X": half(32, 224, 224, 3), "pads": np.array([0, 0, 0, 0, 0, 0, 0, 5], np.int64)}
    stem8 = {"X": rng.integers(-128, 128, (32, 224, 224, 3)).astype(np.int8),
             "pads": np.array([0, 0, 0, 0, 0, 0, 0, 13], np.int64)}
    nchw = {"X": half(32, 3, 224, 224)}
    int8_pool = {"X": rng.integers(-128, 128, (32, 112, 112, 64)).astype(np.int8)}
    return [
        ("GlobalAveragePool NHWC fp16 (32,7,7,2048)", stamped("ReduceMean", gap, {"keepdims": 1}, precision="fp16"),
         gap, ["cuda.reduce", "cuda.reduce.span"], lambda t, x: lambda: x.mean(dim=(1, 2), keepdim=True)),
        ("ReduceMean last axis fp16 (8,128,768)", stamped("ReduceMean", rows, {"keepdims": 1}, precision="fp16"),
         rows, ["cuda.reduce", "cuda.reduce.span"], lambda t, x: lambda: x.mean(dim=-1, keepdim=True)),
        ("ReduceSum last axis fp32 (8,128,768) keepdims 0", stamped("ReduceSum", rows32, {"keepdims": 0}),
         rows32, ["cuda.reduce", "cuda.reduce.span"], lambda t, x: lambda: x.sum(dim=-1)),
        ("Pad channels fp16 (32,224,224,3)->8", stamped("Pad", stem, {"mode": "constant"}), stem,
         ["cuda.movement.pad", "cuda.movement.pad_last"],
         lambda t, x: lambda: t.nn.functional.pad(x, (0, 5))),
        ("Pad channels int8 (32,224,224,3)->16", stamped("Pad", stem8, {"mode": "constant"}), stem8,
         ["cuda.movement.pad", "cuda.movement.pad_last"],
         lambda t, x: lambda: t.nn.functional.pad(x, (0, 13))),
        ("Transpose to NHWC fp16 (32,3,224,224)", stamped("Transpose", nchw, {"perm": [0, 2, 3, 1]}), nchw,
         ["cuda.movement.strided", "cuda.movement.to_nhwc"],
         lambda t, x: lambda: x.permute(0, 2, 3, 1).contiguous()),
        ("MaxPool 3x3 s2 NHWC fp16 (32,112,112,64)",
         stamped("MaxPoolNHWC", {"X": pool_x}, pool_attrs, domain=POLYKIT_DOMAIN), {"X": pool_x},
         ["cuda.pool_nhwc.window"],
         lambda t, x: (lambda xc: lambda: t.nn.functional.max_pool2d(xc, 3, 2, 1))(
             x.permute(0, 3, 1, 2))),  # an NCHW view of NHWC memory: channels_last for torch
        ("MaxPool 3x3 s2 NHWC int8 (32,112,112,64)",
         stamped("MaxPoolNHWC", int8_pool, pool_attrs, domain=POLYKIT_DOMAIN), int8_pool,
         ["cuda.pool_nhwc.window"], None),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    info = driver.current_device()
    print(f"device {info.name} ({info.arch}); us per layer, median of {args.reps} x {REPEAT}")
    stream = Stream()
    try:
        import torch
    except ImportError:
        torch = None
    for label, layer, feeds, tactics, torch_op in cases():
        cells = []
        for tactic in tactics:
            us, nbytes = polykit_us(layer, feeds, tactic, stream, args.reps)
            cells.append(f"{tactic} {us:7.1f} us ({nbytes / us / 1e3:5.0f} GB/s)")
        if torch is not None and torch_op is not None:
            x = torch.from_numpy(feeds["X"]).cuda()
            cells.append(f"torch {torch_us(torch_op(torch, x), args.reps):7.1f} us")
        print(f"{label:48s} " + " | ".join(cells))
    stream.close()


if __name__ == "__main__":
    main()
