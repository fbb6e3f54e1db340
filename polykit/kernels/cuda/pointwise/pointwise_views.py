"""View operands of the pointwise kernels (pass absorb_views; the format:
polykit.compiler.ops.nn.view_operands).

A Pointwise layer may read one of its body's values through a view of a stored tensor: per
logical dim a cyclic shift, then a split into pieces with element strides, plus a base offset.
Such a layer's module has the strided entry `_s` and the view-vector entry `_w` (no `_v`, no row
entry). On the host (launch_geometry.view_geometry) every unshifted dim is split into the view's
pieces as dims of the iteration space of its own, so the kernel reads them as plain strides; a
shifted dim stays one dim, and the kernel takes per dim and view operand i the shift
`vh<i>_<d>`, the inner piece size `vq<i>_<d>` (0: one piece) and the outer piece stride
`vo<i>_<d>`, the inner stride being the operand's ordinary stride, plus its base offset `vb<i>`.
These are runtime arguments, so the declared kernels depend on no stamped shape
(docs/DYNAMIC_SHAPES.md "Tactics").

`_w` takes the same arguments plus one flag per input and gives each thread V consecutive
elements of the innermost iteration dim (V = view_width: 16 bytes of the widest storage type):
the offsets are computed once per vector, at its first element (the strided entry's div/mod and
view step, dividing in 32 bits), then every input contiguous along that dim loads V elements at
once, one broadcast along it loads one value, and every output stores V. The host
(vector_view_flags) takes `_w` only where that reads what `_s` reads: the innermost dim a
multiple of V, every tensor contiguous or (inputs) broadcast along it, every other stride, outer
piece stride, base offset and the innermost dim's shift and inner piece size multiples of V,
every pointer loaded or stored as vectors aligned to V elements, no output smaller than the
iteration space, and under 2^31 elements (NARROW_LIMIT). An entry of the view module rather than
the row kernel (`_r`): the row kernel's [A, B, I] space with offsets affine in the row cannot
express a shifted or split outer dim, and it lives in a module of its own built only for
row-broadcast layers; `_w` takes view_geometry's arguments as they are, so one host geometry
serves both view entries and the module still depends on no shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ops.nn.view_operands import view_operands, view_shape
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.storage_types import LOWP

#: bytes a thread of the view-vector entry loads per operand at most (one 16-byte vector)
VIEW_VECTOR_BYTES = 16
#: elements a thread of the view-vector entry handles at most
MAX_VIEW_VEC = 8
#: the view-vector entry divides in 32 bits: iteration spaces below this many elements
NARROW_LIMIT = 2 ** 31


def view_inputs(layer) -> frozenset[int]:
    """The logical input indices of a Pointwise layer read through views."""
    if layer.kind != "Pointwise" or not layer.attrs.get("view"):
        return frozenset()
    return frozenset(e["input"] for e in view_operands(layer.attrs, len(layer.inputs)))


@dataclass(frozen=True)
class ViewTensor:
    """A view operand at launch: its source (a device tensor) and the view entry."""

    source: DeviceTensor
    entry: Mapping[str, Any]

    @property
    def shape(self) -> tuple[int, ...]:
        return view_shape(self.entry)

    @property
    def dtype(self) -> np.dtype:
        return self.source.dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dims(self) -> list[tuple[int, list[list[int]]]]:
        return [(d["shift"], d["pieces"]) for d in self.entry["dims"]]


def with_views(layer, x: list, tensors: Mapping[str, DeviceTensor]) -> list:
    """The logical input tensors `x` with each view operand's tensor wrapped as a ViewTensor
    (views index the layer's inputs, which have no empty names on a Pointwise layer)."""
    if layer.kind != "Pointwise" or not layer.attrs.get("view"):
        return x
    x = list(x)
    for e in view_operands(layer.attrs, len(layer.inputs), layer.name):
        x[e["input"]] = ViewTensor(tensors[layer.inputs[e["input"]]], e)
    return x


def view_params(views: frozenset[int], maxr: int) -> list[str]:
    """The strided entry's view arguments (after its geometry): base offset, then per dim the
    shift, the inner piece size and the outer piece stride, of each view operand."""
    return [p for i in sorted(views) for p in [f"i64 vb{i}"] + [f"i64 v{k}{i}_{d}" for k in "hqo" for d in range(maxr)]]


def view_locals(views: frozenset[int], maxr: int, pad: str) -> list[str]:
    return [f"{pad}const i64 v{k}{i}[{maxr}] = {{{', '.join(f'v{k}{i}_{d}' for d in range(maxr))}}};"
            for i in sorted(views) for k in "hqo"]


def narrow_div(a: str, b: str) -> str:
    """C expression: a / b in 32-bit unsigned arithmetic (both known to lie in [0, 2^31)), as i64."""
    return f"(i64)((unsigned)({a}) / (unsigned)({b}))"


def view_step(i: int, pad: str, narrow: bool = False) -> str:
    """C statement: add dim d's part of view operand i's offset (index c): shift, then split
    (`narrow`: the division in 32 bits, for the view-vector entry)."""
    div = narrow_div("j", f"vq{i}[d]") if narrow else f"j / vq{i}[d]"
    return (f"{pad}if (vh{i}[d] | vq{i}[d]) {{ i64 j = c + vh{i}[d]; if (j >= dims[d]) j -= dims[d]; "
            f"const i64 h = vq{i}[d] ? {div} : 0; o{i} += h * vo{i}[d] + (j - h * vq{i}[d]) * st{i}[d]; }} "
            f"else o{i} += c * st{i}[d];")


def view_args(x: Sequence, extra: Mapping[int, tuple[list[int], list[int], list[int]]], maxr: int) -> list[int]:
    """The launch's view arguments (view_params' order) from view_geometry's per-view lists."""
    out: list[int] = []
    for i, t in enumerate(x):
        if isinstance(t, ViewTensor):
            out.append(int(t.entry["offset"]))
            for lst in extra[i]:
                out += [*lst, *([0] * (maxr - len(lst)))]
    return out


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def view_width(dtypes: Sequence[str]) -> int:
    """Elements a thread of the view-vector entry `_w` handles for a signature of these dtypes:
    16 bytes of the widest one (8 for fp16, 4 for fp32, 2 for fp64), at most MAX_VIEW_VEC; 0 (no
    `_w`) with a low-precision storage type (packed, decoded one element at a time)."""
    if not dtypes or any(d in LOWP for d in dtypes):
        return 0
    width = min(MAX_VIEW_VEC, VIEW_VECTOR_BYTES // max(_itemsize(d) for d in dtypes))
    return width if width >= 2 else 0


def vector_view_flags(x: Sequence, y: Sequence[DeviceTensor], dims: Sequence[int], strides, zm: Sequence[int],
                      extra: Mapping[int, tuple[list[int], list[int], list[int]]], width: int) -> list[int] | None:
    """The `_w` entry's per-input flags for one launch (view_geometry's dims, strides, zero masks
    and per-view lists): 1 for an input read as V consecutive elements (stride 1 along the
    innermost dim), 0 for one broadcast along it; None when `_w` may not run this launch (see the
    module docstring: sizes, strides, shifts, pieces or pointers that are no multiples of V)."""
    if width < 2 or dims[-1] % width or any(zm) or math.prod(dims) >= NARROW_LIMIT:
        return None
    flags: list[int] = []
    for t, (tensor, st) in enumerate(zip(list(x) + list(y), strides)):
        if st[-1] == 0 and t < len(x):
            flags.append(0)
            continue
        if st[-1] != 1 or any(s % width for s in st[:-1]):
            return None
        base = tensor.source if isinstance(tensor, ViewTensor) else tensor
        if base.ptr % (width * base.dtype.itemsize):
            return None
        if isinstance(tensor, ViewTensor):
            shifts, inner, outer = extra[t]
            if tensor.entry["offset"] % width or shifts[-1] % width or inner[-1] % width or \
                    any(s % width for s in outer):
                return None
        flags.append(1)
    return flags[:len(x)]
