"""Count Polygraphy's CLI example commands that run unchanged with `polygraphy` replaced by `polykit`.

    PYTHONPATH=. python3 benchmarks/polygraphy_examples.py [--mirror GIT_DIR] [--only PREFIX] [--json OUT]

Every README under tools/Polygraphy/examples/cli of NVIDIA/TensorRT (read from the bare git
mirror --mirror, default /work/.mirror/NVIDIA+TensorRT/repo, at HEAD) gives its commands the way
Polygraphy's own README test reads them (tests/tools/polygraphy_examples/harness.py `commands()`:
```bash lines starting with `polygraphy` or `python3`, outside Ignore markers; XFAIL ones must
exit 1). Each example runs in a temporary copy of its folder: the vendored copy under
tests/data/polygraphy_examples/cli with its generated models where there is one, else the
mirror's folder (`git archive`). Its commands run in order (`run_command()`, the engine on the cpu
target) and the script prints one row per command: example, command, whether it ran unchanged
(exit 0, or 1 for an XFAIL command), and why not (the known TensorRT-only reason, if any, and the
last error line of its output). Every command is tried, the known exceptions too. The last line is the total, "N of M run unchanged", which docs/POLYGRAPHY.md
records.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from polykit.plugins import reset_plugin_manager
from tests.tools.polygraphy_examples.harness import EXAMPLES, commands, copy_example, example_environment, run_command
from tests.tools.polygraphy_examples.test_cli_examples import EXCEPTIONS as VENDORED_EXCEPTIONS

UPSTREAM = "tools/Polygraphy/examples/cli"
MIRROR = Path("/work/.mirror/NVIDIA+TensorRT/repo")

#: example -> why its commands that fail need TensorRT itself (docs/POLYGRAPHY.md); every command is tried
TENSORRT_ONLY = {
    "inspect/01_inspecting_a_tensorrt_network": "TensorRT-only: shows TensorRT's INetworkDefinition of the parsed model "
                                                "(--display-as=trt, --model-type=onnx into a TensorRT network)",
    "inspect/04_inspecting_a_tensorflow_graph": "not applicable: TensorFlow graphs",
    "multi_device/01_sharding_attention_layers": "TensorRT-only: TensorRT's multi-device sharding",
    "plugin/01_match_and_replace_plugin": "TensorRT-only: TensorRT's plugin registry",
}


def _examples(mirror: Path) -> list[str]:
    names = subprocess.run(["git", "-C", str(mirror), "ls-tree", "-r", "--name-only", "HEAD", UPSTREAM],
                           capture_output=True, text=True, check=True).stdout.split()
    return sorted(str(Path(n).parent.relative_to(UPSTREAM)) for n in names
                  if n.endswith("/README.md") and n.count("/") == UPSTREAM.count("/") + 3)


def _folder(example: str, mirror: Path, workdir: Path) -> Path:
    if (EXAMPLES / example / "README.md").is_file():
        return copy_example(example, workdir)
    archive = subprocess.run(["git", "-C", str(mirror), "archive", "HEAD", f"{UPSTREAM}/{example}"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(workdir, filter="data")
    return workdir / UPSTREAM / example


def _why(output: str, code: int, expected: int) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error", "Error", "[E]", "[!]")) or "Error" in line[:40]]
    return f"exit {code} (expected {expected}): " + ((errors or lines or [""])[-1])[:160]


def count(mirror: Path, only: str = "") -> list[dict]:
    rows = []
    monkeypatch = pytest.MonkeyPatch()
    example_environment(monkeypatch)
    try:
        for example in _examples(mirror):
            if not example.startswith(only):
                continue
            with tempfile.TemporaryDirectory(prefix="pg_example_") as tmp:
                folder = _folder(example, mirror, Path(tmp))
                for index, command in enumerate(commands((folder / "README.md").read_text(encoding="utf-8"))):
                    reset_plugin_manager()
                    expected = 1 if command.expect_failure else 0
                    try:
                        code, output = run_command(command, folder)
                    except Exception as exc:  # a crash is a "no" with its reason, not the end of the count
                        code, output = 3, f"Error: {type(exc).__name__}: {exc}"
                    known = TENSORRT_ONLY.get(example) or VENDORED_EXCEPTIONS.get((example, index))
                    row = {"example": example, "command": command.text, "ran": code == expected, "exception": False,
                           "why": ""}
                    if not row["ran"]:
                        row["exception"] = bool(known)
                        row["why"] = f"{known} ({_why(output, code, expected)})" if known else _why(output, code, expected)
                    rows.append(row)
                    print(f"{example} | {row['command']} | {'yes' if row['ran'] else 'no'} | {row['why']}",
                          flush=True)
    finally:
        monkeypatch.undo()
        reset_plugin_manager()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="bare git directory of NVIDIA/TensorRT")
    parser.add_argument("--only", default="", help="examples whose path starts with this, e.g. run/")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    logging.getLogger("polykit").setLevel(logging.WARNING)
    print("example | command | ran unchanged | why not")
    rows = count(args.mirror, args.only)
    ran = sum(r["ran"] for r in rows)
    exceptions = sum(r["exception"] for r in rows)
    print(f"{ran} of {len(rows)} run unchanged; {exceptions} TensorRT-only or not applicable; "
          f"{len(rows) - ran - exceptions} fail")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
