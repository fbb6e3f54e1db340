"""Shape rules of CenterCropPad, Col2Im and Det: sizes from constant inputs, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.errors import ShapeError

F32, I64 = np.dtype(np.float32), np.dtype(np.int64)


def infer(op, shapes, consts, attrs=None):
    node = Node(op, [f"in{i}" for i in range(len(shapes))], ["out"], dict(attrs or {}), name=f"{op}_0")
    dtypes = [F32] + [I64] * (len(shapes) - 1)
    return find_shape_rule("", op)(InferContext(node, dtypes, shapes, consts))


def test_center_crop_pad_takes_the_sizes_on_its_axes():
    [(dt, shape)] = infer("CenterCropPad", [("n", 10, 7), (2,)], [None, np.array([4, 9])], {"axes": [-2, 2]})
    assert dt == F32 and shape == ("n", 4, 9)


def test_center_crop_pad_with_unknown_sizes_keeps_the_other_dims():
    [(_, shape)] = infer("CenterCropPad", [("n", 10, 7), (1,)], [None, None], {"axes": [1]})
    assert shape == ("n", None, 7)


def test_center_crop_pad_needs_one_size_per_axis():
    with pytest.raises(ShapeError, match="one non-negative size per axis"):
        infer("CenterCropPad", [(10, 7), (1,)], [None, np.array([4])])


def test_col2im_output_is_batch_channels_and_the_image():
    [(_, shape)] = infer("Col2Im", [("n", 18, 4), (2,), (2,)], [None, np.array([5, 5]), np.array([3, 3])],
                         {"strides": [2, 2]})
    assert shape == ("n", 2, 5, 5)


def test_col2im_with_a_block_count_that_does_not_fit_is_a_shape_error():
    with pytest.raises(ShapeError, match="sliding blocks"):
        infer("Col2Im", [(1, 18, 5), (2,), (2,)], [None, np.array([5, 5]), np.array([3, 3])], {"strides": [2, 2]})


def test_col2im_without_constant_sizes_knows_only_the_rank():
    [(_, shape)] = infer("Col2Im", [(1, 18, 4), (3,), (3,)], [None, None, None])
    assert shape == (None,) * 5


@pytest.mark.parametrize("shape,want", [((3, 3), ()), (("b", 4, 4), ("b",)), ((2, 5, "m", "m"), (2, 5))])
def test_det_drops_the_matrix_dims(shape, want):
    assert infer("Det", [shape], [None]) == [(F32, want)]


def test_det_of_non_square_matrices_is_a_shape_error():
    with pytest.raises(ShapeError, match="square"):
        infer("Det", [(2, 3, 4)], [None])
