"""Reference kernels: DFT, STFT (numpy.fft in float64), window functions, MelWeightMatrix
(the ONNX reference's bin arithmetic)."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ops.math.signal import WINDOW_COEFFS, WINDOW_OPS, dft_geometry, output_dtype, stft_geometry
from polykit.errors import RuntimeInputError
from polykit.compiler.ops.references import reference


def _int(value) -> int:
    return int(np.asarray(value).reshape(-1)[0])


def _complex(x: np.ndarray) -> np.ndarray:
    """[..., 1 or 2] real storage -> complex128 [...]."""
    w = x.astype(np.float64)
    return w[..., 0] + 1j * w[..., 1] if x.shape[-1] == 2 else w[..., 0].astype(np.complex128)


def _stored(z: np.ndarray, dtype) -> np.ndarray:
    """complex [...] -> [..., 2] real storage of `dtype`."""
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


def _bad(node, exc: Exception) -> RuntimeInputError:
    return RuntimeInputError(f"{node.op_type}: {exc}", where=node.describe(), hint=f"see the ONNX {node.op_type} spec")


@reference("DFT")
def dft(node, inputs):
    x = inputs[0]
    length = inputs[1] if len(inputs) > 1 else None
    axis = _int(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else -2
    try:
        g = dft_geometry(node.attrs, x.shape, axis, None if length is None else _int(length))
    except ValueError as exc:
        raise _bad(node, exc) from None
    z = _complex(x)
    if not g.out_complex:  # inverse of a one-sided spectrum: a real signal
        return [np.fft.irfft(z, n=g.length, axis=g.axis)[..., None].astype(x.dtype)]
    if node.attrs.get("inverse", 0):
        out = np.fft.ifft(z, n=g.length, axis=g.axis)
    else:
        out = np.fft.fft(z, n=g.length, axis=g.axis)
    return [_stored(np.take(out, np.arange(g.out_len), axis=g.axis), x.dtype)]


@reference("STFT")
def stft(node, inputs):
    x, step = inputs[0], _int(inputs[1])
    window = inputs[2] if len(inputs) > 2 else None
    length = _int(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
    try:
        g = stft_geometry(bool(node.attrs.get("onesided", 1)), x.shape[1], step,
                          None if window is None else window.shape[0], length)
    except ValueError as exc:
        raise _bad(node, exc) from None
    z = _complex(x)
    starts = np.arange(g.n_frames) * step
    frames = z[:, starts[:, None] + np.arange(g.frame_length)]  # [batch, frames, frame_length]
    if window is not None:
        frames = frames * window.astype(np.float64)
    return [_stored(np.fft.fft(frames, axis=-1)[..., :g.bins], x.dtype)]


def window_values(op: str, size: int, periodic: bool) -> np.ndarray:
    """The float64 window of `size` values (N = size when periodic, size - 1 otherwise)."""
    a0, a1, a2 = WINDOW_COEFFS[op]
    n = np.arange(size, dtype=np.float64)
    denom = size if periodic else size - 1
    with np.errstate(invalid="ignore", divide="ignore"):  # a symmetric window of 1 value divides by 0
        angle = 2 * np.pi * n / denom
    return a0 - a1 * np.cos(angle) + a2 * np.cos(2 * angle)


def _window(node, inputs):
    values = window_values(node.op_type, _int(inputs[0]), bool(node.attrs.get("periodic", 1)))
    return [values.astype(output_dtype(node.attrs, node.describe()))]


for _op in WINDOW_OPS:
    reference(_op)(_window)


def mel_bin_edges(num_mel_bins: int, dft_length: int, sample_rate, lower_hz, upper_hz) -> np.ndarray:
    """The num_mel_bins + 2 spectrogram bins that bound the triangles (as ONNX's reference
    computes them: mel steps of (high - low) / (num_mel_bins + 2), floor of (dft_length + 1) * f / rate)."""
    low = 2595 * np.log1p(np.float64(lower_hz) / 700) / np.log(10)
    high = 2595 * np.log1p(np.float64(upper_hz) / 700) / np.log(10)
    mels = np.arange(num_mel_bins + 2) * ((high - low) / (num_mel_bins + 2)) + low
    hz = 700 * np.expm1(mels / 2595 * np.log(10))
    return (((dft_length + 1) * hz) // np.float64(sample_rate)).astype(np.int64)


@reference("MelWeightMatrix")
def mel_weight_matrix(node, inputs):
    bins, dft_length = _int(inputs[0]), _int(inputs[1])
    edges = mel_bin_edges(bins, dft_length, np.asarray(inputs[2]).reshape(()), np.asarray(inputs[3]).reshape(()),
                          np.asarray(inputs[4]).reshape(()))
    out = np.zeros((dft_length // 2 + 1, bins))
    j = np.arange(out.shape[0])[:, None]
    left, center, right = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    with np.errstate(invalid="ignore", divide="ignore"):
        rising = np.where((j >= left) & (j <= center), (j - left) / (center - left), 0.0)
        falling = np.where((j >= center) & (j < right), (right - j) / (right - center), 0.0)
    out = np.where(center == left, (j == center).astype(np.float64), rising)
    out = np.where((right > center) & (j >= center) & (j < right), falling, out)
    return [out.astype(output_dtype(node.attrs, node.describe()))]
