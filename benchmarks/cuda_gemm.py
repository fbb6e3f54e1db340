"""Time polykit's GEMM tactics against torch.matmul, shape by shape, in one process.

    PYTHONPATH=. python3 benchmarks/cuda_gemm.py [--shapes bert,square] [--dtype fp16] [--out gemm.json]

For each (M, N, K) and B layout ("kn": MatMul with B [K, N]; "nk": Gemm transB with B [N, K])
it runs every cuda GEMM tactic that supports the layer (outputs checked against torch.matmul
in fp32: relative error printed) and times it as the engine runs it: three calls (inputs
rotated over 3 buffer sets so L2 does not hold them) captured in a CUDA graph, the replay timed
with CUDA events (warm-up, then the median of --iters replays, divided by 3); torch.matmul on the
same operands (torch's own layout for B) is timed the same way. Prints TFLOP/s per tactic, the best tactic and
its ratio to torch; writes JSON with date, device, commit and torch version.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from benchmarks import provenance

SHAPES = {
    "square": [(4096, 4096, 4096), (8192, 8192, 8192)],
    # BERT-base, seq 128: batch 8 (M = 1024) and batch 1 (M = 128); Q/K/V/out, FFN1, FFN2
    "bert": [(1024, 768, 768), (1024, 3072, 768), (1024, 768, 3072), (128, 768, 768), (128, 3072, 768),
             (128, 768, 3072)],
    "odd": [(1000, 1000, 1000), (77, 264, 72)],
    # BERT-base bs1 seq 128 (M = 128): Q/K/V fused, out, FFN1, FFN2: 6 to 24 tiles of 128x128 for 132 SMs
    "bert1": [(128, 2304, 768), (128, 768, 768), (128, 3072, 768), (128, 768, 3072)],
    # the dynamic BERT plan's small shapes (batch x seq 1x16, 2x32, 4x77): M 16, 64, 308
    "bert_small": [(16, 768, 768), (16, 768, 3072), (64, 3072, 768), (308, 768, 768), (308, 768, 3072)],
    # wave quantization with a long K (stream-K): 133 tiles of 128x256 (266 of 128x128, 182 of
    # 128x192), 133 of 128x128, 100 of 128x256 (200 of 128x128) for 132 SMs
    "waves": [(896, 4864, 4096), (896, 2432, 8192), (1280, 2560, 3072)],
}


def time_graph(fn, torch, warmup: int, iters: int) -> float:
    """Median ms of one fn(i) call: fn(0), fn(1), fn(2) captured in one CUDA graph and replayed."""
    fn(0)  # eager once (module loads, lazy init) before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(3):
            fn(i)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 3)
    return statistics.median(times)


#: fused epilogues to time (docs/FUSION.md bodies): extra inputs by name -> shape builder
EPILOGUES = {
    "none": ([], {}),
    "bias": ([{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["Y"], "attrs": {}}], {"bias": lambda M, N: (N,)}),
    "bias_gelu": ([{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
                   {"op": "Gelu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}], {"bias": lambda M, N: (N,)}),
    "bias_residual": ([{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
                       {"op": "Add", "inputs": ["s", "res"], "outputs": ["Y"], "attrs": {}}],
                      {"bias": lambda M, N: (N,), "res": lambda M, N: (M, N)}),
}


#: a timed result farther than this (relative norm) from the float32 reference is marked WRONG
WRONG_REL = {"fp16": 5e-3, "bf16": 2e-2, "tf32": 5e-3, "fp32": 1e-4}
#: each epilogue's float32 reference from the GEMM's float32 result and the extra inputs (torch)
EPILOGUE_REFS = {
    "none": lambda torch, raw, e: raw,
    "bias": lambda torch, raw, e: raw + e["bias"].float(),
    "bias_gelu": lambda torch, raw, e: torch.nn.functional.gelu(raw + e["bias"].float()),
    "bias_residual": lambda torch, raw, e: raw + e["bias"].float() + e["res"].float(),
}


def bench_shape(M: int, N: int, K: int, layout: str, dtype, torch, args, epilogue: str = "none") -> list[dict]:
    from dataclasses import replace

    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import candidates
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules

    info = driver.current_device()
    npd = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]
    precision = args.precision
    sets = [(torch.randn(M, K, device="cuda").to(dtype),
             torch.randn(*((K, N) if layout == "kn" else (N, K)), device="cuda").to(dtype)) for _ in range(3)]
    y = torch.empty(M, N, device="cuda", dtype=dtype)
    body, extra_shapes = EPILOGUES[epilogue]
    extras = {n: torch.randn(*f(M, N), device="cuda").to(dtype) for n, f in extra_shapes.items()}
    epi = {"epilogue": {"input": "raw", "body": body}} if body else {}
    domain = "ai.polykit" if body else ""
    if layout == "kn":
        layer = LayerDesc("mm", "MatMul", ("A", "B", *extras), ("Y",), dict(epi), domain=domain, precision=precision)
    else:
        layer = LayerDesc("mm", "Gemm", ("A", "B", "", *extras) if extras else ("A", "B"), ("Y",),
                          {"transB": 1, **epi}, domain=domain, precision=precision)
    ins = [tuple(sets[0][0].shape), tuple(sets[0][1].shape)] + ([()] if layout != "kn" and extras else [])
    ins += [tuple(t.shape) for t in extras.values()]
    layer = replace(layer, in_dtypes=tuple(npd if i else "" for i in layer.inputs), out_dtypes=(npd,),
                    in_shapes=tuple(ins), out_shapes=((M, N),))
    flops = 2.0 * M * N * K
    rows = []
    ref = sets[0][0].float() @ (sets[0][1].float() if layout == "kn" else sets[0][1].float().T)
    ref = EPILOGUE_REFS[epilogue](torch, ref, extras)
    workspace = []

    def take(nbytes: int) -> int:
        workspace.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        return workspace[-1].data_ptr()

    wanted = [p for p in args.tactics.split(",") if p]
    for tactic in candidates("cuda", layer.kind, layer):
        if wanted and not any(tactic.name.startswith(p) for p in wanted):
            continue
        modules = KernelModules(info.arch)
        try:
            modules.load(tactic.kernels(layer))
            def launcher():  # on the current stream: the capture stream inside torch.cuda.graph
                stream = driver.drv().CUstream(torch.cuda.current_stream().cuda_stream)
                return CudaLauncher(modules, stream, take, "mm", sm_count=info.sm_count)

            tensors = [{"A": DeviceTensor(a.data_ptr(), tuple(a.shape), np.dtype(npd)),
                        "B": DeviceTensor(b.data_ptr(), tuple(b.shape), np.dtype(npd)),
                        "Y": DeviceTensor(y.data_ptr(), (M, N), np.dtype(npd)),
                        **{n: DeviceTensor(t.data_ptr(), tuple(t.shape), np.dtype(npd)) for n, t in extras.items()}}
                       for a, b in sets]
            y.fill_(float("nan"))
            tactic.enqueue(layer, launcher(), tensors[0])
            torch.cuda.synchronize()
            rel = float((y.float() - ref).norm() / ref.norm())  # NaN if any element was left unwritten
            ms = time_graph(lambda i: tactic.enqueue(layer, launcher(), tensors[i]), torch, args.warmup, args.iters)
            rows.append({"tactic": tactic.name, "ms": ms, "tflops": flops / ms / 1e9, "rel_err": rel})
        except Exception as exc:  # one failing tactic must not hide the others
            rows.append({"tactic": tactic.name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        finally:
            torch.cuda.synchronize()
            modules.close()
            workspace.clear()
    if layout == "kn":
        tms = time_graph(lambda i: torch.matmul(sets[i][0], sets[i][1], out=y), torch, args.warmup, args.iters)
    else:
        tms = time_graph(lambda i: torch.matmul(sets[i][0], sets[i][1].T, out=y), torch, args.warmup, args.iters)
    rows.append({"tactic": "torch.matmul", "ms": tms, "tflops": flops / tms / 1e9, "rel_err": 0.0})
    return rows


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="square,bert")
    parser.add_argument("--layouts", default="kn,nk")
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32", "tf32"],
                        help="fp32: float32 storage, strict fp32 math (torch's allow_tf32 off); tf32: float32 "
                        "storage, tf32 tensor-core math (torch's allow_tf32 on)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tactics", default="", help="comma-separated tactic name prefixes to time (default all)")
    parser.add_argument("--epilogues", default="none", help=f"comma-separated, of {', '.join(EPILOGUES)}")
    parser.add_argument("--only", default="", help="these MxNxK shapes (comma-separated) instead of --shapes")
    parser.add_argument("--out", default="cuda_gemm.json")
    args = parser.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.dtype, torch.float32)
    args.precision = {"bf16": "bf16", "fp32": "fp32", "tf32": "tf32"}.get(args.dtype, "fp16")
    torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
    results = []
    only = {tuple(int(x) for x in s.split("x")) for s in args.only.split(",") if s}
    shapes = sorted(only) if only else [shape for group in args.shapes.split(",") for shape in SHAPES[group]]
    for M, N, K in shapes:
        for layout in args.layouts.split(","):
            for epilogue in args.epilogues.split(","):
                rows = bench_shape(M, N, K, layout, dtype, torch, args, epilogue)
                results.append({"M": M, "N": N, "K": K, "layout": layout, "epilogue": epilogue, "rows": rows})
                ok = [r for r in rows if "ms" in r and r["tactic"] != "torch.matmul"]
                torch_row = rows[-1]
                best = min(ok, key=lambda r: r["ms"]) if ok else None
                print(f"== {M}x{N}x{K} {layout} {args.dtype} epilogue {epilogue}: torch {torch_row['ms']:.4f} ms "
                      f"{torch_row['tflops']:.0f} TFLOP/s" + (f"; best {best['tactic']} {best['ms']:.4f} ms "
                      f"{best['tflops']:.0f} TFLOP/s = {best['tflops'] / torch_row['tflops']:.2f}x torch" if best else ""),
                      flush=True)
                for r in rows[:-1]:
                    if "error" in r:
                        print(f"   {r['tactic']:26} ERROR {r['error'][:160]}")
                    else:
                        wrong = not r["rel_err"] <= WRONG_REL[args.dtype]  # NaN: unwritten elements
                        print(f"   {r['tactic']:26} {r['ms']:9.4f} ms {r['tflops']:7.1f} TFLOP/s rel {r['rel_err']:.1e}"
                              + ("  WRONG" if wrong else ""))
    meta = provenance.meta(torch, dtype=args.dtype)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(meta)


if __name__ == "__main__":
    main()
