"""GridSample, AffineGrid and DeformConv reference kernels against onnxruntime (random non-zero data)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import NodeAttributeError, ShapeError
from tests.kernels.reference.oracle import ort_run, ours

RNG = np.random.default_rng(33)


def grid_sample_inputs(spatial=(5, 7), out=(4, 6), n=2, c=3, spread=1.3):
    x = RNG.standard_normal((n, c, *spatial)).astype(np.float32)
    g = RNG.uniform(-spread, spread, (n, *out, len(spatial))).astype(np.float32)
    return [x, g]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d_matches_onnxruntime(mode, padding, align):
    ins = grid_sample_inputs()
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    np.testing.assert_allclose(ours("GridSample", ins, attrs)[0], ort_run("GridSample", ins, attrs)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_3d_matches_onnxruntime(mode, padding):
    ins = grid_sample_inputs(spatial=(3, 4, 5), out=(2, 3, 4))
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": 0}
    np.testing.assert_allclose(ours("GridSample", ins, attrs)[0], ort_run("GridSample", ins, attrs)[0],
                               rtol=1e-5, atol=1e-5)


def test_grid_sample_cubic_3d_is_an_attribute_error():
    with pytest.raises(NodeAttributeError, match="cubic"):
        ours("GridSample", grid_sample_inputs(spatial=(3, 4, 5), out=(2, 3, 4)), {"mode": "cubic"})


@pytest.mark.parametrize("dims", [(2, 3, 5, 7), (2, 3, 4, 5, 6)])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_matches_onnxruntime(dims, align):
    r = len(dims) - 2
    theta = RNG.standard_normal((dims[0], r, r + 1)).astype(np.float32)
    ins = [theta, np.array(dims, np.int64)]
    np.testing.assert_allclose(ours("AffineGrid", ins, {"align_corners": align})[0],
                               ort_run("AffineGrid", ins, {"align_corners": align}, opset=20)[0], rtol=1e-5, atol=1e-6)


def deform_inputs(n=2, c=4, h=7, w=6, m=6, k=(3, 3), group=2, og=2, strides=(1, 1), pads=(1, 1, 1, 1),
                  dil=(1, 1), mask=True, bias=True):
    oh = (h + pads[0] + pads[2] - (k[0] - 1) * dil[0] - 1) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - (k[1] - 1) * dil[1] - 1) // strides[1] + 1
    f = lambda *s: RNG.standard_normal(s).astype(np.float32)  # noqa: E731
    ins = [f(n, c, h, w), f(m, c // group, *k), f(n, og * k[0] * k[1] * 2, oh, ow) * 1.5,
           f(m) if bias else None, RNG.uniform(0, 1, (n, og * k[0] * k[1], oh, ow)).astype(np.float32) if mask else None]
    attrs = {"group": group, "offset_group": og, "strides": list(strides), "pads": list(pads), "dilations": list(dil)}
    return [a for a in ins] if mask else ins[:4], attrs


@pytest.mark.parametrize("kw", [{}, {"mask": False, "bias": False, "group": 1, "og": 1},
                                {"strides": (2, 1), "dil": (1, 2), "pads": (0, 2, 1, 0)}, {"og": 4, "group": 1}])
def test_deform_conv_matches_onnxruntime(kw):
    ins, attrs = deform_inputs(**kw)
    np.testing.assert_allclose(ours("DeformConv", ins, attrs)[0], ort_run("DeformConv", ins, attrs)[0],
                               rtol=1e-4, atol=1e-4)


def test_deform_conv_offset_of_the_wrong_size_is_a_shape_error():
    ins, attrs = deform_inputs()
    ins[2] = ins[2][:, :4]
    with pytest.raises(ShapeError, match="offset"):
        ours("DeformConv", ins, attrs)
