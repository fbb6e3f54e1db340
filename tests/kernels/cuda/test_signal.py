"""Signal tactics: argument packing on the host, and on the GPU against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.models import signal
from polykit.kernels.cuda.base import DeviceTensor

from .recording_launcher import RecordingLauncher

rng = np.random.default_rng(63)


def check(layer, inputs, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, **(tol or {"rtol": 1e-4, "atol": 1e-4}))


def test_window_passes_the_periodic_or_symmetric_denominator():
    rec = RecordingLauncher()
    y = DeviceTensor(256, (10,), np.dtype(np.float32))
    for periodic in (1, 0):
        signal.enqueue_window(LayerDesc("w", "HammingWindow", ("n",), ("y",), {"periodic": periodic}), rec, {"y": y})
    assert [args[-1] for _, args in rec.launches] == [10.0, 9.0]


def test_dft_reads_axis_and_length_on_the_device():
    rec = RecordingLauncher()
    tensors = {"x": DeviceTensor(256, (2, 9, 1), np.dtype(np.float32)), "y": DeviceTensor(512, (2, 5, 2), np.dtype(np.float32)),
               "n": DeviceTensor(1024, (), np.dtype(np.int32)), "a": DeviceTensor(2048, (), np.dtype(np.int64))}
    signal.enqueue_dft(LayerDesc("d", "DFT", ("x", "n", "a"), ("y",), {"onesided": 1}), rec, tensors)
    [(name, args)] = rec.launches
    assert name == "dft_f32" and args[11:15] == [2048, 1, 1024, 0]  # axis ptr/int64, length ptr/int32
    assert args[-1] == 10  # one thread per complex output


@pytest.mark.gpu
@pytest.mark.parametrize("last,attrs", [(1, {}), (2, {}), (2, {"inverse": 1}), (1, {"onesided": 1}),
                                        (2, {"inverse": 1, "onesided": 1})])
@pytest.mark.parametrize("axis,length", [(1, None), (2, None), (1, 12), (2, 7)])
def test_dft_matches_reference(last, attrs, axis, length):
    x = rng.standard_normal((2, 9, 10, last)).astype(np.float32)
    feeds = {"x": x, "a": np.array(axis, np.int64)}
    inputs = ("x", "n" if length else "", "a")
    if length:
        feeds["n"] = np.array(length, np.int64)
    check(LayerDesc("d", "DFT", inputs, ("y",), attrs), feeds)


@pytest.mark.gpu
def test_long_float64_dft_keeps_its_accuracy():
    x = rng.standard_normal((1, 4099, 2))
    check(LayerDesc("d", "DFT", ("x", "", "a"), ("y",)), {"x": x, "a": np.array(1, np.int64)}, rtol=1e-9, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("window,onesided", [(False, 1), (True, 1), (True, 0)])
def test_stft_matches_reference(window, onesided):
    feeds = {"x": rng.standard_normal((2, 100, 1)).astype(np.float32), "s": np.array(6, np.int64)}
    if window:
        feeds["w"] = np.hanning(16).astype(np.float32)
        inputs = ("x", "s", "w")
    else:
        feeds["l"] = np.array(16, np.int64)
        inputs = ("x", "s", "", "l")
    check(LayerDesc("s", "STFT", inputs, ("y",), {"onesided": onesided}), feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_reference(op, periodic):
    check(LayerDesc("w", op, ("n",), ("y",), {"periodic": periodic}), {"n": np.array(33, np.int64)}, rtol=1e-6,
          atol=1e-6)


@pytest.mark.gpu
def test_mel_weight_matrix_matches_reference():
    feeds = {"b": np.array(8, np.int32), "n": np.array(16, np.int32), "r": np.array(8192, np.int32),
             "lo": np.array(0.0, np.float32), "hi": np.array(4096.0, np.float32)}
    check(LayerDesc("m", "MelWeightMatrix", ("b", "n", "r", "lo", "hi"), ("y",)), feeds, rtol=0, atol=1e-7)
