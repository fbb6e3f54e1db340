"""Every distinct GEMM / convolution of a model plan against torch's op, shape by shape.

    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases resnet50:32:fp16,bert:8:fp16 [--out k.json]
    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases resnext50_32x4d:32:fp16,regnet_y_800mf:32:fp16
    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases "" --attention 8,12,128,64
    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases "" --attention-dtype fp16 \
        --attention 8,12,128,64 --attention 1,12,512,64

Builds the polykit plan of each case (as benchmarks/cuda_models.py does: torch export, random
weights; a case's model is "bert" or a torchvision classifier's name), then for every distinct (kind, input/output shapes, attributes) among its Conv /
ConvNHWC / MatMul / Gemm layers times the layer's chosen tactic alone and torch's equivalent
in the same process: torch.nn.functional.conv2d on channels_last tensors (cuDNN) for
convolutions, torch.matmul for GEMMs, on random inputs of the layer's shapes and dtype. Both
sides are timed as captured CUDA graphs (three calls per graph, inputs rotated over three
buffer sets, median of --iters replays). Fused epilogues are timed as part of polykit's
layer; torch's side is the bare op, plus the bias. Prints TFLOP/s per shape, the ratio to torch,
and the totals (each shape weighted by how many layers share it).

--attention B,H,S,D times every cuda tactic of an fp32 self-attention layer of that shape
(precision fp32, and tf32 for the --tf32 variants), its tensors stored [B, H, S, D] and
[B, S, H, D] (BERT's folded head transposes), against torch's scaled_dot_product_attention in
fp32 (TF32 off), the same way; each prints its relative error against torch in float64.
--attention-dtype fp16 / bf16 does the same in that storage type (torch's SDPA then picks its own
flash kernel; the polykit candidates include cuda.attention.flash and, on sm_90,
cuda.attention.flash_sm90 / _2wg). --attention may be given several times.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

from benchmarks import provenance

from cuda_gemm import time_graph
from cuda_models import export, make_inputs, make_model

KINDS = ("Conv", "ConvNHWC", "MatMul", "Gemm")


def layer_flops(layer, tensors) -> float:
    out = tensors[layer.outputs[0]].shape
    if layer.kind in ("Conv", "ConvNHWC"):
        w = tensors[layer.inputs[1]].shape
        per_out = int(np.prod(w[1:]))
        return 2.0 * int(np.prod(out)) * per_out
    a = tensors[layer.inputs[0]].shape
    k = a[0] if layer.kind == "Gemm" and layer.attrs.get("transA") else a[-1]
    return 2.0 * int(np.prod(out)) * k


def torch_op(layer, tensors, dtype, torch):
    """A callable(i) running torch's equivalent of `layer` on the i-th of three input sets."""
    F = torch.nn.functional
    shape = lambda n: tuple(tensors[n].shape)  # noqa: E731
    if layer.kind in ("Conv", "ConvNHWC"):
        nhwc = layer.kind == "ConvNHWC"
        x_shape, w_shape = shape(layer.inputs[0]), shape(layer.inputs[1])
        if nhwc:  # NHWC / KRSC -> logical NCHW / KCRS
            x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
            w_shape = (w_shape[0], w_shape[3], w_shape[1], w_shape[2])
        pads = layer.attrs.get("pads", [0, 0, 0, 0])
        sets = [(torch.randn(*x_shape, device="cuda", dtype=dtype).to(memory_format=torch.channels_last),
                 torch.randn(*w_shape, device="cuda", dtype=dtype).to(memory_format=torch.channels_last),
                 torch.randn(w_shape[0], device="cuda", dtype=dtype)) for _ in range(3)]
        kw = {"stride": tuple(layer.attrs.get("strides", [1, 1])), "padding": (pads[0], pads[1]),
              "dilation": tuple(layer.attrs.get("dilations", [1, 1])), "groups": int(layer.attrs.get("group", 1))}
        return lambda i: F.conv2d(sets[i][0], sets[i][1], sets[i][2], **kw)
    a_shape, b_shape = shape(layer.inputs[0]), shape(layer.inputs[1])
    sets = [(torch.randn(*a_shape, device="cuda", dtype=dtype), torch.randn(*b_shape, device="cuda", dtype=dtype))
            for _ in range(3)]
    if layer.kind == "Gemm":
        ta, tb = layer.attrs.get("transA", 0), layer.attrs.get("transB", 0)
        return lambda i: torch.matmul(sets[i][0].T if ta else sets[i][0], sets[i][1].T if tb else sets[i][1])
    return lambda i: torch.matmul(sets[i][0], sets[i][1])


def polykit_op(layer, plan, torch):
    """A callable(i) enqueueing the layer's own tactic on random tensors of its shapes."""
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules
    from polykit.runtime.cuda.target import plan_kernels

    info = driver.current_device()
    tactic = find_tactic("cuda", layer.kind, layer.tactic)
    modules = KernelModules(info.arch)
    modules.load(plan_kernels(plan, layer))
    keep: list = []

    def tensor(name):
        desc = plan.tensors[name]
        t = torch.randn(*desc.shape, device="cuda").to(getattr(torch, desc.dtype))
        keep.append(t)
        return DeviceTensor(t.data_ptr(), tuple(desc.shape), np.dtype(desc.dtype))

    sets = [{n: tensor(n) for n in (*layer.inputs, *layer.outputs) if n} for _ in range(3)]

    def take(nbytes: int) -> int:
        keep.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        return keep[-1].data_ptr()

    def run(i):
        stream = driver.drv().CUstream(torch.cuda.current_stream().cuda_stream)
        tactic.enqueue(layer, CudaLauncher(modules, stream, take, layer.name, sm_count=info.sm_count), sets[i])

    return run, modules, keep


def bench_case(name, batch, precision, args, torch) -> list[dict]:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    model = make_model(name, torch)
    inputs = make_inputs(name, batch, torch)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.onnx"
        export(name, model, inputs, path, torch)
        plan = build_plan(str(path), BuilderConfig(target="cuda", fp16=precision == "fp16"))
    dtype = torch.float16 if precision == "fp16" else torch.float32
    groups: dict = {}
    for layer in plan.layers:
        if layer.kind not in KINDS:
            continue
        key = (layer.kind, layer.tactic, tuple(tuple(plan.tensors[n].shape) if n else () for n in layer.inputs),
               json.dumps({k: v for k, v in layer.attrs.items() if k != "epilogue"}, sort_keys=True, default=str),
               bool(layer.attrs.get("epilogue")))
        groups.setdefault(key, []).append(layer)
    rows = []
    for key, layers in groups.items():
        layer = layers[0]
        flops = layer_flops(layer, plan.tensors)
        run, modules, keep = polykit_op(layer, plan, torch)
        try:
            ms = time_graph(run, torch, args.warmup, args.iters)
        finally:
            torch.cuda.synchronize()
            modules.close()
        tms = time_graph(torch_op(layer, plan.tensors, dtype, torch), torch, args.warmup, args.iters)
        shapes = " ".join(str(tuple(plan.tensors[n].shape)) for n in (*layer.inputs[:2], *layer.outputs[:1]) if n)
        rows.append({"kind": layer.kind, "tactic": layer.tactic, "shapes": shapes, "count": len(layers),
                     "epilogue": bool(layer.attrs.get("epilogue")), "polykit_ms": ms, "torch_ms": tms,
                     "tflops": flops / ms / 1e9, "torch_tflops": flops / tms / 1e9})
        r = rows[-1]
        print(f"{r['count']:3}x {r['kind']:9} {r['tactic']:27} {r['polykit_ms'] * 1e3:8.1f} us {r['tflops']:6.0f} TF | "
              f"torch {r['torch_ms'] * 1e3:8.1f} us {r['torch_tflops']:6.0f} TF | {r['polykit_ms'] / r['torch_ms']:5.2f}x "
              f"{'+epi ' if r['epilogue'] else ''}{shapes}", flush=True)
    total = sum(r["polykit_ms"] * r["count"] for r in rows)
    ttotal = sum(r["torch_ms"] * r["count"] for r in rows)
    print(f"== {name} bs{batch} {precision}: polykit {total:.3f} ms vs torch {ttotal:.3f} ms over "
          f"{sum(r['count'] for r in rows)} layers = {total / ttotal:.2f}x", flush=True)
    return rows


def bench_attention(shape: tuple[int, ...], args, torch) -> list[dict]:
    """cuda Attention tactics on [B, H, S, D] of --attention-dtype (both layouts) vs torch SDPA,
    in one process."""
    from dataclasses import replace

    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import candidates
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules

    B, H, S, D = shape
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    F = torch.nn.functional
    tdtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.attention_dtype]
    storage = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[args.attention_dtype]
    np_storage = np.dtype(ml_dtypes.bfloat16) if storage == "bfloat16" else np.dtype(storage)
    sets = [[torch.randn(B, H, S, D, device="cuda", dtype=tdtype) for _ in range(3)] for _ in range(3)]  # 3 x (q, k, v)
    want = F.scaled_dot_product_attention(*(t.double() for t in sets[0]))
    flops = 4.0 * B * H * S * S * D
    info = driver.current_device()
    keep: list = []

    def take(nbytes: int) -> int:
        keep.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        return keep[-1].data_ptr()

    def report(name: str, ms: float, got) -> dict:
        err = float(torch.linalg.norm(got.double() - want) / torch.linalg.norm(want))
        row = {"tactic": name, "shape": list(shape), "ms": ms, "tflops": flops / ms / 1e9, "rel_err": err}
        print(f"{name:40} {ms * 1e3:8.1f} us {row['tflops']:6.1f} TF  rel err {err:.2e}", flush=True)
        return row

    sdpa_ms = time_graph(lambda i: F.scaled_dot_product_attention(*sets[i]), torch, args.warmup, args.iters)
    rows = [report(f"torch sdpa {args.attention_dtype}", sdpa_ms, F.scaled_dot_product_attention(*sets[0]))]
    for layout in ("bhsd", "bshd"):
        bshd = layout == "bshd"
        stored = (B, S, H, D) if bshd else (B, H, S, D)
        attrs = {a: "bshd" for a in ("q_layout", "k_layout", "v_layout", "out_layout")} if bshd else {}
        layer = LayerDesc("att", "Attention", ("Q", "K", "V"), ("Y",), attrs, domain="ai.polykit",
                          in_dtypes=(storage,) * 3, out_dtypes=(storage,), in_shapes=(stored,) * 3,
                          out_shapes=(stored,))
        tensors, outs = [], []
        for qkv in sets:
            ts = [t.transpose(1, 2).contiguous() if bshd else t for t in qkv] + [torch.empty(stored, device="cuda",
                                                                                              dtype=tdtype)]
            keep.extend(ts)
            outs.append(ts[-1])
            tensors.append({n: DeviceTensor(t.data_ptr(), stored, np_storage) for n, t in zip("QKVY", ts)})
        seen = set()
        variants = (layer, replace(layer, precision="tf32")) if storage == "float32" else (layer,)
        for variant in variants:
            for tactic in candidates("cuda", "Attention", variant, arch=info.arch):
                if tactic.name in seen:
                    continue
                seen.add(tactic.name)
                modules = KernelModules(info.arch)
                modules.load(tactic.kernels(variant))

                def run(i, tactic=tactic, variant=variant, modules=modules):
                    stream = driver.drv().CUstream(torch.cuda.current_stream().cuda_stream)
                    tactic.enqueue(variant, CudaLauncher(modules, stream, take, "att", sm_count=info.sm_count),
                                   tensors[i])

                try:
                    ms = time_graph(run, torch, args.warmup, args.iters)
                    run(0)
                    torch.cuda.synchronize()
                finally:
                    modules.close()
                label = variant.precision if storage == "float32" else args.attention_dtype
                rows.append(report(f"{tactic.name} {label} {layout}", ms,
                                   outs[0].transpose(1, 2) if bshd else outs[0]))
    return rows


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="resnet50:32:fp16,bert:8:fp16")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default="cuda_kernels.json")
    parser.add_argument("--attention", action="append", default=[],
                        help="B,H,S,D: time the Attention tactics at this shape (repeatable)")
    parser.add_argument("--attention-dtype", choices=("fp32", "fp16", "bf16"), default="fp32")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    results = {}
    for spec in args.attention:
        shape = tuple(int(x) for x in spec.split(","))
        results[f"attention:{args.attention_dtype}:{spec}"] = bench_attention(shape, args, torch)
    for case in filter(None, args.cases.split(",")):
        name, batch, precision = case.split(":")
        results[case] = bench_case(name, int(batch), precision, args, torch)
    meta = provenance.meta(torch, cudnn=torch.backends.cudnn.version())
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(meta)


if __name__ == "__main__":
    main()
