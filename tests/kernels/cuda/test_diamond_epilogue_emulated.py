"""Epilogue bodies that read a value more than once (SiLU exported as Mul(x, Sigmoid(x)), then a
residual Add; HardSwish as x * Clip(x + 3, 0, 6) / 6), as fuse_bias_activation now makes them:
the cuda epilogue generator (gemm/epilogue.py, through pointwise_expr.emit_expression) binds each
body name once, so a step may read any earlier value. Checked on conv_depthwise.cu under host
emulation (g++, block_emulation.py) against the float64 reference -- the per-element and the
8-wide vector epilogue paths -- and compiled with NVRTC on the conv_nhwc / gemm kernels."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.gemm.epilogue import kernel_source
from tests.kernels.cuda.test_conv_depthwise import EPI_CASES, F16, P8, TOL
from tests.kernels.cuda.test_conv_depthwise_emulated import launcher, run_emulated  # noqa: F401 (fixture)

SILU_RESIDUAL = {"input": "raw", "body": [
    {"op": "Sigmoid", "inputs": ["raw"], "outputs": ["s"], "attrs": {}},
    {"op": "Mul", "inputs": ["raw", "s"], "outputs": ["t"], "attrs": {}},
    {"op": "Add", "inputs": ["t", "skip"], "outputs": ["Y"], "attrs": {}}]}
HARDSWISH = {"input": "raw", "body": [
    {"op": "Add", "inputs": ["raw", "three"], "outputs": ["a"], "attrs": {}},
    {"op": "Clip", "inputs": ["a", "zero", "six"], "outputs": ["c"], "attrs": {}},
    {"op": "Mul", "inputs": ["c", "raw"], "outputs": ["p"], "attrs": {}},
    {"op": "Div", "inputs": ["p", "six"], "outputs": ["Y"], "attrs": {}}]}


@pytest.mark.parametrize("case", [0, 2])
def test_emulated_silu_diamond_then_residual(launcher, case):  # noqa: F811
    """A full residual (the 8-wide epilogue) and a broadcast one (per element, strided)."""
    x, w, attrs, skip = EPI_CASES[case]
    assert run_emulated(launcher, P8, x, w, attrs, F16, epilogue=SILU_RESIDUAL, extra={"skip": skip}) <= TOL[F16]


def test_emulated_hardswish_shaped_diamond_with_scalar_inputs(launcher):  # noqa: F811
    """HardSwish's shape; run_emulated draws the one-element inputs at random (kernel and reference
    read the same values), so this checks the generated arithmetic, not HardSwish's constants."""
    x, w, attrs, _ = EPI_CASES[0]
    extra = {"three": (1,), "zero": (1,), "six": (1,)}
    assert run_emulated(launcher, P8, x, w, attrs, F16, epilogue=HARDSWISH, extra=extra) <= TOL[F16]


def test_diamond_epilogues_compile_with_nvrtc():
    units = []
    for epi, extras in ((SILU_RESIDUAL, ("skip",)), (HARDSWISH, ("three", "zero", "six"))):
        for kind, file, kernel, base in (("ConvNHWC", "conv_nhwc.cu", "conv_nhwc_igemm_mma", ("x", "w", "")),
                                         ("Gemm", "gemm.cu", "gemm_mma", ("a", "b", "c"))):
            layer = LayerDesc("epi", kind, base + extras, ("Y",), {"epilogue": epi}, domain=POLYKIT_DOMAIN)
            units.append(kernel_source(layer, kernel, file, "half_t"))
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    assert check_all(units, "sm_80") == len(units)
