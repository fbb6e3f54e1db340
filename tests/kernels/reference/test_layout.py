"""Reference kernels of the layout ops, checked against onnxruntime on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import RuntimeInputError

from .oracle import assert_same, ort, run

RNG = np.random.default_rng(7)
I64 = np.int64


def test_transpose_default_reverses_the_axes():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    assert_same(run("Transpose", [x]), ort("Transpose", [x]))


def test_transpose_follows_perm():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    assert_same(run("Transpose", [x], perm=[2, 0, 3, 1]), ort("Transpose", [x], perm=[2, 0, 3, 1]))


def test_concat_joins_along_a_negative_axis():
    a, b = RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal((2, 5)).astype(np.float32)
    assert_same(run("Concat", [a, b], axis=-1), ort("Concat", [a, b], axis=-1))


def test_split_into_num_outputs_makes_the_last_chunk_smaller():
    x = RNG.standard_normal((7, 2)).astype(np.float32)
    ours = run("Split", [x], n_out=3, num_outputs=3)
    assert [o.shape[0] for o in ours] == [3, 3, 1]
    assert_same(ours, ort("Split", [x], n_out=3, num_outputs=3))


def test_split_by_explicit_sizes_along_axis_1():
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    sizes = np.array([1, 0, 5], I64)
    assert_same(run("Split", [x, sizes], n_out=3, axis=1), ort("Split", [x, sizes], n_out=3, axis=1))


def test_split_with_sizes_not_adding_up_is_a_runtime_input_error():
    x = RNG.standard_normal((6,)).astype(np.float32)
    with pytest.raises(RuntimeInputError):
        run("Split", [x, np.array([2, 2], I64)], n_out=2)


@pytest.mark.parametrize("start,end,step", [
    (1, 4, 1), (-1, -4, -1), (10, -100, -2), (-100, 100, 3), (4, 0, -1), (0, -1, 1), (5, 5, 1),
    (2**62, -(2**62), -1), (-100, -100, -1),
])
def test_slice_clamps_like_onnxruntime(start, end, step):
    x = RNG.standard_normal((6, 5)).astype(np.float32)
    args = [x, np.array([start], I64), np.array([end], I64), np.array([0], I64), np.array([step], I64)]
    assert_same(run("Slice", args), ort("Slice", args))


def test_slice_with_negative_start_beyond_the_axis_and_negative_step_keeps_element_0():
    # ONNX clamps start to [0, dim-1] when stepping back, so slicing -100..-100 by -1 keeps x[0]
    x = np.arange(5, dtype=np.float32)
    (y,) = run("Slice", [x, np.array([-100], I64), np.array([-100], I64), np.array([0], I64), np.array([-1], I64)])
    np.testing.assert_array_equal(y, x[:1])


def test_slice_on_several_axes_without_steps():
    x = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    args = [x, np.array([1, -3], I64), np.array([3, 100], I64), np.array([2, 0], I64)]
    assert_same(run("Slice", args), ort("Slice", args))


def test_slice_with_step_0_is_a_runtime_input_error():
    x = np.arange(5, dtype=np.float32)
    with pytest.raises(RuntimeInputError):
        run("Slice", [x, np.array([0], I64), np.array([5], I64), None, np.array([0], I64)])


def test_tile_repeats_each_axis():
    x = RNG.integers(-9, 9, (2, 3)).astype(np.int32)
    reps = np.array([3, 2], I64)
    assert_same(run("Tile", [x, reps]), ort("Tile", [x, reps]))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_match_onnxruntime(mode):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    pads = np.array([1, 2, 2, 1], I64)
    assert_same(run("Pad", [x, pads], mode=mode), ort("Pad", [x, pads], mode=mode))


def test_pad_fills_with_the_constant_value():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    args = [x, np.array([0, 1, 1, 0], I64), np.array(2.5, np.float32)]
    assert_same(run("Pad", args), ort("Pad", args))


def test_pad_with_negative_pads_crops():
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    args = [x, np.array([-1, 2, 1, -2], I64)]
    assert_same(run("Pad", args), ort("Pad", args))


def test_pad_only_the_given_axes():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    args = [x, np.array([1, 2, 0, 3], I64), None, np.array([-1, 0], I64)]
    assert_same(run("Pad", args, mode="edge"), ort("Pad", args, mode="edge"))


def test_reverse_sequence_reverses_each_batch_prefix():
    x = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    lens = np.array([4, 1, 3], I64)
    assert_same(run("ReverseSequence", [x, lens]), ort("ReverseSequence", [x, lens]))


def test_reverse_sequence_with_batch_axis_0():
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    lens = np.array([5, 2, 0], I64)
    attrs = {"batch_axis": 0, "time_axis": 1}
    ours = run("ReverseSequence", [x, lens], **attrs)
    np.testing.assert_array_equal(ours[0][1], np.concatenate([x[1, 1::-1], x[1, 2:]]))
    np.testing.assert_array_equal(ours[0][2], x[2])
