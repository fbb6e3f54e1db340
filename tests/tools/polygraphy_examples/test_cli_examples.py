"""Polygraphy's CLI examples (examples/cli of NVIDIA/TensorRT: run, convert, check, debug,
inspect/05-06, surgeon; vendored under tests/data/polygraphy_examples/cli with a NOTICE) run as
written with `polygraphy` replaced by `polykit`, on the cpu target, against the examples' own
files (harness.py), and reach the outcome each README describes (OUTCOMES). The commands that
cannot run are EXCEPTIONS, with the reason docs/POLYGRAPHY.md gives."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.tools.polygraphy_examples.harness import (EXAMPLES, GENERATED, commands, copy_example, example_environment,
                                                     git_blob_id, run_command)

#: (example, command index) -> why the command does not run here (docs/POLYGRAPHY.md)
EXCEPTIONS = {
    **{("run/04_defining_a_tensorrt_network_or_config_manually", i): "TensorRT-only: `template trt-network/trt-config` "
       "and --model-type=trt-network-script write and run scripts against TensorRT's network and config API"
       for i in range(6)},
    ("run/08_adding_precision_constraints", 2): "TensorRT-only: constrained_network.py builds a TensorRT network "
                                                "with TensorRT's API",
}

EXAMPLE_DIRS = sorted(str(p.parent.relative_to(EXAMPLES)) for p in EXAMPLES.glob("*/*/README.md"))


def _debug01_outcome(folder: Path, outputs: list[str]) -> None:
    """Ten builds, all passing (sorted into replays/good), so diff-tactics finds no bad tactic."""
    assert len(list((folder / "replays" / "good").iterdir())) == 10 and not (folder / "replays" / "bad").exists()
    assert outputs[-1].splitlines()[-3:] == [
        "Loaded 10 good tactic replays.", "Loaded 0 bad tactic replays.",
        "Could not determine potentially bad tactics. Try generating more tactic replay files?"]


def _debug02_outcome(folder: Path, outputs: list[str]) -> None:
    """The simulated failure (a Mul) reduced to just the Mul; the real check (polykit vs the
    layerwise golden outputs) passed, so its reductions keep the model whole."""
    initial = [n.op_type for n in onnx.load(str(folder / "initial_reduced.onnx")).graph.node]
    final = [n.op_type for n in onnx.load(str(folder / "final_reduced.onnx")).graph.node]
    assert "Mul" in initial and final == ["Mul"]
    assert "[Op: Mul]" in outputs[-1] and "[Op: Add]" not in outputs[-1]


def _surgeon01_outcome(folder: Path, outputs: list[str]) -> None:
    extracted = onnx.load(str(folder / "subgraph.onnx")).graph
    assert [n.op_type for n in extracted.node] == ["Mul", "Add"]
    assert [i.name for i in extracted.input] == ["x1"] and [o.name for o in extracted.output] == ["add_out"]


#: example -> a check of what its commands made (the README's described outcome)
OUTCOMES = {"debug/01_debugging_flaky_trt_tactics": _debug01_outcome,
            "debug/02_reducing_failing_onnx_models": _debug02_outcome,
            "surgeon/01_isolating_subgraphs": _surgeon01_outcome}


@pytest.fixture(autouse=True)
def cpu_target(monkeypatch, fresh_plugins):
    example_environment(monkeypatch)


def test_every_vendored_example_is_covered():
    assert EXAMPLE_DIRS == sorted(["check/01_linting_an_onnx_model", "convert/01_int8_calibration_in_tensorrt",
                                   "convert/02_deterministic_engine_builds_in_tensorrt",
                                   "convert/03_dynamic_shapes_in_tensorrt", "convert/04_converting_models_to_fp16",
                                   "debug/01_debugging_flaky_trt_tactics", "debug/02_reducing_failing_onnx_models",
                                   "inspect/05_inspecting_inference_outputs", "inspect/06_inspecting_input_data",
                                   *(f"run/{n}" for n in ("01_comparing_frameworks", "02_comparing_across_runs",
                                                          "03_generating_a_comparison_script",
                                                          "04_defining_a_tensorrt_network_or_config_manually",
                                                          "05_comparing_with_custom_input_data",
                                                          "06_comparing_with_custom_output_data",
                                                          "07_checking_nan_inf", "08_adding_precision_constraints")),
                                   "surgeon/01_isolating_subgraphs", "surgeon/02_folding_constants",
                                   "surgeon/03_modifying_input_shapes", "surgeon/04_setting_upper_bounds"])


def test_commands_are_extracted_as_a_user_reads_them():
    listed = commands((EXAMPLES / "debug/02_reducing_failing_onnx_models/README.md").read_text(encoding="utf-8"))
    assert len(listed) == 9 and all(c.argv[0] == "polykit" for c in listed)
    assert listed[4].argv == ("polykit", "debug", "reduce", "folded.onnx", "-o", "initial_reduced.onnx", "--mode=bisect",
                              "--fail-regex", "Op: Mul", "--check", "polykit", "inspect", "model",
                              "polygraphy_debug.onnx", "--show", "layers")


@pytest.mark.parametrize("example,name", [(e, n) for e, files in GENERATED.items() for n in files])
def test_generated_models_are_the_upstream_files(example, name, tmp_path):
    write, blob = GENERATED[example][name]
    write(tmp_path / name)
    assert git_blob_id((tmp_path / name).read_bytes()) == blob


@pytest.mark.parametrize("example", EXAMPLE_DIRS)
def test_example_commands_run_as_written(example, tmp_path):
    folder = copy_example(example, tmp_path)
    listed = commands((folder / "README.md").read_text(encoding="utf-8"))
    assert listed, f"no commands found in {example}/README.md"
    outputs = []
    for index, command in enumerate(listed):
        if (example, index) in EXCEPTIONS:
            continue
        code, output = run_command(command, folder)
        expected = 1 if command.expect_failure else 0
        assert code == expected, f"{example} command {index}: `{command.text}` exited {code}, not {expected}\n{output}"
        outputs.append(output)
    assert outputs or all((example, i) in EXCEPTIONS for i in range(len(listed)))
    if example in OUTCOMES:
        OUTCOMES[example](folder, outputs)
