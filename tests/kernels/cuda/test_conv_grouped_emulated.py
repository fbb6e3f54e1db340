"""conv_grouped.cu emulated on the host (no GPU): each layer's real enqueue launches the kernel's own
source, compiled by g++, every thread of a block a real thread meeting at __syncthreads
(block_emulation.py); outputs poisoned (NaN), compared with the float64 reference. A sample of
test_conv_grouped.py's GPU cases: each channels-a-thread count, both tactics, the three storage
types, the element and 16-byte staging, strides, dilation and the epilogue paths."""

from __future__ import annotations

import pytest

from tests.kernels.cuda.test_conv_depthwise import BF16, F16, F32, RESIDUAL_RELU, TOL
from tests.kernels.cuda.test_conv_depthwise_emulated import run_emulated
from tests.kernels.cuda.test_conv_grouped import CASES, EPI_CASES, P2, P4


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    from tests.kernels.cuda.block_emulation import host_launcher

    return host_launcher(tmp_path_factory, "GC_PARAMS", "GC_ARGS")


@pytest.mark.parametrize("case,dtype,tactic", [
    (0, F16, P4),    # cpg 2: zero quad tails, 2 channels a thread
    (1, F32, P2),    # cpg 3, 12 channels: element staging, 1 channel a thread, stride 2
    (3, BF16, P4),   # cpg 8: 16-byte staging, stride 2
    (4, F16, P2),    # 5 x 5, cpg 12, asymmetric pads
    (6, F32, P4),    # 1 x 1, cpg 24 in float: two 16-byte loads a chunk
    (8, F16, P4),    # dilation 2
    (10, F16, P2),   # 2 outputs a group, W stride 2
])
def test_emulated_grouped_matches_the_reference(launcher, case, dtype, tactic):
    x, w, group, attrs = CASES[case]
    assert run_emulated(launcher, tactic, x, w, attrs, dtype, group=group) <= TOL[dtype]


@pytest.mark.parametrize("case", [0, 2, 3])
def test_emulated_residual_relu_epilogue(launcher, case):
    """A full residual with 8 channels a thread (16-byte epilogue loads), a broadcast one
    (strided), one with 4 channels a thread (per element)."""
    x, w, group, attrs, skip = EPI_CASES[case]
    assert run_emulated(launcher, P4, x, w, attrs, F16, group=group, epilogue=RESIDUAL_RELU,
                        extra={"skip": skip}) <= TOL[F16]


def test_emulated_misaligned_output_takes_the_element_stores(launcher):
    x, w, group, attrs, skip = EPI_CASES[0]
    assert run_emulated(launcher, P2, x, w, attrs, F16, shift_y=1, group=group, epilogue=RESIDUAL_RELU,
                        extra={"skip": skip}) <= TOL[F16]
