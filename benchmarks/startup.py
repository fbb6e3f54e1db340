"""Start-up benchmark: wall time of `polykit run MODEL --onnxrt` vs `polygraphy run MODEL --onnxrt`.

Both commands do the same work (load a small model into ONNX Runtime, make random inputs,
run once, report); what differs is how much each CLI imports and sets up. Runs are
interleaved (polykit, polygraphy, polykit, ...) so load on the machine hits both alike.

    python3 benchmarks/startup.py [--model examples/models/mlp.onnx] [--runs 15] [--polygraphy "polygraphy"]

polykit is run as `python3 -m polykit.tools.cli.app` (what the `polykit` console script calls).
Polygraphy is optional: without it only polykit's numbers are printed (compare them with the
~0.24 s Polygraphy baseline measured on the 2-core dev machine).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def wall_time(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one run; CPU time is less sensitive to machine load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr.decode()[-2000:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def commit() -> str:
    from benchmarks.provenance import commit as tree_commit

    return tree_commit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="examples/models/mlp.onnx", help="path relative to the repository root, or absolute")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--polygraphy", default=shutil.which("polygraphy") or "", help="polygraphy command ('' to skip)")
    parser.add_argument("--polygraphy-path", default="", help="PYTHONPATH entry holding the polygraphy package; "
                        "runs it as `python3 -c 'from polygraphy.tools import main'` (with --hide)")
    parser.add_argument("--hide", nargs="*", default=[], help="modules Polygraphy must not import (e.g. torch: "
                        "Polygraphy imports torch when it is installed, which the 0.24 s baseline did not have)")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    commands = {"polykit": [sys.executable, "-m", "polykit.tools.cli.app", "run", args.model, "--onnxrt"]}
    if args.polygraphy_path:
        hide = "".join(f"sys.modules[{m!r}] = None; " for m in args.hide)
        code = f"import sys; {hide}sys.argv[0] = 'polygraphy'; from polygraphy.tools import main; sys.exit(main())"
        commands["polygraphy"] = [sys.executable, "-c", code, "run", args.model, "--onnxrt"]
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], args.polygraphy_path])
    elif args.polygraphy:
        commands["polygraphy"] = shlex.split(args.polygraphy) + ["run", args.model, "--onnxrt"]
    for cmd in commands.values():  # warm the OS file cache and .pyc files
        wall_time(cmd, env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, cmd in commands.items():
            wall, used = wall_time(cmd, env)
            times[name].append(wall)
            cpu[name].append(used)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC | commit: {commit()} | "
          f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()} | "
          f"load average (1 min) after: {load:.1f}")
    print(f"model: {args.model} | runs: {args.runs} each, interleaved")
    print("| command | wall min (s) | wall median (s) | CPU user+sys min (s) |")
    print("|---|---|---|---|")
    for name, cmd in commands.items():
        if name == "polykit":
            shown = shlex.join(["polykit"] + cmd[3:])
        elif args.polygraphy_path:
            shown = shlex.join(["polygraphy"] + cmd[3:]) + (f" (hiding {', '.join(args.hide)})" if args.hide else "")
        else:
            shown = shlex.join(cmd)
        print(f"| `{shown}` | {min(times[name]):.3f} | {statistics.median(times[name]):.3f} | {min(cpu[name]):.3f} |")


if __name__ == "__main__":
    main()
