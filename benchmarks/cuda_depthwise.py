"""Depthwise convolutions of ConvNeXt-Tiny, EfficientNet-B0 and MobileNetV3-Large and grouped
convolutions of ResNeXt-50 32x4d, RegNetY-800MF and RegNetX-1.6GF, layer by layer.

    PYTHONPATH=. python3 benchmarks/cuda_depthwise.py [--models convnext,efficientnet,mobilenet]
        [--batch 32] [--dtype fp16] [--iters 20] [--out depthwise.json]
    PYTHONPATH=. python3 benchmarks/cuda_depthwise.py --models resnext50,regnet_y_800mf,regnet_x_1_6gf
    PYTHONPATH=. python3 benchmarks/cuda_depthwise.py --models efficientnet_v2_s,convnext,mobilenet --no-direct --silu

For every distinct depthwise or grouped layer of the models (224x224 inputs, EfficientNet-V2-S's 384x384
as the zoo runs it; torchvision's pads k // 2) it times, on random data of the layer's shapes: polykit's NHWC tactics for it
(cuda.conv_nhwc.depthwise_p8 / _p4, or cuda.conv_nhwc.grouped_p4 / _p2 with several channels a
group, and cuda.conv_nhwc.grouped_mma_p32 / grouped_mma_pipe_p32 with multiples of 8 a group in
fp16 / bf16, printed last on the row; bias included), the NCHW `cuda.conv.direct` they replace, and torch's cuDNN
(torch.nn.functional.conv2d with its groups on channels_last tensors, bias included).
Each is timed as the engine runs it: three calls (inputs rotated over three buffer sets so L2 does
not hold them) captured in a CUDA graph, the replay timed with CUDA events, the median of --iters
replays divided by 3. --silu fuses a SiLU epilogue into polykit's NHWC layers (as the models' plans do
after a depthwise conv + BatchNorm; torch's side stays conv2d + bias, as in benchmarks/cuda_kernels.py's
"+epi" rows) and checks them against silu(conv2d). Each polykit output is checked against torch's (relative error; WRONG past
5e-3 in fp16). Bytes per layer: input + output + weights + bias once each; the floor is the larger
of bytes at HBM_TBPS and the FMAs at the fp32 FMA rate (the kernels accumulate in fp32). Prints a
table (us, achieved GB/s of the best polykit tactic and its share of HBM_TBPS) and each model's
totals weighted by how many layers share a shape; writes JSON with date, device, commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks import provenance  # noqa: E402
from cuda_gemm import time_graph  # noqa: E402

#: the H200's HBM3e bandwidth (datasheet) and fp32 FMA rate (132 SMs x 128 lanes x 1.98 GHz)
HBM_TBPS = 4.8
FP32_FMA_PER_S = 132 * 128 * 1.98e9


@dataclass(frozen=True)
class DwLayer:
    """A depthwise (cpg 1) or grouped conv: input channels and size, kernel, stride (pads k // 2),
    input channels a group; as many output channels as input ones."""

    c: int
    size: int
    k: int
    stride: int
    cpg: int = 1

    @property
    def out(self) -> int:
        return (self.size + 2 * (self.k // 2) - self.k) // self.stride + 1

    @property
    def groups(self) -> int:
        return self.c // self.cpg

    def tactics(self, dtype: str) -> tuple[str, ...]:
        """The NHWC tactics to time: depthwise p8 / p4, or grouped p4 / p2 and, with multiples of 8
        channels a group in 16-bit storage, the tensor-core grouped_mma and grouped_mma_pipe."""
        if self.cpg == 1:
            return TACTICS
        return GROUPED + (MMA if self.cpg % 8 == 0 and dtype != "fp32" else ())

    def label(self) -> str:
        return f"{self.k}x{self.k}/{self.stride} C{self.c}{'/' + str(self.cpg) if self.cpg > 1 else ''} " \
               f"{self.size}->{self.out}"


#: (layer, how many the model has)
MODELS = {
    "convnext": [(DwLayer(96, 56, 7, 1), 3), (DwLayer(192, 28, 7, 1), 3), (DwLayer(384, 14, 7, 1), 9),
                 (DwLayer(768, 7, 7, 1), 3)],
    "efficientnet": [(DwLayer(32, 112, 3, 1), 1), (DwLayer(96, 112, 3, 2), 1), (DwLayer(144, 56, 3, 1), 1),
                     (DwLayer(144, 56, 5, 2), 1), (DwLayer(240, 28, 5, 1), 1), (DwLayer(240, 28, 3, 2), 1),
                     (DwLayer(480, 14, 3, 1), 2), (DwLayer(480, 14, 5, 1), 1), (DwLayer(672, 14, 5, 1), 2),
                     (DwLayer(672, 14, 5, 2), 1), (DwLayer(1152, 7, 5, 1), 3), (DwLayer(1152, 7, 3, 1), 1)],
    "mobilenet": [(DwLayer(16, 112, 3, 1), 1), (DwLayer(64, 112, 3, 2), 1), (DwLayer(72, 56, 3, 1), 1),
                  (DwLayer(72, 56, 5, 2), 1), (DwLayer(120, 28, 5, 1), 2), (DwLayer(240, 28, 3, 2), 1),
                  (DwLayer(200, 14, 3, 1), 1), (DwLayer(184, 14, 3, 1), 2), (DwLayer(480, 14, 3, 1), 1),
                  (DwLayer(672, 14, 3, 1), 1), (DwLayer(672, 14, 5, 2), 1), (DwLayer(960, 7, 5, 1), 2)],
    # at 384x384 (the zoo's size): docs/ZOO.md's per-layer table
    "efficientnet_v2_s": [(DwLayer(256, 48, 3, 2), 1), (DwLayer(512, 24, 3, 1), 5), (DwLayer(768, 24, 3, 1), 1),
                          (DwLayer(960, 24, 3, 1), 8), (DwLayer(960, 24, 3, 2), 1), (DwLayer(1536, 12, 3, 1), 14)],
    # grouped (C / cpg groups), the 3x3 convs of each stage; stride 2 in a stage's first block
    "resnext50": [(DwLayer(128, 56, 3, 1, 4), 3), (DwLayer(256, 56, 3, 2, 8), 1), (DwLayer(256, 28, 3, 1, 8), 3),
                  (DwLayer(512, 28, 3, 2, 16), 1), (DwLayer(512, 14, 3, 1, 16), 5),
                  (DwLayer(1024, 14, 3, 2, 32), 1), (DwLayer(1024, 7, 3, 1, 32), 2)],
    "regnet_y_800mf": [(DwLayer(64, 112, 3, 2, 16), 1), (DwLayer(144, 56, 3, 2, 16), 1),
                       (DwLayer(144, 28, 3, 1, 16), 2), (DwLayer(320, 28, 3, 2, 16), 1),
                       (DwLayer(320, 14, 3, 1, 16), 7), (DwLayer(784, 14, 3, 2, 16), 1),
                       (DwLayer(784, 7, 3, 1, 16), 1)],
    "regnet_x_1_6gf": [(DwLayer(72, 112, 3, 2, 24), 1), (DwLayer(72, 56, 3, 1, 24), 1),
                       (DwLayer(168, 56, 3, 2, 24), 1), (DwLayer(168, 28, 3, 1, 24), 3),
                       (DwLayer(408, 28, 3, 2, 24), 1), (DwLayer(408, 14, 3, 1, 24), 9),
                       (DwLayer(912, 14, 3, 2, 24), 1), (DwLayer(912, 7, 3, 1, 24), 1)],
}
TACTICS = ("cuda.conv_nhwc.depthwise_p8", "cuda.conv_nhwc.depthwise_p4")
GROUPED = ("cuda.conv_nhwc.grouped_p4", "cuda.conv_nhwc.grouped_p2")
MMA = ("cuda.conv_nhwc.grouped_mma_p32", "cuda.conv_nhwc.grouped_mma_pipe_p32")
DIRECT = "cuda.conv.direct"
WRONG = {"fp16": 5e-3, "bf16": 2e-2, "fp32": 1e-4}


def layer_bytes(d: DwLayer, batch: int, itemsize: int) -> int:
    return (batch * d.c * (d.size ** 2 + d.out ** 2) + d.c * (d.k * d.k * d.cpg + 1)) * itemsize


def layer_fmas(d: DwLayer, batch: int) -> int:
    return batch * d.c * d.out ** 2 * d.k * d.k * d.cpg


class Polykit:
    """Runs one polykit tactic on torch tensors (the kernel's modules loaded once)."""

    def __init__(self, layer, tactic_name: str, torch):
        from polykit.kernels.tactics import find_tactic
        from polykit.runtime.cuda import driver
        from polykit.runtime.cuda.launcher import KernelModules

        self.torch, self.layer = torch, layer
        self.info = driver.current_device()
        self.tactic = find_tactic("cuda", layer.kind, tactic_name)
        if self.tactic is None or not self.tactic.supports(layer):
            raise RuntimeError(f"{tactic_name} does not take {layer.kind} {layer.in_shapes}")
        self.modules = KernelModules(self.info.arch)
        self.modules.load(self.tactic.kernels(layer))
        self.keep: list = []

    def run(self, tensors) -> None:
        from polykit.runtime.cuda import driver
        from polykit.runtime.cuda.launcher import CudaLauncher

        def take(nbytes: int) -> int:
            self.keep.append(self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda"))
            return self.keep[-1].data_ptr()

        stream = driver.drv().CUstream(self.torch.cuda.current_stream().cuda_stream)
        self.tactic.enqueue(self.layer, CudaLauncher(self.modules, stream, take, self.layer.name,
                                                     sm_count=self.info.sm_count), tensors)

    def close(self) -> None:
        self.torch.cuda.synchronize()
        self.modules.close()


def device_tensor(t, storage, shape=None):
    """A DeviceTensor over torch tensor `t`'s memory, of `shape` (default: t's; a channels_last
    tensor's NHWC bytes are (N, H, W, C))."""
    from polykit.kernels.cuda.base import DeviceTensor

    return DeviceTensor(t.data_ptr(), tuple(shape or t.shape), storage)


#: the fused epilogue of --silu: y = raw * sigmoid(raw)
SILU = {"input": "raw", "body": [{"op": "Sigmoid", "inputs": ["raw"], "outputs": ["s"], "attrs": {}},
                                 {"op": "Mul", "inputs": ["raw", "s"], "outputs": ["Y"], "attrs": {}}]}


def layer_descs(d: DwLayer, batch: int, storage: str, precision: str, silu: bool = False):
    """(the ConvNHWC layer the NHWC tactics run, with the SiLU epilogue when `silu`, the NCHW Conv layer
    cuda.conv.direct runs)."""
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN
    from polykit.compiler.plan.records import LayerDesc

    n, c, h, o, k, g = batch, d.c, d.size, d.out, d.k, d.cpg
    attrs = {"group": d.groups, "kernel_shape": [k, k], "strides": [d.stride] * 2, "pads": [k // 2] * 4}
    nhwc = LayerDesc("dw", "ConvNHWC", ("X", "W", "B"), ("Y",), dict(attrs, epilogue=SILU) if silu else attrs,
                     domain=POLYKIT_DOMAIN, precision=precision,
                     in_dtypes=(storage,) * 3, out_dtypes=(storage,), in_shapes=((n, h, h, c), (c, k, k, g), (c,)),
                     out_shapes=((n, o, o, c),))
    nchw = LayerDesc("dw", "Conv", ("X", "W", "B"), ("Y",), attrs, precision=precision, in_dtypes=(storage,) * 3,
                     out_dtypes=(storage,), in_shapes=((n, c, h, h), (c, g, k, k), (c,)), out_shapes=((n, c, o, o),))
    return nhwc, nchw


def precompile(layers, args) -> None:
    """Every kernel the run will load, compiled in parallel into the kernel cache first."""
    import os

    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.nvrtc import compile_many

    storage = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[args.dtype]
    sources = []
    for d in layers:
        nhwc, nchw = layer_descs(d, args.batch, storage, args.dtype, args.silu)
        sources += [k for t in d.tactics(args.dtype) for k in find_tactic("cuda", "ConvNHWC", t).kernels(nhwc)]
        if not args.no_direct and args.dtype != "bf16":
            sources += find_tactic("cuda", "Conv", DIRECT).kernels(nchw)
    compile_many(sources, driver.current_device().arch, workers=os.cpu_count())


def bench_layer(d: DwLayer, count: int, args, torch) -> dict:
    F = torch.nn.functional
    tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    storage = {"fp16": np.dtype(np.float16), "fp32": np.dtype(np.float32)}.get(args.dtype)
    if storage is None:
        import ml_dtypes

        storage = np.dtype(ml_dtypes.bfloat16)
    n, c, h, o, k, s = args.batch, d.c, d.size, d.out, d.k, d.stride
    pad = k // 2
    # three input sets: NCHW-logical tensors in channels_last memory (NHWC bytes) for torch and the
    # NHWC tactics, contiguous NCHW copies for the NCHW direct kernel
    sets = []
    for _ in range(3):
        x = torch.randn(n, c, h, h, device="cuda", dtype=tdtype).to(memory_format=torch.channels_last)
        w = torch.randn(c, d.cpg, k, k, device="cuda", dtype=tdtype) * (1.0 / (k * d.cpg ** 0.5))
        b = torch.randn(c, device="cuda", dtype=tdtype)
        sets.append({"x": x, "w": w, "b": b, "x_nchw": x.contiguous(), "w_krsc": w.permute(0, 2, 3, 1).contiguous(),
                     "y": torch.empty(n, c, o, o, device="cuda", dtype=tdtype).to(memory_format=torch.channels_last),
                     "y_nchw": torch.empty(n, c, o, o, device="cuda", dtype=tdtype)})
    nhwc, nchw = layer_descs(d, n, storage.name, args.dtype, args.silu)

    def nhwc_tensors(i):
        t = sets[i]
        return {"X": device_tensor(t["x"], storage, (n, h, h, c)), "W": device_tensor(t["w_krsc"], storage),
                "B": device_tensor(t["b"], storage), "Y": device_tensor(t["y"], storage, (n, o, o, c))}

    def nchw_tensors(i):
        t = sets[i]
        return {"X": device_tensor(t["x_nchw"], storage), "W": device_tensor(t["w"], storage),
                "B": device_tensor(t["b"], storage), "Y": device_tensor(t["y_nchw"], storage)}

    want = F.conv2d(sets[0]["x"].float(), sets[0]["w"].float(), sets[0]["b"].float(), stride=s, padding=pad,
                    groups=d.groups)
    want_nhwc = F.silu(want) if args.silu else want  # the NCHW direct kernel runs without the epilogue
    row = {"layer": d.label(), "count": count, "bytes": layer_bytes(d, n, storage.itemsize),
           "fmas": layer_fmas(d, n)}
    row["floor_us"] = max(row["bytes"] / (HBM_TBPS * 1e6), row["fmas"] / FP32_FMA_PER_S * 1e6)

    def rel(got, ref) -> float:
        return float(torch.linalg.norm(got.float() - ref) / torch.linalg.norm(ref))

    def measure(graph, tactic: str, tensors, out: str) -> None:
        """Time `tactic` on `graph`, then run it once more on poisoned output and record its error."""
        op = Polykit(graph, tactic, torch)
        try:
            row[tactic] = time_graph(lambda i: op.run(tensors(i)), torch, args.warmup, args.iters) * 1e3
            sets[0][out].fill_(float("nan"))
            op.run(tensors(0))
            torch.cuda.synchronize()
            row[tactic + ":err"] = rel(sets[0][out], want_nhwc if out == "y" else want)
        finally:
            op.close()

    for tactic in d.tactics(args.dtype):
        measure(nhwc, tactic, nhwc_tensors, "y")
    if not args.no_direct and args.dtype != "bf16":  # the NCHW conv kernels take float32 / float16
        measure(nchw, DIRECT, nchw_tensors, "y_nchw")
    row["cudnn"] = time_graph(lambda i: F.conv2d(sets[i]["x"], sets[i]["w"], sets[i]["b"], stride=s, padding=pad,
                                                 groups=d.groups), torch, args.warmup, args.iters) * 1e3
    row["tactics"] = list(d.tactics(args.dtype))
    best = min(row["tactics"], key=lambda t: row[t])
    row["best"], row["best_us"] = best, row[best]
    row["gbps"] = row["bytes"] / (row["best_us"] * 1e3)
    return row


def print_row(r: dict, dtype: str) -> None:
    errs = [r[key] for key in r if key.endswith(":err")]
    flag = "" if all(e <= WRONG[dtype] for e in errs) else " WRONG"  # NaN (an unwritten element) too
    direct = f"{r[DIRECT]:8.1f}" if DIRECT in r else "       -"
    print(f"{r['count']:2}x {r['layer']:24} {r['bytes'] / 1e6:7.2f} MB {r['floor_us']:7.1f} | "
          f"{r[r['tactics'][0]]:7.1f} {r[r['tactics'][1]]:7.1f} {r['gbps']:6.0f} GB/s {100 * r['gbps'] / (HBM_TBPS * 1e3):3.0f}% | "
          f"{direct} {r['cudnn']:7.1f} | {r['cudnn'] / r['best_us']:5.2f}x  err {max(errs):.1e}{flag}"
          "".join(f"  {t.split('.')[-1]} {r[t]:.1f} us" for t in MMA if t in r), flush=True)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="convnext,efficientnet,mobilenet")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-direct", action="store_true", help="skip the (slow) NCHW cuda.conv.direct")
    parser.add_argument("--silu", action="store_true", help="fuse a SiLU epilogue into polykit's NHWC layers")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    results = {}
    models = [m for m in args.models.split(",") if m]
    precompile({d for m in models for d, _ in MODELS[m]}, args)
    print(f"{'':3} {'layer (bs' + str(args.batch) + ' ' + args.dtype + ')':24} {'bytes':>10} {'floor':>7} | "
          f"{'p8|p4':>7} {'p4|p2':>7} {'best':>11} {'HBM':>4} | {'direct':>8} {'cuDNN':>7} | cuDNN/best")
    for model in models:
        rows = [bench_layer(d, count, args, torch) for d, count in MODELS[model]]
        for r in rows:
            print_row(r, args.dtype)
        total = {key: sum(r[key] * r["count"] for r in rows) for key in ("best_us", "cudnn", "floor_us")}
        direct = sum(r[DIRECT] * r["count"] for r in rows) if all(DIRECT in r for r in rows) else float("nan")
        print(f"== {model} bs{args.batch} {args.dtype}: {sum(r['count'] for r in rows)} layers: polykit "
              f"{total['best_us']:.1f} us (floor {total['floor_us']:.1f}) vs direct {direct:.1f} us vs cuDNN "
              f"{total['cudnn']:.1f} us = {total['cudnn'] / total['best_us']:.2f}x cuDNN, "
              f"{direct / total['best_us']:.1f}x direct", flush=True)
        results[model] = rows
    meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "commit": provenance.commit(),
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "batch": args.batch,
            "dtype": args.dtype, "silu": args.silu}
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
