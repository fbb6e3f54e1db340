"""ai.polykit PermutedCopy on the GPU against the reference (the cases the host emulation runs too)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.cuda.permuted_copy_cases import CASES, DTYPES, layer_and_input


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_permuted_copy(case, dtype):
    from polykit.runtime.cuda.harness import assert_matches_reference

    layer, x = layer_and_input(case, dtype)
    assert_matches_reference(layer, {"X": x}, tactic="cuda.movement.permuted_copy", rtol=0, atol=0)


@pytest.mark.gpu
def test_a_wide_channel_window_merge_takes_the_16_byte_path():
    from polykit.runtime.cuda.harness import assert_matches_reference

    layer, x = layer_and_input("window_merge", np.float16)
    x = np.ascontiguousarray(np.repeat(x, 16, axis=-1))  # C = 96 halves, Swin-T's first stage
    layer = type(layer)(layer.name, layer.kind, layer.inputs, layer.outputs,
                        dict(layer.attrs, view=[1, 2, 3, 7, 7, 96], shape=[1, 14, 21, 96]), domain=layer.domain)
    assert_matches_reference(layer, {"X": x}, tactic="cuda.movement.permuted_copy", rtol=0, atol=0)
