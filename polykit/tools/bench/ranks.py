"""`polykit bench MODEL --ranks N`: per-query latency of a model split over N ranks, and what
each rank's plan holds (weights and device memory).

Each timed query runs every rank on the same random feeds (polykit.backends.ranks_runner: cpu
ranks are threads of this process, cuda ranks one process per GPU) and ends when all ranks have
finished, so the latency covers the collectives. Warm-up and the iteration/duration rule are
BenchOptions' (polykit.tools.bench.benchmark).
"""

from __future__ import annotations

import time
from typing import Any

from polykit.tools.bench.benchmark import BenchOptions, Stats


def bench_ranks(model: str, config: Any, options: BenchOptions) -> dict[str, Any]:
    """{"target", "ranks", "build_s", "warm_up_runs", "iterations", "latency_ms", "per_rank": [...]}."""
    from polykit.backends.ranks_runner import RanksRunner
    from polykit.tools.data.loaders import DataLoader, DataLoaderOptions

    runner = RanksRunner(model, config)
    start = time.perf_counter()
    with runner:
        build_s = time.perf_counter() - start
        meta = runner.get_input_metadata()
        loader = DataLoader(DataLoaderOptions(seed=options.seed, val_ranges=dict(options.val_ranges),
                                              input_shapes=dict(options.input_shapes)), meta)
        feeds = next(iter(loader))
        warm, until = 0, time.perf_counter() + options.warm_up_ms / 1e3
        while warm == 0 or time.perf_counter() < until:
            runner.infer(feeds)
            warm += 1
        samples: list[float] = []
        until = time.perf_counter() + options.duration_s
        while len(samples) < options.iterations or time.perf_counter() < until:
            runner.infer(feeds)
            samples.append(runner.last_inference_time() * 1e3)
        per_rank = [{"rank": p.metadata["rank"], "weight_bytes": p.weight_bytes,
                     "device_memory_bytes": p.metadata.get("device_memory", {}).get("total_bytes", 0),
                     "collectives": sum(1 for l in p.layers if l.kind == "DistCollective")} for p in runner.plans]
        target = runner.plans[0].target
    return {"target": target, "ranks": config.ranks, "build_s": build_s, "warm_up_runs": warm,
            "iterations": len(samples), "latency_ms": vars(Stats.of(samples)), "per_rank": per_rank}


def render_ranks_bench(model: str, result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    lat = result["latency_ms"]
    console.print(f"[bold]bench[/] {escape(model)}: {result['ranks']} ranks on {result['target']}, built in "
                  f"{result['build_s']:.2f} s; warm-up {result['warm_up_runs']} run(s), timed {result['iterations']}")
    console.print("latency per query (all ranks, host clock) ms: " +
                  ", ".join(f"{k} {lat[k]:.3f}" for k in ("min", "mean", "median", "p90", "p99", "max")))
    table = Table(show_edge=False, box=None)
    for col in ("rank", "weight bytes", "device memory bytes", "collectives"):
        table.add_column(col, justify="right")
    for row in result["per_rank"]:
        table.add_row(str(row["rank"]), str(row["weight_bytes"]), str(row["device_memory_bytes"]),
                      str(row["collectives"]))
    console.print(table)
