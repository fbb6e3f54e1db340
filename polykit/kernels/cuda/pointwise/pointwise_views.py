"""View operands of the pointwise kernels (pass absorb_views; the format:
polykit.compiler.ops.nn.view_operands).

A Pointwise layer may read one of its body's values through a view of a stored tensor: per
logical dim a cyclic shift, then a split into pieces with element strides, plus a base offset.
Only the strided entry serves such a layer (its module has no vector or row entry). On the host
(launch_geometry.view_geometry) every unshifted dim is split into the view's pieces as dims of
the iteration space of its own, so the kernel reads them as plain strides; a shifted dim stays
one dim, and the kernel takes per dim and view operand i the shift `vh<i>_<d>`, the inner piece
size `vq<i>_<d>` (0: one piece) and the outer piece stride `vo<i>_<d>`, the inner stride being
the operand's ordinary stride, plus its base offset `vb<i>`. These are runtime arguments, so the
declared kernels depend on no stamped shape (docs/DYNAMIC_SHAPES.md "Tactics").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ops.nn.view_operands import view_operands, view_shape
from polykit.kernels.cuda.base import DeviceTensor


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


def view_step(i: int, pad: str) -> str:
    """C statement: add dim d's part of view operand i's offset (index c): shift, then split."""
    return (f"{pad}if (vh{i}[d] | vq{i}[d]) {{ i64 j = c + vh{i}[d]; if (j >= dims[d]) j -= dims[d]; "
            f"const i64 h = vq{i}[d] ? j / vq{i}[d] : 0; o{i} += h * vo{i}[d] + (j - h * vq{i}[d]) * st{i}[d]; }} "
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
