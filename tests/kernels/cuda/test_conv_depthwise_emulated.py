"""conv_depthwise.cu emulated on the host (no GPU): each layer's real enqueue launches the kernel's
own source, compiled by g++, every thread of a block a real thread meeting at __syncthreads
(block_emulation.py); outputs poisoned (NaN), compared with the float64 reference. A sample of
test_conv_depthwise.py's GPU cases: each compile-time width the sample reaches, the run-time
variant, both tactics, the three storage types, tails, multipliers and the epilogue paths."""

from __future__ import annotations


import numpy as np
import pytest

from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic
from tests.kernels.cuda.block_emulation import host_launcher
from tests.kernels.cuda.test_conv_depthwise import (BF16, CASES, EPI_CASES, F16, F32, P4, P8, RESIDUAL_RELU, SILU,
                                                    SMALL_CASES, TOL, depthwise_layer, reference, rel_err)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    return host_launcher(tmp_path_factory, "DW_PARAMS", "DW_ARGS")


def run_emulated(launcher, tactic, x, w, attrs, dtype, shift_y=0, shift_w=0, **kw):
    """The layer's error against the reference, its output poisoned; `shift_y` / `shift_w` elements
    off the 16-byte alignment of Y / W."""
    layer, inputs, specs = depthwise_layer(x, w, attrs, dtype, **kw)
    shape, dt = specs["Y"]
    n = int(np.prod(shape))
    poisoned = np.full(n + 8, np.nan, dt)
    y = poisoned[shift_y:shift_y + n].reshape(shape)
    tensors = {name: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for name, a in inputs.items()}
    if shift_w:
        wbuf = np.empty(inputs["W"].size + 8, inputs["W"].dtype)  # numpy's buffer: 16-byte aligned
        moved = wbuf[shift_w:shift_w + inputs["W"].size].reshape(inputs["W"].shape)
        moved[...] = inputs["W"]
        tensors["W"] = DeviceTensor(moved.ctypes.data, moved.shape, moved.dtype)
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


@pytest.mark.parametrize("case,dtype,tactic", [
    (0, F16, P4),    # 12 x 12, the last channel slice past M: zero weights
    (1, F16, P8),    # 7 x 7 on 3 x 3: several batches of 16-byte weight chunks a thread
    (1, F32, P4),    # ... in float32: two 16-byte loads a chunk
    (1, BF16, P8),
    (2, F16, P4),    # 13 x 13: the run-time width, 169 taps
    (3, F16, P8),    # multiplier 2, M * KHW % 8 != 0: the run's last chunk element by element
])
def test_emulated_small_images_with_a_silu_epilogue(launcher, case, dtype, tactic):
    assert run_emulated(launcher, tactic, *SMALL_CASES[case], dtype, epilogue=SILU) <= TOL[dtype]


@pytest.mark.parametrize("case,shift", [(1, 1), (3, 3)])
def test_emulated_misaligned_weights_take_the_element_loads(launcher, case, shift):
    assert run_emulated(launcher, P4, *SMALL_CASES[case], F16, shift_w=shift) <= TOL[F16]


@pytest.mark.parametrize("case", [0, 2, 3])
def test_emulated_residual_relu_epilogue(launcher, case):
    """A full residual (16-byte epilogue loads), a broadcast one (strided), a tail one (per element)."""
    x, w, attrs, skip = EPI_CASES[case]
    assert run_emulated(launcher, P8, x, w, attrs, F16, epilogue=RESIDUAL_RELU, extra={"skip": skip}) <= TOL[F16]


def test_emulated_misaligned_output_takes_the_element_stores(launcher):
    x, w, attrs, skip = EPI_CASES[0]
    assert run_emulated(launcher, P8, x, w, attrs, F16, shift_y=1, epilogue=RESIDUAL_RELU,
                        extra={"skip": skip}) <= TOL[F16]


def run_emulated_placed(launcher, tactic, x, w, attrs, dtype, before, after, **kw):
    """The output placed in a Concat's slice (concat by placement): pixel rows of before + M + after
    elements, the layer's M channels `before` elements in; (error, whether the rest of each row kept
    its poison)."""
    layer, inputs, specs = depthwise_layer(x, w, attrs, dtype, **kw)
    shape, dt = specs["Y"]
    pixels, m = int(np.prod(shape[:-1])), shape[-1]
    ldy = before + m + after
    rows = np.full((pixels, ldy), np.nan, dt)  # numpy's buffer: 16-byte aligned
    tensors = {name: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for name, a in inputs.items()}
    tensors["Y"] = DeviceTensor(rows.ctypes.data + before * rows.itemsize, shape, np.dtype(dt), ldy)
    t = find_tactic("cuda", "ConvNHWC", tactic)
    assert t.places(layer, m, ldy, before)
    t.enqueue(layer, launcher, tensors)
    got = np.ascontiguousarray(rows[:, before:before + m]).reshape(shape)
    untouched = np.isnan(rows[:, :before]).all() and np.isnan(rows[:, before + m:]).all()
    return rel_err(got, reference(layer, inputs)), untouched


@pytest.mark.parametrize("case,dtype,before,after", [
    (0, F16, 8, 16),   # 16-byte stores into rows 32 channels apart
    (3, F16, 3, 5),    # 13 channels 21 apart: element stores
    (2, F32, 4, 4),    # float32, rows 104 apart, the slice 16 bytes in
    (0, F16, 3, 5),    # an aligned M in a misaligned slice: element stores
])
def test_emulated_depthwise_writes_its_rows_of_a_concat_output(launcher, case, dtype, before, after):
    err, untouched = run_emulated_placed(launcher, P8, *CASES[case], dtype, before, after)
    assert err <= TOL[dtype] and untouched


def test_emulated_placed_output_reads_its_residual_at_the_dense_index(launcher):
    x, w, attrs, skip = EPI_CASES[0]
    err, untouched = run_emulated_placed(launcher, P8, x, w, attrs, F16, 16, 8, epilogue=RESIDUAL_RELU,
                                         extra={"skip": skip})
    assert err <= TOL[F16] and untouched
