"""The ONNX importer refuses what would crash it, exhaust memory or give a silent wrong answer:
external data with NUL bytes, offsets and lengths beyond the file or non-ASCII digits, negative
dims, opsets polykit does not implement and bodies nested past the body_depth limit."""

from __future__ import annotations

import pytest

from polykit import limits
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import ModelLoadError
from polykit.testing import hostile


@pytest.mark.parametrize("build, message", [
    (hostile.external_nul, "holds a NUL byte"),
    (hostile.external_offset_huge, r"\(bytes 1000000000000000000000000000000\.\.\d+\) lies outside the 16-byte file"),
    (hostile.external_length_huge, r"\(bytes 0\.\.1000000000000\) lies outside the 16-byte file"),
    (hostile.external_length_2_63, r"\(bytes 0\.\.9223372036854775808\) lies outside the 16-byte file"),
    (hostile.external_unicode_digit, "length '1²' of tensor 'w' is not a non-negative integer"),
    (hostile.model_negative_dims, r"initializer 'w' has dims \[-3, 4\]: a dim is negative"),
    (hostile.model_opset_99, "imports ONNX opset 99; polykit implements opsets up to"),
])
def test_a_hostile_model_is_a_model_load_error(tmp_path, build, message):
    with pytest.raises(ModelLoadError, match=message):
        load_onnx(build(tmp_path))


def test_bodies_nested_past_the_limit_are_refused_before_importing(tmp_path):
    path = hostile.model_nested_bodies(tmp_path, depth=6)
    with limits.raised(body_depth=4), pytest.raises(ModelLoadError, match="nest more than 4 deep") as info:
        load_onnx(path)
    assert "--limit body_depth=" in info.value.hint
    with limits.raised(body_depth=6):
        assert load_onnx(path).nodes[0].op_type == "If"


def test_external_data_over_the_host_memory_limit_is_refused_before_reading(tmp_path):
    path = hostile._external(tmp_path, "ok", "weights.bin", "0", "16")
    assert load_onnx(path).initializers["w"].tolist() == [0, 1, 2, 3]
    with limits.raised(host_memory=8), pytest.raises(ModelLoadError, match="external data .* over the host_memory"):
        load_onnx(path)
