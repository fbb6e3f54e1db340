"""What a tensor-parallel build puts on each rank, for `polykit inspect model`: a rank plan's rank,
rank count and collective layers (`collectives_of`), and an ONNX model's split over N ranks
(`describe_ranks`: per rank its weight bytes, the weights it holds a shard of, its collectives)."""

from __future__ import annotations

from typing import Any, Mapping


def collectives_of(plan: Any) -> dict[str, Any] | None:
    """{rank, ranks, collectives: [{layer, op, ranks, axis?, reduce?}]} of a plan that has a rank."""
    if "ranks" not in plan.metadata:
        return None
    rows = [{"layer": l.name, **{k: l.attrs[k] for k in ("op", "ranks", "reduce", "axis", "root") if k in l.attrs}}
            for l in plan.layers if l.kind == "DistCollective"]
    return {"rank": plan.metadata["rank"], "ranks": plan.metadata["ranks"], "collectives": rows}


def describe_ranks(model: str, ranks: int, input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """Each rank's part of `model` split over `ranks` ranks (built for the cpu target)."""
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.builder.distributed import build_rank_plans

    plans = build_rank_plans(model, BuilderConfig(target="cpu", input_shapes=dict(input_shapes), ranks=ranks,
                                                  builder_optimization_level=0))
    out = []
    for plan in plans:
        part = plan.metadata.get("partition", {})
        out.append({**collectives_of(plan), "weight_bytes": plan.weight_bytes, "layers": len(plan.layers),
                    "split_weights": part.get("split_weights", {}),
                    "replicated_weights": part.get("replicated_weights", [])})
    return {"kind": "ranks", "model": str(model), "ranks": out}


def render_ranks(console: Any, info: Mapping[str, Any]) -> None:
    """Per rank: weights and collectives, then the weights split and how."""
    from rich.markup import escape
    from rich.table import Table

    for rank in info["ranks"]:
        console.print(f"[bold]rank {rank['rank']} of {rank['ranks']}[/]: {rank['layers']} layers, "
                      f"{rank['weight_bytes']} weight bytes, {len(rank['split_weights'])} weights split, "
                      f"{len(rank['replicated_weights'])} replicated")
        table = Table(show_edge=False, box=None)
        for col in ("collective", "op", "axis"):
            table.add_column(col)
        for row in rank["collectives"]:
            table.add_row(escape(row["layer"]), row["op"], str(row.get("axis", "")))
        console.print(table)
    first = info["ranks"][0] if info["ranks"] else {"split_weights": {}}
    split = Table(title="weights split (each rank holds one shard)", title_justify="left")
    for col in ("weight", "full", "per rank"):
        split.add_column(col)
    for name, shapes in first["split_weights"].items():
        split.add_row(escape(name), str(shapes["full"]), str(shapes["local"]))
    console.print(split)
