"""Grouped-query attention as torch exports it, through polykit (CPU only, needs torch):

    PYTHONPATH=. python3 benchmarks/gqa_exports.py [--out gqa_exports.json]

Per form -- HF's `repeat_kv` (expand + reshape, causal SDPA), `repeat_interleave` (plain SDPA),
SDPA's own `enable_gqa=True` -- the TorchScript export (benchmarks/torch_export.py), then the cpu
plan against torch fp32 (max abs error) and the cuda fp16 plan at builder level 0 (no GPU needed):
its layer kinds and each Attention's tactic and `kv_groups`. A form the exporter refuses is
recorded with its error. The check that exporters' forms reach Attention's kv_groups without a
copy of K or V (docs/FUSION.md), on real exports rather than onnx.helper models.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.torch_export import export_onnx  # noqa: E402

FORMS = ("repeat_kv", "repeat_interleave", "enable_gqa")


def module(form: str, torch):
    sdpa = torch.nn.functional.scaled_dot_product_attention

    class Gqa(torch.nn.Module):
        def forward(self, q, k, v):
            B, H, S, D = k.shape
            g = q.shape[1] // H
            if form == "repeat_kv":  # transformers' llama repeat_kv
                k, v = (x[:, :, None].expand(B, H, g, S, D).reshape(B, H * g, S, D) for x in (k, v))
                return sdpa(q, k, v, is_causal=True)
            if form == "repeat_interleave":
                return sdpa(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1))
            return sdpa(q, k, v, enable_gqa=True)

    return Gqa().eval()


def check(form: str, Hq: int, Hkv: int, S: int, D: int, tmp: Path, torch) -> dict:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Engine

    row: dict = {"form": form, "heads": f"{Hq}/{Hkv}", "S": S, "D": D}
    gen = torch.Generator().manual_seed(0)
    inputs = {"q": torch.randn(1, Hq, S, D, generator=gen), "k": torch.randn(1, Hkv, S, D, generator=gen),
              "v": torch.randn(1, Hkv, S, D, generator=gen)}
    path = tmp / f"{form}_{Hq}_{Hkv}.onnx"
    try:
        export_onnx(module(form, torch), inputs, path, torch)
    except Exception as exc:  # recorded: the exporter's refusal is the finding
        row["export_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return row
    cpu = build_plan(str(path), BuilderConfig(target="cpu"))
    with Engine(cpu) as engine, engine.create_execution_context() as ctx:
        out = ctx.execute({k: v.numpy() for k, v in inputs.items()})[cpu.outputs[0]]
    with torch.no_grad():
        ref = module(form, torch)(*inputs.values())
    row["cpu_max_abs_err"] = float((torch.from_numpy(out) - ref).abs().max())
    cuda = build_plan(str(path), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    row["cuda_layer_kinds"] = dict(collections.Counter(layer.kind for layer in cuda.layers))
    row["attention"] = [(layer.tactic, layer.attrs.get("kv_groups", 1)) for layer in cuda.layers if layer.kind == "Attention"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gqa_exports.json")
    args = p.parse_args()
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for form in FORMS:
            for Hq, Hkv, S, D in ((12, 4, 77, 64), (8, 1, 13, 128)):
                rows.append(check(form, Hq, Hkv, S, D, Path(tmp), torch))
                print(json.dumps(rows[-1]))
    Path(args.out).write_text(json.dumps({"torch": torch.__version__, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
