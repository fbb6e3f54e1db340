"""The hostile corpus through the CLI (issue 34's classes): every command that reads a hostile
file exits 2 with a message and no traceback, in a process whose address space is capped at
4 GiB, under small limits so that bombs are refused in milliseconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polykit.testing import hostile, hostile_fresh

ROOT = Path(__file__).resolve().parents[2]


def test_every_hostile_file_is_small(tmp_path):
    for case in hostile.CASES + hostile_fresh.CASES:
        folder = tmp_path / case.name
        folder.mkdir()
        path = case.build(folder)
        assert path.stat().st_size < 1 << 20, case.name  # the bound: any input under 1 MB


@pytest.mark.parametrize("corpus", ["first", "fresh"])
def test_every_command_answers_every_hostile_file_with_an_accepted_code_and_no_traceback(corpus):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("POLYKIT_LIMITS", None)
    proc = subprocess.run([sys.executable, "-m", "polykit.testing.hostile_run", "--json", "--max-memory-gb", "4",
                           "--corpus", corpus], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    outcomes = json.loads(proc.stdout)
    cases = {"first": hostile.CASES, "fresh": hostile_fresh.CASES}[corpus]
    assert {o["case"] for o in outcomes} == {c.name for c in cases}
    failed = [(o["case"], o["argv"][:2], o["code"], o["stderr"][-300:]) for o in outcomes if not o["passed"]]
    assert failed == [] and proc.returncode == 0
