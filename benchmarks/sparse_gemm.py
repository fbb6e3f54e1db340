"""2:4 sparse GEMM (cuda.gemm.sparse24, mma.sp) against the dense fp16 GEMM tactics, per shape.

    PYTHONPATH=. python3 benchmarks/sparse_gemm.py [--set resnet50,bert] [--batch 8] [--out sparse.json]
        [--warmup 20] [--iters 200] [--level 3]

Shapes: the 1x1 convolutions of ResNet-50 as GEMMs (M = batch x output pixels, K = input channels,
N = output channels; bottleneck and downsample convs, each distinct shape once) and BERT-base's
linear layers (768x768, 768x3072, 3072x768) at M = 8 x 128. For each: a model X[M, K] @ W[K, N]
with a random weight pruned to 2:4 along K (polykit.compiler.plan.sparse24.prune), built --fp16 on
the cuda target with float16 engine I/O (the plan is the one GEMM layer) three times: dense (--sparsity disable: the builder's timed choice among the dense
tactics), sparse (--sparsity enable, the layer pinned to cuda.gemm.sparse24 by a tactic replay),
and auto (--sparsity enable, the builder's own choice: whether the sparse candidate won its timing).
Each plan runs bound to torch tensors (one enqueue a call, CUDA-event median of --iters after
--warmup): for one small layer that time is the host's launch (~65 us on the H200 machine, whatever
the shape), so each row also gives the auto build's own timings of the dense and sparse tactics
(its timing cache: the tuner times replicated layers, the kernels' times). The sparse output is
compared with the dense one (relative norm). JSON rows to --out.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import provenance
from benchmarks.cuda_timing import bind_plan, time_cuda

#: ResNet-50's 1x1 convs at one image: (output pixels, K = Cin, N = Cout), each distinct shape once
RESNET50 = [(3136, 64, 64), (3136, 64, 256), (3136, 256, 64), (3136, 256, 128), (784, 128, 512), (784, 512, 128),
            (784, 256, 512), (784, 512, 256), (196, 256, 1024), (196, 1024, 256), (196, 512, 1024),
            (196, 1024, 512), (49, 512, 2048), (49, 2048, 512), (49, 1024, 2048)]
#: BERT-base's linear layers: (K, N) at M = 8 sequences x 128 tokens
BERT = [(768, 768), (768, 3072), (3072, 768)]


def shapes(sets: list[str], batch: int) -> list[tuple[str, int, int, int]]:
    out = []
    if "resnet50" in sets:
        out += [("resnet50", batch * pixels, k, n) for pixels, k, n in RESNET50]
    if "bert" in sets:
        out += [("bert", 8 * 128, k, n) for k, n in BERT]
    return out


def matmul_model(m: int, k: int, n: int, seed: int):
    from onnx import TensorProto, helper, numpy_helper

    from polykit.compiler.plan.sparse24 import prune

    w = prune((np.random.default_rng(seed).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), axis=0)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="gemm")], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                              [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tuner_times(cache: Path) -> dict[str, float]:
    """The auto build's own timings of the one GEMM layer (its timing cache): the best dense tactic's
    and the sparse tactic's milliseconds. These are the kernel times (the tuner replicates the layer
    so launches overlap); a one-layer plan's enqueue, timed alone, is bound by the host's launch."""
    entries = json.loads(cache.read_text())["entries"].values()
    dense = [e["ms"] for e in entries if e["tactic"] != "cuda.gemm.sparse24"]
    sparse = [e["ms"] for e in entries if e["tactic"] == "cuda.gemm.sparse24"]
    return {**({"tuner_dense_ms": min(dense)} if dense else {}), **({"tuner_sparse_ms": min(sparse)} if sparse else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="resnet50,bert", help="comma-separated: resnet50, bert")
    parser.add_argument("--batch", type=int, default=8, help="images of the ResNet-50 GEMMs (M = batch x pixels)")
    parser.add_argument("--level", type=int, default=3, help="builder optimization level of the builds")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    rows = []
    for i, (family, m, k, n) in enumerate(shapes(args.set.split(","), args.batch)):
        model = matmul_model(m, k, n, seed=i)
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        row = {"set": family, "M": m, "K": k, "N": n}
        outs = {}
        builds = (("dense", {}), ("sparse", {"sparsity": "enable", "tactic_replay": {"gemm": "cuda.gemm.sparse24"}}),
                  ("auto", {"sparsity": "enable"}))
        for name, extra in builds:
            cache = Path(tempfile.mkdtemp()) / "timing.json" if name == "auto" else None
            plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=args.level,
                                                   input_io_formats=("fp16:chw",), output_io_formats=("fp16:chw",),
                                                   save_timing_cache=cache, **extra))
            if cache is not None:
                row.update(tuner_times(cache))
            bound = bind_plan(plan, {"x": x}, torch)
            row[f"{name}_ms"] = time_cuda(bound.run, torch, args.warmup, args.iters)
            row[f"{name}_tactic"] = plan.metadata["tactics"]["gemm"]
            outs[name] = bound.out.float().clone()
            bound.close()
        ref = outs["dense"]
        row["rel_diff"] = float(torch.linalg.norm(outs["sparse"] - ref) / torch.linalg.norm(ref))
        row["sparse_speedup"] = row["dense_ms"] / row["sparse_ms"]
        rows.append(row)
        print(f"{family:8s} M={m:6d} K={k:5d} N={n:5d}  dense {row['dense_ms'] * 1e3:8.1f} us ({row['dense_tactic']})"
              f"  sparse {row['sparse_ms'] * 1e3:8.1f} us  {row['sparse_speedup']:.2f}x  auto -> {row['auto_tactic']}"
              f"  | tuner: dense {row.get('tuner_dense_ms', float('nan')) * 1e3:7.1f} us"
              f"  sparse {row.get('tuner_sparse_ms', float('nan')) * 1e3:7.1f} us  rel diff {row['rel_diff']:.2e}")
    if args.out:
        args.out.write_text(json.dumps({**provenance.meta(torch), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
