"""Refit on real exports: zoo models exported twice with other weights, a refittable plan built
from the first refitted with the second, against a plan built from the second with the same
tactics (docs/REFIT.md). Two steps, in two environments:

    # 1. torch: each model from two seeds (random init + BatchNorm statistics, zoo_models.prepare)
    python benchmarks/refit_zoo.py export --out /tmp/refit_zoo resnet18 mobilenet_v2 ...
    # 2. polykit: build, refit, build again, compare bit for bit (cpu target unless --target)
    PYTHONPATH=$PWD python benchmarks/refit_zoo.py check --out /tmp/refit_zoo [--target cuda] [--fp16] resnet18 ...

`check` prints one row a model: the time of the build and of the refit, how many initializers
the plan holds as they are / keeps in its record / must be given, and whether the refitted
plan's weights and outputs are bit-identical to the second build's; it exits 1 if any is not.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SEEDS = (0, 1)


def export(names: list[str], out: Path) -> None:
    import torch

    from torch_export import export_onnx, single_output
    from zoo_models import BY_NAME, make_inputs, prepare

    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        model = BY_NAME[name]
        for seed in SEEDS:
            torch.manual_seed(seed)
            module = single_output(prepare(model, model.make(), torch), tuple(s.name for s in model.inputs), torch)
            export_onnx(module, make_inputs(model, 1, torch), out / f"{name}_{seed}.onnx", torch)
        print(f"exported {name}", flush=True)


def check(names: list[str], out: Path, target: str, fp16: bool = False) -> int:
    import numpy as np

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.builder.refit import record_of, refit_plan, weights_from_file
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.runtime.engine import Engine

    config = BuilderConfig(target=target, refittable=True, builder_optimization_level=0, fp16=fp16)
    failed = 0
    print(f"{'model':<22} {'build s':>8} {'refit s':>8} {'plan/model/caller':>18}  weights  outputs")
    for name in names:
        first, second = (out / f"{name}_{seed}.onnx" for seed in SEEDS)
        start = time.perf_counter()
        plan = build_plan(str(first), config)
        built = time.perf_counter() - start
        record = record_of(plan)
        start = time.perf_counter()
        refitted = refit_plan(plan, weights_from_file(second, record))
        refit_s = time.perf_counter() - start
        expected = build_plan(str(second), replace(config, tactic_replay={l.name: l.tactic for l in plan.layers}))
        rng = np.random.default_rng(0)
        graph = load_onnx(str(first))
        feeds = {n: rng.standard_normal(graph.value(n).shape).astype(graph.value(n).dtype) for n in graph.inputs}
        outputs = []
        for p in (refitted, expected):
            with Engine(p).create_execution_context() as ctx:
                outputs.append(ctx.execute(feeds))
        same_weights = all(refitted.weights[n].tobytes() == w.tobytes() for n, w in expected.weights.items())
        same_outputs = all(outputs[0][n].tobytes() == o.tobytes() for n, o in outputs[1].items())
        sources = [sum(s["source"] == k for s in record["weights"].values()) for k in ("plan", "model", "caller")]
        print(f"{name:<22} {built:8.2f} {refit_s:8.2f} {'/'.join(map(str, sources)):>18}  {same_weights!s:7}  "
              f"{same_outputs!s}", flush=True)
        failed += not (same_weights and same_outputs)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("export", "check"))
    parser.add_argument("models", nargs="+")
    parser.add_argument("--out", type=Path, default=Path("/tmp/refit_zoo"))
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--fp16", action="store_true", help="fp16 builds (weights cast to half)")
    args = parser.parse_args()
    if args.step == "export":
        export(args.models, args.out)
        return 0
    return check(args.models, args.out, args.target, args.fp16)


if __name__ == "__main__":
    sys.exit(main())
