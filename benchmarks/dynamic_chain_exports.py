"""Real torchvision exports with dynamic axes, built for a profile and checked against onnxruntime.

Two steps, so the export can run in a torch environment without polykit's dependencies:

    python benchmarks/dynamic_chain_exports.py export --out DIR     # torch, torchvision: writes DIR/<case>.onnx
    PYTHONPATH=. python benchmarks/dynamic_chain_exports.py check --dir DIR [--target cpu] [--cases ...]

`export` writes each case with the TorchScript exporter (`dynamo=False`, opset 17, the zoo's model:
random weights, BatchNorm statistics estimated by benchmarks/zoo_models.prepare, torch seeded) and
the dynamic axes of CASES; `check` builds each with `BuilderConfig(profiles=...)` (what `polykit
convert --trt-min/opt/max-shapes` passes) and runs the plan at the profile's min, an odd shape inside
it and max against onnxruntime, printing the build error or the max abs difference per shape (issue
33's check: Swin's window padding and Div/Mul shape chains, FCN's and DeepLabV3's upsampling). The
GPU suite runs it on cuda where torch is installed (tests/runtime/cuda/test_dynamic_shape_chains_gpu.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

#: case -> (torchvision maker, dynamic axes of "x", export shape, (min, opt, max) of "x", odd shape)
CASES = {
    "swin_t_dyn_hw": ("swin_t", {0: "batch", 2: "height", 3: "width"}, (1, 3, 224, 224),
                      ((1, 3, 224, 224), (2, 3, 256, 256), (2, 3, 288, 288)), (2, 3, 256, 288)),
    "swin_t_dyn_batch": ("swin_t", {0: "batch"}, (1, 3, 224, 224),
                         ((1, 3, 224, 224), (2, 3, 224, 224), (3, 3, 224, 224)), (2, 3, 224, 224)),
    "fcn_resnet50": ("fcn_resnet50", {0: "batch", 2: "height", 3: "width"}, (1, 3, 128, 128),
                     ((1, 3, 128, 128), (1, 3, 192, 192), (2, 3, 256, 256)), (1, 3, 160, 224)),
    "deeplabv3_mobilenet_v3_large": ("deeplabv3_mobilenet_v3_large", {0: "batch", 2: "height", 3: "width"},
                                     (1, 3, 128, 128), ((1, 3, 128, 128), (1, 3, 192, 192), (2, 3, 256, 256)),
                                     (1, 3, 160, 224)),
}


def export(out: Path, cases: list[str]) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from torch_export import single_output
    from zoo_models import BY_NAME, prepare

    out.mkdir(parents=True, exist_ok=True)
    for case in cases:
        name, axes, shape, _, _ = CASES[case]
        torch.manual_seed(0)
        zoo = BY_NAME[name]  # random weights, BatchNorm statistics estimated so activations mean something
        model = single_output(prepare(zoo, zoo.make().eval(), torch), ("x",), torch)
        torch.onnx.export(model, (torch.randn(*shape),), str(out / f"{case}.onnx"), input_names=["x"],
                          output_names=["out"], opset_version=17, dynamo=False, dynamic_axes={"x": axes})
        print(f"exported {case}", flush=True)


def check(directory: Path, cases: list[str], target: str) -> int:
    import numpy as np
    import onnxruntime as ort

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.profiles import Profile
    from polykit.errors import PolykitError
    from polykit.runtime.engine import Runtime

    failed = 0
    for case in cases:
        _, _, _, profile, odd = CASES[case]
        path = directory / f"{case}.onnx"
        start = time.perf_counter()
        try:
            plan = build_plan(str(path), BuilderConfig(target=target, profiles=[Profile({"x": profile})]))
        except PolykitError as exc:
            print(f"{case}: build failed: {exc}", flush=True)
            failed += 1
            continue
        print(f"{case}: built in {time.perf_counter() - start:.0f} s", flush=True)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
            for shape in (profile[0], odd, profile[2]):
                feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
                try:
                    got = ctx.execute(feeds)["out"]
                except PolykitError as exc:
                    print(f"{case} {shape}: run failed: {exc}", flush=True)
                    failed += 1
                    continue
                want = session.run(["out"], feeds)[0]
                diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
                print(f"{case} {shape}: out {got.shape}, max abs diff {diff:.3g} (|ref| max {np.abs(want).max():.3g})",
                      flush=True)
                failed += not diff <= 1e-3 * max(1.0, float(np.abs(want).max()))
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("export", "check"))
    parser.add_argument("--out", "--dir", dest="dir", type=Path, default=Path("dynamic_chain_exports"))
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--target", default="cpu")
    args = parser.parse_args()
    if args.step == "export":
        export(args.dir, args.cases)
        return 0
    return 1 if check(args.dir, args.cases, args.target) else 0


if __name__ == "__main__":
    sys.exit(main())
