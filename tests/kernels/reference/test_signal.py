"""DFT, STFT, window and MelWeightMatrix reference kernels against onnxruntime / numpy."""

from __future__ import annotations

import numpy as np
import pytest

from .oracle import ort_run, ours

RNG = np.random.default_rng(20)


@pytest.mark.parametrize("last,attrs", [(1, {}), (2, {}), (1, {"inverse": 1}), (2, {"inverse": 1}),
                                        (1, {"onesided": 1})])  # one-sided forward transforms take real input
@pytest.mark.parametrize("axis,length", [(1, None), (-2, None), (1, 12), (2, 7)])
def test_dft_matches_onnxruntime(last, attrs, axis, length):
    x = RNG.standard_normal((2, 9, 10, last)).astype(np.float32)
    inputs = [x, None if length is None else np.array(length, np.int64), np.array(axis, np.int64)]
    (got,), (want,) = ours("DFT", inputs, attrs), ort_run("DFT", inputs, attrs, opset=20)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_inverse_one_sided_dft_is_numpy_irfft():
    x = RNG.standard_normal((3, 6, 2)).astype(np.float64)
    (got,) = ours("DFT", [x, np.array(11, np.int64), np.array(1, np.int64)], {"inverse": 1, "onesided": 1})
    np.testing.assert_allclose(got[..., 0], np.fft.irfft(x[..., 0] + 1j * x[..., 1], n=11, axis=1), rtol=1e-12)


@pytest.mark.parametrize("with_window", [False, True])
@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_matches_numpy_frames(with_window, onesided):
    x = RNG.standard_normal((2, 100, 1)).astype(np.float32)
    window = np.hanning(16).astype(np.float32) if with_window else None
    inputs = [x, np.array(6, np.int64), window, None if with_window else np.array(16, np.int64)]
    (got,) = ours("STFT", inputs, {"onesided": onesided})
    frames = np.stack([x[:, s:s + 16, 0] for s in range(0, 100 - 16 + 1, 6)], axis=1).astype(np.float64)
    want = np.fft.fft(frames * (1.0 if window is None else window), axis=-1)[..., :9 if onesided else 16]
    assert got.shape == (2, 15, 9 if onesided else 16, 2)
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_onnxruntime(op, periodic):
    inputs = [np.array(17, np.int64)]
    (got,), (want,) = ours(op, inputs, {"periodic": periodic}), ort_run(op, inputs, {"periodic": periodic}, opset=17)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_window_output_datatype_is_honoured():
    (got,) = ours("HannWindow", [np.array(8, np.int32)], {"output_datatype": 11})
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.sin(np.pi * np.arange(8) / 8) ** 2, atol=1e-15)


def test_mel_weight_matrix_rows_are_triangles_over_the_spectrogram_bins():
    inputs = [np.array(8, np.int32), np.array(64, np.int32), np.array(16000, np.int32), np.array(20.0, np.float32),
              np.array(8000.0, np.float32)]
    (got,) = ours("MelWeightMatrix", inputs)
    assert got.shape == (33, 8) and got.dtype == np.float32
    for i in range(8):
        col = got[:, i]
        assert col.max() == 1.0 and (col >= 0).all()
        peak = int(np.argmax(col))
        assert (np.diff(col[:peak + 1]) >= 0).all() and (np.diff(col[peak:]) <= 0).all()
