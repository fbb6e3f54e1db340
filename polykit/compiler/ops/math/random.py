"""Random ops: RandomUniform, RandomNormal, their *Like forms, Bernoulli -- shape rules and the
counter-based generator both targets share.

polykit's draws are a pure function of (key, element index): element i's k-th uniform is
splitmix64(key + (2 i + k + 1) * 0x9E3779B97F4A7C15) >> 11, times 2^-53. The cpu reference
(numpy, uint64 arithmetic) and the cuda kernels compute the same bits, so a plan gives the same
values on both targets and on every run. The key is the `seed` attribute (as an int, like
ONNX's reference) or, without one, a hash of the node's first output name: distinct per node
and stable across runs. This is not numpy's RandomState stream, so values differ from ONNX's
reference implementation (whose unseeded cases are not reproducible anyway).
"""

from __future__ import annotations

import hashlib

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ops.registry import InferContext, shape_rule

GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1


def random_key(attrs, first_output: str) -> int:
    """The generator key of a random node (an unsigned 64-bit int)."""
    if "seed" in attrs:
        return int(float(attrs["seed"])) & MASK64
    return int.from_bytes(hashlib.sha256(first_output.encode()).digest()[:8], "little")


def _dtype_attr(ctx: InferContext, default):
    if "dtype" not in ctx.node.attrs:
        return default
    return dtypes.to_numpy(int(ctx.node.attrs["dtype"]), where=ctx.node.describe())


@shape_rule("RandomUniform", "RandomNormal")
def _random(ctx: InferContext):
    shape = ctx.attr("shape")
    if any(int(d) < 0 for d in shape):
        raise ctx.fail(f"{ctx.node.op_type} shape {list(shape)} has a negative dim")
    return [(_dtype_attr(ctx, np.dtype(np.float32)), tuple(int(d) for d in shape))]


@shape_rule("RandomUniformLike", "RandomNormalLike", "Bernoulli")
def _random_like(ctx: InferContext):
    if ctx.node.op_type == "Bernoulli" and ctx.dtype(0) is not None and not dtypes.is_float(ctx.dtype(0)):
        raise ctx.fail(f"Bernoulli probabilities must be floats, got {ctx.dtype(0)}")
    return [(_dtype_attr(ctx, ctx.dtype(0)), ctx.shape(0))]
