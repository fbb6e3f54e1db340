"""Trilu tactic: every element width, both triangles, offsets k, against the reference (outputs poisoned)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.movement import trilu

rng = np.random.default_rng(43)


def check(layer, inputs):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, rtol=0, atol=0)


def test_trilu_declares_one_kernel_per_element_width():
    assert {k.name for k in trilu.compile_variants()} == {"trilu_b1", "trilu_b2", "trilu_b4", "trilu_b8"}


@pytest.mark.gpu
@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -3, 40, -40])
@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 9, 4), (1, 1)])
def test_trilu_float32_matches_reference(upper, k, shape):
    inputs = {"X": rng.standard_normal(shape).astype(np.float32)}
    names = ("X",)
    if k is not None:
        inputs["k"] = np.array(k, np.int64)
        names = ("X", "k")
    check(LayerDesc("trilu", "Trilu", names, ("Y",), {"upper": upper}), inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64, np.bool_])
def test_trilu_moves_every_dtype_bit_exactly(dtype):
    x = (rng.integers(1, 100, size=(3, 6, 5)) % 2 == 1) if dtype is np.bool_ else \
        rng.integers(1, 100, size=(3, 6, 5)).astype(dtype)
    check(LayerDesc("trilu", "Trilu", ("X", "k"), ("Y",), {"upper": 0}), {"X": x, "k": np.array(1, np.int64)})
