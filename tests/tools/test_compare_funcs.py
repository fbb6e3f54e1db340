import numpy as np
import pytest

from polykit.errors import UsageError
from polykit.tools.compare_funcs import CompareOptions, cosine, l2, simple, snr

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
