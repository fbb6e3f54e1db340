"""Run a Polygraphy CLI example README's commands with `polygraphy` replaced by `polykit`.

Commands are the lines of the README's ```bash blocks that start with `polygraphy` or `python3`
(a trailing backslash joins the next line), outside `<!-- Polygraphy Test: Ignore Start/End -->`
markers, as Polygraphy's own README test reads them; commands inside `XFAIL Start/End` markers are
expected to fail (exit 1). Every word `polygraphy` becomes `polykit` (`debug --check polygraphy run
polygraphy_debug.onnx` too; `polygraphy_debug.onnx` stays). `python3 SCRIPT` runs as
`python -m polykit.compat SCRIPT` (docs/POLYGRAPHY.md, API): the examples' data scripts import
`polygraphy.json`, which that resolves to polykit.compat.

Each example runs in a copy of its folder (tests/data/polygraphy_examples/cli/<same path as under
examples/cli>), its commands in order: later ones read what earlier ones wrote. Models too large
to vendor are written byte for byte by GENERATED. `polykit` commands run in process
(polykit.tools.cli.app.main) with the engine on the cpu target; what they start themselves
(`debug --check polykit ...`) finds `polykit` on PATH with this tree first on PYTHONPATH
(`example_environment`).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "polygraphy_examples"
EXAMPLES = DATA / "cli"
API_EXAMPLES = DATA / "api"
_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
_MARK = re.compile(r"<!-- Polygraphy Test: (Ignore|XFAIL) (Start|End) -->")


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    expect_failure: bool = False

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


def commands(readme: str) -> list[Command]:
    """The README's commands in order, `polygraphy` already replaced by `polykit`."""
    out: list[Command] = []
    ignore = xfail = False
    for match in re.finditer(rf"{_MARK.pattern}|{_BLOCK.pattern}", readme, re.S):
        if match.group(1):
            on = match.group(2) == "Start"
            ignore, xfail = (on, xfail) if match.group(1) == "Ignore" else (ignore, on)
            continue
        if ignore:
            continue
        for line in _joined(match.group(3)):
            if line.startswith(("polygraphy ", "python3 ")):
                argv = ["polykit" if word == "polygraphy" else word for word in shlex.split(line)]
                out.append(Command(tuple(argv), xfail))
    return out


def _joined(block: str) -> list[str]:
    lines, current = [], ""
    for raw in block.splitlines():
        line = raw.strip()
        current = f"{current} {line}" if current else line
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        lines.append(current)
        current = ""
    return lines + ([current] if current else [])


def example_environment(monkeypatch) -> None:
    """The cpu target in process (resolve_target asks default_target) and in the commands that
    commands start: no GPU visible, `polykit` on PATH importing this tree."""
    monkeypatch.setattr("polykit.runtime.target.default_target", lambda: "cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("POLYKIT_PLUGINS", raising=False)


@contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _isolating_model(path: Path) -> None:
    """debug/02's and surgeon/01's model.onnx (1.2 MB: two 1x3x224x224 initializers of ones):
    x0, x1 -> Mul(a, x1) -> Add(., b) -> Add(x0, .) -> Y, opset 11, the same bytes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ones = np.ones((1, 3, 224, 224), np.float32)
    io_ = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 224, 224]) for n in ("x0", "x1", "Y")]
    nodes = [helper.make_node("Mul", ["a", "x1"], ["mul_out"]), helper.make_node("Add", ["mul_out", "b"], ["add_out"]),
             helper.make_node("Add", ["x0", "add_out"], ["Y"])]
    graph = helper.make_graph(nodes, "onnx_graphsurgeon_graph", io_[:2], io_[2:],
                              [numpy_helper.from_array(ones, "a"), numpy_helper.from_array(ones, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(path))


def _needs_constraints_model(path: Path) -> None:
    """run/08's needs_constraints.onnx (262 KB): x [1,1,256,256] -> MatMul(I) -> Add(65504) ->
    Sub(65504) -> MatMul(I), I the 256x256 identity (named I_rot90), opset 11, the same bytes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    eye = np.eye(256, dtype=np.float32).reshape(1, 1, 256, 256)
    weights = [numpy_helper.from_array(eye, "I_rot90"), numpy_helper.from_array(np.full((1, 1, 1, 1), 65504, np.float32),
                                                                                 "fp16_max")]
    nodes = [helper.make_node("MatMul", ["x", "I_rot90"], ["matmul_out_0"], name="MatMul_0"),
             helper.make_node("Add", ["matmul_out_0", "fp16_max"], ["add_out_1"], name="Add"),
             helper.make_node("Sub", ["add_out_1", "fp16_max"], ["sub_out_2"], name="Sub"),
             helper.make_node("MatMul", ["sub_out_2", "I_rot90"], ["matmul_out_3"], name="MatMul_1")]
    graph = helper.make_graph(nodes, "onnx_graphsurgeon_graph",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 256, 256])],
                              [helper.make_tensor_value_info("matmul_out_3", TensorProto.FLOAT, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version, model.producer_name, model.producer_version = 8, "", ""
    onnx.save(model, str(path))


#: example -> {file name: (writer, the upstream file's git blob id)}: models not vendored (see the NOTICE)
GENERATED: dict[str, dict[str, tuple[Callable[[Path], None], str]]] = {
    "debug/02_reducing_failing_onnx_models": {"model.onnx": (_isolating_model, "27cc8f3b4b91b880a4ff2bdf7a42eabd71e9c1fc")},
    "surgeon/01_isolating_subgraphs": {"model.onnx": (_isolating_model, "27cc8f3b4b91b880a4ff2bdf7a42eabd71e9c1fc")},
    "run/08_adding_precision_constraints": {
        "needs_constraints.onnx": (_needs_constraints_model, "b7c7637857acb4984737a4dae6232d312954c9c7")},
}


#: example -> other vendored folders (relative to DATA) its commands read
ALSO_COPIED = {"convert/01_int8_calibration_in_tensorrt": ("api/04_int8_calibration_in_tensorrt",)}


def git_blob_id(data: bytes) -> str:
    """The id git gives a file of these bytes (how the upstream tree names its files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def copy_example(relative: str, workdir: Path, root: Path = EXAMPLES) -> Path:
    """A copy of the example's vendored folder (under `root`: EXAMPLES or API_EXAMPLES) in
    `workdir`, with its GENERATED models, to run its commands in."""
    target = workdir / root.name / relative  # the upstream layout: cli/convert/01's ../../../api/04 resolves
    shutil.copytree(root / relative, target)
    for other in ALSO_COPIED.get(relative, ()):
        shutil.copytree(DATA / other, workdir / other)
    for name, (write, _) in GENERATED.get(relative, {}).items():
        write(target / name)
    return target


def run_command(command: Command, folder: Path) -> tuple[int, str]:
    """(exit code, output) of one command run in `folder`."""
    if command.argv[0] == "python3":
        proc = subprocess.run([sys.executable, "-m", "polykit.compat", *command.argv[1:]], cwd=folder,
                              capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr
    from polykit.tools.cli.app import main

    out = io.StringIO()
    with _cwd(folder), redirect_stdout(out), redirect_stderr(out):
        code = main(list(command.argv[1:]))
    return code, out.getvalue()
