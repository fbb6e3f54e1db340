import numpy as np
import pytest

from polykit.backends.base import BaseRunner, TensorMeta
from polykit.errors import UsageError
from polykit.tools.compare.comparator import Comparator, RunResults
from polykit.tools.data.loaders import DataLoader, DataLoaderOptions


class FakeRunner(BaseRunner):
    """y = x * scale, plus optional extra outputs; records the feeds it saw."""

    def __init__(self, name, scale=1.0, outputs=("y",)):
        super().__init__(name)
        self.scale, self.outputs, self.seen = scale, outputs, []

    def get_input_metadata_impl(self):
        return {"x": TensorMeta("x", "float32", (3, 4))}

    def infer_impl(self, feed):
        self.seen.append(feed["x"].copy())
        return {name: feed["x"] * self.scale for name in self.outputs}


def test_every_runner_gets_identical_inputs():
    a, b = FakeRunner("a"), FakeRunner("b")
    Comparator.run([a, b], DataLoader(DataLoaderOptions(iterations=2)))
    assert len(a.seen) == 2
    for x, y in zip(a.seen, b.seen):
        np.testing.assert_array_equal(x, y)


def test_runner_mutating_its_feed_does_not_affect_the_next():
    class Mutating(FakeRunner):
        def infer_impl(self, feed):
            out = super().infer_impl(feed)
            feed["x"][...] = 0
            return out

    a, b = Mutating("a"), FakeRunner("b")
    Comparator.run([a, b], DataLoader())
    assert b.seen[0].any()


def test_a_runner_that_only_reads_gets_the_feeds_own_bytes_read_only():
    class Reading(FakeRunner):
        reads_feeds_only = True

        def infer_impl(self, feed):
            self.given = feed["x"]
            return super().infer_impl(feed)

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    runner = Reading("a")
    Comparator.run([runner], feeds=[{"x": x}])
    assert np.shares_memory(runner.given, x) and not runner.given.flags.writeable  # no copy, and no writes
    with pytest.raises(ValueError):
        runner.given[...] = 0


def test_the_built_in_runners_only_read_their_feeds():
    from polykit.backends.onnxrt import OnnxrtRunner
    from polykit.backends.polykit_runner import PolykitRunner
    from polykit.backends.ranks_runner import RanksRunner

    assert OnnxrtRunner.reads_feeds_only and PolykitRunner.reads_feeds_only and RanksRunner.reads_feeds_only
    assert not BaseRunner.reads_feeds_only  # a plugin's runner gets copies unless it says otherwise


def test_matching_runners_pass():
    results = Comparator.run([FakeRunner("a"), FakeRunner("b")])
    report = Comparator.compare_accuracy(results)
    assert report.passed and len(report.pairs) == 1


def test_differing_runner_fails_on_that_output():
    results = Comparator.run([FakeRunner("a"), FakeRunner("b", scale=1.1)])
    report = Comparator.compare_accuracy(results)
    assert not report.passed
    [(pair, out)] = report.failures()
    assert (pair.reference, pair.runner, out.name) == ("a", "b", "y")


def test_report_is_truthy_exactly_when_the_comparison_passed():
    """Polygraphy's accuracy gate, `assert bool(Comparator.compare_accuracy(results))`."""
    passing = Comparator.compare_accuracy(Comparator.run([FakeRunner("a"), FakeRunner("b")]))
    failing = Comparator.compare_accuracy(Comparator.run([FakeRunner("a"), FakeRunner("b", scale=1.1)]))
    assert bool(passing) and bool(passing.pairs[0])
    assert not bool(failing) and not bool(failing.pairs[0])
    with pytest.raises(AssertionError):
        assert bool(failing)


def test_report_with_a_validate_problem_is_falsy():
    results = RunResults(feeds=[{}])
    results.add("a", [{"y": np.array([1.0, np.nan])}])
    assert not Comparator.compare_accuracy(results, validate=True)


def test_missing_output_is_an_explicit_failure():
    results = Comparator.run([FakeRunner("a", outputs=("y", "z")), FakeRunner("b", outputs=("y",))])
    [(_, out)] = Comparator.compare_accuracy(results).failures()
    assert out.name == "z" and "missing" in out.message


def test_extra_output_is_an_explicit_failure():
    results = Comparator.run([FakeRunner("a", outputs=("y",)), FakeRunner("b", outputs=("y", "w"))])
    [(_, out)] = Comparator.compare_accuracy(results).failures()
    assert out.name == "w" and "extra" in out.message


def test_outputs_pair_by_name_not_position():
    results = RunResults(feeds=[{}])
    results.add("a", [{"p": np.ones(2), "q": np.zeros(2)}])
    results.add("b", [{"q": np.zeros(2), "p": np.ones(2)}])
    assert Comparator.compare_accuracy(results).passed


def test_runners_with_the_same_name_get_distinct_result_names():
    results = Comparator.run([FakeRunner("a"), FakeRunner("a")])
    assert results.runners == ["a", "a-1"]


def test_validate_flags_nan_outputs():
    results = RunResults(feeds=[{}])
    results.add("a", [{"y": np.array([1.0, np.nan])}])
    report = Comparator.compare_accuracy(results, validate=True)
    assert not report.passed and "NaN" in report.problems[0]


def test_no_runners_is_usage_error():
    with pytest.raises(UsageError):
        Comparator.run([])


def test_inference_times_are_recorded():
    results = Comparator.run([FakeRunner("a")], DataLoader(DataLoaderOptions(iterations=3)))
    assert len(results.times["a"]) == 3 and all(t >= 0 for t in results.times["a"])


def test_validate_flags_nan_in_bfloat16_outputs():
    import ml_dtypes

    results = RunResults(feeds=[{}])
    results.add("a", [{"y": np.array([1.0, np.nan], ml_dtypes.bfloat16)}])
    report = Comparator.compare_accuracy(results, validate=True)
    assert not report.passed and "1 NaN" in report.problems[0]


def test_scalar_and_empty_outputs_are_compared_and_reported():
    from polykit.tools.report.comparison import render_text, to_json

    results = RunResults(feeds=[{}])
    results.add("a", [{"s": np.float32(2.0), "e": np.zeros((0, 4), np.float32), "b": np.array(True)}])
    results.add("b", [{"s": np.array(2.5, np.float32), "e": np.zeros((0, 4), np.float32), "b": np.array(True)}])
    report = Comparator.compare_accuracy(results)
    verdicts = {o.name: o.passed for o in report.pairs[0].outputs}
    assert verdicts == {"s": False, "e": True, "b": True}
    assert "worst element []: reference 2, b 2.5" in render_text(report, results)
    assert to_json(report)["comparisons"][0]["outputs"][0]["worst_index"] == []
