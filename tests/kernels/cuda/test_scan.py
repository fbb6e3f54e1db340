"""CumSum tactic: host geometry, and on the GPU every axis / mode against the reference (outputs poisoned)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.reduce import scan

rng = np.random.default_rng(41)


def cumsum_layer(**attrs):
    return LayerDesc("cumsum", "CumSum", ("X", "axis"), ("Y",), dict(attrs))


def check(layer, inputs, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, **(tol or {"rtol": 1e-5, "atol": 1e-4}))


def test_scan_grid_covers_a_row_per_block_and_is_capped():
    assert scan.scan_grid(1) == 1
    assert scan.scan_grid(64 * 300) == 300
    assert scan.scan_grid(10 ** 9) == scan.MAX_GRID


def test_cumsum_declares_one_kernel_per_dtype_in_one_module():
    names = {k.name for k in scan._kernels(cumsum_layer())}
    assert names == {f"cumsum_{c}" for c in scan.DTYPES}
    assert len({k.key() for k in scan.compile_variants()}) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 1000), 1), ((3, 1000), -1), ((5, 37, 3), 1), ((4, 6, 9), 0),
                                        ((2, 300), 0), ((1, 1), 1), ((2, 3, 5, 70), 3)])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_float32_matches_reference(shape, axis, exclusive, reverse):
    x = rng.standard_normal(shape).astype(np.float32)
    check(cumsum_layer(exclusive=exclusive, reverse=reverse), {"X": x, "axis": np.array(axis, np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64])
def test_cumsum_integers_are_exact(dtype):
    x = rng.integers(1, 100, size=(3, 513)).astype(dtype)
    check(cumsum_layer(exclusive=1), {"X": x, "axis": np.array([1], np.int32)}, rtol=0, atol=0)


@pytest.mark.gpu
def test_cumsum_float64_and_float16_rows():
    x = rng.standard_normal((4, 777))
    check(cumsum_layer(reverse=1), {"X": x, "axis": np.array(-1, np.int64)}, rtol=1e-12, atol=1e-12)
    check(cumsum_layer(), {"X": x.astype(np.float16)[:, :100], "axis": np.array(1, np.int64)}, rel=2e-3)


@pytest.mark.gpu
def test_cumsum_long_row_is_deterministic():
    from polykit.runtime.cuda.harness import run_layer

    inputs = {"X": rng.standard_normal((2, 100_003)).astype(np.float32), "axis": np.array(1, np.int64)}
    first = run_layer(cumsum_layer(), inputs)["Y"]
    np.testing.assert_array_equal(first, run_layer(cumsum_layer(), inputs)["Y"])
    check(cumsum_layer(), inputs, rel=1e-5)


def cumprod_layer(**attrs):
    return LayerDesc("cumprod", "CumProd", ("X", "axis"), ("Y",), dict(attrs))


def test_cumprod_kernels_share_the_scan_module():
    names = {k.name for k in scan.compile_variants()}
    assert {f"cumprod_{c}" for c in scan.DTYPES} <= names
    assert {k.name for k in scan._kernels(cumprod_layer())} == {f"cumprod_{c}" for c in scan.DTYPES}


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 700), 1), ((5, 37, 3), 1), ((2, 300), 0)])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_float32_matches_reference(shape, axis, exclusive, reverse):
    # factors near 1 keep long products finite; the row path multiplies in a tree order
    x = rng.uniform(0.99, 1.01, shape).astype(np.float32)
    check(cumprod_layer(exclusive=exclusive, reverse=reverse), {"X": x, "axis": np.array(axis, np.int64)}, rel=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_cumprod_integers_wrap_exactly(dtype):
    x = rng.choice(np.array([-3, -2, -1, 1, 2, 3]), size=(3, 200)).astype(dtype)  # no zero: the products wrap
    check(cumprod_layer(exclusive=1, reverse=1), {"X": x, "axis": np.array(1, np.int64)}, rtol=0, atol=0)
