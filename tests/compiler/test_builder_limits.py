"""The builder stays within the limits: it declines to time a layer whose tensors exceed the
workspace limit or the memory limits (and says so), and refuses a plan whose arena and weights
exceed the target's memory limit instead of writing it."""

from __future__ import annotations

import logging

import pytest

from polykit import limits
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import BuildError
from polykit.testing import hostile


def test_a_layer_too_large_to_time_is_not_timed_and_the_build_says_why(tmp_path, caplog):
    path = hostile.model_conv_timing(tmp_path)
    with limits.raised(host_memory=1 << 50), caplog.at_level(logging.WARNING, logger="polykit"):
        plan = build_plan(path, BuilderConfig(target="cpu", workspace_limit=1 << 20))
    assert plan.layers[0].tactic == "cpu.reference"
    assert "layer 'conv': not timed: its tensors need 100.0 TiB, more than the workspace limit (1.0 MiB)" in caplog.text


def test_a_plan_over_the_memory_limit_is_a_build_error_naming_the_limit(tmp_path):
    with pytest.raises(BuildError, match=r"arena and weights on target 'cpu' \(8.0 TiB\) is over the host_memory "
                                         r"limit \(16.0 GiB\)") as info:
        build_plan(hostile.model_huge_shape(tmp_path), BuilderConfig(target="cpu"))
    assert "--limit host_memory=8TiB" in info.value.hint
    with pytest.raises(BuildError, match="over the device_memory limit"):
        build_plan(hostile.model_huge_shape(tmp_path), BuilderConfig(target="cuda"))
