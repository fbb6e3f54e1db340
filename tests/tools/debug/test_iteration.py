"""Polygraphy's iterative-debugging conventions (polykit.tools.debug.iteration) and the
command line that carries them: how a --check command's result is judged (--fail-code,
--ignore-fail-code, --fail-regex), artifacts sorted into good/ and bad/, the iteration
artifact, and --check taking the rest of the command line."""

from __future__ import annotations

import shlex

import pytest

from polykit.errors import UsageError
from polykit.tools.cli.debug import fold_check_command
from polykit.tools.debug.iteration import CheckRules, IterationFiles, parse_until


@pytest.mark.parametrize("rules, returncode, output, passed", [
    (CheckRules(), 0, "", True),
    (CheckRules(), 1, "", False),
    (CheckRules(fail_regex=("Op: Mul",)), 0, "Node 0 | [Op: Mul]", False),  # a match fails even on exit code 0
    (CheckRules(fail_regex=("Op: Mul",)), 1, "Op: Add", True),  # with a regex, the exit code alone does not fail
    (CheckRules(fail_regex=("Op: Mul", "Op: Div")), 0, "Op: Div", False),  # any of several
    (CheckRules(fail_codes=(3,)), 1, "", True),
    (CheckRules(fail_codes=(3,)), 3, "", False),
    (CheckRules(fail_codes=(3,), fail_regex=("boom",)), 3, "fine", True),  # both: the code and a match
    (CheckRules(fail_codes=(3,), fail_regex=("boom",)), 3, "boom", False),
    (CheckRules(ignore_fail_codes=(2,)), 2, "", True),
    (CheckRules(ignore_fail_codes=(2,)), 1, "", False),
])
def test_a_check_command_is_judged_by_polygraphys_rules(rules, returncode, output, passed):
    assert rules.passed(returncode, output) is passed


def test_bad_rules_are_usage_errors():
    with pytest.raises(UsageError, match="exclude each other"):
        CheckRules(fail_codes=(1,), ignore_fail_codes=(2,))
    with pytest.raises(UsageError, match="not a regular expression"):
        CheckRules(fail_regex=("[",))


def test_artifacts_are_moved_into_good_and_bad_with_the_iteration_in_their_names(tmp_path):
    replay = tmp_path / "replay.json"
    files = IterationFiles(artifacts=(str(replay),), artifacts_dir=str(tmp_path / "replays"))
    replay.write_text("first")
    (good,) = files.sort(True, 0)
    replay.write_text("second")
    (bad,) = files.sort(False, 1)
    assert good.parent == tmp_path / "replays" / "good" and bad.parent == tmp_path / "replays" / "bad"
    assert good.name.startswith("replay_") and good.name.endswith("_N0.json") and bad.name.endswith("_N1.json")
    assert good.read_text() == "first" and bad.read_text() == "second" and not replay.exists()
    assert files.sort(True, 2) == []  # nothing to move: logged, skipped


def test_the_iteration_artifact_must_not_exist_and_is_removed_after_each_iteration(tmp_path):
    files = IterationFiles(iter_artifact=str(tmp_path / "it.onnx"))
    path = files.claim("unused.onnx")
    path.write_text("candidate")
    files.done(path)
    assert not path.exists()
    path.write_text("left over")
    with pytest.raises(UsageError, match="exists"):
        files.claim("unused.onnx")
    IterationFiles(iter_artifact=str(path), remove_intermediate=False).done(path)
    assert path.exists()


@pytest.mark.parametrize("value, until", [("10", 10), ("good", "good"), ("bad", "bad")])
def test_until_is_a_count_good_or_bad(value, until):
    assert parse_until(value) == until


@pytest.mark.parametrize("value", ["0", "-2", "forever"])
def test_another_until_is_a_usage_error(value):
    with pytest.raises(UsageError, match="--until"):
        parse_until(value)


def test_check_takes_the_rest_of_the_command_line_as_one_word_the_app_leaves_alone():
    argv = ["-v", "debug", "reduce", "m.onnx", "-o", "r.onnx", "--fail-regex", "Op: Mul", "Op: Div",
            "--check", "polykit", "run", "polygraphy_debug.onnx", "--trt", "--onnxrt", "-v"]
    assert fold_check_command(argv) == [
        "-v", "debug", "reduce", "m.onnx", "-o", "r.onnx", "--fail-regex", "Op: Mul", "--fail-regex", "Op: Div",
        "--check", shlex.join(["polykit", "run", "polygraphy_debug.onnx", "--trt", "--onnxrt", "-v"])]


def test_polykits_one_word_check_keeps_the_options_after_it():
    argv = ["debug", "reduce", "m.onnx", "--check", "polykit run {model} --trt", "-o", "r.onnx",
            "--artifacts", "a.json", "b.json"]
    assert fold_check_command(argv) == ["debug", "reduce", "m.onnx", "--check", "polykit run {model} --trt", "-o",
                                        "r.onnx", "--artifacts", "a.json", "--artifacts", "b.json"]


def test_other_commands_are_left_as_they_are():
    argv = ["run", "m.onnx", "--trt", "--check", "x", "y"]
    assert fold_check_command(argv) == argv
