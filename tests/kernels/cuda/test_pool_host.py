"""Host side of the pooling tactics (no GPU): which storage types each pool kind takes."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.conv.pool import _supports_window, _window_kernels, window_elem


@pytest.mark.parametrize("dtype,elem", [(np.uint8, "u8"), (np.int8, "i8"), (np.float16, "half_t")])
def test_max_pool_takes_8bit_integer_and_half_storage(dtype, elem):
    assert window_elem("MaxPool", DeviceTensor(0, (1, 1, 4, 4), np.dtype(dtype)), "here") == elem


def test_average_pool_rejects_uint8_with_a_device_error():
    with pytest.raises(DeviceError, match="uint8"):
        window_elem("AveragePool", DeviceTensor(0, (1, 1, 4, 4), np.dtype(np.uint8)), "here")


def test_max_pool_layer_declares_its_8bit_kernels_for_the_plan():
    layer = LayerDesc("p", "MaxPool", ("X",), ("Y",), {"kernel_shape": [2, 2]})
    elems = {dict(k.defines)["ELEM"] for k in _window_kernels(layer)}
    assert {"u8", "i8", "float", "half_t"} <= elems


def test_max_pool_with_column_major_indices_has_a_window_tactic():
    layer = LayerDesc("p", "MaxPool", ("X",), ("Y", "I"), {"kernel_shape": [2, 2], "storage_order": 1})
    assert _supports_window(layer)
