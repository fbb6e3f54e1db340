"""Reference kernels: DepthToSpace and SpaceToDepth (a reshape, a transpose, a reshape)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.spatial import block_attrs
from polykit.errors import ShapeError
from polykit.compiler.ops.references import reference


def _check(node: Node, x: np.ndarray, ok: bool, what: str) -> None:
    if x.ndim != 4 or not ok:
        raise ShapeError(f"input of shape {x.shape} {what}", where=node.describe())


@reference("DepthToSpace")
def depth_to_space(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    b, mode = block_attrs(node.attrs, node.describe())
    _check(node, x, x.ndim == 4 and x.shape[1] % (b * b) == 0, f"is not (N, C, H, W) with C divisible by {b * b}")
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [np.ascontiguousarray(y).reshape(n, c // (b * b), h * b, w * b)]


@reference("SpaceToDepth")
def space_to_depth(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    b, mode = block_attrs(node.attrs, node.describe())
    _check(node, x, x.ndim == 4 and x.shape[2] % b == 0 and x.shape[3] % b == 0,
           f"is not (N, C, H, W) with H and W divisible by {b}")
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return [np.ascontiguousarray(y).reshape(n, c * b * b, h // b, w // b)]
