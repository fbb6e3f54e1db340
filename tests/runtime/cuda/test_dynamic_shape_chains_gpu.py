"""GPU: issue 33's shape-chain patterns (Swin's window padding and partition, Resize with scales
and with sizes from Shape, a batch-only profile over dynamic dims) and every op of the shape-value
table built as cuda plans for a profile, matching onnxruntime at min, odd shapes and max; and real
torchvision exports with dynamic axes where torch is installed (benchmarks/dynamic_chain_exports.py)."""

from __future__ import annotations

import pytest

from tests.compiler.test_dynamic_shape_chains import HWC_PROFILE, HWC_SHAPES, PATTERNS, VALUE_CASES, serves, value_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_pattern_cuda_plan_for_a_profile_matches_onnxruntime_at_min_odd_and_max(pattern):
    make, profile, shapes = PATTERNS[pattern]
    serves(make(), profile, shapes, atol=1e-4, target="cuda")


@pytest.mark.parametrize("op", sorted(VALUE_CASES))
def test_shape_chain_op_cuda_plan_matches_onnxruntime(op):
    serves(value_model(op), HWC_PROFILE, HWC_SHAPES, atol=1e-3, target="cuda")


@pytest.mark.parametrize("case", ["swin_t_dyn_batch", "swin_t_dyn_hw", "fcn_resnet50", "deeplabv3_mobilenet_v3_large"])
def test_torchvision_export_with_dynamic_axes_matches_onnxruntime_on_cuda(case, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from benchmarks.dynamic_chain_exports import check, export

    export(tmp_path, [case])
    assert check(tmp_path, [case], "cuda") == 0
