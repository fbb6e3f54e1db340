"""Which tactic runs each layer of issue 35's FP8 plans, without a GPU: cuda plans built at builder level 0
as for sm_90 (dynamic_vs_static.pretend_gpu: no timing, tactics by priority and estimate; nothing compiled).

    # export (torch): DIR/resnet50_bs32.onnx, DIR/resnet50_bs2.onnx (calibration), DIR/bert_bs8.onnx
    /work/zoovenv/bin/python benchmarks/fp8_tactics.py export --dir /tmp/fp8
    # the table (polykit): every layer's kind, precision and tactic, and the products off the FP8 tactics
    PYTHONPATH=. python benchmarks/fp8_tactics.py table --dir /tmp/fp8 [--out fp8_tactics.json] [--layers] [--models bert]

Each plan's summary counts its layers, those that are not views (`non_view_layers`: a layer whose outputs are
all views of its input, memory.aliases, copies nothing and launches nothing) and its distinct kernel units.
`--compile` also compiles every plan's distinct kernels with NVRTC here (no cache, --workers processes) and
reports their count and seconds: the part of a GPU build that does not need the GPU (the device has 16
cores; its tactic timing comes on top). The fp16 plans of both models are built alongside for comparison.

The plans are the ones benchmarks/int8_resnet.py and benchmarks/fp8_bert.py time: ResNet-50 bs32 `--fp8
--fp16` (its e4m3 scales calibrated on the cpu target from the same model exported at batch 2: the tensor
names are the export's own, so the cache serves the batch-32 build), and BERT-base bs8 s128 with explicit
FP8 Q/DQ of its linear layers (polykit.tools.model.fp8_qdq, calibrated on the cpu target) built `--fp16`.
A product (Conv / Gemm / MatMul in any form) is FP8 on the sm90 tactics when it is an FP8 layer whose
tactic is one of `cuda.fp8.sm90_*`, `cuda.fp8.gemm_sm90_*` or `cuda.fp8.conv_sm90_*` (kernels/cuda/int8/fp8_sm90.py,
fp8_gemm_sm90.py, fp8_conv_sm90.py: a timed plan may pick the latter two); BERT's attention products are not
quantized (they stay fp16 by design: no Q/DQ goes around them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ARCH = "sm_90"
#: the FP8 tensor-core tactics: the conv tiles, the GEMM tiles over rows (and their rolled variants), the conv tiles
#: with pieces
FP8_TACTIC = ("cuda.fp8.sm90_", "cuda.fp8.gemm_sm90_", "cuda.fp8.conv_sm90_", "cuda.fp8.gemm_fast_sm90_",
              "cuda.fp8.conv_fast_sm90_", "cuda.fp8.gemm_fast_rolled_sm90_")
#: file stem -> (model, batch) exported by `export`
EXPORTS = {"resnet50_bs32": ("resnet50", 32), "resnet50_bs2": ("resnet50", 2), "bert_bs8": ("bert", 8)}
#: the models `table --models` may name (the ones `export` writes)
MODELS = ("resnet50", "bert")


def export(folder: Path) -> None:
    import torch

    from benchmarks.cuda_models import export as export_model, make_inputs, make_model

    folder.mkdir(parents=True, exist_ok=True)
    for stem, (name, batch) in EXPORTS.items():
        export_model(name, make_model(name, torch), make_inputs(name, batch, torch), folder / f"{stem}.onnx", torch)
        print(f"exported {folder / stem}.onnx", flush=True)


def is_product(layer: Any) -> bool:
    return any(k in layer.kind for k in ("Conv", "Gemm", "MatMul"))


def compile_seconds(plan: Any, workers: int) -> dict[str, Any]:
    """NVRTC over the plan's distinct kernel units for its arch, without the disk cache."""
    from polykit.runtime.cuda.nvrtc import compile_many, unique_units
    from polykit.runtime.tactic_check import plan_kernels

    units = unique_units(source for layer in plan.layers for source in plan_kernels(plan, layer))
    start = time.perf_counter()
    compile_many(units, ARCH, cache=False, workers=workers)
    return {"kernel_units": len(units), "nvrtc_s": round(time.perf_counter() - start, 1), "workers": workers}


def summary(plan: Any, build_s: float, layers: bool, workers: int = 0, fp8: bool = True) -> dict[str, Any]:
    """The plan's products on and off the FP8 tactics (`fp8`: a plan meant to run them), its other layers by kind
    and tactic (and with `workers`, compile_seconds)."""
    from polykit.runtime.cuda.nvrtc import unique_units
    from polykit.runtime.tactic_check import plan_kernels

    products = [layer for layer in plan.layers if is_product(layer)]
    aliases = plan.memory.aliases  # a layer all of whose outputs are views of its input copies nothing
    on = [layer for layer in products if layer.precision == "fp8" and layer.tactic.startswith(FP8_TACTIC)]
    out = {
        "build_s": round(build_s, 1), "layers": len(plan.layers),
        "non_view_layers": sum(not all(o in aliases for o in layer.outputs if o) for layer in plan.layers),
        "kernel_units": len(unique_units(s for layer in plan.layers for s in plan_kernels(plan, layer))),
        "products": len(products),
        "products_on_fp8_sm90": len(on),
        "products_by_tactic": dict(Counter(f"{layer.kind} {layer.precision} {layer.tactic}" for layer in products)),
        "products_off_fp8_sm90": [f"{layer.name} ({layer.kind} {layer.precision} {layer.tactic})"
                                  for layer in products if layer not in on] if fp8 else None,
        "other_layers_by_tactic": dict(Counter(f"{layer.kind} {layer.precision} {layer.tactic}"
                                               for layer in plan.layers if not is_product(layer))),
    }
    if workers:
        out["compile"] = compile_seconds(plan, workers)
    if layers:
        out["every_layer"] = [f"{layer.kind:16} {layer.precision:5} {layer.tactic:28} {layer.name}"
                              for layer in plan.layers]
    return out


def fp16_plan(path: Path) -> tuple[Any, float]:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    start = time.perf_counter()
    plan = build_plan(str(path), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    return plan, time.perf_counter() - start


def resnet_plan(folder: Path) -> tuple[Any, float]:
    from benchmarks.int8_resnet import smooth_images
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    cache = folder / "resnet50.fp8.cache"
    if not cache.is_file():  # calibrate on the cpu at batch 2 (the same model: the same tensor names)
        build_plan(str(folder / "resnet50_bs2.onnx"), BuilderConfig(
            target="cpu", fp8=True, builder_optimization_level=0, calibration_cache=cache,
            calibration_data=[{"x": smooth_images(seed, 2)} for seed in range(2)]))
    start = time.perf_counter()
    plan = build_plan(str(folder / "resnet50_bs32.onnx"), BuilderConfig(
        target="cuda", fp16=True, fp8=True, calibration_cache=cache, builder_optimization_level=0))
    return plan, time.perf_counter() - start


def bert_plan(folder: Path) -> tuple[Any, float]:
    import onnx

    from benchmarks.fp8_bert import token_feeds
    from benchmarks.dynamic_bert import VOCAB
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq

    model = onnx.load(str(folder / "bert_bs8.onnx"))
    scales = calibrate_fp8(model, [token_feeds(0, (8, 128), VOCAB)], target="cpu")
    qdq = insert_fp8_qdq(model, scales)
    start = time.perf_counter()
    plan = build_plan(qdq, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    return plan, time.perf_counter() - start


def table(folder: Path, layers: bool, workers: int = 0, models: tuple[str, ...] = MODELS) -> dict[str, Any]:
    """The summaries of `models`' plans (each model's FP8 plan and its fp16 one)."""
    from benchmarks.dynamic_vs_static import pretend_gpu

    pretend_gpu(ARCH)
    out: dict[str, Any] = {"arch": ARCH}
    if "resnet50" in models:
        out["resnet50_bs32_fp8"] = summary(*resnet_plan(folder), layers, workers)
    if "bert" in models:
        out["bert_base_bs8_s128_fp8_qdq"] = summary(*bert_plan(folder), layers, workers)
    if "resnet50" in models:
        out["resnet50_bs32_fp16"] = summary(*fp16_plan(folder / "resnet50_bs32.onnx"), False, workers, fp8=False)
    if "bert" in models:
        out["bert_base_bs8_s128_fp16"] = summary(*fp16_plan(folder / "bert_bs8.onnx"), False, workers, fp8=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("export", "table"))
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--layers", action="store_true", help="also list every layer")
    parser.add_argument("--compile", action="store_true", help="also time NVRTC over each plan's kernels")
    parser.add_argument("--workers", type=int, default=2, help="NVRTC processes for --compile")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated models to tabulate, of {', '.join(MODELS)} (their exports alone needed)")
    args = parser.parse_args()
    if args.step == "export":
        export(args.dir)
        return
    models = tuple(m for m in args.models.split(",") if m)
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"--models {','.join(unknown)}: not one of {', '.join(MODELS)}")
    text = json.dumps(table(args.dir, args.layers, args.workers if args.compile else 0, models), indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
