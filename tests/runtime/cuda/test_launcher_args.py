"""Kernel-argument packing rules of the cuda Launcher (no GPU needed)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.runtime.cuda.launcher import pack_arg


def test_device_tensor_is_passed_as_its_pointer():
    v = pack_arg(DeviceTensor(0xDEAD00, (3,), np.dtype(np.float32)))
    assert isinstance(v, ctypes.c_uint64) and v.value == 0xDEAD00


def test_python_int_is_int64_and_float_is_float32():
    assert isinstance(pack_arg(-5), ctypes.c_int64) and pack_arg(-5).value == -5
    assert isinstance(pack_arg(0.5), ctypes.c_float)


def test_numpy_scalars_keep_their_type():
    assert isinstance(pack_arg(np.int32(7)), ctypes.c_int32)
    assert isinstance(pack_arg(np.float64(1.5)), ctypes.c_double)
    half = pack_arg(np.float16(1.0))
    assert isinstance(half, ctypes.c_uint16) and half.value == 0x3C00


def test_unsupported_argument_is_a_device_error():
    with pytest.raises(DeviceError):
        pack_arg("a string")
