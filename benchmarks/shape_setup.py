"""Shape set-up time per shape change: what `ShapeBinder.bind` takes (checking the input shapes
against the profile, evaluating every dynamic tensor's dim expressions and every host shape tensor's
value) for input shapes it has not cached, on plans of benchmarks/dynamic_exports.py's exports, built
for the export's min/opt/max profile (cpu) and loaded as an engine loads them.

    python benchmarks/dynamic_exports.py export --dir DIR --models resnet18,bert_base   # torch
    PYTHONPATH=. python benchmarks/shape_setup.py --dir DIR --models resnet18,bert_base

It imports polykit from PYTHONPATH only (not from this file's checkout), so one script times two trees:
`PYTHONPATH=/path/to/other/tree python benchmarks/shape_setup.py ...`. Prints, per model, the number of
dynamic tensors and host shape tensors and the mean microseconds of a bind (the binder's cache cleared
before each), over the profile's min, opt, max and odd shapes in turn.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def time_binds(onnx_path: Path, spec: dict, repeats: int) -> dict:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.profiles import Profile
    from polykit.runtime.shapes import ShapeBinder

    profile = Profile({n: tuple(tuple(s["shapes"][k]) for k in range(3)) for n, s in spec.items()})
    from polykit.runtime.engine import Runtime

    built = build_plan(str(onnx_path), BuilderConfig(target="cpu", profiles=[profile], builder_optimization_level=0))
    with Runtime().deserialize_engine(built.serialize()) as engine:  # the plan as an engine loads it
        plan = engine.plan
    binder = ShapeBinder(plan)
    shape_sets = [{n: tuple(s["shapes"][k]) for n, s in spec.items()} for k in range(len(next(iter(spec.values()))["shapes"]))]
    for shapes in shape_sets:  # warm up (and check every set binds)
        binder.bind(shapes)
    start = time.perf_counter()
    for i in range(repeats):
        binder._cache.clear()  # a shape change: nothing cached
        binder.bind(shape_sets[i % len(shape_sets)])
    mean = (time.perf_counter() - start) / repeats
    return {"dynamic_tensors": len(binder._dynamic), "host_tensors": len(binder._host), "bind_us": round(mean * 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="dynamic_exports.py's export folder")
    parser.add_argument("--models", default="resnet18,bert_base")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    import polykit

    print(f"polykit from {Path(polykit.__file__).parent.parent}")
    for name in args.models.split(","):
        spec = json.loads((args.dir / f"{name}.json").read_text())["inputs"]
        print(name, time_binds(args.dir / f"{name}.onnx", spec, args.repeats), flush=True)


if __name__ == "__main__":
    main()
