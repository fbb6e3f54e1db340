"""conv_depthwise.cu emulated on the host (no GPU): each layer's real enqueue launches the kernel's
own source, compiled by g++, every thread of a block a real thread meeting at __syncthreads
(block_emulation.py); outputs poisoned (NaN), compared with the float64 reference. A sample of
test_conv_depthwise.py's GPU cases: each compile-time width the sample reaches, the run-time
variant, both tactics, the three storage types, tails, multipliers and the epilogue paths."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic
from tests.kernels.cuda.block_emulation import EmulatedLauncher
from tests.kernels.cuda.test_conv_depthwise import (BF16, CASES, EPI_CASES, F16, F32, P4, P8, RESIDUAL_RELU, TOL,
                                                    depthwise_layer, reference, rel_err)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    return EmulatedLauncher(tmp_path_factory.mktemp("depthwise_emulated"), cxx, "DW_PARAMS", "DW_ARGS")


def run_emulated(launcher, tactic, x, w, attrs, dtype, shift_y=0, **kw):
    layer, inputs, specs = depthwise_layer(x, w, attrs, dtype, **kw)
    shape, dt = specs["Y"]
    n = int(np.prod(shape))
    poisoned = np.full(n + 8, np.nan, dt)
    y = poisoned[shift_y:shift_y + n].reshape(shape)
    tensors = {name: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for name, a in inputs.items()}
    tensors["Y"] = DeviceTensor(y.ctypes.data, shape, np.dtype(dt))
    t = find_tactic("cuda", "ConvNHWC", tactic)
    assert t.supports(layer)
    t.enqueue(layer, launcher, tensors)
    return rel_err(y, reference(layer, inputs))


@pytest.mark.parametrize("case,dtype,tactic", [
    (0, F16, P8),    # 3 x 3, stride 1
    (1, F16, P8),    # 5 x 5, stride 2, asymmetric pads, batch 3
    (2, F32, P8),    # 7 x 7 in float32: two 16-byte planes a vector
    (2, BF16, P4),   # 7 x 7 in bfloat16 on the p4 tactic
    (3, F16, P8),    # 13 channels: element staging and stores
    (5, F16, P4),    # tail channels and a channel multiplier
    (8, F16, P8),    # dilation 2: the run-time variant
])
def test_emulated_depthwise_matches_the_reference(launcher, case, dtype, tactic):
    assert run_emulated(launcher, tactic, *CASES[case], dtype) <= TOL[dtype]


@pytest.mark.parametrize("case", [0, 2, 3])
def test_emulated_residual_relu_epilogue(launcher, case):
    """A full residual (16-byte epilogue loads), a broadcast one (strided), a tail one (per element)."""
    x, w, attrs, skip = EPI_CASES[case]
    assert run_emulated(launcher, P8, x, w, attrs, F16, epilogue=RESIDUAL_RELU, extra={"skip": skip}) <= TOL[F16]


def test_emulated_misaligned_output_takes_the_element_stores(launcher):
    x, w, attrs, skip = EPI_CASES[0]
    assert run_emulated(launcher, P8, x, w, attrs, F16, shift_y=1, epilogue=RESIDUAL_RELU,
                        extra={"skip": skip}) <= TOL[F16]
