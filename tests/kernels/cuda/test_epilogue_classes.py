"""Epilogue extra inputs are read by the class their stamped shapes give (CPU: generated code only)."""

from __future__ import annotations

import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.gemm.epilogue import epilogue_prelude, input_classes

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


def gelu_layer(out_dtype: str = "float16"):
    body = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
            {"op": "Gelu", "inputs": ["s"], "outputs": ["g"], "attrs": {}},
            {"op": "Add", "inputs": ["g", "res"], "outputs": ["Y"], "attrs": {}}]
    return LayerDesc("mm", "MatMul", ("A", "B", "bias", "res"), ("Y",), {"epilogue": {"input": "raw", "body": body}},
                     domain="ai.polykit", in_shapes=((4, 8), (8, 16), (16,), (4, 16)), out_shapes=((4, 16),))


def test_the_8_wide_epilogue_reads_column_inputs_apart_from_row_inputs():
    """load_cols8 reads the bias at the column, load_rows8 the residual at the output index: finish_rows
    reads a bias once for a lane's two rows."""
    code = epilogue_prelude(gelu_layer(), "half_t")
    cols = code[code.index("void load_cols8"):code.index("struct EpiRows8")]
    rows = code[code.index("void load_rows8"):code.index("void apply_epilogue8")]
    assert "load8(cols.x0, E.e0 + col);" in cols and "e1" not in cols
    assert "load8(rows.x1, E.e1 + oi);" in rows and "e0" not in rows
    assert "EpiIn8" not in code, "the joined loads are the INT8 epilogue's"


def test_16_bit_epilogues_take_the_16_bit_gelu_and_leave_the_last_rounding_to_the_store():
    half, single = epilogue_prelude(gelu_layer(), "half_t"), epilogue_prelude(gelu_layer(), "float")
    assert half.startswith("#define PK_GELU16 1\n") and "PK_GELU16" not in single
    apply8 = half[half.index("void apply_epilogue8"):]
    assert "auto t2 = pk_add(t1, ld(rows.x1, i));" in apply8, "the store rounds the result to ELEM"
    assert "auto t1 = round_as<ELEM>(pk_gelu(t0));" in apply8, "a body op before the last keeps its rounding"


def test_inputs_read_at_the_output_index_get_an_l2_prefetch_and_columns_do_not():
    """prefetch_rows (EPI_PREFETCH) brings a tile's residual rows into L2 before its K loop
    (gemm_sm90_epilogue.cuh's prefetch_tile); a bias, read at the column, is not prefetched."""
    code = epilogue_prelude(gelu_layer(), "half_t")
    assert "#define EPI_PREFETCH 1" in code
    rows = code[code.index("void prefetch_rows"):]
    rows = rows[:rows.index("}\n") + 2]
    assert "prefetch_span(E.e1 + oi, n * (i64)sizeof(*E.e1));" in rows and "E.e0" not in rows
    bias_only = epilogue_prelude(layer((2, 5, 3), (3, 7), (7,), (2, 5, 7)), "half_t")
    assert "EPI_PREFETCH" not in bias_only and "prefetch_rows" not in bias_only


@pytest.mark.parametrize("y_dtype,gelu16", [("float8_e4m3fn", True), ("float32", False)])
def test_an_fp8_layer_stored_in_8_bits_takes_the_16_bit_gelu_and_a_float32_one_keeps_erff(y_dtype, gelu16):
    from polykit.kernels.cuda.int8.fp8_sm90 import fp8_layer

    code = epilogue_prelude(fp8_layer(y_dtype, residual="float32"), "float")
    assert code.startswith("#define PK_GELU16 1\n") == gelu16 and ("PK_GELU16" in code) == gelu16
