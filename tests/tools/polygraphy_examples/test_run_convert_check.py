"""Polygraphy's CLI examples (run, convert, check, inspect/05-06, surgeon) run as written with
`polygraphy` replaced by `polykit`, on the cpu target, against the examples' own model files
(tests/data/polygraphy_examples; harness.py). The commands that cannot run are listed in
EXCEPTIONS with the reason, as docs/POLYGRAPHY.md lists them."""

from __future__ import annotations

import importlib.util

import pytest

from tests.tools.polygraphy_examples.harness import EXAMPLES, commands, copy_example, run_command

#: (example, command index) -> why the command does not run here (docs/POLYGRAPHY.md)
EXCEPTIONS = {
    ("convert/01_int8_calibration_in_tensorrt", 2): "its data loader is the API example's script (examples/api/04), "
                                                   "which builds a TensorRT calibrator; not vendored",
    **{("run/04_defining_a_tensorrt_network_or_config_manually", i): "TensorRT-only: `template trt-network/trt-config` "
       "and --model-type=trt-network-script write and run scripts against TensorRT's network and config API"
       for i in range(6)},
    ("run/08_adding_precision_constraints", 0): "needs_constraints.onnx (262 KB) is not vendored",
    ("run/08_adding_precision_constraints", 1): "needs_constraints.onnx (262 KB) is not vendored",
    ("run/08_adding_precision_constraints", 2): "TensorRT-only: constrained_network.py builds a TensorRT network "
                                                "with TensorRT's API",
    **{("surgeon/01_isolating_subgraphs", i): "the example's model.onnx (1.2 MB) is not vendored" for i in range(3)},
}
#: examples whose scripts import Polygraphy's JSON helpers (`from polygraphy.json import save_json`):
#: they run where the `polygraphy` compat module is importable
NEEDS_POLYGRAPHY_JSON = ("run/05_comparing_with_custom_input_data", "run/06_comparing_with_custom_output_data")

EXAMPLE_DIRS = sorted(str(p.parent.relative_to(EXAMPLES)) for p in EXAMPLES.glob("*/*/README.md"))


@pytest.fixture(autouse=True)
def cpu_target(monkeypatch, fresh_plugins):
    """`--trt` builds for the cpu target, as without a GPU (resolve_target asks default_target)."""
    monkeypatch.setattr("polykit.runtime.target.default_target", lambda: "cpu")


def test_every_vendored_example_is_covered():
    assert EXAMPLE_DIRS == sorted(["check/01_linting_an_onnx_model", "convert/01_int8_calibration_in_tensorrt",
                                   "convert/02_deterministic_engine_builds_in_tensorrt",
                                   "convert/03_dynamic_shapes_in_tensorrt", "convert/04_converting_models_to_fp16",
                                   "inspect/05_inspecting_inference_outputs", "inspect/06_inspecting_input_data",
                                   *(f"run/{n}" for n in ("01_comparing_frameworks", "02_comparing_across_runs",
                                                          "03_generating_a_comparison_script",
                                                          "04_defining_a_tensorrt_network_or_config_manually",
                                                          "05_comparing_with_custom_input_data",
                                                          "06_comparing_with_custom_output_data",
                                                          "07_checking_nan_inf", "08_adding_precision_constraints")),
                                   "surgeon/01_isolating_subgraphs", "surgeon/02_folding_constants",
                                   "surgeon/03_modifying_input_shapes", "surgeon/04_setting_upper_bounds"])


@pytest.mark.parametrize("example", EXAMPLE_DIRS)
def test_example_commands_run_as_written(example, tmp_path):
    if example in NEEDS_POLYGRAPHY_JSON and importlib.util.find_spec("polygraphy") is None:
        pytest.skip("its scripts import polygraphy.json (the compat module is not on the path)")
    folder = copy_example(example, tmp_path)
    listed = commands((folder / "README.md").read_text(encoding="utf-8"))
    assert listed, f"no commands found in {example}/README.md"
    ran = 0
    for index, command in enumerate(listed):
        if (example, index) in EXCEPTIONS:
            continue
        code, output = run_command(command, folder)
        expected = 1 if command.expect_failure else 0
        assert code == expected, f"{example} command {index}: `{command.text}` exited {code}, not {expected}\n{output}"
        ran += 1
    assert ran or all((example, i) in EXCEPTIONS for i in range(len(listed)))
