"""Reformat tactics: which layers they take (CPU) and results against the reference (GPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.plan_records import LayerDesc
from polykit.kernels.cuda.reformat import _pads_last_only, _transposes

rng = np.random.default_rng(29)


def stamped(layer: LayerDesc, inputs: dict, out_shape) -> LayerDesc:
    names = [n for n in layer.inputs if n]
    return replace(layer, in_dtypes=tuple(np.dtype(inputs[n].dtype).name for n in names),
                   in_shapes=tuple(tuple(inputs[n].shape) for n in names),
                   out_dtypes=(np.dtype(inputs[names[0]].dtype).name,), out_shapes=(tuple(out_shape),))


def transpose(x, perm):
    layer = LayerDesc("t", "Transpose", ("x",), ("y",), {"perm": perm})
    return stamped(layer, {"x": x}, np.transpose(x, perm).shape)


def pad(x, pads, value=None):
    inputs = {"x": x, "pads": np.asarray(pads, np.int64)}
    if value is not None:
        inputs["v"] = np.asarray(value, x.dtype)
    out = np.pad(x, list(zip(pads[:x.ndim], pads[x.ndim:]))).shape
    return stamped(LayerDesc("p", "Pad", tuple(inputs), ("y",), {"mode": "constant"}), inputs, out), inputs


def test_the_reformat_transposes_take_small_channel_counts_in_either_direction():
    assert _transposes("to_nhwc")(transpose(np.zeros((2, 3, 5, 5), np.float16), [0, 2, 3, 1]))
    assert _transposes("from_nhwc")(transpose(np.zeros((2, 5, 5, 3), np.float16), [0, 3, 1, 2]))
    assert not _transposes("to_nhwc")(transpose(np.zeros((2, 128, 5, 5), np.float16), [0, 2, 3, 1]))
    assert not _transposes("to_nhwc")(transpose(np.zeros((2, 3, 5, 5), np.float16), [0, 3, 2, 1]))


def test_pad_last_takes_only_constant_pads_of_the_last_axis():
    x = np.zeros((2, 4, 4, 3), np.float16)
    assert _pads_last_only(pad(x, [0, 0, 0, 0, 0, 0, 0, 5])[0])
    assert _pads_last_only(pad(x, [0, 0, 0, 2, 0, 0, 0, 3])[0])
    assert not _pads_last_only(pad(x, [0, 1, 0, 0, 0, 0, 0, 5])[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("shape,perm", [((2, 3, 17, 19), [0, 2, 3, 1]), ((1, 8, 7, 7), [0, 2, 3, 1]),
                                        ((3, 64, 5, 6), [0, 2, 3, 1]), ((2, 9, 11, 3), [0, 3, 1, 2])])
def test_reformat_transposes_match_numpy(dtype, shape, perm):
    from polykit.runtime.cuda.harness import run_layer

    x = rng.standard_normal(shape).astype(dtype)
    name = "cuda.movement.to_nhwc" if perm == [0, 2, 3, 1] else "cuda.movement.from_nhwc"
    out = run_layer(transpose(x, perm), {"x": x}, tactic=name)["y"]
    np.testing.assert_array_equal(out, np.transpose(x, perm))


@pytest.mark.gpu
@pytest.mark.parametrize("pads,value", [([0, 0, 0, 0, 0, 0, 0, 5], None), ([0, 0, 0, 2, 0, 0, 0, 3], 1.5)])
def test_pad_last_matches_numpy(pads, value):
    from polykit.runtime.cuda.harness import run_layer

    x = rng.standard_normal((2, 6, 7, 3)).astype(np.float16)
    layer, inputs = pad(x, pads, value)
    out = run_layer(layer, inputs, tactic="cuda.movement.pad_last")["y"]
    want = np.pad(x, list(zip(pads[:4], pads[4:])), constant_values=0 if value is None else value)
    np.testing.assert_array_equal(out, want)
