"""TopK tactic: host helpers, and on the GPU values and indices against the reference (ties, NaN, long rows)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.movement import topk

rng = np.random.default_rng(47)


def topk_layer(**attrs):
    return LayerDesc("topk", "TopK", ("X", "K"), ("V", "I"), dict(attrs))


def check(layer, inputs):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, rtol=0, atol=0)


def test_padded_length_is_the_next_power_of_two():
    assert [topk.padded_length(r) for r in (1, 2, 3, 4, 5, 4096, 4097)] == [1, 2, 4, 4, 8, 4096, 8192]


def test_topk_declares_kernels_for_every_integer_width():
    names = {k.name for k in topk._kernels(topk_layer())}
    assert {f"topk_shared_{c}" for c in ("u64", "u32", "i16", "u16", "i8", "u8")} <= names


def test_shared_threads_stay_within_32_and_512():
    assert topk.shared_threads(2) == 32 and topk.shared_threads(256) == 128 and topk.shared_threads(4096) == 512


@pytest.mark.gpu
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("shape,axis,k", [((1,), 0, 1), ((3, 10), -1, 4), ((2, 33, 5), 1, 33), ((4, 1000), 1, 17),
                                          ((6, 7), 0, 3), ((2, 4096), 1, 100)])
def test_topk_float32_matches_reference(largest, shape, axis, k):
    x = rng.standard_normal(shape).astype(np.float32)
    check(topk_layer(axis=axis, largest=largest), {"X": x, "K": np.array([k], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_ties_keep_ascending_index_order(largest):
    x = rng.integers(0, 4, size=(5, 300)).astype(np.float32)
    check(topk_layer(axis=1, largest=largest), {"X": x, "K": np.array([50], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_nan_counts_as_the_largest_value(largest):
    x = rng.standard_normal((3, 20)).astype(np.float32)
    x[:, [2, 7, 11]] = np.nan
    check(topk_layer(axis=1, largest=largest), {"X": x, "K": np.array([20], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64])
def test_topk_other_dtypes_match_reference(dtype):
    x = rng.permutation(600).reshape(2, 300).astype(dtype) - 250
    check(topk_layer(axis=-1), {"X": x, "K": np.array([9], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_rows_beyond_shared_memory_use_the_global_sort(largest):
    x = rng.integers(0, 3000, size=(3, 5000)).astype(np.float32)  # ties across the long row
    check(topk_layer(axis=1, largest=largest), {"X": x, "K": np.array([64], np.int64)})


@pytest.mark.gpu
def test_topk_long_inner_axis_uses_the_global_sort():
    x = rng.standard_normal((4500, 3)).astype(np.float32)
    check(topk_layer(axis=0, largest=1), {"X": x, "K": np.array([5], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.int8, np.uint8, np.int16, np.uint16])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_narrow_and_unsigned_integers_match_reference(dtype, largest):
    x = rng.integers(0, 120, size=(3, 300)).astype(dtype)
    check(topk_layer(axis=1, largest=largest), {"X": x, "K": np.array([20], np.int64)})
