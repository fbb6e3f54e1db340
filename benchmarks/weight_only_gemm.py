"""W4A16 / W8A16 weight-only GEMM (WeightOnlyMatMul, weight_only.cu) against the fp16 GEMM, small M.

    PYTHONPATH=. python3 benchmarks/weight_only_gemm.py [--n 4096 --k 4096] [--ms 1,2,4,8,16]
        [--weight int4] [--block 128] [--chain L] [--pdl off|on|both] [--torch off|eager|compile|all]
        [--out wo.json]

For each M: a float16 model X[M, K] -> DequantizeLinear(W int4 [K, N], blocked along K) -> MatMul,
built twice on the cuda target: as is (the weight packed, WeightOnlyMatMul, every m<ROWS> tactic
timed by the builder) and with the MatMul pinned to float (`fp32_layers`: the dequantize folded
into a float16 weight, the fp16 GEMM tactics). Both plans run bound to torch tensors (one enqueue a
call, CUDA-event median of --iters after --warmup: at these sizes mostly the host's launch of a
one-layer plan) and profiled (`profile_engine`: CUDA events around each layer, its median over
--profile-runs: the kernels' own time, which the speed target is about); the outputs are compared
(relative norm) and the plan weight bytes printed. The issue's target (35, point 3): >= 2.5x the fp16 GEMM at
N = K = 4096, M = 1..16, weights 4x smaller.

`--chain L` (N == K) also times a decoder's form: L such layers one after another, each with its own weight (so
the weights do not stay in L2 from one to the next), as one plan, queued back to back (`time_cuda_queued`, 10 plan
runs between two events): the plan's time over L is a layer's steady-state time with neither the host's launch
nor a per-layer event pair in it, for the weight-only plan and its fp16 twin alike. `--pdl on|both` loads the
chain's engines with Programmatic Dependent Launch (sm_90+; both: each plan timed without and with it).

`--torch` (default off) times torch's side in the same process, for each M beside polykit's (and, with --chain, its
chain form: L layers, each its own weight): `eager` torch's fp16 `x @ w` (x [M, K] float16, w the same weights
dequantized to a float16 [K, N] tensor: the file's own models, read back by `weight_layers`), `compile` the same
layers as one torch.compile(mode="reduce-overhead") module (weights as parameters, so its CUDA graph does not copy
them; warmed up before timing), `all` both and torch's own int4 GEMM, `torch._weight_int4pack_mm` (tinygemm:
bfloat16 activations, the weight from `_convert_weight_to_int4pack` with 8 inner k-tiles, group size --block; int4 /
uint4 weights only). tinygemm's convention (torchao's tensor-core tiled layout, gpt-fast's WeightOnlyInt4Linear): the
weight [N, K] as uint4 0..15, two a byte (even k in the high nibble; torch >= 2.5, older torch takes int32 [N, K] and
records an error here), dequantized as (q_u - 8) * scale + zero with scales and zeros [K / block, N, 2] bfloat16;
ONNX's (q - z) * s is fed as q_u = q + 8 (int4; uint4 as is) and zero = -z * s (int4; uint4: (8 - z) * s),
exact up to bfloat16's rounding of s and z * s (`tinygemm_operands`). Its output is checked against the bfloat16
dequantized reference (`torch_int4pack_rel_diff`), torch's fp16 outputs against polykit's fp16 GEMM plan (the same
weights); a torch side that raises (a missing op, a changed signature, an unsupported group size) records
{"torch_<side>": {"error": "<type>: <message>"}} and the run goes on. torch's time is a layer's: the CUDA-event median
of 10 calls queued back to back (`time_cuda_queued`), over L for the chain; polykit's W4A16 against each
(`torch_ratios`: torch's time over polykit's, > 1 polykit faster) is `w4a16_vs_torch_<side>` against the layer's own
time (weight_only_layers_ms) and `w4a16_chain[_pdl]_vs_torch_<side>` against the chain's layer. One layer timed again
and again keeps its weights in L2 (fp16's 32 MiB fit an H100's 50 MiB), on both sides; the chain's do not. The JSON's
`torch` holds torch.__version__ (provenance.meta).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks import provenance
from benchmarks.cuda_timing import bind_plan, time_cuda, time_cuda_queued

#: --torch -> torch's sides timed
TORCH_SIDES = {"off": (), "eager": ("fp16_eager",), "compile": ("fp16_compile",),
               "all": ("fp16_eager", "fp16_compile", "int4pack")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--ms", default="1,2,4,8,16")
    parser.add_argument("--weight", default="int4", choices=["int4", "uint4", "float4_e2m1fn", "int8", "uint8"])
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--profile-runs", type=int, default=20, help="profiled runs for the layers' own time")
    parser.add_argument("--level", type=int, default=5, help="builder optimization level (0: no tactic timing, "
                        "the first tactic by priority: what ncu should see)")
    parser.add_argument("--chain", type=int, default=0, metavar="L",
                        help="also time L layers one after another (N == K), a layer's time = the plan's / L")
    parser.add_argument("--pdl", default="off", choices=["off", "on", "both"],
                        help="the chain's engines with Programmatic Dependent Launch (sm_90+): off, on, or both timed")
    parser.add_argument("--torch", default="off", choices=list(TORCH_SIDES),
                        help="also time torch in the same run: fp16 eager, torch.compile, or all (those and "
                             "torch._weight_int4pack_mm)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.chain and args.n != args.k:
        parser.error("--chain needs --n equal to --k (each layer's output is the next one's input)")
    return args


def main() -> None:
    args = parse_args()
    sides = TORCH_SIDES[args.torch]

    import torch

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.tools.bench.benchmark import profile_engine
    from tests.compiler.weight_only_models import weight_only

    if sides:
        print(f"torch {torch.__version__}", flush=True)
    rows, torch_one, torch_chain = [], None, None
    for m in (int(v) for v in args.ms.split(",")):
        proto = weight_only(args.weight, k=args.k, n=args.n, block=args.block, x_shape=(m, None), elem="float16")
        model = load_onnx(proto)
        x = torch.randn(m, args.k, device="cuda", dtype=torch.float16)
        row = {"M": m, "N": args.n, "K": args.k, "weight": args.weight, "block": args.block}
        outs = {}
        for name, extra in (("weight_only", {}), ("fp16_gemm", {"fp32_layers": ("fc",)})):
            plan = build_plan(model, BuilderConfig(target="cuda", builder_optimization_level=args.level, **extra))
            bound = bind_plan(plan, {"x": x}, torch)
            row[f"{name}_ms"] = time_cuda(bound.run, torch, args.warmup, args.iters)
            # the layers' own time (CUDA events around each layer of a profiled run): at these sizes the
            # enqueue above is the host's launch of a one-layer plan (~70 us), not the kernel
            summary = profile_engine(bound.engine, {"x": x.cpu().numpy()}, args.profile_runs)
            row[f"{name}_layers_ms"] = summary.total_ms  # each layer's median over the runs, summed
            row[f"{name}_weight_bytes"] = sum(int(w.nbytes) for w in plan.weights.values())
            row[f"{name}_tactics"] = sorted(set(plan.metadata["tactics"].values()))
            outs[name] = bound.out.float().clone()
            bound.close()
        ref = outs["fp16_gemm"]
        row["rel_diff"] = float(torch.linalg.norm(outs["weight_only"] - ref) / torch.linalg.norm(ref))
        row["speedup"] = row["fp16_gemm_ms"] / row["weight_only_ms"]
        row["layer_speedup"] = row["fp16_gemm_layers_ms"] / row["weight_only_layers_ms"]
        if sides:
            torch_one = torch_one or torch_weights(weight_layers(proto), args.weight, torch)
            row.update(time_torch(sides, torch_one, x, args, torch, "", ref))
        if args.chain:
            chain_proto = weight_only_chain(args.weight, args.k, args.chain, args.block, m)
            chain = load_onnx(chain_proto)
            fp32_layers = tuple(f"fc{i}" for i in range(args.chain))
            modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.pdl]
            chain_outs = {}
            for name, extra in (("weight_only", {}), ("fp16_gemm", {"fp32_layers": fp32_layers})):
                plan = build_plan(chain, BuilderConfig(target="cuda", builder_optimization_level=args.level, **extra))
                for pdl in modes:
                    bound = bind_plan(plan, {"x": x}, torch, pdl=pdl)
                    per_layer = time_cuda_queued(bound.run, torch, args.warmup, max(5, args.iters // 10),
                                                 10) / args.chain
                    row[f"{name}_chain{'_pdl' if pdl else ''}_layer_ms"] = per_layer
                    chain_outs[name, pdl] = chain_ref = bound.out.float().clone()  # the fp16 plan's, the last bound
                    bound.close()
                row[f"{name}_chain_tactics"] = sorted(set(plan.metadata["tactics"].values()))
            row.update(chain_checks(chain_outs, torch))
            row["chain_layers"] = args.chain
            for suffix in ("_pdl" if pdl else "" for pdl in modes):
                row[f"chain{suffix}_speedup"] = (row[f"fp16_gemm_chain{suffix}_layer_ms"]
                                                 / row[f"weight_only_chain{suffix}_layer_ms"])
            if sides:
                torch_chain = torch_chain or torch_weights(weight_layers(chain_proto), args.weight, torch)
                row.update(time_torch(sides, torch_chain, x, args, torch, "_chain", chain_ref))
        row.update(torch_ratios(row))
        rows.append(row)
        print(f"M={m:3d} weight-only {row['weight_only_ms'] * 1e3:8.1f} us  fp16 GEMM {row['fp16_gemm_ms'] * 1e3:8.1f} us"
              f"  {row['speedup']:.2f}x  weights {row['weight_only_weight_bytes']:,} vs {row['fp16_gemm_weight_bytes']:,}"
              f" B  rel diff {row['rel_diff']:.2e}  {row['weight_only_tactics']} | layers alone: weight-only "
              f"{row['weight_only_layers_ms'] * 1e3:.1f} us, fp16 GEMM {row['fp16_gemm_layers_ms'] * 1e3:.1f} us, "
              f"{row['layer_speedup']:.2f}x", flush=True)
        if "chain_rel_diff" in row or any(k.endswith("_nonfinite") for k in row):
            checks = {k: row[k] for k in row if k.endswith(("_nonfinite", "_pdl_identical")) or k == "chain_rel_diff"}
            print(f"      chain checks: {checks}", flush=True)
        for suffix, mode in (("", "PDL off"), ("_pdl", "PDL on")):
            if f"chain{suffix}_speedup" in row:
                print(f"      chain of {args.chain}, a layer queued back to back, {mode}: weight-only "
                      f"{row[f'weight_only_chain{suffix}_layer_ms'] * 1e3:.1f} us {row['weight_only_chain_tactics']}, "
                      f"fp16 GEMM {row[f'fp16_gemm_chain{suffix}_layer_ms'] * 1e3:.1f} us, "
                      f"{row[f'chain{suffix}_speedup']:.2f}x", flush=True)
        for line in torch_lines(row, sides):
            print(line, flush=True)
    if args.out:
        args.out.write_text(json.dumps({**provenance.meta(torch), "rows": rows}, indent=1))


def chain_checks(outs: dict, torch) -> dict:
    """What the chains computed (outs: (form, pdl) -> the chain's output, float32): each output's non-finite count,
    whether PDL changed a form's output (it must not: the same kernels in the same order), and the weight-only chain
    against the fp16 one (relative norm difference, PDL off where it ran)."""
    out = {f"{name}_chain{'_pdl' if pdl else ''}_nonfinite": int((~torch.isfinite(y)).sum()) for (name, pdl), y in
           outs.items()}
    for name in ("weight_only", "fp16_gemm"):
        if (name, False) in outs and (name, True) in outs:
            out[f"{name}_chain_pdl_identical"] = bool(torch.equal(outs[name, False], outs[name, True]))
    pdl = False if ("fp16_gemm", False) in outs else True
    if ("weight_only", pdl) in outs and ("fp16_gemm", pdl) in outs:
        w, f = outs["weight_only", pdl], outs["fp16_gemm", pdl]
        out["chain_rel_diff"] = float(torch.linalg.norm(w - f) / torch.linalg.norm(f))
    return out


def torch_ratios(row: dict) -> dict:
    """polykit's W4A16 against each torch time in `row` (torch's over polykit's, > 1: polykit faster): one layer
    against the layer's own time (profiled), the chain's layer (PDL off, and on where timed) against torch's."""
    ratios = {}
    for side in TORCH_SIDES["all"]:
        pairs = [("", f"torch_{side}_ms", "weight_only_layers_ms")]
        pairs += [(f"_chain{pdl}", f"torch_{side}_chain_layer_ms", f"weight_only_chain{pdl}_layer_ms")
                  for pdl in ("", "_pdl")]
        for tag, theirs, ours in pairs:
            if isinstance(row.get(theirs), float) and row.get(ours):
                ratios[f"w4a16{tag}_vs_torch_{side}"] = row[theirs] / row[ours]
    return ratios


def torch_lines(row: dict, sides) -> list[str]:
    """The printed lines of torch's side of one row: one layer, then the chain's layer (where timed); a side
    that raised prints its error."""
    lines = []
    for tag, what, ms in (("", "one layer", "_ms"), ("_chain", f"chain of {row.get('chain_layers')}, a layer",
                                                     "_chain_layer_ms")):
        parts = []
        for side in sides:
            if isinstance(row.get(f"torch_{side}{tag}"), dict):
                parts.append(f"{side} {row[f'torch_{side}{tag}']['error'][:160]}")
            elif f"torch_{side}{ms}" in row:
                ratios = [f"{row[key]:.2f}x" + (" PDL on" if "_pdl" in key else "")
                          for key in (f"w4a16{tag}_vs_torch_{side}", f"w4a16{tag}_pdl_vs_torch_{side}") if key in row]
                diff = row.get(f"torch_{side}{tag}_rel_diff")
                parts.append(f"{side} {row[f'torch_{side}{ms}'] * 1e3:.1f} us"
                             + (f" (rel diff {diff:.2e})" if diff is not None else "") + f", W4A16 {' '.join(ratios)}")
        if parts:
            lines.append(f"      torch {what}: " + " | ".join(parts))
    return lines


def weight_layers(model) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """Each DequantizeLinear of `model` (an ONNX ModelProto; its weight blocked along K: axis 0, block_size), in
    graph order, as (q [K, N] float32: the stored integers or FP4 values, scale and zero [ceil(K / block), N]
    float32 (zero 0 where the node has none), block)."""
    from onnx import helper, numpy_helper

    from polykit.errors import PolykitError

    inits = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in model.graph.initializer}
    layers = []
    for node in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("axis") != 0 or not attrs.get("block_size"):
            raise PolykitError(f"DequantizeLinear attributes {attrs}: not blocked along K", where=f"node {node.name!r}",
                               hint="weight_layers reads weights blocked along axis 0 (the file's own models)")
        q, scale = inits[node.input[0]], inits[node.input[1]]
        zero = inits[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros_like(scale)
        layers.append((q, scale, zero, attrs["block_size"]))
    return layers


def dequantize(q: np.ndarray, scale: np.ndarray, zero: np.ndarray, block: int) -> np.ndarray:
    """DequantizeLinear blocked along K: (q - zero) * scale, float32 [K, N]."""
    k = q.shape[0]
    return (q - np.repeat(zero, block, axis=0)[:k]) * np.repeat(scale, block, axis=0)[:k]


def tinygemm_operands(q: np.ndarray, scale: np.ndarray, zero: np.ndarray, block: int,
                      weight: str) -> tuple[np.ndarray, np.ndarray]:
    """`dequantize`'s weight in torch._weight_int4pack_mm's terms: the weight transposed, [N, K] uint4 values
    q_u two a byte (uint8 [N, K / 2], even k in the high nibble), and scales and zeros [K / block, N, 2] float32
    such that (q_u - 8) * scale + zero = (q - z) * s: q_u = q + 8 for int4 (uint4 as stored), zero = -z * s for
    int4 ((8 - z) * s for uint4)."""
    from polykit.errors import PolykitError

    if weight not in ("int4", "uint4") or q.shape[0] % block or q.shape[0] % 2:
        raise PolykitError(f"torch's int4 GEMM takes int4 / uint4 weights with K a multiple of the block, not "
                           f"{weight} K={q.shape[0]} block={block}", where="tinygemm_operands",
                           hint="run with --weight int4 (or uint4) and --block dividing --k")
    shift = 8 if weight == "int4" else 0
    q_u = (q.T + shift).astype(np.uint8)
    packed = (q_u[:, ::2] << 4) | q_u[:, 1::2]
    return np.ascontiguousarray(packed), np.stack([scale, (8 - shift - zero) * scale], axis=-1)


def torch_weights(layers, weight: str, torch) -> dict:
    """The CUDA tensors of `layers` (weight_layers'): "fp16" each layer's float16 [K, N] weight; "int4pack" each
    layer's (packed weight, bfloat16 scales and zeros, block), or the exception that stopped packing them."""
    fp16 = [torch.from_numpy(dequantize(*layer)).to("cuda", torch.float16) for layer in layers]
    try:
        packs = []
        for q, scale, zero, block in layers:
            packed, scales_zeros = tinygemm_operands(q, scale, zero, block, weight)
            packs.append((torch.ops.aten._convert_weight_to_int4pack(torch.from_numpy(packed).cuda(), 8),
                          torch.from_numpy(scales_zeros).to("cuda", torch.bfloat16), block))
    except Exception as exc:  # a torch failure is a result, not the end of the run
        packs = exc
    return {"fp16": fp16, "int4pack": packs}


def torch_callable(side: str, weights: dict, x, torch):
    """(run, reference) of one torch side over every layer of `weights` (torch_weights'): run() takes x through
    them one after another; reference the bfloat16 dequantized output for the int4 GEMM, else None."""
    layers = weights["fp16"]
    if side == "int4pack":
        if isinstance(weights["int4pack"], Exception):
            raise weights["int4pack"]
        mm, xb, ref = torch.ops.aten._weight_int4pack_mm, x.bfloat16(), x.bfloat16()
        for w in layers:
            ref = ref @ w.bfloat16()

        def run():
            h = xb
            for packed, scales_zeros, block in weights["int4pack"]:
                h = mm(h, packed, block, scales_zeros)
            return h

        return run, ref
    if side == "fp16_eager":
        def run():
            h = x
            for w in layers:
                h = h @ w
            return h

        return run, None

    class Layers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = torch.nn.ParameterList(torch.nn.Parameter(w, requires_grad=False) for w in layers)

        def forward(self, h):
            for w in self.ws:
                h = h @ w
            return h

    torch._dynamo.reset()  # each M and form its own compile (not one cache across them, nor its recompile limit)
    compiled = torch.compile(Layers(), mode="reduce-overhead")
    for _ in range(3):  # compile, record the CUDA graph
        compiled(x)
    return (lambda: compiled(x)), None


def time_torch(sides, weights: dict, x, args, torch, tag: str, polykit_fp16) -> dict:
    """torch's side of one M (`tag` "" one layer, "_chain" the chain): each of `sides` a layer's ms (CUDA-event
    median of 10 calls queued back to back, over the layers) and its output's relative norm difference (the int4
    GEMM against the bfloat16 dequantized reference, fp16 against `polykit_fp16`, polykit's fp16 GEMM plan's); a
    side that raises records {"error": "<type>: <message>"} under torch_<side><tag>."""
    results = {}
    for side in sides:
        try:
            with torch.no_grad():  # not inference_mode: its tensors could not become the compiled module's weights
                run, ref = torch_callable(side, weights, x, torch)
                out = run().float()
                ref = (ref if ref is not None else polykit_fp16).float()
                results[f"torch_{side}{tag}_rel_diff"] = float(torch.linalg.norm(out - ref) / torch.linalg.norm(ref))
                ms = time_cuda_queued(run, torch, args.warmup, max(5, args.iters // 10), 10) / len(weights["fp16"])
            results[f"torch_{side}{'_chain_layer_ms' if tag else '_ms'}"] = ms
        except Exception as exc:  # a torch failure is a result, not the end of polykit's timings
            results.pop(f"torch_{side}{tag}_rel_diff", None)
            results[f"torch_{side}{tag}"] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


def weight_only_chain(weight: str, k: int, layers: int, block: int, m: int, seed: int = 0):
    """x [m, k] float16 -> `layers` x (DequantizeLinear(W_i [k, k], blocked along K) -> MatMul, named fc<i>) -> y:
    each layer its own weight, scales about 1 / (sqrt(k) * the weights' spread) so the values keep their size
    from layer to layer (float16 neither overflows nor vanishes)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from tests.compiler.weight_only_models import TYPES, quantized

    rng = np.random.default_rng(seed)
    _, bounds, opset = TYPES[weight]
    spread = (bounds[1] - bounds[0] + 1) / 12 ** 0.5 if bounds else 3.0
    inits, nodes, prev = [], [], "x"
    for i in range(layers):
        scales = rng.uniform(0.5, 1.5, (-(-k // block), k)) / (k ** 0.5 * spread)
        inits += [quantized(f"w{i}", weight, (k, k), rng), numpy_helper.from_array(scales.astype(np.float16), f"s{i}")]
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", f"s{i}"], [f"wf{i}"], name=f"dq{i}", axis=0,
                                   block_size=block),
                  helper.make_node("MatMul", [prev, f"wf{i}"], ["y" if i == layers - 1 else f"h{i}"], name=f"fc{i}")]
        prev = f"h{i}"
    graph = helper.make_graph(nodes, f"weight_only_chain_{weight}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [m, k])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10 if opset < 23 else 11)


if __name__ == "__main__":
    main()
