"""Reference kernels: RandomUniform(Like), RandomNormal(Like), Bernoulli on polykit's
counter-based generator (polykit.compiler.ops.math.random; the cuda kernels compute the same bits)."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ops.math.random import GOLDEN, random_key
from polykit.compiler.ops.references import reference


def uniforms(key: int, n: int, k: int) -> np.ndarray:
    """The k-th uniform (k = 0 or 1) of elements 0..n-1, float64 in [0, 1)."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (np.arange(n, dtype=np.uint64) * np.uint64(2) + np.uint64(k + 1)) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def normals(key: int, n: int) -> np.ndarray:
    """Standard normals by Box-Muller from the element's two uniforms."""
    return np.sqrt(-2.0 * np.log1p(-uniforms(key, n, 0))) * np.cos(2.0 * np.pi * uniforms(key, n, 1))


def _out(node, like: np.ndarray | None):
    """(shape, dtype) of the output: the attribute form or the input's."""
    shape = tuple(int(d) for d in node.attrs["shape"]) if like is None else like.shape
    default = np.dtype(np.float32) if like is None else like.dtype
    dt = dtypes.to_numpy(int(node.attrs["dtype"]), where=node.describe()) if "dtype" in node.attrs else default
    return shape, dt


def _draw(node, like):
    shape, dt = _out(node, like)
    n = int(np.prod(shape, dtype=np.int64))
    key = random_key(node.attrs, node.outputs[0])
    if node.op_type.startswith("RandomUniform"):
        low, high = float(node.attrs.get("low", 0.0)), float(node.attrs.get("high", 1.0))
        values = low + (high - low) * uniforms(key, n, 0)
    else:
        values = float(node.attrs.get("mean", 0.0)) + float(node.attrs.get("scale", 1.0)) * normals(key, n)
    return [values.reshape(shape).astype(dt)]


@reference("RandomUniform", "RandomNormal")
def random(node, inputs):
    return _draw(node, None)


@reference("RandomUniformLike", "RandomNormalLike")
def random_like(node, inputs):
    return _draw(node, inputs[0])


@reference("Bernoulli")
def bernoulli(node, inputs):
    """1 where the element's uniform is below its probability (p <= 0 never, p >= 1 always)."""
    p = inputs[0]
    _, dt = _out(node, p)
    u = uniforms(random_key(node.attrs, node.outputs[0]), p.size, 0).reshape(p.shape)
    return [(u < p.astype(np.float64)).astype(dt)]
