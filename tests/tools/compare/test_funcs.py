import ml_dtypes
import numpy as np
import pytest

from polykit.errors import UsageError
from polykit.tools.compare.funcs import CompareOptions, cosine, l2, simple, snr

rng = np.random.default_rng(0)
REF = rng.standard_normal((4, 5)).astype(np.float32)


def test_simple_passes_identical_outputs():
    res = simple(CompareOptions())("y", REF, REF.copy())
    assert res.passed and res.max_abs == 0 and res.required_atol == 0


def test_simple_reports_worst_element_and_its_values():
    act = REF.copy()
    act[2, 3] += 0.25
    res = simple(CompareOptions())("y", REF, act)
    assert not res.passed
    assert res.worst_index == (2, 3)
    assert res.worst_reference == pytest.approx(float(REF[2, 3]))
    assert res.worst_actual == pytest.approx(float(act[2, 3]))
    assert res.max_abs == pytest.approx(0.25, rel=1e-5)


def test_simple_required_atol_is_the_smallest_passing_atol():
    act = REF + np.float32(1e-3)
    res = simple(CompareOptions(rtol={"": 0.0}))("y", REF, act)
    assert not res.passed
    again = simple(CompareOptions(atol={"": res.required_atol}, rtol={"": 0.0}))("y", REF, act)
    assert again.passed


def test_simple_element_fails_only_when_both_atol_and_rtol_exceeded():
    ref = np.array([1000.0, 1e-3], dtype=np.float32)
    act = np.array([1000.01, 1e-3 + 1e-6], dtype=np.float32)
    assert simple(CompareOptions(atol={"": 1e-5}, rtol={"": 1e-3}))("y", ref, act).passed


def test_simple_uses_per_output_tolerance():
    act = REF + np.float32(1e-3)
    opts = CompareOptions(atol={"": 1e-6, "logits": 1e-2}, rtol={"": 0.0})
    assert simple(opts)("logits", REF, act).passed
    assert not simple(opts)("probs", REF, act).passed


@pytest.mark.parametrize("stat", ["max", "mean", "median", "quantile"])
def test_simple_error_stat_judges_the_statistic_not_each_element(stat):
    ref = rng.standard_normal(1000).astype(np.float32)
    act = ref.copy()
    act[7] += 1.0  # one outlier of 1000: only the max statistic sees it beyond atol
    res = simple(CompareOptions(atol={"": 1e-2}, rtol={"": 0.0}, check_error_stat={"": stat}))("y", ref, act)
    assert res.passed == (stat != "max")
    assert res.stat == stat


def test_simple_rejects_unknown_error_stat():
    with pytest.raises(UsageError):
        simple(CompareOptions(check_error_stat={"": "p99"}))("y", REF, REF)


def test_shape_mismatch_fails_with_message():
    res = simple(CompareOptions())("y", REF, REF[:2])
    assert not res.passed and "shape mismatch" in res.message


def test_nan_in_both_at_same_place_matches_but_nan_against_number_fails():
    ref = np.array([np.nan, 1.0, np.inf], dtype=np.float32)
    assert simple(CompareOptions())("y", ref, ref.copy()).passed
    act = np.array([0.5, 1.0, np.inf], dtype=np.float32)
    res = simple(CompareOptions())("y", ref, act)
    assert not res.passed and res.worst_index == (0,)


def test_integer_outputs_compare_exactly_with_default_tolerance():
    ref = np.array([1, 2, 3], dtype=np.int64)
    assert simple(CompareOptions())("y", ref, ref.copy()).passed
    assert not simple(CompareOptions())("y", ref, ref + 1).passed


def test_l2_passes_small_noise_and_fails_large():
    noise = rng.standard_normal(REF.shape).astype(np.float32)
    assert l2(CompareOptions(l2_tol=1e-3))("y", REF, REF + 1e-6 * noise).passed
    res = l2(CompareOptions(l2_tol=1e-3))("y", REF, REF + 0.1 * noise)
    assert not res.passed and res.metric_value > 1e-3


def test_cosine_fails_for_a_sign_flip():
    assert cosine(CompareOptions())("y", REF, REF * 2).passed  # same direction
    assert not cosine(CompareOptions())("y", REF, -REF).passed


def test_snr_is_infinite_for_identical_outputs_and_low_for_noise():
    assert snr(CompareOptions())("y", REF, REF.copy()).passed
    noisy = REF + 0.1 * rng.standard_normal(REF.shape).astype(np.float32)
    res = snr(CompareOptions(snr_min_db=40))("y", REF, noisy)
    assert not res.passed and 10 < res.metric_value < 40


def _all_funcs():
    from polykit.tools.compare.funcs import builtin_compare_funcs

    return [spec.factory(CompareOptions()) for spec in builtin_compare_funcs()]


@pytest.mark.parametrize("value", [
    np.float32(1.5), np.array(2.0, np.float64), np.array(True), np.array(7, np.int64), np.zeros((0, 3), np.float32),
    np.array([1, 2, 3], np.uint8), np.array([0.5, -1.25], np.float16), np.array([1.0, 2.5], ml_dtypes.bfloat16),
    np.array([[True, False]]),
], ids=["scalar-f32", "0d-f64", "0d-bool", "0d-int", "empty", "uint8", "float16", "bfloat16", "bool"])
def test_every_compare_function_passes_equal_tensors_of_any_kind(value):
    for compare in _all_funcs():
        result = compare("out", value, np.array(value, copy=True))
        assert result.passed, (compare, result)


def test_a_differing_0d_output_fails_and_names_the_empty_index():
    result = simple(CompareOptions())("s", np.array(1.0, np.float32), np.array(1.5, np.float32))
    assert not result.passed and result.worst_index == () and result.max_abs == 0.5


def test_differing_bfloat16_outputs_fail_with_their_float_values():
    ref = np.array([1.0, 2.0], ml_dtypes.bfloat16)
    act = np.array([1.0, 3.0], ml_dtypes.bfloat16)
    result = simple(CompareOptions())("b", ref, act)
    assert not result.passed and result.worst_index == (1,) and result.worst_actual == 3.0


def test_differing_bool_outputs_fail():
    result = simple(CompareOptions())("m", np.array([True, False]), np.array([True, True]))
    assert not result.passed and result.worst_index == (1,)


def test_string_outputs_compare_for_equality():
    same = simple(CompareOptions())("t", np.array(["a", "b"]), np.array(["a", "b"]))
    differ = simple(CompareOptions())("t", np.array(["a", "b"]), np.array(["a", "c"]))
    assert same.passed and not differ.passed and "compared for equality" in differ.message


@pytest.mark.parametrize("options, message", [
    (dict(error_quantile=2.0), r"--error-quantile 2.0 is not in \[0, 1\]"),
    (dict(atol={"": -1.0}), r"--atol -1.0 is not a non-negative number"),
    (dict(rtol={"y": float("nan")}), r"--rtol y:nan is not a non-negative number"),
    (dict(check_error_stat={"y": "p99"}), r"--check-error-stat y:p99 is not an error statistic"),
    (dict(cosine_tol=3.0), r"--cosine-tol 3.0 is not in \[0, 2\]"),
])
def test_impossible_compare_options_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        CompareOptions(**options)


def test_a_per_output_option_naming_no_output_lists_the_outputs():
    with pytest.raises(UsageError, match=r"--atol nosuch:0.001 names no output of the model") as info:
        CompareOptions(atol={"": 1e-5, "nosuch": 1e-3}).check_output_names(["logits", "probs"])
    assert info.value.hint == "outputs are: logits, probs"


def test_a_per_output_option_with_an_extra_field_says_so():
    with pytest.raises(UsageError, match=r"--rtol logits:1e-3:2.0 names no output") as info:
        CompareOptions(rtol={"logits:1e-3": 2.0}).check_output_names(["logits"])
    assert "one value" in info.value.hint


def test_every_comparison_carries_a_bounded_error_histogram():
    ref = rng.standard_normal(10_000).astype(np.float32)
    act = ref.copy()
    act[:100] += np.float32(1e-3)
    act[100:110] += np.float32(1.0)
    act[110] = np.nan
    for func in (simple, l2):
        hist = func(CompareOptions())("y", ref, act).histogram
        if func is l2:  # the metric functions stop at non-finite differences, with the same statistics
            assert hist.nonfinite == 1
            continue
        assert len(hist.counts) == 20 and len(hist.edges) == 21
        assert hist.zeros == 10_000 - 111 and hist.nonfinite == 1 and sum(hist.counts) == 110
        assert hist.edges[0] == pytest.approx(1e-3, rel=1e-3) and hist.edges[-1] == pytest.approx(1.0, rel=1e-3)
        assert hist.counts[0] + hist.counts[1] == 100 and hist.counts[-1] == 10


def test_the_worst_elements_are_the_largest_errors_largest_first():
    act = REF.copy()
    act[1, 1] += 0.5
    act[3, 4] -= 0.25
    act[0, 2] += 0.125
    worst = simple(CompareOptions())("y", REF, act).worst
    assert [w.index for w in worst] == [(1, 1), (3, 4), (0, 2)]
    assert worst[0].reference == pytest.approx(float(REF[1, 1])) and worst[0].actual == pytest.approx(float(act[1, 1]))
    assert worst[1].abs_error == pytest.approx(0.25, rel=1e-5)
    assert worst[1].rel_error == pytest.approx(0.25 / abs(float(REF[3, 4])), rel=1e-4)


def test_identical_outputs_have_no_worst_elements_and_only_exact_matches():
    res = simple(CompareOptions())("y", REF, REF.copy())
    assert res.worst == () and res.histogram.zeros == REF.size and res.histogram.counts == ()
