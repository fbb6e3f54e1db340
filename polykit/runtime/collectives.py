"""Communicators: what an execution context of one rank's plan exchanges tensors through.

    group = SimulatedGroup(2, timeout_s=60)
    ctx0 = engine0.create_execution_context(communicator=group.communicator(0))

A communicator is a tiny protocol (rank, ranks, close). The cpu target's is a SimulatedGroup's:
the ranks are threads of one process that hand numpy arrays to each other under a barrier with a
timeout, so partitioning and collective semantics are tested without GPUs. The cuda target's is
polykit.runtime.cuda.nccl.NcclCommunicator (one process per GPU). `run_simulated_ranks` runs one
plan per rank on threads and gathers their outputs.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from polykit.errors import PolykitError, RankError, UsageError


class Communicator(Protocol):
    """One rank's end of a group of `ranks` ranks."""

    rank: int
    ranks: int

    def close(self) -> None: ...


class SimulatedGroup:
    """`ranks` simulated ranks in one process (threads): their communicators meet in `exchange`.

    A member waiting at a collective more than `timeout_s` seconds for another, or for one that
    failed (`fail`), raises RankError naming the missing rank: never a hang."""

    def __init__(self, ranks: int, timeout_s: float = 60.0):
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise UsageError(f"a group needs ranks >= 1, not {ranks!r}")
        if not timeout_s > 0:
            raise UsageError(f"the collective timeout must be > 0 seconds, not {timeout_s!r}")
        self.ranks = ranks
        self.timeout_s = float(timeout_s)
        self._cond = threading.Condition()
        self._slots: dict[tuple, dict[int, np.ndarray]] = {}
        self._reads: dict[tuple, int] = {}
        self._failed: dict[int, str] = {}

    def communicator(self, rank: int) -> "SimulatedCommunicator":
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.ranks:
            raise UsageError(f"rank {rank!r} is not in 0..{self.ranks - 1}")
        return SimulatedCommunicator(self, rank)

    def fail(self, rank: int, reason: str) -> None:
        """Mark `rank` failed: members waiting for it raise RankError at once."""
        with self._cond:
            self._failed[rank] = reason
            self._cond.notify_all()

    def exchange(self, rank: int, group: tuple[int, ...], seq: int, value: np.ndarray, layer: str) -> list[np.ndarray]:
        """Every member's `value` for the `seq`-th collective of `group` (in group order)."""
        key = (group, seq)
        with self._cond:
            slot = self._slots.setdefault(key, {})
            # a copy, as a real collective sends one: `value` may be a view of the rank's arena,
            # which its next layers overwrite while the other ranks still read the exchange
            slot[rank] = np.array(value, copy=True)
            self._cond.notify_all()
            deadline = time.monotonic() + self.timeout_s
            while len(slot) < len(group):
                failed = [g for g in group if g in self._failed and g not in slot]
                if failed:
                    raise RankError(f"rank {failed[0]} failed before collective layer {layer!r}: "
                                    f"{self._failed[failed[0]]}", where=f"rank {rank}",
                                    hint="fix the failing rank's error; the others stop with it")
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [g for g in group if g not in slot]
                    raise RankError(f"rank {missing[0]} did not reach collective layer {layer!r} within "
                                    f"{self.timeout_s:g} s (missing: {missing})", where=f"rank {rank}",
                                    hint="every rank must run its plan with a communicator of the same group; "
                                         "raise the timeout for slow ranks")
                self._cond.wait(left)
            result = [slot[g] for g in group]
            self._reads[key] = self._reads.get(key, 0) + 1
            if self._reads[key] == len(group):
                del self._slots[key], self._reads[key]
            return result


class SimulatedCommunicator:
    """Rank `rank` of a SimulatedGroup (use it from one thread)."""

    def __init__(self, group: SimulatedGroup, rank: int):
        self.group = group
        self.rank = rank
        self.ranks = group.ranks
        self._seq: dict[tuple[int, ...], int] = {}
        self._closed = False

    def exchange(self, value: np.ndarray, members: tuple[int, ...], layer: str) -> list[np.ndarray]:
        """The members' inputs of collective layer `layer` (this rank's is `value`), in member order."""
        if self._closed:
            raise UsageError("the communicator is closed", where=f"rank {self.rank}")
        if self.rank not in members:
            raise RankError(f"rank {self.rank} runs collective layer {layer!r} of group {list(members)}, which it is "
                            "not a member of", where=f"rank {self.rank}", hint="give each rank its own plan")
        if any(m >= self.ranks for m in members):
            raise RankError(f"collective layer {layer!r} names ranks {list(members)}, the group has {self.ranks}",
                            where=f"rank {self.rank}", hint="build the plans with --ranks equal to the group's size")
        seq = self._seq.get(members, 0)
        self._seq[members] = seq + 1
        return self.group.exchange(self.rank, members, seq, value, layer)

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"SimulatedCommunicator(rank={self.rank}, ranks={self.ranks})"


def run_simulated_ranks(engines: Sequence[Any], feeds: Sequence[Mapping[str, np.ndarray]], *,
                        timeout_s: float = 60.0, iterations: int = 1) -> list[dict[str, np.ndarray]]:
    """Each engine (rank i's plan, loaded on the cpu target) executes its feeds `iterations` times
    on its own thread, in one SimulatedGroup; rank i's outputs of the last run. A rank that fails
    makes the others stop at their next collective; the first failure is raised (a RankError
    naming the rank for errors that are not already one)."""
    group = SimulatedGroup(len(engines), timeout_s)
    results: list[dict[str, np.ndarray] | None] = [None] * len(engines)
    errors: list[tuple[int, BaseException]] = []

    def work(rank: int) -> None:
        try:
            with engines[rank].create_execution_context(communicator=group.communicator(rank)) as ctx:
                for _ in range(iterations):
                    results[rank] = ctx.execute(feeds[rank])
        except BaseException as exc:  # reported below, by rank
            errors.append((rank, exc))
            group.fail(rank, str(exc).splitlines()[0])

    threads = [threading.Thread(target=work, args=(r,), name=f"polykit-rank{r}", daemon=True)
               for r in range(len(engines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        rank, exc = min(errors, key=lambda e: (isinstance(e[1], RankError), e[0]))  # the cause before the echoes
        if isinstance(exc, RankError):
            raise exc
        if isinstance(exc, PolykitError):
            raise RankError(exc.what, where=f"rank {rank}" + (f", {exc.where}" if exc.where else ""),
                            hint=exc.hint) from exc
        raise RankError(f"{type(exc).__name__}: {exc}", where=f"rank {rank}") from exc
    return [r or {} for r in results]


def needs_communicator(plan: Any) -> bool:
    """Whether `plan` has a collective layer over more than one rank."""
    from polykit.compiler.ops.models.collective import is_collective

    return any(is_collective(l) and int(l.attrs.get("ranks", 1)) > 1 for l in plan.layers)


def check_communicator(plan: Any, communicator: Any) -> None:
    """UsageError unless `communicator` is one of the plan's rank and rank count."""
    rank, ranks = int(plan.metadata.get("rank", 0)), int(plan.metadata.get("ranks", 1))
    if communicator is None:
        raise UsageError(f"the plan is rank {rank} of {ranks}: its collective layers need a communicator",
                         hint="create the context with communicator=... (SimulatedGroup(ranks).communicator(rank) "
                              "on cpu, NcclCommunicator on cuda), or run the ranks with `polykit run --ranks`")
    if (communicator.rank, communicator.ranks) != (rank, ranks):
        raise UsageError(f"the communicator is rank {communicator.rank} of {communicator.ranks}, the plan rank "
                         f"{rank} of {ranks}", hint="give each rank's plan the communicator of the same rank")
