"""Optimization profiles on the command line: convert/run/bench with --trt-min/opt/max-shapes,
a profile-built plan run at the shapes --input-shapes or a data loader script feeds."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from polykit.compiler.plan.file import Plan
from polykit.errors import UsageError
from polykit.tools.cli.app import main
from polykit.tools.cli.args import parse_profiles
from tests.cli_models import fresh_plugins  # noqa: F401  (pytest fixture)
from tests.dynamic_models import encoder

pytestmark = pytest.mark.usefixtures("fresh_plugins")

PROFILE_FLAGS = ("--trt-min-shapes", "x:[1,1,32]", "mask:[1,1]", "--trt-opt-shapes", "x:[2,8,32]", "mask:[2,8]",
                 "--trt-max-shapes", "x:[4,40,32]", "mask:[4,40]")


@pytest.fixture(scope="module")
def encoder_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("dyn") / "encoder.onnx"
    onnx.save_model(encoder(layers=1), str(path))
    return str(path)


@pytest.fixture(scope="module")
def encoder_plan(encoder_path, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dyn") / "encoder.plan")
    assert main(["convert", encoder_path, "-o", path, "--target", "cpu", *PROFILE_FLAGS]) == 0
    return path


def test_repeated_profile_flags_give_one_profile_per_repetition():
    profiles = parse_profiles(["x:[1,3]", "x:[4,3]"], ["x:[2,3]", "x:[8,3]"], ["x:[4,3]", "x:[16,3]"])
    assert [p.shapes["x"] for p in profiles] == [((1, 3), (2, 3), (4, 3)), ((4, 3), (8, 3), (16, 3))]


def test_profile_flags_without_every_shape_name_the_input():
    with pytest.raises(UsageError, match=r"lacks the min, opt or max of input\(s\) \['y'\]"):
        parse_profiles(["x:[1]", "y:[1]"], ["x:[2]"], ["x:[4]", "y:[4]"])


def test_convert_writes_a_plan_with_the_profile(encoder_plan):
    plan = Plan.load(encoder_plan)
    assert plan.profiles.ranges == ({"batch": (1, 2, 4), "seq": (1, 8, 40)},)


def test_inspect_shows_the_profiles_and_dim_expressions(encoder_plan, capsys):
    assert main(["inspect", "model", encoder_plan]) == 0
    out = capsys.readouterr().out
    assert "optimization profile 0" in out and "x: min (1, 1, 32), opt (2, 8, 32), max (4, 40, 32)" in out
    assert "[batch, seq, 32]" in out


@pytest.mark.parametrize("seq", [7, 33])
def test_run_feeds_the_given_shape_to_a_profile_plan_and_matches_onnxruntime(encoder_plan, encoder_path, seq,
                                                                              tmp_path, capsys):
    feeds, outputs = tmp_path / "feeds.npz", tmp_path / "out.npz"
    assert main(["run", encoder_plan, "--trt", "--input-shapes", f"x:[3,{seq},32]", f"mask:[3,{seq}]",
                 "--save-inputs", str(feeds), "--save-outputs", str(outputs)]) == 0
    assert np.load(feeds)["0/x"].shape == (3, seq, 32)
    assert main(["run", encoder_path, "--onnxrt", "--load-inputs", str(feeds), "--load-outputs", str(outputs),
                 "--atol", "1e-4", "--rtol", "1e-4"]) == 0


def test_run_builds_with_profile_flags_and_compares_at_the_input_shapes(encoder_path, capsys):
    assert main(["run", encoder_path, "--trt", "--onnxrt", "--target", "cpu", *PROFILE_FLAGS,
                 "--input-shapes", "x:[3,13,32]", "mask:[3,13]", "--atol", "1e-4", "--rtol", "1e-4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"]


def test_shape_outside_the_profile_exits_2_naming_the_input(encoder_plan, capsys):
    code = main(["run", encoder_plan, "--trt", "--input-shapes", "x:[2,41,32]", "mask:[2,41]"])
    assert code == 2
    err = capsys.readouterr().err
    assert "input 'x' has dim 1 = 41" in err and "[1, 40]" in err


def test_data_loader_script_of_several_shapes_runs_them_all_through_one_engine(encoder_plan, encoder_path, tmp_path,
                                                                               capsys):
    script = tmp_path / "shapes.py"
    script.write_text(
        "import numpy as np\n"
        "def load_data():\n"
        "    rng = np.random.default_rng(0)\n"
        "    for b, s in ((1, 7), (2, 13), (4, 33)):\n"
        "        yield {'x': rng.standard_normal((b, s, 32)).astype(np.float32), 'mask': np.zeros((b, s), np.float32)}\n")
    assert main(["run", encoder_path, "--trt", "--onnxrt", "--target", "cpu", *PROFILE_FLAGS,
                 "--data-loader-script", str(script), "--atol", "1e-4", "--rtol", "1e-4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and len(report["comparisons"]) == 3


def test_bench_times_a_profile_plan_at_the_given_shape(encoder_plan, capsys):
    assert main(["bench", encoder_plan, "--input-shapes", "x:[3,13,32]", "mask:[3,13]", "--warm-up", "0",
                 "--iterations", "2", "--duration", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batch"] == 3


def test_shape_value_flags_give_profile_values_of_shape_tensor_inputs():
    (profile,) = parse_profiles(["x:[1]"], ["x:[32]"], ["x:[256]"], ["shape:[1,-1]"], ["shape:[4,-1]"],
                                ["shape:[16,-1]"])
    assert profile.values == {"shape": ((1, -1), (4, -1), (16, -1))}
    assert profile.shapes == {"x": ((1,), (32,), (256,))}
