"""Zoo transformers through onnxruntime's transformer optimizer, then polykit (CPU only):

    PYTHONPATH=. python3 benchmarks/ms_optimized_zoo.py [--models bert_base gpt2] [--out ms_optimized_zoo.json]

Per model: `onnxruntime.transformers.optimizer.optimize_model` on the zoo's batch-1 export
(/work/zoo_cache/<name>_bs1.onnx; num_heads 12, hidden 768, opt_level 0) gives the file a serving
user would hand polykit, with com.microsoft ops (ops/models/attention_ms.py, ops/nn/contrib_ms.py).
Recorded: the com.microsoft ops it has, the max abs error of polykit's cpu plan against onnxruntime
on that file (random token ids, a padded attention mask), and the cuda fp16 plans at builder level 0
(no GPU needed) of the optimized and the unoptimized file: layer count, layer kinds, attention tactics.
The real-export check of the contrib lowering; tests/compiler/test_ms_optimized_models.py has the
small models.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ZOO = Path("/work/zoo_cache")
KINDS = {"bert_base": "bert", "distilbert": "bert", "gpt2": "gpt2"}


def optimize(path: Path, kind: str, heads: int, hidden: int) -> onnx.ModelProto:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions(kind)
    try:
        import sympy  # noqa: F401  (the optimizer's symbolic shape inference)
    except ImportError:
        options.enable_shape_inference = False
    return optimize_model(str(path), model_type=kind, num_heads=heads, hidden_size=hidden, opt_level=0,
                          optimization_options=options).model


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        B, S = (d.dim_value for d in value.type.tensor_type.shape.dim)
        if value.name == "attention_mask":
            mask = np.ones((B, S), np.int64)
            mask[:, S - S // 4:] = 0  # right padding: the [B] lengths mask_index means the same
            feeds[value.name] = mask
        else:
            feeds[value.name] = rng.integers(0, 1000, (B, S)).astype(np.int64)
    return feeds


def cuda_plan_summary(path: str) -> dict:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    plan = build_plan(path, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    kinds = collections.Counter(layer.kind for layer in plan.layers)
    attention = collections.Counter(layer.tactic for layer in plan.layers if layer.kind == "Attention")
    return {"layers": len(plan.layers), "kinds": dict(sorted(kinds.items())), "attention_tactics": dict(attention)}


def check(name: str, folder: Path) -> dict:
    import onnxruntime

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Runtime

    source = ZOO / f"{name}_bs1.onnx"
    t0 = time.perf_counter()
    optimized = optimize(source, KINDS[name], 12, 768)
    out = folder / f"{name}_optimized.onnx"
    onnx.save(optimized, str(out))
    record = {"model": name, "optimize_s": round(time.perf_counter() - t0, 1),
              "com.microsoft": dict(collections.Counter(n.op_type for n in optimized.graph.node
                                                        if n.domain == "com.microsoft"))}
    feeds = feeds_for(optimized)
    sess = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    engine = Runtime("cpu").deserialize_engine(build_plan(str(out), BuilderConfig(target="cpu")))
    got = engine.create_execution_context().execute(feeds)
    record["cpu_max_abs_error"] = {k: float(np.abs(got[k] - want[k]).max()) for k in want}
    record["cuda_fp16_level0_optimized"] = cuda_plan_summary(str(out))
    record["cuda_fp16_level0_unoptimized"] = cuda_plan_summary(str(source))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert_base", "gpt2"], choices=sorted(KINDS))
    parser.add_argument("--out", default="ms_optimized_zoo.json")
    args = parser.parse_args()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            records.append(check(name, Path(tmp)))
            print(json.dumps(records[-1], indent=1), flush=True)
    Path(args.out).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
