"""Folders that every test of one run shares, on every xdist worker: build outputs (kernel cubins,
host-emulation libraries) that any test of the run may reuse, so each is built once a run."""

from __future__ import annotations

import os
from pathlib import Path


def run_shared_dir(tmp_path_factory, name: str) -> Path:
    """`name` under this test run's base temp folder, empty when the run starts (pytest gives each run
    a fresh base) and the same folder on every xdist worker of the run."""
    base = tmp_path_factory.getbasetemp()
    # an xdist worker's base is <the run's base>/popen-gwN: the run's base is the one they share
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    path.mkdir(exist_ok=True)
    return path
