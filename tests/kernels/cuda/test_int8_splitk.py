"""Split-K INT8 QMatMul (`cuda.int8.mma_matmul_sk*`, int8_splitk.py): the K slices, the tactics, and
(GPU) exact equality with the cpu reference, outputs poisoned first."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polykit.kernels.cuda.int8 import int8_splitk
from polykit.kernels.cuda.int8.int8 import supports
from polykit.kernels.tactics import find_tactic

from .test_int8 import DTYPES, check, layer_of, params, q, stamped

TACTICS = [f"cuda.int8.mma_matmul_sk{s}" for s in int8_splitk.SPLITS]


@given(k=st.integers(1, 1 << 15), splits=st.sampled_from(int8_splitk.SPLITS))
def test_the_slices_cover_k_in_whole_64_byte_steps(k, splits):
    kslice, slices = int8_splitk.slicing(k, splits)
    assert kslice % 64 == 0 and 1 <= slices <= splits
    assert (slices - 1) * kslice < k <= slices * kslice  # every slice has work, the last may be short


def test_each_split_tactic_takes_what_the_unsplit_one_takes_below_its_priority():
    inputs = {"X": q((32, 2048), np.int8), "W": q((2048, 1000), np.int8), **params(1000, np.int8, np.int8, True, None)}
    layer = stamped(layer_of("QMatMul", inputs), inputs)
    unsplit = find_tactic("cuda", "QMatMul", "cuda.int8.mma_matmul")
    for name in TACTICS:
        tactic = find_tactic("cuda", "QMatMul", name)
        assert tactic.supports(layer) and supports(layer) and tactic.priority < unsplit.priority


# (X shape, K, N): the ResNet-50 fc at bs32; K not a multiple of 64 or 16; fewer K steps than slices
CASES = [((32, 2048), 2048, 1000), ((3, 5, 1000), 1000, 130), ((7, 100), 100, 33)]


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize("x_dtype,w_dtype", DTYPES)
@pytest.mark.parametrize("x,k,n", CASES)
def test_split_k_qmatmul_equals_the_reference(x, k, n, x_dtype, w_dtype, tactic):
    """uint8 and asymmetric operands: each slice's zero-point corrections must add up to the whole's."""
    inputs = {"X": q(x, x_dtype), "W": q((k, n), w_dtype), **params(n, x_dtype, w_dtype, True, None)}
    check(stamped(layer_of("QMatMul", inputs), inputs), inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("y_dtype", [np.int8, np.uint8])
def test_split_k_qmatmul_requantizes_as_the_reference(y_dtype):
    inputs = {"X": q((32, 2048), np.int8), "W": q((2048, 1000), np.int8),
              **params(1000, np.int8, np.int8, False, y_dtype)}
    check(stamped(layer_of("QMatMul", inputs), inputs), inputs, TACTICS[1])


def test_each_int8_tactic_compiles_its_own_entry_point_alone():
    """int8.cu's INT8_ENTRIES (int8.entries): a QMatMul's unit holds int8_matmul alone, the split-K tactic's two kernels
    one unit with the pair, a QConvNHWC's int8_conv_nhwc alone (PTX entries), where each had compiled all five."""
    import re

    pytest.importorskip("cuda.bindings")
    from polykit.runtime.cuda.nvrtc import unique_units

    from .test_int8 import conv_inputs
    from .test_sm90_wgmma_pipeline import ptx_of

    inputs = {"X": q((32, 256), np.int8), "W": q((256, 100), np.int8), **params(100, np.int8, np.int8, True, None)}
    matmul = stamped(layer_of("QMatMul", inputs), inputs)
    nhwc_inputs = conv_inputs((1, 6, 6, 32), (24, 3, 3, 32), np.int8, np.int8, True)
    nhwc = stamped(layer_of("QConvNHWC", nhwc_inputs, {"pads": [1, 1, 1, 1]}), nhwc_inputs)
    for kind, layer, tactic, want in (("QMatMul", matmul, "cuda.int8.mma_matmul", ["int8_matmul"]),
                                      ("QMatMul", matmul, TACTICS[0], ["int8_matmul_splitk", "int8_splitk_reduce"]),
                                      ("QConvNHWC", nhwc, "cuda.int8.mma_conv_nhwc", ["int8_conv_nhwc"])):
        (unit,) = unique_units(find_tactic("cuda", kind, tactic).kernels(layer))
        assert sorted(re.findall(r"\.entry (\w+)", ptx_of(unit, "int8.cu"))) == want, tactic
