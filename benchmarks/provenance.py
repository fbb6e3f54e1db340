"""The commit a benchmark's numbers belong to.

The device machine runs a copy of the working tree whose git metadata can lag the tree it
carries, so `git rev-parse HEAD` there may name an older commit. The caller that knows the
tree passes it explicitly: `POLYKIT_COMMIT=$(git rev-parse --short HEAD) python3 benchmarks/...`
(the lead's device commands do); otherwise git is asked, marked "-dirty" when files differ.
`meta` is the provenance block every benchmark's JSON opens with."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def commit() -> str:
    if os.environ.get("POLYKIT_COMMIT"):
        return os.environ["POLYKIT_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()

    sha = git("rev-parse", "--short", "HEAD")
    if not sha:
        return "unknown"
    return sha + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def meta(torch, **extra) -> dict:
    """Date, GPU name, commit and torch version of a run on the device, then `extra`."""
    return {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "commit": commit(),
            "torch": torch.__version__, **extra}
