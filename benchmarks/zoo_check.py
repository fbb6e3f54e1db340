"""Host-side check of the zoo, no GPU needed: does every model export, import, lower and run?

    PYTHONPATH=. python3 benchmarks/zoo_check.py [--family conv|transformer|all] [--models a,b]
        [--out zoo_check.json] [--cache-dir .zoo_cache] [--nvrtc sm_90] [--no-run] [--batch N]
        [--cpu-channels-last] [--fp32]

Per model at batch 1 or --batch (zoo.exported: the same prepared weights and ONNX cache as zoo.py): the
nodes `polykit inspect capability --target cuda` finds unsupported, a cuda fp16 (--fp32: fp32) plan at builder
level 0 (lowered and given first-priority tactics, nothing timed: no GPU needed), with --nvrtc
the kernels that plan records compiled by NVRTC for that architecture, and a cpu-target fp32
plan run once against torch fp32 (max abs error / max |ref|; NCHW, or with --cpu-channels-last the
cuda plan's channels-last layout and passes on the reference kernels), and the cuda plan's traffic: the
bytes each layer kind reads and writes and the share of them movement layers move (`traffic`), a
static yardstick for layout and view work that needs no GPU, and its movement layers that are views
and those that copy (`movement_layers`). A cuda plan built on the GPU at
level 3 may pick other tactics, so this proves lowering and kernel sources, not the device run.
Rows are written after every model; an existing --out is resumed.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.zoo import exported, merge, pending, say, select_cases, write_results  # noqa: E402
from benchmarks.zoo_models import FAMILIES, ZooModel  # noqa: E402
from benchmarks.zoo_report import load_results  # noqa: E402


def compile_kernels(plan, arch: str) -> int:
    """Compile every kernel `plan` records with NVRTC for `arch` (through the kernel cache); how many."""
    from polykit.runtime.cuda.nvrtc import compile_cached
    from polykit.runtime.cuda.target import plan_kernels

    sources = {s.key(): s for layer in plan.layers for s in plan_kernels(plan, layer)}
    for source in sources.values():
        compile_cached(source, arch)
    return len(sources)


#: layer kinds that only move bytes (no arithmetic of the model): what issue #30 wants gone as views
MOVEMENT_KINDS = frozenset({"Transpose", "Slice", "Concat", "Split", "Pad", "Expand", "Gather", "Tile", "Reshape",
                            "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "DepthToSpace", "SpaceToDepth",
                            "GatherElements", "ScatterND", "Copy", "PermutedCopy", "Reformat", "ConcatGather"})


#: layer kinds whose output can be their input's bytes (a view in the memory plan)
VIEW_KINDS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
#: layer kinds that read of their data input only what they write (an embedding table's rows, a
#: Slice's or a PermutedCopy's window)
SELECTS = frozenset({"Gather", "GatherElements", "GatherND", "Slice", "PermutedCopy"})
#: an Attention layer's view attributes of Q, K, V (docs/FUSION.md): [offset, *shape, *strides]
VIEW_ATTRS = ("q_view", "k_view", "v_view")


def traffic(plan) -> dict:
    """A static stand-in for where the time goes, no GPU needed: the bytes each layer kind reads and
    writes (its inputs, weights included, and its outputs, each once; views cost nothing, and a Concat
    only its inputs not placed (polykit.compiler.builder.concat_placement), a fully placed one nothing; a gather's,
    slice's or PermutedCopy's data input at most as much as it writes, a ConcatGather's sources together
    too, an Attention's strided view of a packed Q, K or V only its view, a Pointwise view operand only
    its view, a SqueezeExcite that scales its input that input twice), in MB.
    Memory-bound layers take about bytes / bandwidth, so the movement share of these bytes is what
    a movement kernel's share of the GPU time would be if every layer ran at memory speed."""
    aliases = getattr(plan.memory, "aliases", {}) or {}
    placed = getattr(plan.memory, "placements", {}) or {}
    by_kind: dict[str, float] = collections.Counter()
    for layer in plan.layers:
        if _is_view(layer, aliases):
            continue  # a view: the layer copies nothing
        sizes = [plan.tensors[n].nbytes if n in plan.tensors else 0 for n in (*layer.inputs, *layer.outputs)]
        if layer.kind == "Concat" and placed:  # it copies only the inputs not placed, into their slices
            copied = [plan.tensors[n].nbytes for n in layer.inputs if n in plan.tensors and n not in placed]
            sizes = copied + [sum(copied)]
        if layer.kind in SELECTS and layer.inputs and layer.outputs and layer.outputs[0] in plan.tensors:
            sizes[0] = min(sizes[0], plan.tensors[layer.outputs[0]].nbytes)  # it reads what it selects
        if layer.kind == "ConcatGather" and layer.outputs and layer.outputs[0] in plan.tensors:
            n = len(layer.inputs)  # indices, then the sources: together they give what it writes
            sizes[1:n] = [min(sum(sizes[1:n]), plan.tensors[layer.outputs[0]].nbytes)] + [0] * (n - 2)
        for i, attr in enumerate(VIEW_ATTRS if layer.kind == "Attention" else ()):
            raw = layer.attrs.get(attr)  # Q, K or V a strided view of a packed tensor: it reads the view
            if raw is not None and i < len(layer.inputs) and layer.inputs[i] in plan.tensors:
                rank = (len(raw) - 1) // 2
                view_bytes = math.prod(raw[1:1 + rank]) * plan.tensors[layer.inputs[i]].np_dtype.itemsize
                sizes[i] = min(sizes[i], view_bytes)
        for entry in layer.attrs.get("view") or () if layer.kind == "Pointwise" else ():
            i = entry["input"]  # a Pointwise view operand (pass absorb_views): it reads its view
            if i < len(layer.inputs) and layer.inputs[i] in plan.tensors:
                view_bytes = math.prod(math.prod(p[0] for p in d["pieces"]) for d in entry["dims"]) \
                    * plan.tensors[layer.inputs[i]].np_dtype.itemsize
                sizes[i] = min(sizes[i], view_bytes)
        if layer.kind == "SqueezeExcite" and layer.attrs.get("scale") == 1 and sizes:
            sizes[0] *= 2  # it reads x twice: to pool it, then to scale it
        by_kind[layer.kind] += sum(sizes) / 1e6
    total = sum(by_kind.values()) or 1.0
    moved = sum(v for k, v in by_kind.items() if k in MOVEMENT_KINDS)
    return {"traffic_mb": round(total, 1), "movement_share": round(moved / total, 3),
            "traffic_by_kind_mb": {k: round(v, 1) for k, v in by_kind.most_common()}}


def _is_view(layer, aliases: dict) -> bool:
    """Whether a Reshape-family layer's input and output share their bytes (plan.memory.aliases,
    whose values are roots: the output a view of the input, or the input of an engine output)."""
    return layer.kind in VIEW_KINDS and bool(layer.inputs) and bool(layer.outputs) \
        and aliases.get(layer.inputs[0], layer.inputs[0]) == aliases.get(layer.outputs[0], layer.outputs[0])


def movement_layers(plan) -> dict:
    """The plan's movement layers: how many are views (no launch), and per kind how many copy and
    the bytes they write, [layers, bytes]."""
    aliases = getattr(plan.memory, "aliases", {}) or {}
    views, copies = 0, {}
    for layer in plan.layers:
        if layer.kind not in MOVEMENT_KINDS:
            continue
        if _is_view(layer, aliases):
            views += 1
            continue
        count, nbytes = copies.get(layer.kind, (0, 0))
        copies[layer.kind] = (count + 1, nbytes + sum(plan.tensors[n].nbytes for n in layer.outputs if n in plan.tensors))
    return {"movement_views": views, "movement_copies": {k: list(v) for k, v in sorted(copies.items())}}


def placed_concats(plan) -> dict:
    """How many Concat inputs the plan places in their Concat's output, how many Concats move
    nothing (every input placed), and how many placed inputs other layers read too, at their rows
    (Tactic.reads_placed: a skip connection's pool)."""
    placed = getattr(plan.memory, "placements", {}) or {}
    aliases = getattr(plan.memory, "aliases", {}) or {}
    concats = [layer for layer in plan.layers if layer.kind == "Concat"]
    strided = {n for layer in plan.layers if layer.kind != "Concat" and aliases.get(layer.outputs[0] if layer.outputs
                                                                                    else "") is None
               for n in layer.inputs if n in placed and n not in aliases}
    return {"concat_inputs_placed": len(placed),
            "concats_fully_placed": sum(all(n in placed for n in layer.inputs if n) for layer in concats),
            "placed_inputs_read_strided": len(strided)}


def check(model: ZooModel, args: argparse.Namespace, row: dict) -> None:
    import torch

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Engine
    from polykit.tools.model.capability import check_capability

    row["stage"] = "export"
    module, inputs, path, facts = exported(model, int(args.batches), Path(args.cache_dir), torch)
    row.update(facts)
    row["stage"] = "capability"
    report, _ = check_capability(str(path), "cuda")
    row["nodes"] = len(report.nodes)
    row["unsupported"] = sorted({f"{n.op}: {n.reason}"[:200] for n in report.nodes if not n.supported})
    row["stage"] = "cuda build (level 0)"
    t0 = time.perf_counter()
    plan = build_plan(str(path), BuilderConfig(target="cuda", fp16=not args.fp32, builder_optimization_level=0))
    row["cuda_build_s"] = round(time.perf_counter() - t0, 1)
    row["cuda_layer_kinds"] = dict(collections.Counter(layer.kind for layer in plan.layers).most_common())
    row.update(traffic(plan))
    row.update(movement_layers(plan))
    row.update(placed_concats(plan))
    if args.nvrtc:
        row["stage"] = f"nvrtc ({args.nvrtc})"
        t0 = time.perf_counter()
        row["kernels"] = compile_kernels(plan, args.nvrtc)
        row["nvrtc_s"] = round(time.perf_counter() - t0, 1)
    if not args.no_run:
        row["stage"] = "cpu build and run"
        layout = {"channels_last": True} if args.cpu_channels_last else {}  # the cuda plan's layout and passes
        cpu_plan = build_plan(str(path), BuilderConfig(target="cpu", builder_optimization_level=0, **layout))
        with Engine(cpu_plan) as engine, engine.create_execution_context() as ctx:
            out = ctx.execute({k: v.numpy() for k, v in inputs.items()})[cpu_plan.outputs[0]]
        with torch.no_grad():
            ref = module(*inputs.values()).float()
        diff = (torch.from_numpy(out).float() - ref).abs()
        row["cpu_max_rel_err"] = float(diff.max() / ref.abs().max())
    del row["stage"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=[*FAMILIES, "all"], default="all")
    p.add_argument("--models", default="")
    p.add_argument("--out", default="zoo_check.json")
    p.add_argument("--cache-dir", default=".zoo_cache")
    p.add_argument("--nvrtc", default="", metavar="ARCH", help="also compile the cuda plan's kernels, e.g. sm_90")
    p.add_argument("--no-run", action="store_true", help="skip the cpu-target run against torch")
    p.add_argument("--batch", type=int, default=1, help="the batch the plans are built for (default 1)")
    p.add_argument("--fp32", action="store_true", help="build the cuda plan fp32 (default fp16)")
    p.add_argument("--cpu-channels-last", action="store_true",
                   help="build the cpu plan channels-last, as the cuda plan (its NHWC passes on the reference kernels)")
    args = p.parse_args()
    args.batches = str(args.batch)
    Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
    rows = load_results(args.out)["results"] if Path(args.out).exists() else []
    for model, _ in pending(select_cases(args), rows):
        say(f"{model.name}: checking")
        row = {"model": model.name, "family": model.family, "batch": int(args.batches)}
        t0 = time.monotonic()
        try:
            check(model, args, row)
        except Exception as exc:  # recorded: the check goes on to the next model
            traceback.print_exc()
            row["error"] = f"{row.pop('stage', '?')}: {type(exc).__name__}: {exc}"[:800]
        row["check_s"] = round(time.monotonic() - t0, 1)
        rows = merge(rows, row)
        write_results(args.out, rows, {"check": vars(args)})
        say(f"{model.name}: {row}")


if __name__ == "__main__":
    main()
