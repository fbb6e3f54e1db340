"""CenterCropPad and Col2Im reference kernels against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import RuntimeInputError

from .oracle import assert_same, ort_run, ours

RNG = np.random.default_rng(18)


@pytest.mark.parametrize("sizes,axes", [([3, 9], [0, 1]), ([7, 2], [1, -1]), ([4, 6, 3], None), ([2], [2])])
def test_center_crop_pad_matches_onnxruntime(sizes, axes):
    x = RNG.standard_normal((5, 6, 3)).astype(np.float32)
    inputs, attrs = [x, np.array(sizes, np.int64)], ({} if axes is None else {"axes": axes})
    assert_same(ours("CenterCropPad", inputs, attrs), ort_run("CenterCropPad", inputs, attrs, opset=18))


def test_center_crop_pad_of_int8_pads_with_zeros():
    x = RNG.integers(1, 100, (3, 3)).astype(np.int8)
    (got,) = ours("CenterCropPad", [x, np.array([6, 2], np.int64)])
    assert got.dtype == np.int8 and got.shape == (6, 2)
    assert (got[:1] == 0).all() and (got[4:] == 0).all()
    np.testing.assert_array_equal(got[1:4], x[:, :2])


@pytest.mark.parametrize("image,block,attrs", [
    ([5, 5], [1, 5], {}),
    ([5, 5], [3, 3], {"strides": [2, 2]}),
    ([5, 5], [1, 5], {"pads": [0, 1, 0, 1]}),
    ([6, 6], [2, 2], {"dilations": [1, 5]}),
    ([7, 6], [3, 2], {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [2, 1]}),
    ([3, 4, 5], [1, 2, 3], {}),
])
def test_col2im_matches_onnxruntime(image, block, attrs):
    n = len(image)
    pads, dil, strides = attrs.get("pads", [0] * 2 * n), attrs.get("dilations", [1] * n), attrs.get("strides", [1] * n)
    blocks = [(image[i] + pads[i] + pads[i + n] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(n)]
    x = RNG.standard_normal((2, 3 * int(np.prod(block)), int(np.prod(blocks)))).astype(np.float32)
    inputs = [x, np.array(image, np.int64), np.array(block, np.int64)]
    (got,), (want,) = ours("Col2Im", inputs, attrs), ort_run("Col2Im", inputs, attrs, opset=18)
    assert got.shape == want.shape == (2, 3, *image)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_col2im_with_the_wrong_block_count_is_a_runtime_input_error():
    x = RNG.standard_normal((1, 5, 4)).astype(np.float32)
    with pytest.raises(RuntimeInputError, match="sliding blocks"):
        ours("Col2Im", [x, np.array([5, 5], np.int64), np.array([1, 5], np.int64)])
