"""Reference kernels: normalizations, statistics in float64, outputs in the ONNX dtypes."""

from __future__ import annotations

import math

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.norm_row_map import IN_MAP, ROW_MAP, check_row_map, input_index, row_destinations
from polykit.compiler.ops.references import reference
from polykit.errors import RuntimeInputError


def _per_channel(p: np.ndarray, rank: int) -> np.ndarray:
    """A [C] parameter shaped to broadcast against an (N, C, ...) tensor."""
    return p.astype(np.float64).reshape((-1,) + (1,) * (rank - 2))


def _normalize(x64: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float) -> np.ndarray:
    return (x64 - mean) / np.sqrt(var + eps)


@reference("BatchNormalization")
def batch_normalization(node, inputs):
    x, scale, bias, mean, var = inputs[:5]
    eps = node.attrs.get("epsilon", 1e-5)
    r = x.ndim
    x64 = x.astype(np.float64)
    if not node.attrs.get("training_mode", 0):
        y = _normalize(x64, _per_channel(mean, r), _per_channel(var, r), eps)
        return [(y * _per_channel(scale, r) + _per_channel(bias, r)).astype(x.dtype)]
    momentum = node.attrs.get("momentum", 0.9)
    axes = tuple(i for i in range(r) if i != 1)
    batch_mean, batch_var = x64.mean(axis=axes), x64.var(axis=axes)
    y = _normalize(x64, _per_channel(batch_mean, r), _per_channel(batch_var, r), eps)
    y = y * _per_channel(scale, r) + _per_channel(bias, r)
    running_mean = mean.astype(np.float64) * momentum + batch_mean * (1 - momentum)
    running_var = var.astype(np.float64) * momentum + batch_var * (1 - momentum)
    return [y.astype(x.dtype), running_mean.astype(mean.dtype), running_var.astype(var.dtype)]


@reference("InstanceNormalization")
def instance_normalization(node, inputs):
    x, scale, bias = inputs
    axes = tuple(range(2, x.ndim))
    x64 = x.astype(np.float64)
    y = _normalize(x64, x64.mean(axis=axes, keepdims=True), x64.var(axis=axes, keepdims=True),
                   node.attrs.get("epsilon", 1e-5))
    return [(y * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)).astype(x.dtype)]


def _stash_dtype(node) -> np.dtype:
    return dtypes.to_numpy(int(node.attrs.get("stash_type", 1)))


@reference("LayerNormalization")
def layer_normalization(node, inputs):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = int(node.attrs.get("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(x64.var(axis=axes, keepdims=True) + node.attrs.get("epsilon", 1e-5))
    y = (x64 - mean) * inv_std * scale.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    stash = _stash_dtype(node)
    return [y.astype(x.dtype), mean.astype(stash), inv_std.astype(stash)][: max(len(node.outputs), 1)]


@reference("RMSNormalization")
def rms_normalization(node, inputs):
    x, scale = inputs
    axis = int(node.attrs.get("axis", -1)) % x.ndim
    x64 = x.astype(np.float64)
    rms = np.sqrt(np.mean(x64 * x64, axis=tuple(range(axis, x.ndim)), keepdims=True) + node.attrs.get("epsilon", 1e-5))
    return [(x64 / rms * scale.astype(np.float64)).astype(scale.dtype)]


@reference("GroupNormalization")
def group_normalization(node, inputs):
    """Opset-21 form: statistics per (instance, group), scale/bias per channel."""
    x, scale, bias = inputs
    groups = int(node.attrs["num_groups"])
    n, c = x.shape[:2]
    grouped = x.astype(np.float64).reshape(n, groups, c // groups, *x.shape[2:])
    axes = tuple(range(2, grouped.ndim))
    y = _normalize(grouped, grouped.mean(axis=axes, keepdims=True), grouped.var(axis=axes, keepdims=True),
                   node.attrs.get("epsilon", 1e-5)).reshape(x.shape)
    return [(y * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)).astype(x.dtype)]


@reference("LpNormalization")
def lp_normalization(node, inputs):
    """x / ||x||_p along the axis; a zero norm gives 0 (not NaN)."""
    x = inputs[0]
    axis = int(node.attrs.get("axis", -1)) % x.ndim
    p = int(node.attrs.get("p", 2))
    x64 = x.astype(np.float64)
    if p == 1:
        norm = np.sum(np.abs(x64), axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.sum(x64 * x64, axis=axis, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(norm == 0, 0.0, x64 / norm)
    return [y.astype(x.dtype)]


@reference("MeanVarianceNormalization")
def mean_variance_normalization(node, inputs):
    """(x - mean) / (std + 1e-9) over `axes` (ONNX's function body)."""
    x = inputs[0]
    axes = tuple(int(a) % x.ndim for a in node.attrs.get("axes", [0, 2, 3]))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    std = np.sqrt(np.maximum(np.mean(x64 * x64, axis=axes, keepdims=True) - mean * mean, 0.0))
    return [((x64 - mean) / (std + 1e-9)).astype(x.dtype)]


@reference("LayerNormalization", "RMSNormalization", domain=POLYKIT_DOMAIN)
def mapped_normalization(node, inputs):
    """The ONNX norm of the input gathered by `in_map`, its rows then written to the positions of
    `row_map` (ops/nn/norm_row_map.py); either map optional."""
    x = inputs[0]
    try:
        if IN_MAP in node.attrs:
            x = x.reshape(-1)[input_index(node.attrs[IN_MAP], x.shape)]
        axis = int(node.attrs.get("axis", -1)) % x.ndim
        shape = check_row_map(node.attrs[ROW_MAP], x.shape, axis) if ROW_MAP in node.attrs else x.shape
    except ValueError as exc:
        raise RuntimeInputError(str(exc), where=node.describe(), hint="the input's shape is not the one the node "
                                "was built for") from None
    plain = layer_normalization if node.op_type == "LayerNormalization" else rms_normalization
    y = plain(node, [x, *inputs[1:]])[0]
    if ROW_MAP not in node.attrs:
        return [y]
    rows = y.reshape(math.prod(x.shape[:axis]), -1)
    out = np.empty_like(rows)
    out[row_destinations(node.attrs[ROW_MAP])] = rows
    return [out.reshape(shape)]
