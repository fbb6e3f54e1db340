"""CenterCropPad and Col2Im tactics: host-side geometry, and on the GPU against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.models import image
from polykit.kernels.cuda.base import DeviceTensor

from .recording_launcher import RecordingLauncher

rng = np.random.default_rng(61)


def check(layer, inputs, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, **(tol or {"rtol": 0, "atol": 0}))


def test_crop_pad_passes_the_offsets_of_a_crop_and_a_pad():
    rec = RecordingLauncher()
    layer = LayerDesc("c", "CenterCropPad", ("x", "s"), ("y",), {"axes": [0, 1]})
    x, y = DeviceTensor(256, (10, 5), np.dtype(np.float32)), DeviceTensor(512, (7, 8), np.dtype(np.float32))
    image.enqueue_crop_pad(layer, rec, {"x": x, "s": DeviceTensor(0, (2,), np.dtype(np.int64)), "y": y})
    [(name, args)] = rec.launches
    assert name == "crop_pad_4"
    assert args[-8:] == [1, -1, 0, 0, 0, 0, 0, 0]  # crop 10 -> 7 starts at 1; pad 5 -> 8 puts 1 zero first


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
@pytest.mark.parametrize("sizes,axes", [([3, 9], [0, 1]), ([7, 2], [1, -1]), ([4, 6, 3], None)])
def test_center_crop_pad_matches_reference(dtype, sizes, axes):
    x = np.abs(rng.standard_normal((5, 6, 3)) * 50).astype(dtype)
    attrs = {} if axes is None else {"axes": axes}
    check(LayerDesc("c", "CenterCropPad", ("x", "s"), ("y",), attrs), {"x": x, "s": np.array(sizes, np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("img,block,attrs", [
    ([5, 5], [3, 3], {"strides": [2, 2]}),
    ([7, 6], [3, 2], {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [2, 1]}),
    ([3, 4, 5], [1, 2, 3], {}),
])
def test_col2im_matches_reference(dtype, img, block, attrs):
    n = len(img)
    pads, dil, strides = attrs.get("pads", [0] * 2 * n), attrs.get("dilations", [1] * n), attrs.get("strides", [1] * n)
    blocks = [(img[i] + pads[i] + pads[i + n] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(n)]
    x = rng.standard_normal((2, 3 * int(np.prod(block)), int(np.prod(blocks)))).astype(dtype)
    layer = LayerDesc("c", "Col2Im", ("x", "img", "blk"), ("y",), attrs)
    check(layer, {"x": x, "img": np.array(img, np.int64), "blk": np.array(block, np.int64)}, rtol=1e-5, atol=1e-6)
