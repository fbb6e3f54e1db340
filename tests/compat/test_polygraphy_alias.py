"""polykit.compat: Polygraphy's data scripts (examples/cli/run/05 and 06, vendored) run without
Polygraphy, through `python -m polykit.compat` and through the CLI's --data-loader-script;
a real Polygraphy install is never shadowed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from polykit.tools.data import results_io

REPO = Path(__file__).resolve().parents[2]
RUN_EXAMPLES = REPO / "tests" / "data" / "polygraphy_examples" / "cli" / "run"


def _python(args: list[str], cwd: Path, extra_path: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (extra_path, str(REPO)) if p), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _copy(example: str, tmp_path: Path) -> Path:
    shutil.copytree(RUN_EXAMPLES / example, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_the_custom_input_data_script_writes_polygraphy_json_polykit_reads(tmp_path):
    folder = _copy("05_comparing_with_custom_input_data", tmp_path)
    done = _python(["-m", "polykit.compat", "data_loader.py"], folder)
    assert done.returncode == 0, done.stderr
    feeds = results_io.load_feeds(folder / "custom_inputs.json")
    assert len(feeds) == 5 and all(np.array_equal(f["x"], np.ones((1, 2, 28, 28), np.float32)) for f in feeds)


def test_the_cli_runs_a_data_loader_script_that_imports_polygraphy(tmp_path):
    folder = _copy("05_comparing_with_custom_input_data", tmp_path)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 28, 28]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", io[:1], io[1:])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(folder / "identity.onnx"))
    done = _python(["-m", "polykit.tools.cli.app", "run", "identity.onnx", "--trt", "--onnxrt",
                    "--data-loader-script", "data_loader.py"], folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 iteration(s)" in done.stdout


def test_the_custom_output_data_script_makes_files_run_compares_with(tmp_path):
    folder = _copy("06_comparing_with_custom_output_data", tmp_path)
    assert _python(["-m", "polykit.compat", "generate_data.py"], folder).returncode == 0
    assert list(results_io.load_outputs(folder / "custom_outputs.json")) == ["custom_runner"]
    done = _python(["-m", "polykit.tools.cli.app", "run", "identity.onnx", "--onnxrt", "--load-inputs",
                    "custom_inputs.json", "--load-outputs", "custom_outputs.json"], folder)
    assert done.returncode == 0 and "PASSED" in done.stdout, done.stdout + done.stderr


def test_a_real_polygraphy_install_wins(tmp_path):
    (tmp_path / "polygraphy").mkdir()
    (tmp_path / "polygraphy" / "__init__.py").write_text("REAL = True\n")
    code = ("from polykit.compat import install_polygraphy_alias; assert not install_polygraphy_alias(); "
            "import polygraphy; print(polygraphy.REAL)")
    done = _python(["-c", code], tmp_path, extra_path=str(tmp_path))
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


def test_without_polygraphy_the_alias_gives_polykits_modules_and_only_those(tmp_path):
    code = ("from polykit.compat import install_polygraphy_alias; assert install_polygraphy_alias(); "
            "import polygraphy.json, polykit.compat.polygraphy.json as ours; assert polygraphy.json is ours; "
            "from polygraphy import func\n"
            "import polygraphy.backend.trt, polykit.compat.polygraphy.backend.trt as trt; "
            "assert polygraphy.backend.trt is trt\n"
            "try:\n    import polygraphy.tools.args\nexcept ModuleNotFoundError as exc:\n    print(exc.name)")
    done = _python(["-c", code], tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "polygraphy.tools", done.stderr
