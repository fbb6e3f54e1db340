"""`polykit run M --onnxrt` starts without importing ml_dtypes or onnx (issue 32: start-up no
slower than Polygraphy's; ml_dtypes alone takes longer to import than the rest of the path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
MODEL = REPO / "tests" / "data" / "polygraphy_examples" / "cli" / "run" / "02_comparing_across_runs" / "identity.onnx"

PROBE = """
import sys
from polykit.tools.cli.app import main
code = main(sys.argv[1:])
print("LOADED", sorted(m for m in ("ml_dtypes", "onnx", "polykit.kernels.cuda", "polykit.compiler.ops")
                       if m in sys.modules), code)
"""


def test_run_onnxrt_imports_neither_ml_dtypes_nor_onnx(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", PROBE, "run", str(MODEL), "--onnxrt"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "LOADED [] 0"
