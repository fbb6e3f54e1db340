"""Crafted plans and builder caches within the limits: numbers of thousands of digits, bodies
nested past body_depth, arenas over the memory limits and a profile naming a deleted tensor
are PlanErrors (caches: UsageError / DataFileError), never an internal error."""

from __future__ import annotations

import pytest

from polykit import limits
from polykit.compiler.builder.calibration_cache import read_calibration_cache
from polykit.compiler.builder.tactic_replay import load_replay
from polykit.compiler.builder.timing_cache import load_timing_cache
from polykit.compiler.plan.file import Plan
from polykit.errors import DataFileError, PlanError, UsageError
from polykit.testing import hostile


@pytest.mark.parametrize("build, message", [
    (hostile.plan_long_int, "a number of 5001 characters"),
    (hostile.plan_nested_bodies, "nests 755 levels deep; the json_depth limit is 200"),
    (hostile.plan_profile_missing_tensor, r"profiles.inputs\['x'\]: names an engine input that has no tensor record"),
])
def test_a_crafted_plan_is_a_plan_error(tmp_path, build, message):
    with pytest.raises(PlanError, match=message):
        Plan.load(build(tmp_path))


def test_bodies_nested_past_body_depth_are_refused_when_json_depth_allows_them(tmp_path):
    path = hostile.plan_nested_bodies(tmp_path, depth=5)
    with limits.raised(body_depth=3), pytest.raises(PlanError, match="body plans nest more than 3 deep"):
        Plan.load(path)


def test_a_plan_whose_arena_is_over_the_memory_limit_is_refused_at_load(tmp_path):
    path = hostile.plan_huge_arena(tmp_path)
    with pytest.raises(PlanError, match=r"\(64.0 TiB\) is over the host_memory limit") as info:
        Plan.load(path)
    assert "--limit host_memory=64TiB" in info.value.hint


@pytest.mark.parametrize("build, load, error, message", [
    (hostile.timing_cache_huge_ms, load_timing_cache, UsageError, "a number of 401 characters"),
    (hostile.timing_cache_float_overflow, load_timing_cache, UsageError, "1e400, beyond the range of a float64"),
    (hostile.timing_cache_deep, load_timing_cache, UsageError, "nests more levels than the parser can take"),
    (hostile.replay_long_int, load_replay, UsageError, "a number of 5000 characters"),
    (hostile.replay_deep, load_replay, UsageError, "nests more levels than the parser can take"),
    (hostile.calibration_scale_overflow, read_calibration_cache, DataFileError, "'0x1p99999' is not a positive, finite"),
    (hostile.calibration_long_version, read_calibration_cache, DataFileError, "is not a calibration cache header"),
    (hostile.calibration_unicode_version, read_calibration_cache, DataFileError, "is not a calibration cache header"),
])
def test_a_crafted_cache_or_replay_is_a_polykit_error(tmp_path, build, load, error, message):
    with pytest.raises(error, match=message):
        load(build(tmp_path))
