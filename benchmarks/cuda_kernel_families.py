"""Achieved bandwidth of the memory-bound CUDA kernel families (pointwise, softmax, norm, reduce,
movement, gather, attention) on the device: `PYTHONPATH=. python3 benchmarks/cuda_kernel_families.py`.
Kernel time = CUDA-graph replays of 20 enqueues; numbers are recorded in docs/CUDA_KERNELS.md.

`--quantize-nhwc NB,C,H,W,CP` times only an --int8 plan's input layer (QuantizeNHWC, float32 NCHW
to int8 NHWC padded to CP channels; ResNet-50 bs32: 32,3,224,224,16).
`--int8-conv NB,H,W,C,N,K [--tactic NAME]` times only one INT8 convolution as an --int8 ResNet
runs it (QConvNHWC, symmetric int8 X and W, per-channel scale and bias, an int8 residual
dequantized in the epilogue, Relu, int8 output; K x K kernel, stride 1, same padding), e.g. for
ncu: `ncu --kernel-name conv_sm90 --launch-skip 3 --launch-count 1 python3
benchmarks/cuda_kernel_families.py --int8-conv 32,56,56,64,256,1 --tactic cuda.int8.sm90_128x128`."""
import argparse

import numpy as np
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.int8.int8 import RESIDUALS
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

def bench(name, layer, feeds, nbytes_fn=None, tactic=None):
    t = resolve_tactic(layer, tactic); mods = KernelModules(info.arch); mods.load(t.kernels(layer))
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

def int8_conv(nb, h, w, c, n, k):
    """(layer, feeds) of an --int8 ResNet bottleneck's last conv: int8 residual + Relu, int8 out."""
    i8 = lambda *s: rng.integers(-128, 128, s).astype(np.int8)
    feeds = {"X": i8(nb, h, w, c), "XZ": np.int8(0), "W": i8(n, k, k, c), "WZ": np.zeros(n, np.int8),
             "S": rng.uniform(1e-4, 2e-3, n).astype(np.float32), "B": rng.standard_normal(n).astype(np.float32),
             "YS": np.float32(0.1), "YZ": np.int8(0), "skip": i8(nb, h, w, n), "skip_scale": np.float32(0.037)}
    body = [dict(step, outputs=["Y"]) if i == len(RESIDUALS["int8"]) - 1 else step
            for i, step in enumerate(RESIDUALS["int8"])]
    attrs = {"kernel_shape": [k, k], "pads": [k // 2] * 4, "symmetric": 1, "epilogue": {"input": "raw", "body": body}}
    layer = LayerDesc("qconv", "QConvNHWC", tuple(feeds), ("Y",), attrs, domain=POLYKIT_DOMAIN, precision="int8",
                      in_dtypes=tuple(np.asarray(a).dtype.name for a in feeds.values()),
                      in_shapes=tuple(np.shape(a) for a in feeds.values()), out_dtypes=("int8",),
                      out_shapes=((nb, h, w, n),))
    return layer, feeds


def main():
    global info, stream
    parser = argparse.ArgumentParser()
    parser.add_argument("--int8-conv", default="", metavar="NB,H,W,C,N,K", help="time only this INT8 convolution")
    parser.add_argument("--tactic", default=None, help="the tactic --int8-conv runs (default: the first eligible)")
    parser.add_argument("--quantize-nhwc", default="", metavar="NB,C,H,W,CP",
                        help="time only QuantizeNHWC of a float32 NB x C x H x W image to int8 NHWC with CP channels")
    args = parser.parse_args()
    info = driver.current_device()
    stream = Stream()
    if args.int8_conv:
        nb, h, w, c, n, k = (int(v) for v in args.int8_conv.split(","))
        layer, feeds = int8_conv(nb, h, w, c, n, k)
        macs = nb * h * w * n * k * k * c
        print(f"int8 conv {args.int8_conv} ({args.tactic or 'default tactic'}): {2 * macs / 1e9:.2f} GOP")
        bench(f"QConvNHWC {args.int8_conv}", layer, feeds, tactic=args.tactic)
        return
    if args.quantize_nhwc:
        nb, c, h, w, cp = (int(v) for v in args.quantize_nhwc.split(","))
        feeds = {"X": rng.standard_normal((nb, c, h, w)).astype(np.float32), "S": np.float32(0.02), "Z": np.int8(0)}
        layer = LayerDesc("q", "QuantizeNHWC", tuple(feeds), ("Y",), {"channels": cp}, domain=POLYKIT_DOMAIN)
        bench(f"QuantizeNHWC {args.quantize_nhwc}", layer, feeds)
        return
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
