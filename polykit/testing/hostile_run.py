"""Run the hostile corpus (polykit.testing.hostile) through the CLI, as a user would, in a process
of bounded memory:

    python -m polykit.testing.hostile_run [--corpus first|fresh|all] [--max-memory-gb 4] [--case NAME ...] [--json]
    python -m polykit.testing.hostile_run --isolated [--corpus all] [--json]   # default limits, peak RSS

Each case's file is built in a temporary folder and every command that reads it runs in this
process through `polykit.tools.cli.app.main` under the case's small limits (POLYKIT_LIMITS),
with an address-space limit over the whole process (RLIMIT_AS) and an alarm per command. A
command passes when it exits 2 (a PolykitError) with no traceback on stderr; exit 3, any
other code, a traceback, a MemoryError or an alarm is a failure. Exit status: 1 if any failed.

`--isolated` is the acceptance measurement (issue 34: "peak memory under 2 GiB for any input
under 1 MB"): every command runs as its own `python -m polykit` process under polykit's
*default* limits (no POLYKIT_LIMITS, no address-space cap), killed after `--timeout` seconds,
and its peak resident memory (the child's ru_maxrss, from wait4) must stay under
`--max-rss-gb` (2). There a command may also succeed (exit 0, or 1 for a comparison against
loaded outputs): without the small limits a 64 MiB bomb is data polykit may read; what must
hold is no exit 3, no traceback, the bound on memory and no hang.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from polykit import limits
from polykit.testing.fuzz import cap_address_space
from polykit.testing import hostile, hostile_fresh
from polykit.testing.hostile import Case, valid_model

#: the corpora by name: the first (hostile.py) and the fresh one written apart from it
CORPORA = {"first": hostile.CASES, "fresh": hostile_fresh.CASES, "all": hostile.CASES + hostile_fresh.CASES,
           "at-defaults": hostile_fresh.AT_DEFAULT_LIMITS}


@dataclass(frozen=True)
class Outcome:
    case: str
    argv: list[str]
    code: int | str  # the exit code, or "hang" / "MemoryError"
    stderr: str
    peak_rss_mb: float | None = None  # --isolated only
    seconds: float | None = None  # --isolated only
    max_rss_mb: float | None = None  # the bound --isolated checks
    accept: tuple[int, ...] = (2,)  # the exit codes that pass (the case's, for its reader)

    @property
    def passed(self) -> bool:
        if "Traceback" in self.stderr:
            return False
        if self.max_rss_mb is None:
            return self.code in self.accept
        compared = "--load-outputs" in self.argv  # a comparison may fail (1) on data the defaults admit
        return self.code in (0, *self.accept, *((1,) if compared else ())) and self.peak_rss_mb is not None and self.peak_rss_mb < self.max_rss_mb


class _Alarm(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Alarm()


def run_case(case: Case, folder: Path, timeout: float = 60.0) -> list[Outcome]:
    """The outcome of every command that reads `case`'s file (built in `folder`)."""
    from polykit.tools.cli.app import main

    path, model = case.build(folder), valid_model(folder)
    outcomes = []
    for reader, argv in case.readings(path, model):
        err = io.StringIO()
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            with limits.raised(**case.limits), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code: int | str = main(argv)
        except _Alarm:
            code = "hang"
        except MemoryError:
            code = "MemoryError"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        outcomes.append(Outcome(case.name, argv, code, err.getvalue(), accept=case.accepted(reader)))
    return outcomes


def run_isolated(case: Case, folder: Path, timeout: float, max_rss_gb: float) -> list[Outcome]:
    """The outcome of every command that reads `case`'s file, each in its own process under the
    default limits, with its peak resident memory."""
    import os
    import subprocess
    import time

    env = {k: v for k, v in os.environ.items() if k != "POLYKIT_LIMITS"}
    path, model = case.build(folder), valid_model(folder)
    outcomes = []
    for reader, argv in case.readings(path, model):
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "polykit.tools.cli.app", *argv], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=env, cwd=folder)
        killer = _Killer(proc.pid, timeout)
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        killer.cancel()
        code: int | str = "hang" if killer.fired else proc.returncode
        outcomes.append(Outcome(case.name, argv, code, stderr[-4000:], round(usage.ru_maxrss / 1024, 1),
                                round(time.perf_counter() - t0, 2), max_rss_gb * 1024, case.accepted(reader)))
    return outcomes


class _Killer:
    """Kills process `pid` after `timeout` seconds unless cancelled."""

    def __init__(self, pid: int, timeout: float):
        import threading

        self.pid, self.fired = pid, False
        self._timer = threading.Timer(timeout, self._kill)
        self._timer.start()

    def _kill(self) -> None:
        import os

        self.fired = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def cancel(self) -> None:
        self._timer.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polykit.testing.hostile_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="run only these cases (by name)")
    parser.add_argument("--max-memory-gb", type=float, default=4.0, help="address-space limit of this process")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a command may take")
    parser.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    parser.add_argument("--corpus", choices=tuple(CORPORA), default="first", help="which corpus to run")
    parser.add_argument("--isolated", action="store_true",
                        help="each command in its own process under the default limits, with its peak memory")
    parser.add_argument("--max-rss-gb", type=float, default=2.0, help="--isolated: the bound on a command's peak memory")
    args = parser.parse_args(argv)
    chosen = [c for c in CORPORA[args.corpus] if not args.case or c.name in args.case]
    if not args.isolated:
        cap_address_space(args.max_memory_gb)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in chosen:
            folder = Path(tmp) / case.name
            folder.mkdir()
            if args.isolated:
                outcomes += run_isolated(case, folder, args.timeout, args.max_rss_gb)
            else:
                outcomes += run_case(case, folder, args.timeout)
    if args.json:
        print(json.dumps([{**asdict(o), "passed": o.passed} for o in outcomes], indent=1))
    else:
        for o in outcomes:
            first = o.stderr.strip().splitlines()[:1]
            rss = f" {o.peak_rss_mb:7.1f} MB {o.seconds:5.1f} s" if o.peak_rss_mb is not None else ""
            print(f"{'ok  ' if o.passed else 'FAIL'} {o.case}: polykit {' '.join(o.argv[:2])} -> {o.code}{rss} "
                  f"{first[0][:160] if first else ''}")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
