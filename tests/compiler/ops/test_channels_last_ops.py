"""Shape rules of the channels-last ops (ai.polykit ConvNHWC, MaxPoolNHWC, AveragePoolNHWC)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.errors import PolykitError

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def infer(op, shapes, dtype=F32, **attrs):
    names = [f"i{k}" for k in range(len(shapes))]
    node = Node(op, names, ["y"], attrs, name="n", domain=POLYKIT_DOMAIN)
    ctx = InferContext(node, [dtype] * len(shapes), list(shapes), [None] * len(shapes))
    return find_shape_rule(POLYKIT_DOMAIN, op)(ctx)


def test_conv_nhwc_output_is_the_conv_output_channels_last():
    [(dtype, shape)] = infer("ConvNHWC", [(2, 11, 10, 8), (5, 3, 2, 8), (5,)], strides=[2, 3], pads=[1, 0, 2, 1])
    # NCHW Conv: (11 + 1 + 2 - 3) // 2 + 1 = 6, (10 + 0 + 1 - 2) // 3 + 1 = 4
    assert dtype == F32 and shape == (2, 6, 4, 5)


def test_conv_nhwc_keeps_a_symbolic_batch_and_half_dtype():
    [(dtype, shape)] = infer("ConvNHWC", [("N", 8, 8, 16), (4, 3, 3, 16)], dtype=F16, pads=[1, 1, 1, 1],
                             dilations=[2, 1])
    assert dtype == F16 and shape == ("N", 6, 8, 4)


def test_conv_nhwc_groups_check_weight_channels_on_the_last_axis():
    [(_, shape)] = infer("ConvNHWC", [(1, 5, 5, 8), (6, 1, 1, 4)], group=2)
    assert shape == (1, 5, 5, 6)
    with pytest.raises(PolykitError, match="channels"):
        infer("ConvNHWC", [(1, 5, 5, 8), (6, 1, 1, 3)], group=2)


def test_conv_nhwc_with_an_epilogue_runs_the_body_on_the_nhwc_result():
    epi = {"input": "raw", "body": [{"op": "Add", "inputs": ["raw", "i3"], "outputs": ["y"], "attrs": {}}]}
    [(_, shape)] = infer("ConvNHWC", [(2, 4, 4, 8), (3, 1, 1, 8), None, (3,)], epilogue=epi)
    assert shape == (2, 4, 4, 3)


@pytest.mark.parametrize("shapes", [[(1, 8, 5, 5, 8), (3, 1, 1, 1, 8)], [(1, 8, 8), (3, 1, 8)]])
def test_nhwc_ops_are_two_dimensional(shapes):
    with pytest.raises(PolykitError, match="rank"):
        infer("ConvNHWC", shapes)


def test_auto_pad_is_refused_with_a_hint():
    with pytest.raises(PolykitError, match="auto_pad") as err:
        infer("MaxPoolNHWC", [(1, 6, 6, 8)], kernel_shape=[2, 2], auto_pad="SAME_UPPER")
    assert "explicit pads" in err.value.hint


def test_pools_map_ceil_mode_and_have_one_output():
    [(_, shape)] = infer("MaxPoolNHWC", [(2, 10, 7, 3)], kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1)
    assert shape == (2, 5, 4, 3)  # W: ceil((7 - 2) / 2) + 1 = 4 (floor would give 3)
    [(_, shape)] = infer("AveragePoolNHWC", [(2, 9, 9, 16)], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], count_include_pad=1)
    assert shape == (2, 5, 5, 16)


def test_a_pool_with_an_epilogue_is_refused():
    epi = {"input": "raw", "body": [{"op": "Relu", "inputs": ["raw"], "outputs": ["y"], "attrs": {}}]}
    with pytest.raises(PolykitError, match="no epilogue"):
        infer("MaxPoolNHWC", [(1, 4, 4, 8)], kernel_shape=[2, 2], epilogue=epi)
