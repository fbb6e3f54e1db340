"""The cpu WeightOnlyMatMul tactic (cpu.weight_only.tiled) against the reference, and the packed
weight layout both read (polykit.compiler.ops.quant.weight_only)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ops.quant.weight_only import FP4_VALUES, pack_rows, padded_row_bytes, unpack_values, weight_codes
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import layer_as_node
from polykit.kernels.cpu.weight_only import TILE_ROWS, run_tiled
from tests.kernels.weight_only_cases import BF16, random_layer


@pytest.mark.parametrize("weight_type", ["int4", "uint4", "float4_e2m1fn", "int8", "uint8"])
@pytest.mark.parametrize("k", [1, 31, 32, 33, 100])
def test_packed_rows_unpack_to_the_values_they_hold(weight_type, k):
    rng = np.random.default_rng(k)
    dtype = np.dtype(getattr(ml_dtypes, weight_type, None) or weight_type)
    if weight_type == "float4_e2m1fn":
        values = rng.choice(FP4_VALUES, (5, k)).astype(dtype)
    else:
        info = ml_dtypes.iinfo(dtype)
        values = rng.integers(int(info.min), int(info.max) + 1, (5, k)).astype(dtype)
    bits = 8 if weight_type in ("int8", "uint8") else 4
    packed = pack_rows(weight_codes(values), bits)
    assert packed.shape == (5, padded_row_bytes(k, bits)) and packed.shape[1] % 16 == 0
    np.testing.assert_array_equal(unpack_values(packed, k, weight_type), values.astype(np.float32))


def test_two_int4_values_share_a_byte_low_nibble_first():
    values = np.array([[1, -2, 7]], ml_dtypes.int4)
    packed = pack_rows(weight_codes(values), 4)
    assert packed[0, :2].tolist() == [0x01 | (0x0E << 4), 0x07] and not packed[0, 2:].any()


@pytest.mark.parametrize("x_shape,n,weight_type,block,dtype", [
    ((3, 100), TILE_ROWS + 44, "int4", 7, np.float32),
    ((2, 5, 64), 2 * TILE_ROWS, "float4_e2m1fn", 32, np.float32),
    ((4, 48), TILE_ROWS + 1, "uint8", None, np.float16),
    ((2, 40), 300, "uint4", 16, BF16),
])
def test_the_tiled_tactic_equals_the_reference(x_shape, n, weight_type, block, dtype):
    layer, inputs = random_layer(x_shape, n, weight_type, block, dtype=dtype)
    node = layer_as_node(layer)
    args = [inputs.get(name) if name else None for name in layer.inputs]
    want = run_reference(node, args)[0]
    got = run_tiled(node, args)[0]
    assert got.dtype == want.dtype and got.shape == x_shape[:-1] + (n,)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-6)
