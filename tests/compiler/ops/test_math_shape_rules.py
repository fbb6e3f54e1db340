"""Shape rules of the math ops: symbolic dims, constant vs unknown axes, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.errors import ShapeError
from polykit.compiler.ops.references import run_reference

F32, I64 = np.dtype(np.float32), np.dtype(np.int64)


def infer(op, shapes, dtypes=None, consts=None, attrs=None, n_out=1):
    """Run op's shape rule; shapes/dtypes/consts per input (None shape entry with name "" = omitted)."""
    names = [f"in{i}" if s != "omitted" else "" for i, s in enumerate(shapes)]
    node = Node(op, names, [f"out{i}" for i in range(n_out)], dict(attrs or {}), name=f"{op}_0")
    dtypes = dtypes or [F32] * len(shapes)
    consts = consts or [None] * len(shapes)
    shapes = [None if s == "omitted" else s for s in shapes]
    return find_shape_rule("", op)(InferContext(node, dtypes, shapes, consts))


# ---- reductions ---------------------------------------------------------------------------------

def test_reduce_with_const_axes_keeps_symbolic_dims():
    [(dt, shape)] = infer("ReduceMean", [("batch", 8, "seq"), (1,)], [F32, I64], [None, np.array([1])])
    assert dt == F32 and shape == ("batch", 1, "seq")


def test_reduce_without_keepdims_drops_axes():
    [(_, shape)] = infer("ReduceSum", [("n", 3, 4), (2,)], [F32, I64], [None, np.array([0, -1])], {"keepdims": 0})
    assert shape == (3,)


def test_reduce_with_unknown_axes_and_keepdims_keeps_only_the_rank():
    [(_, shape)] = infer("ReduceMax", [(2, 3, 4), (1,)], [F32, I64])
    assert shape == (None, None, None)


def test_reduce_with_unknown_axes_of_known_length_gives_the_rank():
    [(_, shape)] = infer("ReduceMax", [(2, 3, 4), (2,)], [F32, I64], attrs={"keepdims": 0})
    assert shape == (None,)


def test_reduce_with_unknown_axes_of_unknown_length_gives_unknown_shape():
    [(_, shape)] = infer("ReduceMax", [(2, 3, 4), None], [F32, I64], attrs={"keepdims": 0})
    assert shape is None


def test_reduce_with_empty_axes_and_noop_flag_keeps_shape():
    [(_, shape)] = infer("ReduceSum", [(2, "k"), (0,)], [F32, I64], [None, np.array([], np.int64)],
                         {"noop_with_empty_axes": 1})
    assert shape == (2, "k")


def test_reduce_with_repeated_axes_is_a_shape_error():
    with pytest.raises(ShapeError, match="repeat"):
        infer("ReduceSum", [(2, 3), (2,)], [F32, I64], [None, np.array([1, -1])])


def test_reduce_axis_out_of_range_is_a_shape_error():
    with pytest.raises(ShapeError, match="out of range"):
        infer("ReduceL2", [(2, 3), (1,)], [F32, I64], [None, np.array([2])])


def test_reduce_with_leftover_axes_attribute_is_a_shape_error():
    with pytest.raises(ShapeError, match="canonical"):
        infer("ReduceMean", [(2, 3)], attrs={"axes": [0]})


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data(), keepdims=st.booleans())
def test_reduce_rule_agrees_with_the_kernel(shape, data, keepdims):
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), max_size=rank, unique_by=lambda a: a % rank))
    axes_arr = np.array(axes, np.int64)
    [(_, inferred)] = infer("ReduceSum", [tuple(shape), (len(axes),)], [F32, I64], [None, axes_arr],
                            {"keepdims": int(keepdims)})
    x = np.ones(shape, np.float32)
    (out,) = run_reference(Node("ReduceSum", ["x", "a"], ["y"], {"keepdims": int(keepdims)}), [x, axes_arr])
    assert inferred == out.shape


def test_argmax_gives_int64_with_symbolic_dims():
    [(dt, shape)] = infer("ArgMax", [("n", 5, "t")], attrs={"axis": 1, "keepdims": 0})
    assert dt == I64 and shape == ("n", "t")


# ---- softmax, activations -------------------------------------------------------------------------

def test_softmax_axis_out_of_range_is_a_shape_error():
    with pytest.raises(ShapeError):
        infer("Softmax", [(2, 3)], attrs={"axis": 2})


def test_activation_keeps_dtype_and_symbolic_shape():
    assert infer("Gelu", [("b", 7)]) == [(F32, ("b", 7))]


def test_prelu_slope_of_higher_rank_than_x_is_a_shape_error():
    with pytest.raises(ShapeError, match="broadcast"):
        infer("PRelu", [(3,), (2, 3)])


def test_clip_bound_of_another_dtype_is_a_shape_error():
    with pytest.raises(ShapeError, match="dtype"):
        infer("Clip", [(3,), ()], [F32, np.dtype(np.float64)])


# ---- TopK, Einsum, CumSum ----------------------------------------------------------------------------

def test_topk_with_const_k_sets_the_axis_dim():
    (v, i) = infer("TopK", [("n", 10), (1,)], [F32, I64], [None, np.array([3])], n_out=2)
    assert v == (F32, ("n", 3)) and i == (I64, ("n", 3))


def test_topk_with_unknown_k_leaves_the_axis_dim_unknown():
    (v, _) = infer("TopK", [(4, 10), (1,)], [F32, I64], attrs={"axis": 1}, n_out=2)
    assert v[1] == (4, None)


def test_topk_with_k_beyond_the_axis_is_a_shape_error():
    with pytest.raises(ShapeError, match="exceeds"):
        infer("TopK", [(4, 2), (1,)], [F32, I64], [None, np.array([3])], n_out=2)


def test_einsum_output_shape_with_ellipsis_and_symbolic_dims():
    [(_, shape)] = infer("Einsum", [("b", "s", 4), ("b", 4, 6)], attrs={"equation": "...ij,...jk->...ik"})
    assert shape == ("b", "s", 6)


def test_einsum_implicit_output_sorts_letters():
    [(_, shape)] = infer("Einsum", [(2, 3), (3, 5)], attrs={"equation": "ij,jk"})
    assert shape == (2, 5)


def test_einsum_letter_with_two_sizes_is_a_shape_error():
    with pytest.raises(ShapeError, match="sizes"):
        infer("Einsum", [(2, 3), (4, 5)], attrs={"equation": "ij,jk->ik"})


def test_einsum_with_wrong_number_of_terms_is_a_shape_error():
    with pytest.raises(ShapeError, match="input terms"):
        infer("Einsum", [(2, 3)], attrs={"equation": "ij,jk->ik"})


def test_cumsum_axis_out_of_range_is_a_shape_error():
    with pytest.raises(ShapeError):
        infer("CumSum", [(2, 3), ()], [F32, I64], [None, np.array(2)])


# ---- normalization ------------------------------------------------------------------------------------

def test_layernorm_statistics_keep_leading_dims():
    out = infer("LayerNormalization", [("b", "s", 8), (8,)], attrs={"axis": -1}, n_out=3)
    assert out[0] == (F32, ("b", "s", 8)) and out[1] == (F32, ("b", "s", 1)) and out[2] == out[1]


def test_groupnorm_with_channels_not_divisible_by_groups_is_a_shape_error():
    with pytest.raises(ShapeError, match="groups"):
        infer("GroupNormalization", [(1, 6, 4), (6,), (6,)], attrs={"num_groups": 4})


def test_batchnorm_running_stats_outputs_need_training_mode():
    with pytest.raises(ShapeError, match="training_mode"):
        infer("BatchNormalization", [(2, 3, 4), (3,), (3,), (3,), (3,)], n_out=3)


def test_batchnorm_param_of_wrong_length_is_a_shape_error():
    with pytest.raises(ShapeError, match="channels"):
        infer("BatchNormalization", [(2, 3, 4), (4,), (3,), (3,), (3,)])


# ---- quantization ---------------------------------------------------------------------------------------

def test_quantize_output_dtype_follows_zero_point():
    [(dt, shape)] = infer("QuantizeLinear", [("n", 4), (), ()], [F32, F32, np.dtype(np.int8)])
    assert dt == np.int8 and shape == ("n", 4)


def test_quantize_without_zero_point_is_uint8():
    [(dt, _)] = infer("QuantizeLinear", [(2, 4), ()])
    assert dt == np.uint8


def test_dequantize_output_dtype_follows_scale():
    [(dt, _)] = infer("DequantizeLinear", [(2, 4), (4,)], [np.dtype(np.int8), np.dtype(np.float16)], attrs={"axis": 1})
    assert dt == np.float16


def test_per_axis_scale_of_wrong_length_is_a_shape_error():
    with pytest.raises(ShapeError, match="per-axis"):
        infer("QuantizeLinear", [(2, 4), (3,)], attrs={"axis": 1})


def test_dynamic_quantize_gives_scalar_scale_and_zero_point():
    out = infer("DynamicQuantizeLinear", [(3, 4)], n_out=3)
    assert out == [(np.uint8, (3, 4)), (F32, ()), (np.uint8, ())]
