"""Start-up benchmark: wall time of `polykit run MODEL --onnxrt` vs `polygraphy run MODEL --onnxrt`.

Both commands do the same work (load a small model into ONNX Runtime, make random inputs,
run once, report); what differs is how much each CLI imports and sets up. Runs are
interleaved (polykit, polygraphy, polykit, ...) so load on the machine hits both alike.

    python3 benchmarks/startup.py [--model examples/models/mlp.onnx] [--runs 15] [--polygraphy "polygraphy"]

polykit is run as `python3 -m polykit.tools.cli` (what the `polykit` console script calls).
Polygraphy is optional: without it only polykit's numbers are printed (compare them with the
~0.24 s Polygraphy baseline measured on the 2-core dev machine).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def wall_time(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr.decode()[-2000:]}")
    return elapsed


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "examples" / "models" / "mlp.onnx"))
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--polygraphy", default=shutil.which("polygraphy") or "", help="polygraphy command ('' to skip)")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    commands = {"polykit": [sys.executable, "-m", "polykit.tools.cli", "run", args.model, "--onnxrt"]}
    if args.polygraphy:
        commands["polygraphy"] = shlex.split(args.polygraphy) + ["run", args.model, "--onnxrt"]
    for cmd in commands.values():  # warm the OS file cache and .pyc files
        wall_time(cmd, env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, cmd in commands.items():
            times[name].append(wall_time(cmd, env))

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC | commit: {commit()} | "
          f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()} | "
          f"load average (1 min) after: {load:.1f}")
    print(f"model: {os.path.relpath(args.model, REPO)} | runs: {args.runs} each, interleaved")
    print("| command | min (s) | median (s) |")
    print("|---|---|---|")
    for name, cmd in commands.items():
        shown = shlex.join(["polykit"] + cmd[3:]) if name == "polykit" else shlex.join(cmd)
        print(f"| `{shown}` | {min(times[name]):.3f} | {statistics.median(times[name]):.3f} |")


if __name__ == "__main__":
    main()
