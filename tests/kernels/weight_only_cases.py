"""Random WeightOnlyMatMul layers (polykit.compiler.ops.quant.weight_only) for the kernel tests."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.dtypes import EXTENDED_TYPES
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.weight_only import KIND, WEIGHT_TYPES, pack_rows
from polykit.compiler.plan.records import LayerDesc

BF16 = EXTENDED_TYPES[16]
#: integer weight type -> code range drawn from (float4: every code but -0)
CODES = {"int4": (-8, 8), "uint4": (0, 16), "int8": (-128, 128), "uint8": (0, 256)}


def random_layer(x_shape, n, weight_type, block, dtype=np.float32, zero_point=True, bias=True, seed=0):
    """(layer, inputs) of a WeightOnlyMatMul with random codes, scales, zero points, bias and X."""
    rng = np.random.default_rng(seed)
    k = x_shape[-1]
    block = block or k
    blocks = -(-k // block)
    if weight_type == "float4_e2m1fn":
        codes = rng.choice([c for c in range(16) if c != 8], (n, k)).astype(np.uint8)
        zero = None
    else:
        low, high = CODES[weight_type]
        codes = rng.integers(low, high, (n, k)).astype(np.int16).astype(np.uint8)
        if WEIGHT_TYPES[weight_type] == 4:
            codes &= 0x0F
        zero = rng.integers(low, high, (n, blocks)).astype(np.int8 if low < 0 else np.uint8) if zero_point else None
    dtype = np.dtype(dtype)
    inputs = {"X": rng.standard_normal(x_shape).astype(np.float32).astype(dtype),
              "W": pack_rows(codes, WEIGHT_TYPES[weight_type]),
              "S": rng.uniform(0.002, 0.02, (n, blocks)).astype(np.float32).astype(dtype)}
    if zero is not None:
        inputs["Z"] = zero
    if bias:
        inputs["B"] = rng.standard_normal(n).astype(np.float32).astype(dtype)
    names = tuple(name if name in inputs else "" for name in ("X", "W", "S", "Z", "B"))
    layer = LayerDesc("wo", KIND, names, ("Y",), {"weight_type": weight_type, "block_size": block, "K": k},
                      domain=POLYKIT_DOMAIN)
    return layer, inputs
