"""The fuzzer in CI: a few hundred mutated plans, models and data files, every one a success
or a PolykitError; and the fuzzer's own parts (mutators, the oracle) doing what they say."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from polykit.errors import PlanError
from polykit.testing.fuzz import FAILURES, KINDS, run_case
from polykit.testing.fuzz_corpus import DataFile, mutate_data, seed_models
from polykit.testing.mutate import mutate_bytes, mutate_json, mutate_proto

REPO = Path(__file__).resolve().parents[2]
CASES = 150  # per file type: 450 cases, about 10 s on 2 cores


def _children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def test_fuzzed_plans_models_and_data_files_give_success_or_a_polykit_error():
    start = _children_cpu_s()  # the fuzzer's CPU time: a loaded machine stretches its wall time
    proc = subprocess.run([sys.executable, "-m", "polykit.testing.fuzz", "--cases", str(CASES), "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    report = json.loads(proc.stdout)
    assert report["failures"] == [], json.dumps(report["failures"], indent=1)
    assert proc.returncode == 0, proc.stderr
    for kind in KINDS:
        counts = report["counts"][kind]
        assert sum(counts.values()) == CASES and set(counts) <= {"ok", "error"}
        assert counts.get("ok", 0) > 0, f"no {kind} case got past the checks: the mutations are too blunt"
    assert _children_cpu_s() - start < 60


def test_the_oracle_tells_errors_crashes_and_hangs_apart():
    def plan_error():
        raise PlanError("bad field")

    def crash():
        raise KeyError("x")

    def hang():
        time.sleep(5)

    import signal

    from polykit.testing.fuzz import _on_alarm

    old = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        assert run_case(lambda: None, 1.0) == ("ok", "")
        assert run_case(plan_error, 1.0)[0] == "error"
        outcome, detail = run_case(crash, 1.0)
        assert outcome == "crash" and "KeyError" in detail and outcome in FAILURES
        assert run_case(hang, 0.2)[0] == "hang"
    finally:
        signal.signal(signal.SIGALRM, old)


def test_json_mutations_are_deterministic_for_a_seed_and_change_the_document():
    doc = {"tensors": {"x": {"shape": [1, 2], "dtype": "float32"}}, "layers": [{"name": "a", "attrs": {"axis": 1}}]}
    first = [mutate_json(doc, np.random.default_rng(7)) for _ in range(2)]
    assert first[0] == first[1]
    changed = [mutate_json(doc, np.random.default_rng(s))[0] != doc for s in range(20)]
    assert sum(changed) >= 15
    assert doc == {"tensors": {"x": {"shape": [1, 2], "dtype": "float32"}}, "layers": [{"name": "a", "attrs": {"axis": 1}}]}


def test_json_mutation_focus_keeps_to_the_named_part():
    doc = {"layers": [{"name": "a", "attrs": {"axis": 1, "perm": [0, 1]}}], "tensors": {"x": {"offset": 0}}}
    for seed in range(10):
        _, note = mutate_json(doc, np.random.default_rng(seed), focus="['attrs']")
        assert "['attrs']" in note


def test_proto_mutations_give_models_that_still_serialize():
    model = seed_models()["conv"]
    for seed in range(30):
        mutated, note = mutate_proto(model, np.random.default_rng(seed))
        assert note and isinstance(onnx.load_model_from_string(mutated.SerializeToString()), onnx.ModelProto)
    assert model == seed_models()["conv"]


def test_npz_mutations_keep_a_zip_archive_and_byte_mutations_change_bytes():
    buf = io.BytesIO()
    np.savez(buf, **{"0/x": np.arange(6, dtype=np.float32).reshape(2, 3)})
    file = DataFile("feeds", ".npz", buf.getvalue())
    notes = set()
    for seed in range(20):
        data, note = mutate_data(file, np.random.default_rng(seed), 1)
        notes.add(note.split(" ")[0])
        if data.startswith(b"PK"):
            zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert len(notes) >= 3
    assert all(mutate_bytes(b"abcdef", np.random.default_rng(s))[0] != b"abcdef" for s in range(10))


@pytest.mark.parametrize("argv", [["--cases", "3", "--kind", "plan", "--json"]])
def test_the_fuzzer_runs_from_its_module_entry_point(argv):
    proc = subprocess.run([sys.executable, "-m", "polykit.testing.fuzz", *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["counts"]["plan"]
