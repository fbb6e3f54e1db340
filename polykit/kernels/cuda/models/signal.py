"""Signal tactics (signal.cu): DFT, STFT, the window functions and MelWeightMatrix.

Direct transforms (O(N^2) per output row, double accumulation): correct for every length,
no workspace; sizes held in input tensors are read on the device (plans keep no host copy).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ops.math.signal import WINDOW_COEFFS, WINDOW_OPS
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, storage_code, stored_as
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for
from polykit.kernels.cuda.storage_types import CODE, dtype_names

FILE = "signal.cu"
DTYPES = ("f32", "f16", "f64")
STORED = dtype_names(DTYPES)
MAXR = 8
#: dtype of a scalar input -> its code in signal.cu's scalar()
SCALAR_CODES = {"int32": 0, "int64": 1, "float32": 2, "float64": 3, "float16": 4}


def _where(layer) -> str:
    return f"layer {layer.name!r}"


def _code(layer, t: DeviceTensor) -> str:
    return storage_code(layer, t, CODE, DTYPES)


def _optional(layer, tensors: Mapping[str, DeviceTensor], i: int) -> DeviceTensor | None:
    return tensors[layer.inputs[i]] if len(layer.inputs) > i and layer.inputs[i] else None


def _scalar(layer, t: DeviceTensor | None, what: str) -> tuple[int, np.int32]:
    """(pointer, scalar code) of a one-value input (0 and code 0 when absent)."""
    if t is None:
        return 0, np.int32(0)
    if t.dtype.name not in SCALAR_CODES or t.size != 1:
        raise DeviceError(f"{layer.kind} {what} must be one value of {sorted(SCALAR_CODES)}, got {t.dtype} of shape "
                          f"{t.shape}", where=_where(layer))
    return t.ptr, np.int32(SCALAR_CODES[t.dtype.name])


def _kernels(prefix: str):
    return lambda layer: [KernelSource(f"{prefix}_{c}", FILE) for c in DTYPES]


def enqueue_dft(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    code = _code(layer, x)
    if len(x.shape) > MAXR:
        raise DeviceError(f"DFT of a rank-{len(x.shape)} tensor (at most {MAXR})", where=_where(layer),
                          hint="use --target cpu")
    axis = _optional(layer, tensors, 2)
    if axis is None:
        raise DeviceError("DFT without an axis input", where=_where(layer),
                          hint="the importer gives every DFT an axis input; rebuild the plan")
    n = y.size // y.shape[-1]
    if n == 0:
        return
    dims = list(x.shape) + [1] * (MAXR - len(x.shape))
    args = [x, y, np.int32(len(x.shape)), *dims, *_scalar(layer, axis, "axis"),
            *_scalar(layer, _optional(layer, tensors, 1), "dft_length"), np.int32(x.shape[-1] == 2),
            np.int32(bool(layer.attrs.get("inverse", 0))), np.int32(bool(layer.attrs.get("onesided", 0))), n]
    launcher.launch(KernelSource(f"dft_{code}", FILE), grid_for(n), (BLOCK, 1, 1), args)


def enqueue_stft(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    code = _code(layer, x)
    window, length = _optional(layer, tensors, 2), _optional(layer, tensors, 3)
    if window is not None and window.dtype != x.dtype:
        raise DeviceError(f"STFT window of dtype {window.dtype} for a {x.dtype} signal", where=_where(layer))
    batch, n_frames, bins, _ = y.shape
    if y.size == 0:
        return
    host_length = window.shape[0] if window is not None else (-1 if length is not None else x.shape[1])
    args = [x, y, window.ptr if window is not None else 0, *_scalar(layer, length, "frame_length"), host_length,
            *_scalar(layer, tensors[layer.inputs[1]], "frame_step"), batch, x.shape[1], np.int32(x.shape[-1] == 2),
            n_frames, bins]
    launcher.launch(KernelSource(f"stft_{code}", FILE), grid_for(y.size // 2), (BLOCK, 1, 1), args)


def enqueue_window(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    y = tensors[layer.outputs[0]]
    code = _code(layer, y)
    size = y.size
    if size == 0:
        return
    a0, a1, a2 = WINDOW_COEFFS[layer.kind]
    denom = float(size if layer.attrs.get("periodic", 1) else size - 1)
    launcher.launch(KernelSource(f"window_{code}", FILE), grid_for(size), (BLOCK, 1, 1),
                    [y, size, np.float64(a0), np.float64(a1), np.float64(a2), np.float64(denom)])


def enqueue_mel(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    y = tensors[layer.outputs[0]]
    code = _code(layer, y)
    if y.size == 0:
        return
    names = ("dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    scalars = [v for i, what in enumerate(names, start=1) for v in _scalar(layer, tensors[layer.inputs[i]], what)]
    launcher.launch(KernelSource(f"mel_{code}", FILE), grid_for(y.size), (BLOCK, 1, 1), [y, *y.shape, *scalars])


def _output_stored(layer) -> bool:
    """Windows and MelWeightMatrix: the output_datatype has a kernel (default float32)."""
    from polykit.compiler.ir import dtypes

    return dtypes.ONNX_TO_NUMPY.get(int(layer.attrs.get("output_datatype", 1)), np.dtype(object)).name in STORED


cuda_tactic("DFT", "cuda.signal.dft", kernels=_kernels("dft"), supports=stored_as(*STORED))(enqueue_dft)
cuda_tactic("STFT", "cuda.signal.stft", kernels=_kernels("stft"), supports=stored_as(*STORED))(enqueue_stft)
for _op in WINDOW_OPS:
    cuda_tactic(_op, "cuda.signal.window", kernels=_kernels("window"), supports=_output_stored)(enqueue_window)
cuda_tactic("MelWeightMatrix", "cuda.signal.mel", kernels=_kernels("mel"), supports=_output_stored)(enqueue_mel)


def compile_variants() -> list[KernelSource]:
    """The one signal.cu module (every kernel is an entry point in it)."""
    return _kernels("dft")(None)
