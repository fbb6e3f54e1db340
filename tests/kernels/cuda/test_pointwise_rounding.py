"""CI (no GPU): the generated code's float / double Mul and Add round on their own. NVRTC contracts a plain
`a * b + c` into one fma by default (--fmad=true), one rounding fewer than ONNX's Mul then Add and the cpu reference:
it moved an INT8 layer's requantized output by one step at a near-tie (test_int8.py's 8-bit residual, H100,
2026-12-08). pointwise.cuh's pk_mul / pk_add / pk_sub (what epilogue.py and pointwise.py emit for Mul, Add, Sub) are
__fmul_rn / __fadd_rn / __fsub_rn on the device, which NVVM never fuses: the PTX NVRTC makes of them holds mul.rn /
add.rn / sub.rn and no fma."""

from __future__ import annotations

import pytest

from polykit.kernels.cuda.base import KernelSource
from tests.kernels.cuda.test_sm90_wgmma_pipeline import ptx_of

CHAIN = r"""
#include "pointwise.cuh"
extern "C" __global__ void chain(const ELEMT* a, const ELEMT* b, const ELEMT* c, ELEMT* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = pk_sub(pk_add(pk_mul(a[i], b[i]), c[i]), pk_mul(b[i], c[i]));  // Mul, Add, Mul, Sub
}
"""


@pytest.mark.parametrize("elem,suffix", [("float", "f32"), ("double", "f64")])
def test_generated_mul_add_sub_are_not_contracted_into_an_fma(elem, suffix):
    pytest.importorskip("cuda.bindings")
    ptx = ptx_of(KernelSource("chain", code=CHAIN, defines=(("ELEMT", elem),)), "chain.cu")
    body = ptx.split(".entry chain", 1)[1]
    assert f"fma.rn.{suffix}" not in body, body
    assert body.count(f"mul.rn.{suffix}") == 2 and f"add.rn.{suffix}" in body and f"sub.rn.{suffix}" in body
