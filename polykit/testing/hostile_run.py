"""Run the hostile corpus (polykit.testing.hostile) through the CLI, as a user would, in a process
of bounded memory:

    python -m polykit.testing.hostile_run [--max-memory-gb 4] [--case NAME ...] [--json]

Each case's file is built in a temporary folder and every command that reads it runs in this
process through `polykit.tools.cli.app.main` under the case's small limits (POLYKIT_LIMITS),
with an address-space limit over the whole process (RLIMIT_AS) and an alarm per command. A
command passes when it exits 2 (a PolykitError) with no traceback on stderr; exit 3, any
other code, a traceback, a MemoryError or an alarm is a failure. Exit status: 1 if any failed.
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
from polykit.testing.hostile import CASES, Case, valid_model


@dataclass(frozen=True)
class Outcome:
    case: str
    argv: list[str]
    code: int | str  # the exit code, or "hang" / "MemoryError"
    stderr: str

    @property
    def passed(self) -> bool:
        return self.code == 2 and "Traceback" not in self.stderr


class _Alarm(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Alarm()


def run_case(case: Case, folder: Path, timeout: float = 60.0) -> list[Outcome]:
    """The outcome of every command that reads `case`'s file (built in `folder`)."""
    from polykit.tools.cli.app import main

    path, model = case.build(folder), valid_model(folder)
    outcomes = []
    for argv in case.commands(path, model):
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
        outcomes.append(Outcome(case.name, argv, code, err.getvalue()))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polykit.testing.hostile_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="run only these cases (by name)")
    parser.add_argument("--max-memory-gb", type=float, default=4.0, help="address-space limit of this process")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a command may take")
    parser.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    args = parser.parse_args(argv)
    cap_address_space(args.max_memory_gb)
    chosen = [c for c in CASES if not args.case or c.name in args.case]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in chosen:
            folder = Path(tmp) / case.name
            folder.mkdir()
            outcomes += run_case(case, folder, args.timeout)
    if args.json:
        print(json.dumps([{**asdict(o), "passed": o.passed} for o in outcomes], indent=1))
    else:
        for o in outcomes:
            first = o.stderr.strip().splitlines()[:1]
            print(f"{'ok  ' if o.passed else 'FAIL'} {o.case}: polykit {' '.join(o.argv[:2])} -> {o.code} "
                  f"{first[0][:160] if first else ''}")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
