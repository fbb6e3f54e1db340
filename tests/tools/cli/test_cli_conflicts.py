"""Options the CLI would ignore are usage errors, every usage error the CLI can raise carries a
hint, and inputs holding inf or NaN run without numpy's RuntimeWarnings."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import numpy as np
import pytest

from polykit.testing import hostile
from polykit.tools.cli.app import main

pytestmark = pytest.mark.usefixtures("fresh_plugins")
PACKAGE = Path(__file__).resolve().parents[3] / "polykit"


@pytest.mark.parametrize("extra, named", [
    (["--data-loader-script", "missing.py"], "--data-loader-script"),
    (["--seed", "3"], "--seed"),
    (["--iterations", "2", "--val-range", "[0,1]"], "--iterations, --val-range"),
])
def test_load_inputs_with_options_that_make_feeds_is_a_usage_error(tmp_path, capsys, extra, named):
    np.savez(tmp_path / "in.npz", x=np.ones((1, 2), np.float32))
    code = main(["run", str(hostile.valid_model(tmp_path)), "--trt", "--target", "cpu",
                 "--load-inputs", str(tmp_path / "in.npz"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and f"--load-inputs reads the feeds from a file; {named} would make feeds" in err
    assert "hint: drop" in err


def test_every_usage_error_of_the_cli_layers_carries_a_hint():
    missing = []
    for folder in ("tools", "compiler/builder"):
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "UsageError" \
                        and not any(k.arg == "hint" for k in node.keywords):
                    missing.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert missing == []


@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_inputs_with_inf_or_nan_run_without_runtime_warnings(tmp_path, capsys, value):
    np.savez(tmp_path / "in.npz", x=np.array([[value, -1.0]], np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        code = main(["run", str(hostile.valid_model(tmp_path)), "--trt", "--onnxrt", "--target", "cpu",
                     "--load-inputs", str(tmp_path / "in.npz")])
    assert code == 0 and "RuntimeWarning" not in capsys.readouterr().err
