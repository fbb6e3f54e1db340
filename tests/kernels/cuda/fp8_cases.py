"""What the FP8 sm90 tactics' enqueue tests share (test_fp8_gemm_sm90.py, test_fp8_conv_sm90.py): stand-in device
tensors for a layer's inputs and its e4m3 output, and the one launch a tactic records for them (no GPU)."""

from __future__ import annotations

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic

from ...compiler.fp8_models import E4M3
from .recording_launcher import RecordingLauncher


def device_tensors(inputs: dict[str, np.ndarray], y_shape: tuple[int, ...]) -> dict[str, DeviceTensor]:
    """A DeviceTensor for each of `inputs` (at 0x10000, 0x20000, ... in their order, their shapes and dtypes) and an
    e4m3 output Y of `y_shape` at 0x900000."""
    tensors = {name: DeviceTensor(0x10000 * (i + 1), np.asarray(a).shape, np.asarray(a).dtype)
               for i, (name, a) in enumerate(inputs.items())}
    tensors["Y"] = DeviceTensor(0x900000, y_shape, np.dtype(E4M3))
    return tensors


def recorded_launch(name: str, layer, tensors: dict[str, DeviceTensor]) -> tuple[str, list]:
    """(kernel, args) of the one launch the QConvNHWC tactic `name` enqueues for `layer` on `tensors` (a recording
    launcher of 132 SMs); more or fewer launches fail the unpacking."""
    launcher = RecordingLauncher(sm_count=132)
    find_tactic("cuda", "QConvNHWC", name).enqueue(layer, launcher, tensors)
    ((kernel, args),) = launcher.launches
    return kernel, args
