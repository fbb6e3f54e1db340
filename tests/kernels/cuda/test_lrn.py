"""LRN on the GPU against the reference (fp32/fp16/fp64, odd sizes and channel counts)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc

rng = np.random.default_rng(5)


def test_lrn_tactic_registered_for_plain_layers_only():
    from polykit.kernels.tactics import candidates

    assert candidates("cuda", "LRN", LayerDesc("l", "LRN", ("x",), ("y",), {"size": 3}))
    assert not candidates("cuda", "LRN", LayerDesc("l", "LRN", ("x",), ("y",), {"size": 3}, domain="custom"))


@pytest.mark.gpu
@pytest.mark.parametrize("shape,attrs", [((2, 7, 5, 5), {"size": 3}), ((1, 16, 9, 13), {"size": 5, "alpha": 1e-3, "beta": 0.6, "bias": 2.0}),
                                         ((3, 5, 11), {"size": 4}), ((2, 3), {"size": 7})])
@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-5), (np.float64, 1e-12), (np.float16, 2e-3)])
def test_lrn_matches_reference(shape, attrs, dtype, rtol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    x = (rng.standard_normal(shape) * 3).astype(dtype)
    assert_matches_reference(LayerDesc("l", "LRN", ("x",), ("y",), attrs), {"x": x}, rtol=rtol, atol=rtol)
