"""2:4 structured sparsity of GEMM weights: the pattern, magnitude pruning, and the compressed
form the sparse tactics read (polykit.kernels.cpu.sparse24, polykit.kernels.cuda.gemm.sparse24): part of
the plan format, since a plan stores the compressed weight (plan.check validates its record).

A weight is viewed as its GEMM matrix W[N, K] (N output features, K the reduction axis):
MatMul B[K, N] transposed, Gemm B ([K, N], or [N, K] with transB), Conv / ConvNHWC weights
with their output channels as rows and (for a 1x1 kernel) the input channels as K. It has the
2:4 pattern when every group of 4 consecutive K elements of a row holds at most 2 non-zeros
(along the input channels of every kernel position for a general Conv, as TensorRT checks).

The compressed form is one uint8 blob: the kept values W_c[N, K/2] in the weight's dtype,
row-major, then the metadata M[N, K/16] uint16, little-endian. M[n, c] covers K 16c..16c+15:
its group g (K 16c+4g..16c+4g+3) sits in bits 4g..4g+3, the position (0..3) of the first kept
value in the low two bits, the second's in the high two, first < second. That is the
metadata the PTX ISA defines for mma.sp m16n8k32 with 16-bit operands ("Sparse matrix
storage", sparsity selector 0): lane 4q + t (t = 0, 1) of a warp passes M[r0 + q, 2j + t] |
M[r0 + q + 8, 2j + t] << 16 for the 16-row tile at r0 and the k-step j (32 K elements).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

#: K elements one sparse mma step consumes (m16n8k32): an eligible weight's K is a multiple of it
K_STEP = 32
#: the layer attribute of a sparse variant: the compressed form's record (see sparse_record)
ATTR = "sparse24"
#: the weight dtypes a compressed form holds (numpy names)
DTYPES = ("float16", "float32", "float64")
#: kinds whose constant weight (input 1) may be 2:4 sparse along the reduction axis
KINDS = ("Gemm", "MatMul", "Conv", "ConvNHWC")


def has_pattern(w: np.ndarray, axis: int = -1) -> bool:
    """Whether every group of 4 consecutive elements along `axis` holds at most 2 non-zeros
    (the axis length a multiple of 4)."""
    w = np.moveaxis(np.asarray(w), axis, -1)
    if w.shape[-1] % 4:
        return False
    groups = w.reshape(*w.shape[:-1], w.shape[-1] // 4, 4)
    return bool(((groups != 0).sum(axis=-1) <= 2).all())


def prune(w: np.ndarray, axis: int = -1) -> np.ndarray:
    """`w` with the 2 smallest-magnitude elements of every group of 4 along `axis` set to 0
    (the axis length a multiple of 4); ties keep the earlier element."""
    moved = np.moveaxis(np.array(w, copy=True), axis, -1)
    groups = moved.reshape(*moved.shape[:-1], moved.shape[-1] // 4, 4)
    order = np.argsort(np.abs(groups.astype(np.float64)), axis=-1, kind="stable")
    np.put_along_axis(groups, order[..., :2], 0, axis=-1)
    return np.moveaxis(groups.reshape(moved.shape), -1, axis)


def kept_positions(w: np.ndarray) -> np.ndarray:
    """For W[N, K] with the pattern: [N, K/4, 2] positions (0..3) of the two values each group
    keeps, ascending; a group with fewer non-zeros keeps the lowest zero positions too."""
    groups = (np.asarray(w) != 0).reshape(w.shape[0], w.shape[1] // 4, 4)
    # non-zeros first (by position), then zeros (by position): the first two are kept
    rank = np.where(groups, 0, 4) + np.arange(4)
    keep = np.sort(np.argsort(rank, axis=-1, kind="stable")[..., :2], axis=-1)
    return keep.astype(np.uint8)


def compress(w: np.ndarray) -> np.ndarray:
    """The compressed blob (uint8) of W[N, K] (K a multiple of K_STEP, the 2:4 pattern)."""
    w = np.ascontiguousarray(w)
    n, k = w.shape
    if k % K_STEP or not has_pattern(w):
        raise ValueError(f"a [{n}, {k}] weight without the 2:4 pattern or K % {K_STEP} != 0")
    keep = kept_positions(w)
    values = np.take_along_axis(w.reshape(n, k // 4, 4), keep.astype(np.intp), axis=-1).reshape(n, k // 2)
    nibbles = (keep[..., 0] | (keep[..., 1] << 2)).astype(np.uint16).reshape(n, k // 16, 4)
    meta = (nibbles << (np.arange(4, dtype=np.uint16) * 4)).sum(axis=-1, dtype=np.uint16)
    return np.concatenate([values.view(np.uint8).reshape(-1), meta.astype("<u2").view(np.uint8).reshape(-1)])


def values_bytes(n: int, k: int, dtype: Any) -> int:
    return n * (k // 2) * np.dtype(dtype).itemsize


def blob_bytes(n: int, k: int, dtype: Any) -> int:
    """Bytes of the compressed blob of a [n, k] weight of `dtype`."""
    return values_bytes(n, k, dtype) + n * (k // 16) * 2


def decompress(blob: np.ndarray, n: int, k: int, dtype: Any) -> np.ndarray:
    """W[n, k] of `dtype` back from its compressed blob (ValueError when the blob's size or
    metadata does not fit)."""
    blob = np.asarray(blob, dtype=np.uint8).reshape(-1)
    if k % K_STEP or blob.size != blob_bytes(n, k, dtype):
        raise ValueError(f"a {blob.size}-byte blob is not the compressed form of a [{n}, {k}] {np.dtype(dtype).name} "
                         f"weight ({blob_bytes(n, k, dtype)} bytes)")
    split = values_bytes(n, k, dtype)
    values = blob[:split].view(np.dtype(dtype)).reshape(n, k // 4, 2)
    meta = blob[split:].view("<u2").reshape(n, k // 16, 1)
    nibbles = ((meta >> (np.arange(4, dtype=np.uint16) * 4)) & 0xF).reshape(n, k // 4)
    first, second = (nibbles & 3).astype(np.intp), (nibbles >> 2).astype(np.intp)
    if (first >= second).any():
        raise ValueError("sparse metadata names a group's positions out of order")
    out = np.zeros((n, k // 4, 4), np.dtype(dtype))
    np.put_along_axis(out, first[..., None], values[..., :1], axis=-1)
    np.put_along_axis(out, second[..., None], values[..., 1:], axis=-1)
    return out.reshape(n, k)


def record_problem(record: Any, blob_size: int | None) -> str:
    """What is wrong with a sparse layer's ATTR record read from a plan ("" when nothing): its
    fields' types, K a multiple of K_STEP, [N, K] the dense shape's size, and the compressed
    weight's size (`blob_size` bytes, None when unknown)."""
    if not isinstance(record, dict) or not {"weight", "n", "k", "dtype", "shape"} <= set(record):
        return "is not a record of weight, n, k, dtype and shape"
    n, k, shape = record["n"], record["k"], record["shape"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (n, k)) or k % K_STEP:
        return f"n {n!r} and k {k!r} must be positive integers, k a multiple of {K_STEP}"
    if record["dtype"] not in DTYPES or not isinstance(shape, list) \
            or not all(isinstance(d, int) and d > 0 for d in shape) or math.prod(shape) != n * k:
        return f"dtype {record['dtype']!r} or shape {shape!r} does not describe a float [{n}, {k}] weight"
    if blob_size is not None and blob_size != blob_bytes(n, k, record["dtype"]):
        return f"the compressed weight has {blob_size} bytes, a [{n}, {k}] {record['dtype']} one {blob_bytes(n, k, record['dtype'])}"
    return ""


# ---- the GEMM view of a layer's weight ----------------------------------------------------------

def is_pointwise_conv(kind: str, attrs: Mapping[str, Any], shape: tuple[int, ...]) -> bool:
    """A Conv / ConvNHWC that is a GEMM: 1x1 kernel, stride 1, no padding, one group."""
    if kind not in ("Conv", "ConvNHWC") or len(shape) != 4:
        return False
    spatial = shape[1:3] if kind == "ConvNHWC" else shape[2:]
    return (tuple(spatial) == (1, 1) and int(attrs.get("group", 1)) == 1
            and all(int(s) == 1 for s in attrs.get("strides", (1, 1)))
            and all(int(p) == 0 for p in attrs.get("pads", (0, 0, 0, 0)))
            and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID"))


def reduction_axis(kind: str, attrs: Mapping[str, Any], shape: tuple[int, ...]) -> int | None:
    """The axis of the weight (input 1 of `kind`) that the GEMM reduces over, where the 2:4
    pattern is checked and pruned; None for a weight that is no GEMM operand."""
    if kind == "MatMul":
        return 0 if len(shape) == 2 else None
    if kind == "Gemm":
        return (1 if int(attrs.get("transB", 0)) else 0) if len(shape) == 2 else None
    if kind == "Conv":
        return 1 if len(shape) >= 3 else None
    if kind == "ConvNHWC":
        return len(shape) - 1 if len(shape) >= 3 else None
    return None


def gemm_matrix(kind: str, attrs: Mapping[str, Any], w: np.ndarray) -> np.ndarray | None:
    """W[N, K] of a weight a sparse tactic can run as a GEMM operand, else None."""
    axis = reduction_axis(kind, attrs, w.shape)
    if axis is None or kind in ("Conv", "ConvNHWC") and not is_pointwise_conv(kind, attrs, w.shape):
        return None
    if kind in ("Conv", "ConvNHWC"):
        return w.reshape(w.shape[0], -1)
    return w.T if axis == 0 else w


def weight_from_matrix(kind: str, attrs: Mapping[str, Any], matrix: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The weight of `shape` whose GEMM matrix is `matrix` (gemm_matrix's inverse)."""
    if kind in ("Conv", "ConvNHWC"):
        return matrix.reshape(shape)
    return matrix.T if reduction_axis(kind, attrs, shape) == 0 else matrix


def sparse_record(name: str, n: int, k: int, dtype: Any, shape: tuple[int, ...]) -> dict[str, Any]:
    """The ATTR record of a sparse variant: the blob's tensor name, W's [N, K], the values'
    dtype and the dense weight's shape (what a decompression needs)."""
    return {"weight": name, "n": int(n), "k": int(k), "dtype": np.dtype(dtype).name, "shape": [int(d) for d in shape]}


def dense_weight(kind: str, attrs: Mapping[str, Any], blob: np.ndarray) -> np.ndarray:
    """The dense weight a sparse variant's blob (input 1) was compressed from (attrs[ATTR] its record)."""
    rec = attrs[ATTR]
    matrix = decompress(blob, rec["n"], rec["k"], rec["dtype"])
    return weight_from_matrix(kind, attrs, matrix, tuple(rec["shape"]))
