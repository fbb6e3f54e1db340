"""Run the plans of a distributed model as processes, one per rank (`polykit run/bench --ranks N`
on the cuda target):

    outputs = run_ranks([Path("m.rank0.plan"), Path("m.rank1.plan")], feeds, target="cuda",
                        devices=[0, 1], timeout_s=120)        # one dict of outputs per rank

Each rank is `python -m polykit.backends.rank_worker` on the CUDA device the explicit rank ->
device map gives it (`devices[i]`, an ordinal of the parent's view; CUDA_VISIBLE_DEVICES is
passed through unchanged and named in errors). The parent makes the NCCL unique id and hands
it over as hex; feeds go in and outputs come back as .npz files in a temporary folder, with a
JSON list of dtype names beside each (bfloat16 survives; nothing is pickled). A rank that exits
non-zero is a RankError naming it with the tail of its stderr, and the other ranks are killed;
so are all ranks still running at `timeout_s` (the whole run's budget; each rank's collectives
give up earlier, at 3/4 of it, so a rank stuck in one names its layer itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Mapping, Sequence

import numpy as np

from polykit.errors import DataFileError, DeviceError, RankError, UsageError
from polykit.npy_io import open_npz

#: how much of a rank's stderr a RankError quotes
STDERR_TAIL = 2000


@dataclass(frozen=True)
class RankRun:
    """What one rank's process returned: its outputs of the last query, the milliseconds of
    each timed query (host to host: copy in, layers, collectives, copy out), its weight bytes."""

    rank: int
    device: int | None
    outputs: dict[str, np.ndarray] = field(hash=False)
    times_ms: tuple[float, ...] = ()
    weight_bytes: int = 0


def write_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """`arrays` as an .npz (members a0, a1, ...) and `path`.json ([name, dtype name] per member)."""
    items = list(arrays.items())
    with open(path, "wb") as fh:
        np.savez(fh, **{f"a{i}": np.ascontiguousarray(a) for i, (_, a) in enumerate(items)})
    Path(f"{path}.json").write_text(json.dumps([[name, np.asarray(a).dtype.name] for name, a in items]))


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays `write_arrays` wrote (each .npy member checked; dtypes restored by name)."""
    try:
        manifest = json.loads(Path(f"{path}.json").read_text())
    except (OSError, ValueError) as exc:
        raise DataFileError(f"the dtype list beside the arrays cannot be read: {exc}", where=f"{path}.json") from None
    stored = open_npz(path) if manifest else {}
    out = {}
    for i, (name, dtype) in enumerate(manifest):
        a = stored[f"a{i}"]
        out[name] = a if a.dtype.name == dtype else a.view(np.dtype(dtype))
    return out


def run_ranks(plan_paths: Sequence[Path], feeds: Mapping[str, np.ndarray], *, target: str,
              devices: Sequence[int] | None = None, timeout_s: float = 120.0,
              iterations: int = 1) -> list[dict[str, np.ndarray]]:
    """Each rank's outputs (rank order) of running plan_paths[i] as rank i on `target`."""
    return [r.outputs for r in run_rank_processes(plan_paths, feeds, target=target, devices=devices,
                                                  timeout_s=timeout_s, iterations=iterations)]


def run_rank_processes(plan_paths: Sequence[Path], feeds: Mapping[str, np.ndarray], *, target: str,
                       devices: Sequence[int] | None = None, timeout_s: float = 120.0, iterations: int = 1,
                       warmup: int = 0) -> list[RankRun]:
    """run_ranks with each rank's query times and weight bytes (`warmup` untimed queries first)."""
    ranks = len(plan_paths)
    devices = _devices(ranks, target, devices)
    if iterations < 1 or warmup < 0 or timeout_s <= 0:
        raise UsageError(f"iterations ({iterations}) must be >= 1, warmup ({warmup}) >= 0, timeout_s "
                         f"({timeout_s}) > 0")
    with tempfile.TemporaryDirectory(prefix="polykit-ranks-") as tmp:
        folder = Path(tmp)
        write_arrays(folder / "feeds.npz", feeds)
        common = ["--ranks", str(ranks), "--target", target, "--feeds", str(folder / "feeds.npz"),
                  "--iterations", str(iterations), "--warmup", str(warmup), "--timeout", f"{timeout_s * 0.75:g}"]
        uid = _unique_id() if target == "cuda" else ""
        procs, logs = [], []
        try:
            for rank, plan in enumerate(plan_paths):
                log = open(folder / f"stderr{rank}.txt", "w+b")
                logs.append(log)
                argv = [sys.executable, "-m", "polykit.backends.rank_worker", "--plan", str(Path(plan).resolve()),
                        "--rank", str(rank), "--out", str(folder / f"out{rank}.npz"),
                        "--stats", str(folder / f"stats{rank}.json"), *common]
                if devices[rank] is not None:
                    argv += ["--device", str(devices[rank]), "--nccl-id", uid]
                procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=log, env={**os.environ, "NCCL_NVLS_ENABLE": "0"}))
            _wait(procs, logs, timeout_s, devices)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for log in logs:
                log.close()
        return [_collect(folder, rank, devices[rank]) for rank in range(ranks)]


def _devices(ranks: int, target: str, devices: Sequence[int] | None) -> list[int | None]:
    if ranks < 1:
        raise UsageError("run_ranks needs at least one plan (one per rank)")
    if target == "cpu":
        return [None] * ranks
    if target != "cuda":
        raise UsageError(f"ranks run on target 'cuda' or 'cpu', not {target!r}")
    chosen = list(range(ranks)) if devices is None else [int(d) for d in devices]
    if len(chosen) != ranks or len(set(chosen)) != ranks or min(chosen) < 0:
        raise UsageError(f"the rank -> device map {chosen} must name {ranks} distinct CUDA devices, one per rank",
                         hint="NCCL runs one rank per GPU: pass devices=[d0, d1, ...]")
    return chosen


def _unique_id() -> str:
    """A new NCCL unique id as hex; "" where NCCL is not usable here (plans without collectives
    still run; a rank whose plan has some says so)."""
    from polykit.runtime.cuda.nccl import nccl_unique_id, unusable_reason

    return "" if unusable_reason() else nccl_unique_id().hex()


def _tail(log: IO[bytes]) -> str:
    log.flush()
    log.seek(0)
    text = log.read().decode("utf-8", "replace").strip()
    return text[-STDERR_TAIL:] or "(nothing on stderr)"


def _visible() -> str:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f" (CUDA_VISIBLE_DEVICES={cvd!r})" if cvd is not None else ""


def _wait(procs: list[subprocess.Popen], logs: list[IO[bytes]], timeout_s: float,
          devices: Sequence[int | None]) -> None:
    """Until every rank exited 0; RankError for the first that fails or for those still running
    at the deadline (the caller kills the rest)."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank = failed[0]
            on = f" on CUDA device {devices[rank]}{_visible()}" if devices[rank] is not None else ""
            raise RankError(f"rank {rank}{on} exited with code {codes[rank]}:\n{_tail(logs[rank])}",
                            where=f"rank {rank}", hint="the other ranks were stopped; fix the failing rank's "
                                                       "error above")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            late = [r for r, code in enumerate(codes) if code is None]
            tails = "\n".join(f"rank {r}: {_tail(logs[r])}" for r in late)
            raise RankError(f"rank(s) {', '.join(map(str, late))} did not finish within {timeout_s:g} s and were "
                            f"stopped:\n{tails}", where=f"rank {late[0]}",
                            hint="a rank hung or runs slower than the timeout allows; raise timeout_s or check "
                                 "that every rank runs the plan of the same model and group")
        time.sleep(0.02)


def _collect(folder: Path, rank: int, device: int | None) -> RankRun:
    try:
        stats = json.loads((folder / f"stats{rank}.json").read_text())
    except (OSError, ValueError) as exc:
        raise DeviceError(f"rank {rank} exited 0 but left no statistics: {exc}", where=f"rank {rank}") from None
    return RankRun(rank, device, read_arrays(folder / f"out{rank}.npz"), tuple(float(t) for t in stats["times_ms"]),
                   int(stats["weight_bytes"]))
