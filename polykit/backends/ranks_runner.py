"""The polykit engine split over ranks (`polykit run --trt --ranks N`): rank 0's outputs.

It builds one plan per rank (polykit.compiler.builder.distributed.build_rank_plans) and runs every rank
on each feed: on the cpu target as simulated ranks, threads of this process in one SimulatedGroup
(polykit.runtime.collectives); on cuda as one process per GPU through
polykit.backends.rank_processes.run_ranks (NCCL). Every rank gets the same feeds; the runner returns rank 0's
outputs, which the comparator checks like any runner's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from polykit.backends.base import BaseRunner, TensorMeta

#: seconds a rank may wait at a collective for the others before RankError
RANK_TIMEOUT_S = 120.0


class RanksRunner(BaseRunner):
    """Runs `model` built with `config` (config.ranks > 1) on config.ranks ranks."""

    reads_feeds_only = True  # (the Comparator need not copy its feeds)

    def __init__(self, model: Any, config: Any, name: str = "trt", timeout_s: float = RANK_TIMEOUT_S):
        super().__init__(name)
        self.model, self.config, self.timeout_s = model, config, timeout_s
        self.plans: list[Any] = []
        self._engines: list[Any] = []
        self._folder: tempfile.TemporaryDirectory | None = None
        self._paths: list[Path] = []

    @property
    def rank_weight_bytes(self) -> list[int]:
        """Bytes of weights each rank's plan holds (its shards and the replicated weights)."""
        return [p.weight_bytes for p in self.plans]

    def activate_impl(self) -> None:
        from polykit.compiler.builder.distributed import build_rank_plans
        from polykit.runtime.engine import Engine

        self.plans = build_rank_plans(self.model, self.config)
        if self.plans[0].target == "cpu":
            self._engines = [Engine(p) for p in self.plans]
            return
        self._folder = tempfile.TemporaryDirectory(prefix="polykit-ranks-")
        self._paths = [Path(self._folder.name) / f"model.rank{r}.plan" for r in range(len(self.plans))]
        for plan, path in zip(self.plans, self._paths):
            plan.save(path)

    def deactivate_impl(self) -> None:
        for engine in self._engines:
            engine.close()
        self._engines = []
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def get_input_metadata_impl(self) -> dict[str, TensorMeta]:
        plan = self.plans[0]
        return {n: TensorMeta(n, plan.tensors[n].dtype, tuple(plan.tensors[n].shape)) for n in plan.inputs}

    def infer_impl(self, feed_dict: dict[str, Any]) -> dict[str, Any]:
        if self._engines:
            from polykit.runtime.collectives import run_simulated_ranks

            return run_simulated_ranks(self._engines, [feed_dict] * len(self._engines), timeout_s=self.timeout_s)[0]
        from polykit.backends.rank_processes import run_ranks  # dist-rt's process launcher (cuda: NCCL)

        return run_ranks(self._paths, feed_dict, target=self.plans[0].target, devices=None,
                         timeout_s=self.timeout_s)[0]
