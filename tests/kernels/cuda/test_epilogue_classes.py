"""Epilogue extra inputs are read by the class their stamped shapes give (CPU: generated code only)."""

from __future__ import annotations

import pytest

from polykit.compiler.plan_records import LayerDesc
from polykit.kernels.cuda.epilogue import epilogue_prelude, input_classes

BODY = [{"op": "Add", "inputs": ["raw", "e"], "outputs": ["Y"], "attrs": {}}]


def layer(a, b, e, out, stamped=True):
    return LayerDesc("mm", "MatMul", ("A", "B", "e"), ("Y",), {"epilogue": {"input": "raw", "body": BODY}},
                     domain="ai.polykit", in_shapes=(a, b, e) if stamped else (), out_shapes=(out,) if stamped else ())


@pytest.mark.parametrize("e,want", [((2, 5, 7), "full"), ((5, 7), "general"), ((7,), "last"), ((1, 1, 7), "last"),
                                    ((1,), "scalar"), ((2, 1, 7), "general")])
def test_extra_inputs_are_classified_by_their_broadcast_against_the_output(e, want):
    assert input_classes(layer((2, 5, 3), (3, 7), e, (2, 5, 7))) == [want]


def test_without_stamped_shapes_every_input_is_general():
    assert input_classes(layer((2, 5, 3), (3, 7), (7,), (2, 5, 7), stamped=False)) == ["general"]


def test_a_matmul_with_a_1d_b_has_no_column_axis():
    # output [4, 6]: its last axis is M, not the GEMM's column (N = 1)
    assert input_classes(layer((4, 6, 5), (5,), (6,), (4, 6))) == ["general"]


def test_known_classes_inline_and_read_at_the_index_or_column():
    code = epilogue_prelude(layer((2, 5, 3), (3, 7), (7,), (2, 5, 7)), "half_t")
    assert "__forceinline__ float apply_epilogue" in code and "off0 = col;" in code
    general = epilogue_prelude(layer((2, 5, 3), (3, 7), (5, 7), (2, 5, 7)), "half_t")
    assert "__noinline__ float apply_epilogue" in general and "strided_offset" in general
