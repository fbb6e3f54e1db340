"""Reformat tactics: which layers they take (CPU) and results against the reference (GPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.conv.reformat import _pads_last_only, _transposes, chunk_bytes, enqueue_pad_last
from tests.kernels.cuda.recording_launcher import RecordingLauncher

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


def test_pad_chunks_write_a_whole_padded_stem_pixel_a_thread():
    assert chunk_bytes(2, 8, 0x1000) == 16  # fp16 3 -> 8
    assert chunk_bytes(1, 16, 0x1000) == 16  # int8 3 -> 16
    assert chunk_bytes(2, 6, 0x1000) == 4
    assert chunk_bytes(2, 8, 0x1008) == 8  # y aligned to 8 bytes only
    assert chunk_bytes(2, 7, 0x1000) == 0  # an odd row: the element loop
    assert chunk_bytes(8, 3, 0x1000) == 0


def test_pad_last_enqueue_takes_pad_chunks_when_a_chunk_fits():
    def launched(cout, y_ptr):
        rec = RecordingLauncher()
        tensors = {"x": DeviceTensor(0x1000, (4, 5, 3), np.dtype(np.float16)),
                   "pads": DeviceTensor(0x2000, (6,), np.dtype(np.int64)),
                   "y": DeviceTensor(y_ptr, (4, 5, cout), np.dtype(np.float16))}
        enqueue_pad_last(LayerDesc("p", "Pad", ("x", "pads"), ("y",), {"mode": "constant"}), rec, tensors)
        (name, args), = rec.launches
        return name, args[-1]

    assert launched(8, 0x4000) == ("pad_chunks_2", 16)
    assert launched(7, 0x4000)[0] == "pad_last_2"


def test_pad_last_refuses_a_run_that_pads_another_axis():
    """A run whose shapes pad a leading axis too (a profile's interior point the build did not see) is a
    DeviceError naming the layer, not rows written over each other."""
    rec = RecordingLauncher()
    tensors = {"x": DeviceTensor(0x1000, (1, 3, 319, 319), np.dtype(np.float32)),
               "pads": DeviceTensor(0x2000, (8,), np.dtype(np.int64)),
               "y": DeviceTensor(0x4000, (1, 3, 320, 320), np.dtype(np.float32))}
    with pytest.raises(DeviceError, match="pads only the last axis") as info:
        enqueue_pad_last(LayerDesc("p", "Pad", ("x", "pads"), ("y",), {"mode": "constant"}), rec, tensors)
    assert info.value.where == "layer 'p'" and not rec.launches


#: (input shape, dtype, pads of the last axis (begin, end), fill): every chunk width, odd row counts
PAD_CASES = [((3, 17, 19, 3), np.float16, (0, 5), None), ((2, 7, 9, 3), np.int8, (0, 13), 3),
             ((5, 11, 3), np.float32, (1, 0), 1.5), ((33, 5), np.float16, (0, 1), None),
             ((4, 9, 2), np.float16, (3, 3), -2.0), ((7, 6), np.float64, (1, 1), 0.5), ((13, 1), np.uint8, (2, 5), 7)]


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [0, 2])
@pytest.mark.parametrize("shape,dtype,last,value", PAD_CASES)
def test_pad_last_chunks_match_numpy(shape, dtype, last, value, misalign):
    from polykit.runtime.cuda.harness import run_layer

    x = (rng.standard_normal(shape) * 20).astype(dtype)
    x[x == 0] = 1
    pads = [0] * len(shape) + [0] * len(shape)
    pads[len(shape) - 1], pads[-1] = last
    layer, inputs = pad(x, pads, value)
    out = run_layer(layer, inputs, tactic="cuda.movement.pad_last", misalign={"y": misalign * x.itemsize})["y"]
    want = np.pad(x, list(zip(pads[:len(shape)], pads[len(shape):])), constant_values=0 if value is None else value)
    np.testing.assert_array_equal(out, want, err_msg=f"{shape} {np.dtype(dtype)} pads {last} misalign {misalign}")
