"""Every distinct GEMM / convolution of a model plan against torch's op, shape by shape.

    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases resnet50:32:fp16,bert:8:fp16 [--out k.json]
    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases resnext50_32x4d:32:fp16,regnet_y_800mf:32:fp16
    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases "" --attention 8,12,128,64
    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases "" --pointwise efficientnet_b0:32,mobilenet_v3_large:32
    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases "" --attention-dtype fp16 \
        --attention 8,12,128,64 --attention 1,12,512,64

Builds the polykit plan of each case (as benchmarks/cuda_models.py does: torch export, random
weights; a case's model is "bert" or a torchvision classifier's name, its images 224 pixels square
or the case's fourth field: efficientnet_v2_s:32:fp16:384), then for every distinct (kind, input/output shapes, attributes) among its Conv /
ConvNHWC / MatMul / Gemm layers times the layer's chosen tactic alone and torch's equivalent
in the same process: torch.nn.functional.conv2d on channels_last tensors (cuDNN) for
convolutions, torch.matmul for GEMMs, on random inputs of the layer's shapes and dtype. Both
sides are timed as captured CUDA graphs (three calls per graph, inputs rotated over three
buffer sets, median of --iters replays). Fused epilogues are timed as part of polykit's
layer; torch's side is the bare op, plus the bias. Prints TFLOP/s per shape, the ratio to torch,
and the totals (each shape weighted by how many layers share it).

--pointwise efficientnet_b0:32,mobilenet_v3_large:32 times every pointwise (1x1, stride 1) convolution
shape of those zoo models (shapes from forward hooks on the torchvision module; fp16, NHWC, bias):
the fastest of the sm90 wgmma tiles, the fastest of the skinny tiles (gemm_skinny.cu) and torch's
conv2d on channels_last tensors, in us and GB/s (X and W read once, Y written once), and the
totals over the model's layers.

--attention B,H,S,D times every cuda tactic of an fp32 self-attention layer of that shape
(precision fp32, and tf32 for the --tf32 variants), its tensors stored [B, H, S, D] and
[B, S, H, D] (BERT's folded head transposes), against torch's scaled_dot_product_attention in
fp32 (TF32 off), the same way; each prints its relative error against torch in float64.
--attention-dtype fp16 / bf16 does the same in that storage type (torch's SDPA then picks its own
flash kernel; the polykit candidates include cuda.attention.flash, its other block shapes
cuda.attention.flash_q128 / _kv128 at head sizes 32 and 64, and, on sm_90, cuda.attention.flash_sm90).
--attention may be given several times; the zoo's attention shapes at batch 8 (whisper_encoder, BERT /
GPT-2, ViT-B/16):

    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases "" --attention-dtype fp16 \
        --attention 8,6,1500,64 --attention 8,12,128,64 --attention 8,12,197,64

--se efficientnet_b0:32:fp16 (or mobilenet_v3_large, bf16, fp32; repeatable) times every cuda
tactic of the squeeze-excitation scale Mul x[N, H, W, C] * s[N, 1, 1, C] and of the NHWC pool
ReduceMean over (H, W) at the model's SE shapes against torch's x * s and x.mean((2, 3)) on
channels_last tensors, printing GB/s and the count-weighted totals:

    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases "" --se efficientnet_b0:32:fp16

--norm ROWS,L[,rms][,fp16|bf16|fp32] (repeatable) times every cuda tactic of a LayerNormalization (or
RMSNormalization with `rms`) over the last axis of [ROWS, L] with an L-element scale and bias (no bias
for RMS) against torch's layer_norm / rms_norm, in us and GB/s (x read once, y written once) with the
relative error against torch in float64 -- Swin-T bs8 stage 1 is 25088,96, BERT bs8 1024,768, LLaMA-small
bs8 1024,768,rms:

    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases "" --norm 25088,96 --norm 1024,768 --norm 1024,768,rms

--conv N,H,W,C,K,R[,stride][,silu] (repeatable) times every cuda ConvNHWC tactic of one fp16 convolution
(pad R // 2, bias, optionally the SiLU epilogue) against torch's conv2d on channels_last tensors -- the
EfficientNet-V2-S fused-MBConv conv at batch 32: --conv 32,192,192,24,24,3,1,silu

--fp8 N,H,W,C,K,R[,stride][,f16|e4m3|f32][,res:e4m3|res:f32|res:f16] (repeatable) times every cuda FP8 QConvNHWC
tactic of one FP8 conv (e4m3 X and W, per-channel weight scales, pad R // 2, bias; the output float16 through the
Cast epilogue of an --fp16 build, requantized e4m3, or float32; with res: a residual Add + Relu as the plans
fuse it: e4m3 dequantized by its scale, float32, or float16 cast, Add, Relu, Cast; the fp16 rows then read a
float16 residual too) -- the promoted tiles and the fast-accumulation ones (`_fast_`) --
beside every cuda ConvNHWC tactic of the same conv in fp16 and torch's conv2d in fp16; for a 1x1 stride-1 conv
(a GEMM over rows) also torch._scaled_mm (cuBLASLt FP8, float16 out) with and without use_fast_accum. BERT-base
bs8's GEMMs (M 1024): --fp8 8,128,1,768,2304,1 --fp8 8,128,1,768,3072,1 --fp8 8,128,1,3072,768,1 --fp8 8,128,1,768,768,1

--resize N,C,H,W,OH,OW[,linear|nearest] (repeatable) times cuda.resize in fp16 against torch's interpolate
(bilinear, align_corners=False; or nearest) -- FCN / DeepLabV3's last layer at batch 8:

    PYTHONPATH=. python3 benchmarks/cuda_kernels.py --cases "" --resize 8,21,64,64,512,512
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

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
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.cuda.target import plan_kernels

    specs = {n: (plan.tensors[n].shape, plan.tensors[n].dtype) for n in (*layer.inputs, *layer.outputs) if n}
    return tactic_op(layer, find_tactic("cuda", layer.kind, layer.tactic), plan_kernels(plan, layer), specs, torch)


def tactic_op(layer, tactic, kernels, specs, torch, fill=None):
    """(callable(i) enqueueing `tactic` on `layer` over the i-th of three sets of random tensors of
    `specs` (name -> (shape, dtype)), its kernel modules, the tensors to keep alive); `fill` maps a name to a
    constant for it (a quantized layer's scales and zero points: a random scale may be negative)."""
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules

    info = driver.current_device()
    modules = KernelModules(info.arch)
    modules.load(kernels)
    keep: list = []

    def tensor(name):
        shape, dtype = specs[name]
        if fill and name in fill:
            t = torch.full(tuple(shape), fill[name], device="cuda").to(getattr(torch, dtype))
        else:
            t = torch.randn(tuple(shape), device="cuda").to(getattr(torch, dtype))
        keep.append(t)
        return DeviceTensor(t.data_ptr(), tuple(shape), np.dtype(dtype))

    sets = [{n: tensor(n) for n in specs} for _ in range(3)]

    def take(nbytes: int) -> int:
        keep.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        return keep[-1].data_ptr()

    def run(i):
        stream = driver.drv().CUstream(torch.cuda.current_stream().cuda_stream)
        tactic.enqueue(layer, CudaLauncher(modules, stream, take, layer.name, sm_count=info.sm_count), sets[i])

    return run, modules, keep


def bench_case(name, batch, precision, args, torch, size: int = 224) -> list[dict]:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    model = make_model(name, torch)
    inputs = make_inputs(name, batch, torch, size)
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


def time_tactic(tactic, layer, tensors, torch, args, label: str = "layer") -> float:
    """Median ms of cuda `tactic` running `layer` on tensors[i] (three buffer sets: {name: DeviceTensor}),
    captured and replayed as time_graph does, then once more on set 0 (its outputs are the ones to check);
    the scratch the tactic borrows lives until the timing ends."""
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules

    info = driver.current_device()
    keep: list = []

    def take(nbytes: int) -> int:
        keep.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        return keep[-1].data_ptr()

    modules = KernelModules(info.arch)
    modules.load(tactic.kernels(layer))

    def run(i):
        stream = driver.drv().CUstream(torch.cuda.current_stream().cuda_stream)
        tactic.enqueue(layer, CudaLauncher(modules, stream, take, label, sm_count=info.sm_count), tensors[i])

    try:
        ms = time_graph(run, torch, args.warmup, args.iters)
        run(0)
        torch.cuda.synchronize()
    finally:
        modules.close()
    return ms


def bench_resize(spec: str, args, torch) -> dict:
    """cuda.resize on x [N, C, H, W] (fp16) to [N, C, OH, OW] (linear, half_pixel: torch's bilinear
    with align_corners=False; or nearest / asymmetric) against torch.nn.functional.interpolate, in us
    and GB/s (x read once, y written once), with the largest difference from torch."""
    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import find_tactic

    *dims, mode = spec.split(",") if not spec.split(",")[-1].isdigit() else (*spec.split(","), "linear")
    n, c, h, w, oh, ow = map(int, dims)
    coord = "half_pixel" if mode == "linear" else "asymmetric"
    layer = LayerDesc("up", "Resize", ("X", "", "", "Z"), ("Y",),
                      {"mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": "floor"},
                      in_dtypes=("float16", "", "", "int64"), out_dtypes=("float16",))
    sizes = torch.tensor([n, c, oh, ow], dtype=torch.int64, device="cuda")
    xs = [torch.randn(n, c, h, w, device="cuda", dtype=torch.float16) for _ in range(3)]
    ys = [torch.empty(n, c, oh, ow, device="cuda", dtype=torch.float16) for _ in range(3)]
    f16 = np.dtype(np.float16)
    tensors = [{"X": DeviceTensor(x.data_ptr(), (n, c, h, w), f16), "Y": DeviceTensor(y.data_ptr(), (n, c, oh, ow), f16),
                "Z": DeviceTensor(sizes.data_ptr(), (4,), np.dtype(np.int64))} for x, y in zip(xs, ys)]
    ms = time_tactic(find_tactic("cuda", "Resize", "cuda.resize"), layer, tensors, torch, args, "up")
    interp = lambda i: torch.nn.functional.interpolate(xs[i], size=(oh, ow), mode="bilinear" if mode == "linear"  # noqa: E731
                                                       else "nearest", **({"align_corners": False} if mode == "linear" else {}))
    tms = time_graph(interp, torch, args.warmup, args.iters)
    err = float((ys[0].float() - interp(0).float()).abs().max())
    gb = 2 * (n * c * (h * w + oh * ow)) / 1e9
    print(f"Resize {mode} {(n, c, h, w)} -> {(oh, ow)}: polykit {ms * 1e3:8.1f} us {gb / ms * 1e3:6.0f} GB/s | torch "
          f"{tms * 1e3:8.1f} us {gb / tms * 1e3:6.0f} GB/s | {ms / tms:5.2f}x | max |diff| {err:.1e}", flush=True)
    return {"spec": spec, "ms": ms, "torch_ms": tms, "max_abs_diff": err}


def bench_attention(shape: tuple[int, ...], args, torch) -> list[dict]:
    """cuda Attention tactics on [B, H, S, D] of --attention-dtype (both layouts) vs torch SDPA,
    in one process."""
    from dataclasses import replace

    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import candidates
    from polykit.runtime.cuda import driver

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
                ms = time_tactic(tactic, variant, tensors, torch, args, "att")
                label = variant.precision if storage == "float32" else args.attention_dtype
                rows.append(report(f"{tactic.name} {label} {layout}", ms,
                                   outs[0].transpose(1, 2) if bshd else outs[0]))
    return rows


def bench_norm(spec: str, args, torch) -> list[dict]:
    """Every cuda tactic of a last-axis LayerNormalization / RMSNormalization at `spec` (ROWS,L[,rms]
    [,dtype]) against torch's, timed the same way as the attention tactics."""
    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import candidates
    from polykit.runtime.cuda import driver

    parts = spec.split(",")
    rows, length = int(parts[0]), int(parts[1])
    rms = "rms" in parts[2:]
    storage = next((p for p in parts[2:] if p in ("fp16", "bf16", "fp32")), "fp16")
    tdtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[storage]
    np_storage = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16),
                  "bf16": np.dtype(ml_dtypes.bfloat16)}[storage]
    F = torch.nn.functional
    eps = 1e-5
    scale = torch.randn(length, device="cuda", dtype=tdtype)
    bias = None if rms else torch.randn(length, device="cuda", dtype=tdtype)
    xs = [torch.randn(rows, length, device="cuda", dtype=tdtype) for _ in range(3)]
    ys = [torch.empty_like(x) for x in xs]

    def torch_norm(x):
        if rms:
            return F.rms_norm(x, (length,), scale, eps)
        return F.layer_norm(x, (length,), scale, bias, eps)

    x0 = xs[0].double()
    want = (F.rms_norm(x0, (length,), scale.double(), eps) if rms
            else F.layer_norm(x0, (length,), scale.double(), bias.double(), eps))
    moved = 2.0 * rows * length * xs[0].element_size()
    info = driver.current_device()

    def report(name: str, ms: float, got) -> dict:
        err = float(torch.linalg.norm(got.double() - want) / torch.linalg.norm(want))
        row = {"tactic": name, "shape": [rows, length], "rms": rms, "dtype": storage, "ms": ms,
               "gbps": moved / ms / 1e6, "rel_err": err}
        print(f"{name:40} {ms * 1e3:8.1f} us {row['gbps']:7.0f} GB/s  rel err {err:.2e}", flush=True)
        return row

    rows_out = [report(f"torch {'rms_norm' if rms else 'layer_norm'} {storage}",
                       time_graph(lambda i: torch_norm(xs[i]), torch, args.warmup, args.iters), torch_norm(xs[0]))]
    kind = "RMSNormalization" if rms else "LayerNormalization"
    names = ("X", "S") if rms else ("X", "S", "B")
    layer = LayerDesc("norm", kind, names, ("Y",), {"axis": -1, "epsilon": eps},
                      in_dtypes=(np_storage.name,) * len(names), out_dtypes=(np_storage.name,),
                      in_shapes=((rows, length),) + ((length,),) * (len(names) - 1), out_shapes=((rows, length),))
    params = {"S": DeviceTensor(scale.data_ptr(), (length,), np_storage)}
    if bias is not None:
        params["B"] = DeviceTensor(bias.data_ptr(), (length,), np_storage)
    tensors = [{"X": DeviceTensor(x.data_ptr(), (rows, length), np_storage),
                "Y": DeviceTensor(y.data_ptr(), (rows, length), np_storage), **params} for x, y in zip(xs, ys)]
    for tactic in candidates("cuda", kind, layer, arch=info.arch):
        rows_out.append(report(f"{tactic.name} {storage}", time_tactic(tactic, layer, tensors, torch, args, "norm"),
                               ys[0]))
    return rows_out


# ---- pointwise (1x1) convolutions of the mobile nets: sm90 tiles vs skinny tiles vs torch (issue 29) ----

def pointwise_shapes(name: str, batch: int, torch) -> dict[tuple[int, int, int, int], int]:
    """(C, H, W, N) of every 1x1, stride-1, unpadded, group-1 Conv2d of zoo model `name` (its
    input at `batch`), with how many layers share it: forward hooks on one CPU batch-1 pass."""
    from benchmarks.zoo_models import BY_NAME, make_inputs

    zoo = BY_NAME[name]
    module, found = zoo.make().eval(), {}

    def hook(conv, args, _out):
        x = args[0]
        if conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.groups == 1 and conv.padding == (0, 0):
            key = (conv.in_channels, x.shape[2], x.shape[3], conv.out_channels)
            found[key] = found.get(key, 0) + 1

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        module(**make_inputs(zoo, 1, torch))
    for h in handles:
        h.remove()
    return found


def time_tactic_op(layer, tactic, specs, torch, args, fill=None) -> float:
    """Median ms of `tactic` on `layer` over random tensors of `specs` (tactic_op), as a captured graph."""
    run, modules, _keep = tactic_op(layer, tactic, tactic.kernels(layer), specs, torch, fill)
    try:
        return time_graph(run, torch, args.warmup, args.iters)
    finally:
        torch.cuda.synchronize()
        modules.close()


def bench_pointwise(name: str, batch: int, args, torch) -> list[dict]:
    """Each pointwise convolution shape of zoo model `name` at `batch`, fp16 NHWC with its bias:
    the fastest sm90 wgmma tile (cuda.conv_nhwc.sm90_*, the best before the skinny tiles), the
    fastest skinny tile (cuda.conv_nhwc.skinny_*) and torch's conv2d on channels_last tensors, each
    timed as a captured CUDA graph; GB/s counts X and W read once and Y written once."""
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN
    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.base import all_cuda_tactics
    from polykit.runtime.cuda import driver

    arch = driver.current_device().arch
    tactics = [t for t in all_cuda_tactics() if t.kind == "ConvNHWC" and t.runs_on(arch)]
    rows = []
    for (C, H, W, N), count in pointwise_shapes(name, batch, torch).items():
        x, w, y = (batch, H, W, C), (N, 1, 1, C), (batch, H, W, N)
        layer = LayerDesc("pw", "ConvNHWC", ("X", "W", "B"), ("Y",), {"kernel_shape": [1, 1]}, domain=POLYKIT_DOMAIN,
                          precision="fp16", in_dtypes=("float16",) * 3, out_dtypes=("float16",),
                          in_shapes=(x, w, (N,)), out_shapes=(y,))
        nbytes = 2 * (batch * H * W * (C + N) + C * N)
        best: dict[str, tuple[float, str]] = {}
        for tactic in tactics:
            family = tactic.name.split(".")[-1].split("_")[0]
            if family not in ("sm90", "skinny") or not tactic.supports(layer):
                continue
            specs = {"X": (x, "float16"), "W": (w, "float16"), "B": ((N,), "float16"), "Y": (y, "float16")}
            ms = time_tactic_op(layer, tactic, specs, torch, args)
            if family not in best or ms < best[family][0]:
                best[family] = (ms, tactic.name)
        shapes = {"X": SimpleNamespace(shape=x), "W": SimpleNamespace(shape=w)}
        tms = time_graph(torch_op(layer, shapes, torch.float16, torch), torch, args.warmup, args.iters)
        r = {"C": C, "H": H, "W": W, "N": N, "count": count, "MB": nbytes / 1e6, "torch_ms": tms,
             **{f"{f}_ms": best[f][0] for f in best}, **{f"{f}_tactic": best[f][1] for f in best}}
        rows.append(r)
        cell = lambda f: (f"{best[f][1].split('.')[-1]:14} {best[f][0] * 1e3:7.1f} us {nbytes / best[f][0] / 1e6:6.0f} GB/s"  # noqa: E731
                          if f in best else f"{'-':14} {'':7}    {'':6}     ")
        print(f"{count:2}x M {batch * H * W:7} K {C:5} N {N:5} {r['MB']:6.1f} MB | {cell('sm90')} | {cell('skinny')} | "
              f"torch {tms * 1e3:7.1f} us {nbytes / tms / 1e6:6.0f} GB/s", flush=True)
    # totals over the layers an sm90 tile runs (the others, K % 8 != 0 or K = 4-wide SE convs, run neither family)
    both = [r for r in rows if "sm90_ms" in r]
    old = sum(r["count"] * r["sm90_ms"] for r in both)
    new = sum(r["count"] * min(r["sm90_ms"], r.get("skinny_ms", float("inf"))) for r in both)
    torch_ms = sum(r["count"] * r["torch_ms"] for r in both)
    print(f"== {name} bs{batch}: {sum(r['count'] for r in both)} of {sum(r['count'] for r in rows)} layers: best sm90 "
          f"tile {old:.3f} ms, best of sm90 and skinny tiles {new:.3f} ms, torch {torch_ms:.3f} ms", flush=True)
    return rows


def bench_conv(spec: str, args, torch) -> list[dict]:
    """Every cuda ConvNHWC tactic that supports one fp16 convolution x [N, H, W, C] -> K channels, R x R,
    pad R // 2, `stride` (spec N,H,W,C,K,R[,stride][,silu]: `silu` fuses x * sigmoid(x) as the zoo's
    EfficientNets do), each timed as a captured CUDA graph, against torch's conv2d (+ bias, + silu) on
    channels_last tensors; TFLOP/s and GB/s (X, W read once, Y written once)."""
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN
    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.base import all_cuda_tactics
    from polykit.runtime.cuda import driver

    fields = spec.split(",")
    silu = fields[-1] == "silu"
    dims = [int(v) for v in fields[: len(fields) - silu]]
    n, h, w, c, k, r = dims[:6]
    stride = dims[6] if len(dims) > 6 else 1
    oh, ow = (h + 2 * (r // 2) - r) // stride + 1, (w + 2 * (r // 2) - r) // stride + 1
    x, wt, y = (n, h, w, c), (k, r, r, c), (n, oh, ow, k)
    attrs = {"kernel_shape": [r, r], "pads": [r // 2] * 4, "strides": [stride, stride]}
    if silu:
        attrs["epilogue"] = {"input": "raw", "body": [
            {"op": "Sigmoid", "inputs": ["raw"], "outputs": ["s"], "attrs": {}},
            {"op": "Mul", "inputs": ["raw", "s"], "outputs": ["Y"], "attrs": {}}]}
    layer = LayerDesc("conv", "ConvNHWC", ("X", "W", "B"), ("Y",), attrs, domain=POLYKIT_DOMAIN, precision="fp16",
                      in_dtypes=("float16",) * 3, out_dtypes=("float16",), in_shapes=(x, wt, (k,)), out_shapes=(y,))
    arch = driver.current_device().arch
    flops = 2 * n * oh * ow * k * r * r * c
    nbytes = 2 * (n * h * w * c + k * r * r * c + n * oh * ow * k)
    specs = {"X": (x, "float16"), "W": (wt, "float16"), "B": ((k,), "float16"), "Y": (y, "float16")}
    rows = []
    for tactic in (t for t in all_cuda_tactics() if t.kind == "ConvNHWC" and t.runs_on(arch)):
        if not tactic.supports(layer) or (args.only and args.only not in tactic.name):
            continue
        rows.append({"tactic": tactic.name, "ms": time_tactic_op(layer, tactic, specs, torch, args)})
    shapes = {"X": SimpleNamespace(shape=x), "W": SimpleNamespace(shape=wt)}
    op = torch_op(layer, shapes, torch.float16, torch)
    tms = time_graph((lambda i: torch.nn.functional.silu(op(i))) if silu else op, torch, args.warmup, args.iters)
    for row in sorted(rows, key=lambda q: q["ms"]):
        print(f"conv {spec}: {row['tactic']:36} {row['ms'] * 1e3:8.1f} us {flops / row['ms'] / 1e9:6.0f} TF "
              f"{nbytes / row['ms'] / 1e6:6.0f} GB/s | torch {tms * 1e3:8.1f} us | {row['ms'] / tms:5.2f}x", flush=True)
    return [{"spec": spec, "torch_ms": tms, **row} for row in rows]


#: an FP8 layer's scales and zero points in the bench (random values for the rest): positive scales of the size a
#: calibrated plan has (a random, possibly negative output scale takes the per-element store path: Out::vec_ok)
FP8_FILL = {"S": 0.01, "YS": 0.05, "XZ": 0.0, "WZ": 0.0, "YZ": 0.0, "skip_scale": 0.05}


def bench_fp8(spec: str, args, torch) -> list[dict]:
    """Every cuda FP8 QConvNHWC tactic and every fp16 ConvNHWC tactic of one conv (module docstring: --fp8)."""
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN
    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.base import all_cuda_tactics
    from polykit.runtime.cuda import driver

    from polykit.kernels.cuda.int8.fp8_sm90 import HALF_RESIDUAL
    from polykit.kernels.cuda.int8.int8 import RESIDUALS

    fields = spec.split(",")
    residual = fields.pop()[4:] if fields[-1].startswith("res:") else None
    out = fields.pop() if fields[-1] in ("f16", "e4m3", "f32") else "f16"
    dims = [int(v) for v in fields]
    n, h, w, c, k, r = dims[:6]
    stride = dims[6] if len(dims) > 6 else 1
    oh, ow = (h + 2 * (r // 2) - r) // stride + 1, (w + 2 * (r // 2) - r) // stride + 1
    x, wt, y = (n, h, w, c), (k, r, r, c), (n, oh, ow, k)
    attrs = {"kernel_shape": [r, r], "pads": [r // 2] * 4, "strides": [stride, stride]}
    e4m3 = "float8_e4m3fn"
    requant = out == "e4m3"
    y_dtype = {"f16": "float16", "e4m3": e4m3, "f32": "float32"}[out]
    if out == "f16":  # an --fp16 build's FP8 layer: its Cast to float16 taken into the epilogue
        attrs["epilogue"] = {"input": "raw", "body": [{"op": "Cast", "inputs": ["raw"], "outputs": ["y"],
                                                       "attrs": {"to": 10}}]}
    extra: tuple = ()
    if residual is not None:  # fp8_sm90.fp8_layer's residual epilogues, the skip stamped with Y's shape
        body = {"f32": RESIDUALS["float32"], "e4m3": RESIDUALS["int8"], "f16": HALF_RESIDUAL}[residual]
        if out == "f16" and residual != "f16":
            body = [*[dict(step, outputs=["r"]) if step["outputs"] == ["y"] else step for step in body],
                    {"op": "Cast", "inputs": ["r"], "outputs": ["y"], "attrs": {"to": 10}}]
        attrs["epilogue"] = {"input": "raw", "body": body}
        extra = ("skip", "skip_scale") if residual == "e4m3" else ("skip",)
    names = ("X", "XZ", "W", "WZ", "S", "B", "YS" if requant else "", "YZ" if requant else "", *extra)
    shapes = {"X": x, "XZ": (), "W": wt, "WZ": (k,), "S": (k,), "B": (k,), "YS": (), "YZ": (), "skip": y,
              "skip_scale": ()}
    dtypes = {"X": e4m3, "XZ": e4m3, "W": e4m3, "WZ": e4m3, "S": "float32", "B": "float32", "YS": "float32",
              "YZ": e4m3, "skip": {"e4m3": e4m3, "f32": "float32", "f16": "float16"}.get(residual or "", ""),
              "skip_scale": "float32"}
    layer = LayerDesc("fp8", "QConvNHWC", names, ("Y",), attrs, domain=POLYKIT_DOMAIN, precision="fp8",
                      in_dtypes=tuple(dtypes.get(m, "") for m in names),
                      in_shapes=tuple(shapes.get(m, ()) for m in names), out_dtypes=(y_dtype,), out_shapes=(y,))
    arch = driver.current_device().arch
    flops = 2 * n * oh * ow * k * r * r * c
    specs = {m: (shapes[m], dtypes[m]) for m in names if m}
    specs["Y"] = (y, y_dtype)
    rows = []
    for tactic in (t for t in all_cuda_tactics() if t.kind == "QConvNHWC" and t.runs_on(arch)):
        if not tactic.supports(layer) or (args.only and args.only not in tactic.name):
            continue
        rows.append({"tactic": tactic.name, "precision": "fp8",  # scales as a calibrated plan has them
                     "ms": time_tactic_op(layer, tactic, specs, torch, args, FP8_FILL)})
    half_attrs = {k_: v for k_, v in attrs.items() if k_ != "epilogue"}
    if residual is not None:  # the fp16 plan's own residual epilogue: Add a float16 skip, Relu
        half_attrs["epilogue"] = {"input": "raw", "body": [
            {"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
            {"op": "Relu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}]}
    half_names = ("X", "W", "B", *(("skip",) if residual is not None else ()))
    half = LayerDesc("conv", "ConvNHWC", half_names, ("Y",), half_attrs,
                     domain=POLYKIT_DOMAIN, precision="fp16", in_dtypes=("float16",) * len(half_names),
                     out_dtypes=("float16",), in_shapes=(x, wt, (k,), y)[:len(half_names)], out_shapes=(y,))
    hspecs = {"X": (x, "float16"), "W": (wt, "float16"), "B": ((k,), "float16"), "Y": (y, "float16")}
    if residual is not None:
        hspecs["skip"] = (y, "float16")
    for tactic in (t for t in all_cuda_tactics() if t.kind == "ConvNHWC" and t.runs_on(arch)):
        if args.only and args.only not in tactic.name:  # (--only: those tactics alone, for ncu)
            continue
        if tactic.supports(half) and "simt" not in tactic.name:  # (the CUDA-core tiles: far behind, slow to time)
            rows.append({"tactic": tactic.name, "precision": "fp16",
                         "ms": time_tactic_op(half, tactic, hspecs, torch, args)})
    op = torch_op(half, {"X": SimpleNamespace(shape=x), "W": SimpleNamespace(shape=wt)}, torch.float16, torch)
    if args.only:
        return [{"spec": spec, **row} for row in rows]
    rows.append({"tactic": "torch.conv2d", "precision": "fp16", "ms": time_graph(op, torch, args.warmup, args.iters)})
    if r == 1 and stride == 1 and hasattr(torch, "_scaled_mm"):
        m = n * h * w
        a = [torch.randn(m, c, device="cuda").to(torch.float8_e4m3fn) for _ in range(3)]
        b = [torch.randn(k, c, device="cuda").to(torch.float8_e4m3fn) for _ in range(3)]  # [N, K]: .t() column-major
        one = torch.ones((), device="cuda")
        ha = [torch.randn(m, c, device="cuda", dtype=torch.float16) for _ in range(3)]
        hb = [torch.randn(c, k, device="cuda", dtype=torch.float16) for _ in range(3)]
        rows.append({"tactic": "torch.matmul", "precision": "fp16",
                     "ms": time_graph(lambda i: torch.matmul(ha[i], hb[i]), torch, args.warmup, args.iters)})
        for fast in (False, True):
            def mm(i, fast=fast):
                return torch._scaled_mm(a[i], b[i].t(), scale_a=one, scale_b=one, out_dtype=torch.float16,
                                        use_fast_accum=fast)
            rows.append({"tactic": f"torch._scaled_mm{' fast' if fast else ''}", "precision": "fp8",
                         "ms": time_graph(mm, torch, args.warmup, args.iters)})
    for row in sorted(rows, key=lambda q: q["ms"]):
        print(f"fp8 {spec}: {row['precision']:4} {row['tactic']:36} {row['ms'] * 1e3:8.1f} us "
              f"{flops / row['ms'] / 1e9:6.0f} TF", flush=True)
    return [{"spec": spec, **row} for row in rows]


# ---- squeeze-excitation: the SE scale Mul and the NHWC global pool (ReduceMean) -----------------
#: (H*W, C, scale Muls, pools) of the squeeze-excitation blocks of torchvision's models (their ONNX
#: exports; the last pool of each is the classifier's)
SE_SHAPES = {
    "efficientnet_b0": [(12544, 32, 1, 1), (3136, 96, 1, 1), (3136, 144, 1, 1), (784, 144, 1, 1), (784, 240, 1, 1),
                        (196, 240, 1, 1), (196, 480, 3, 3), (196, 672, 2, 2), (49, 672, 1, 1), (49, 1152, 4, 4),
                        (49, 1280, 0, 1)],
    "mobilenet_v3_large": [(784, 72, 1, 1), (784, 120, 2, 2), (196, 480, 1, 1), (196, 672, 1, 1), (49, 672, 1, 1),
                           (49, 960, 2, 3)],
}


def bench_squeeze_excitation(spec: str, args, torch) -> list[dict]:
    """Every cuda tactic of the SE scale x[N, H, W, C] * s[N, 1, 1, C] and of the pool
    ReduceMean(x, axes (1, 2)) at each SE shape of model:batch:precision, against torch's same op
    on channels_last tensors (x * s, x.mean((2, 3), keepdim=True)); GB/s of the bytes each must
    move, the error against torch's result, and count-weighted totals (polykit's best tactic)."""
    from math import isqrt

    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import candidates
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules

    model, batch, precision = spec.split(":")
    n = int(batch)
    tdtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    storage = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[precision]
    np_storage = np.dtype(ml_dtypes.bfloat16) if storage == "bfloat16" else np.dtype(storage)
    item = np_storage.itemsize
    info = driver.current_device()
    keep: list = []

    def take(nbytes: int) -> int:
        keep.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        return keep[-1].data_ptr()

    rows = []
    for hw, c, muls, pools in SE_SHAPES[model]:
        h = isqrt(hw)
        xs = [torch.randn(n, c, h, h, device="cuda", dtype=tdtype).to(memory_format=torch.channels_last)
              for _ in range(3)]
        ss = [torch.rand(n, c, 1, 1, device="cuda", dtype=tdtype) for _ in range(3)]
        axes = torch.tensor([1, 2], dtype=torch.int64, device="cuda")
        keep.extend(xs + ss + [axes])
        nhwc, pooled = (n, h, h, c), (n, 1, 1, c)
        cases = []
        if muls:
            ys = [torch.empty(nhwc, device="cuda", dtype=tdtype) for _ in range(3)]
            layer = LayerDesc("se_scale", "Mul", ("X", "S"), ("Y",), {}, precision=precision, in_dtypes=(storage,) * 2,
                              in_shapes=(nhwc, pooled), out_dtypes=(storage,), out_shapes=(nhwc,))
            tensors = [{"X": DeviceTensor(x.data_ptr(), nhwc, np_storage),
                        "S": DeviceTensor(s.data_ptr(), pooled, np_storage),
                        "Y": DeviceTensor(y.data_ptr(), nhwc, np_storage)} for x, s, y in zip(xs, ss, ys)]
            cases.append((layer, muls, tensors, ys, lambda i: xs[i] * ss[i], 2 * n * hw * c + n * c,
                          lambda got, want: got.permute(0, 3, 1, 2) - want))
        ps = [torch.empty(pooled, device="cuda", dtype=tdtype) for _ in range(3)]
        layer = LayerDesc("se_pool", "ReduceMean", ("X", "axes"), ("Y",), {"keepdims": 1}, precision=precision,
                          in_dtypes=(storage, "int64"), in_shapes=(nhwc, (2,)), out_dtypes=(storage,),
                          out_shapes=(pooled,))
        axes_t = DeviceTensor(axes.data_ptr(), (2,), np.dtype(np.int64))
        tensors = [{"X": DeviceTensor(x.data_ptr(), nhwc, np_storage), "axes": axes_t,
                    "Y": DeviceTensor(p.data_ptr(), pooled, np_storage)} for x, p in zip(xs, ps)]
        cases.append((layer, pools, tensors, ps, lambda i: xs[i].mean((2, 3), keepdim=True), n * hw * c + n * c,
                      lambda got, want: got.reshape(want.shape) - want))
        for layer, count, tensors, outs, torch_fn, elems, diff in cases:
            gb = elems * item / 1e9
            tms = time_graph(torch_fn, torch, args.warmup, args.iters)
            want = torch_fn(0).float()
            row = {"op": layer.kind, "shape": [n, h, h, c], "count": count, "torch_ms": tms, "tactics": {}}
            print(f"{count}x {layer.kind:10} {str(nhwc):22} torch {tms * 1e3:7.1f} us {gb / tms * 1e3:6.0f} GB/s",
                  flush=True)
            for tactic in candidates("cuda", layer.kind, layer, arch=info.arch):
                modules = KernelModules(info.arch)
                modules.load(tactic.kernels(layer))

                def run(i, tactic=tactic, layer=layer, modules=modules, tensors=tensors):
                    stream = driver.drv().CUstream(torch.cuda.current_stream().cuda_stream)
                    tactic.enqueue(layer, CudaLauncher(modules, stream, take, layer.name, sm_count=info.sm_count),
                                   tensors[i])

                try:
                    outs[0].fill_(float("nan"))
                    ms = time_graph(run, torch, args.warmup, args.iters)
                    run(0)
                    torch.cuda.synchronize()
                finally:
                    modules.close()
                err = float(diff(outs[0].float(), want).abs().max())
                row["tactics"][tactic.name] = {"ms": ms, "max_abs_err": err}
                print(f"    {tactic.name:26} {ms * 1e3:7.1f} us {gb / ms * 1e3:6.0f} GB/s {tms / ms:5.2f}x torch "
                      f"err {err:.1e}", flush=True)
            rows.append(row)
    for op in ("Mul", "ReduceMean"):
        mine = [r for r in rows if r["op"] == op and r["count"]]
        best = sum(min(t["ms"] for t in r["tactics"].values()) * r["count"] for r in mine)
        ttotal = sum(r["torch_ms"] * r["count"] for r in mine)
        print(f"== {model} bs{n} {precision} {op}: polykit best {best:.3f} ms vs torch {ttotal:.3f} ms over "
              f"{sum(r['count'] for r in mine)} layers = {best / ttotal:.2f}x", flush=True)
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
    parser.add_argument("--pointwise", default="", help="zoo model:batch list: time its 1x1 convolutions' tiles")
    parser.add_argument("--se", action="append", default=[], help=f"model:batch:precision, model one of "
                        f"{', '.join(SE_SHAPES)}: time the squeeze-excitation scale and pool tactics (repeatable)")
    parser.add_argument("--norm", action="append", default=[],
                        help="ROWS,L[,rms][,fp16|bf16|fp32]: time the LayerNorm / RMSNorm tactics (repeatable)")
    parser.add_argument("--conv", action="append", default=[],
                        help="N,H,W,C,K,R[,stride][,silu]: every ConvNHWC tactic of that fp16 conv against torch (repeatable)")
    parser.add_argument("--only", default="", help="--conv: only the tactics whose name holds this (for ncu)")
    parser.add_argument("--fp8", action="append", default=[],
                        help="N,H,W,C,K,R[,stride][,f16|e4m3|f32]: every FP8 tactic of that conv against fp16 and torch")
    parser.add_argument("--resize", action="append", default=[],
                        help="N,C,H,W,OH,OW[,linear|nearest]: time cuda.resize (fp16) against torch's interpolate (repeatable)")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    results = {}
    for spec in args.attention:
        shape = tuple(int(x) for x in spec.split(","))
        results[f"attention:{args.attention_dtype}:{spec}"] = bench_attention(shape, args, torch)
    for case in filter(None, args.pointwise.split(",")):
        name, batch = case.split(":")
        results[f"pointwise:{case}"] = bench_pointwise(name, int(batch), args, torch)
    for spec in args.se:
        results[f"se:{spec}"] = bench_squeeze_excitation(spec, args, torch)
    for spec in args.norm:
        results[f"norm:{spec}"] = bench_norm(spec, args, torch)
    for spec in args.conv:
        results[f"conv:{spec}"] = bench_conv(spec, args, torch)
    for spec in args.resize:
        results[f"resize:{spec}"] = bench_resize(spec, args, torch)
    for spec in args.fp8:
        results[f"fp8:{spec}"] = bench_fp8(spec, args, torch)
    for case in filter(None, args.cases.split(",")):
        name, batch, precision, *size = case.split(":")  # an optional fourth field: the image size
        results[case] = bench_case(name, int(batch), precision, args, torch, *map(int, size))
    meta = provenance.meta(torch, cudnn=torch.backends.cudnn.version())
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(meta)


if __name__ == "__main__":
    main()
