"""Distances in units of the last place of a 16-bit float type: what kernel tests of 16-bit
outputs bound where the device's float math (expf, logf) and numpy's may differ by an ulp of
float next to a 16-bit rounding boundary."""

from __future__ import annotations

import numpy as np

#: explicit significand bits of each 16-bit float type, by numpy dtype name
MANTISSA_BITS = {"float16": 10, "bfloat16": 7}


def ulps_apart(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the last place of want's 16-bit type at `want`."""
    bits = MANTISSA_BITS[np.asarray(want).dtype.name]
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(w), 1e-30))) - bits)
    return np.abs(g - w) / ulp


def bit_mismatches(got: np.ndarray, want: np.ndarray) -> str:
    """'' when got and want (one 16-bit dtype) hold the same bits, else how many differ and the first."""
    assert got.dtype == want.dtype and got.shape == want.shape, f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    differ = got.view(np.uint16) != want.view(np.uint16)
    if not differ.any():
        return ""
    at = tuple(int(i) for i in np.argwhere(differ)[0])
    return f"{int(differ.sum())} of {differ.size} elements differ, first at {at}: {got[at]} vs {want[at]}"
