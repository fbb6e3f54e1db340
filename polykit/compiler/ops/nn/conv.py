"""Convolutions: Conv, ConvTranspose, ConvInteger -- shape rules and the sliding-window geometry.

`window_geometry` and `transpose_geometry` are the one place where output sizes and the
resolved pads of a sliding window are computed (auto_pad, ceil_mode, dilations); the shape
rules here and in pool.py, and the reference kernels, all call them so shapes agree.
Conv's semantics did not change across opsets 1/11/22, so it needs no importer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import Dim
from polykit.compiler.ops.registry import InferContext, shape_rule
from polykit.errors import NodeAttributeError

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Window:
    """A resolved sliding window over the spatial dims: output size and pads per dim.

    `out` holds None for a dim whose input size is not a known int.
    """

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[Dim, ...]


def _ints(attrs: Mapping[str, Any], key: str, n: int, default: int, where: str) -> tuple[int, ...]:
    value = attrs.get(key)
    if value is None or len(value) == 0:
        return (default,) * n
    if len(value) != n:
        raise NodeAttributeError(
            f"attribute {key!r} has {len(value)} values, the op has {n} spatial dims",
            where=where,
            hint=f"give one {key} value per spatial dimension",
        )
    return tuple(int(v) for v in value)


def window_geometry(attrs: Mapping[str, Any], spatial: Sequence[Dim], kernel: Sequence[int], *,
                    ceil_mode: bool = False, where: str = "") -> Window:
    """Output sizes and resolved pads of a conv/pool window (ONNX Conv/MaxPool/AveragePool rules)."""
    n = len(kernel)
    strides = _ints(attrs, "strides", n, 1, where)
    dilations = _ints(attrs, "dilations", n, 1, where)
    auto_pad = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in AUTO_PADS:
        raise NodeAttributeError(f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}", where=where)
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dilations) or any(k <= 0 for k in kernel):
        raise NodeAttributeError("strides, dilations and kernel sizes must be positive", where=where)
    pads = attrs.get("pads")
    if auto_pad == "NOTSET" and pads:
        if len(pads) != 2 * n:
            raise NodeAttributeError(f"attribute 'pads' has {len(pads)} values, expected {2 * n}", where=where,
                                     hint="pads lists all begin values, then all end values")
        begin, end = [int(p) for p in pads[:n]], [int(p) for p in pads[n:]]
    else:
        begin, end = [0] * n, [0] * n
    out: list[Dim] = []
    for i in range(n):
        size = spatial[i]
        span = (kernel[i] - 1) * dilations[i] + 1
        if not isinstance(size, int):
            out.append(None)
            continue
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // strides[i])
            total = max(0, (o - 1) * strides[i] + span - size)
            small, large = total // 2, total - total // 2
            begin[i], end[i] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        else:
            room = size + begin[i] + end[i] - span
            if ceil_mode:
                o = -(-room // strides[i]) + 1
                if (o - 1) * strides[i] >= size + begin[i]:  # the last window must start inside
                    o -= 1
            else:
                o = room // strides[i] + 1
        out.append(o)
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out))


def transpose_geometry(attrs: Mapping[str, Any], spatial: Sequence[Dim], kernel: Sequence[int], *,
                       where: str = "") -> Window:
    """Output sizes and pads of ConvTranspose (output_shape / auto_pad / output_padding rules)."""
    n = len(kernel)
    strides = _ints(attrs, "strides", n, 1, where)
    dilations = _ints(attrs, "dilations", n, 1, where)
    out_pad = _ints(attrs, "output_padding", n, 0, where)
    auto_pad = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in AUTO_PADS:
        raise NodeAttributeError(f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}", where=where)
    requested = attrs.get("output_shape")
    if requested:
        requested = [int(v) for v in requested][-n:]
        if len(requested) != n:
            raise NodeAttributeError(f"output_shape has {len(requested)} values for {n} spatial dims", where=where)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        requested = [s * st if isinstance(s, int) else None for s, st in zip(spatial, strides)]
    pads = attrs.get("pads")
    begin, end = [0] * n, [0] * n
    if pads and not requested and auto_pad in ("NOTSET", "VALID"):
        if len(pads) != 2 * n:
            raise NodeAttributeError(f"attribute 'pads' has {len(pads)} values, expected {2 * n}", where=where)
        if auto_pad == "NOTSET":
            begin, end = [int(p) for p in pads[:n]], [int(p) for p in pads[n:]]
    out: list[Dim] = []
    for i in range(n):
        size = spatial[i]
        full = None if not isinstance(size, int) else strides[i] * (size - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
        if requested:
            want = requested[i]
            if full is not None and want is not None:
                total = full - want
                small, large = total // 2, total - total // 2
                begin[i], end[i] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
            out.append(want)
        else:
            out.append(None if full is None else full - begin[i] - end[i])
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out))


def kernel_shape(ctx: InferContext, w_index: int = 1) -> tuple[int, ...] | None:
    """The spatial kernel from the `kernel_shape` attribute or the weight's shape."""
    ks = ctx.attr("kernel_shape", None)
    if ks:
        return tuple(int(k) for k in ks)
    w = ctx.shape(w_index)
    if w is None or not all(isinstance(d, int) for d in w[2:]):
        return None
    return tuple(w[2:])


def check_spatial_input(ctx: InferContext, min_rank: int = 3) -> tuple[Dim, ...] | None:
    """The (N, C, D1, ...) shape of input 0, or None; ShapeError if its rank is too small."""
    x = ctx.shape(0)
    if x is not None and len(x) < min_rank:
        raise ctx.fail(f"input has rank {len(x)}, expected (N, C, D1, ...) with rank >= {min_rank}",
                       hint="convolution and pooling inputs are batch x channels x spatial dims")
    return x


def _conv_shape(ctx: InferContext) -> tuple[Dim, ...] | None:
    x, w = check_spatial_input(ctx), ctx.shape(1)
    group = int(ctx.attr("group", 1))
    if x is not None and w is not None:
        if len(w) != len(x):
            raise ctx.fail(f"weight rank {len(w)} does not match input rank {len(x)}")
        c, wc = x[1], w[1]
        if isinstance(c, int) and isinstance(wc, int) and c != wc * group:
            raise ctx.fail(f"input has {c} channels, weight expects {wc} x group {group} = {wc * group}",
                           hint="the weight's dim 1 must be input channels / group")
        if isinstance(w[0], int) and w[0] % group:
            raise ctx.fail(f"{w[0]} output channels are not divisible by group {group}")
    rank = len(x) if x is not None else (len(w) if w is not None else None)
    if rank is None:
        return None
    ks = kernel_shape(ctx)
    m = w[0] if w is not None else None
    n = x[0] if x is not None else None
    if ks is None:
        return (n, m) + (None,) * (rank - 2)
    spatial = x[2:] if x is not None else (None,) * (rank - 2)
    geo = window_geometry(ctx.node.attrs, spatial, ks, where=ctx.node.describe())
    if any(isinstance(o, int) and o <= 0 for o in geo.out):
        raise ctx.fail(f"the output spatial shape {geo.out} is empty", hint="the kernel is larger than the padded input")
    return (n, m) + geo.out


@shape_rule("Conv")
def _conv(ctx: InferContext):
    return [(ctx.dtype(0), _conv_shape(ctx))]


@shape_rule("ConvInteger")
def _conv_integer(ctx: InferContext):
    return [(np.dtype(np.int32), _conv_shape(ctx))]


@shape_rule("ConvTranspose")
def _conv_transpose(ctx: InferContext):
    x, w = check_spatial_input(ctx), ctx.shape(1)
    group = int(ctx.attr("group", 1))
    if x is not None and w is not None and isinstance(x[1], int) and isinstance(w[0], int) and x[1] != w[0]:
        raise ctx.fail(f"input has {x[1]} channels, the weight's dim 0 is {w[0]}",
                       hint="ConvTranspose weights are (C, M/group, k1, ...)")
    rank = len(x) if x is not None else (len(w) if w is not None else None)
    if rank is None:
        return [(ctx.dtype(0), None)]
    m = w[1] * group if w is not None and isinstance(w[1], int) else None
    n = x[0] if x is not None else None
    ks = kernel_shape(ctx)
    if ks is None:
        return [(ctx.dtype(0), (n, m) + (None,) * (rank - 2))]
    spatial = x[2:] if x is not None else (None,) * (rank - 2)
    geo = transpose_geometry(ctx.node.attrs, spatial, ks, where=ctx.node.describe())
    return [(ctx.dtype(0), (n, m) + geo.out)]

