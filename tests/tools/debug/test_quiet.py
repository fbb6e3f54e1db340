"""`-q` on the debug commands prints one summary line (what was found, what was written) and
nothing else on stdout; the progress bars stay off even on a terminal."""

from __future__ import annotations

import logging

import pytest

from polykit.compiler.builder.tuner import progress_bar
from polykit.tools.cli.app import main
from tests.tools.debug.test_precision import CPU, TOL as PRECISION_TOL, overflow_model
from tests.tools.debug.test_reduce import CONVNET, LEVEL0, TOL


def _lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if line.strip()]


@pytest.mark.usefixtures("fault_plugin")
def test_debug_tactics_quiet_prints_only_the_culprits(monkeypatch, capsys):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "fc/Gemm")
    assert main(["-q", "debug", "tactics", CONVNET, *LEVEL0]) == 0
    lines = _lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("debug tactics: 1 culprit(s)") and lines[0].endswith("/fc/Gemm")


@pytest.mark.usefixtures("fault_plugin")
def test_debug_reduce_quiet_prints_the_reduction_and_the_file(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "fc/Gemm")
    out = tmp_path / "reduced.onnx"
    assert main(["-q", "debug", "reduce", CONVNET, "-o", str(out), *LEVEL0, *TOL]) == 0
    lines = _lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("debug reduce: 16 node(s) -> ") and "FAILS" in lines[0]
    assert lines[0].endswith(f"wrote {out}") and out.is_file()


def test_debug_precision_quiet_prints_the_value_to_pass(capsys, tmp_path):
    model = overflow_model(tmp_path / "overflow.onnx")
    out = tmp_path / "keep.txt"
    assert main(["-q", "debug", "precision", model, "--fp16", *CPU, *PRECISION_TOL, "--timing-iterations", "0",
                 "-o", str(out)]) == 0
    lines = _lines(capsys)
    value = out.read_text().strip()
    assert "big_mm:fp32" in value
    assert lines == [f"debug precision (fp16): --layer-precisions {value}; after passes"
                     + lines[0].split("after passes", 1)[1]]
    assert lines[0].endswith(f"wrote {out}")


def test_quiet_keeps_progress_bars_off_on_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    logger = logging.getLogger("polykit")
    previous = logger.level
    try:
        logger.setLevel(logging.ERROR)
        with progress_bar(3, "quiet") as advance:
            assert getattr(advance, "__name__", "") == "<lambda>" and advance("x") is None
    finally:
        logger.setLevel(previous)
