"""cpu pooling tactics (MaxPool without Indices, AveragePool).

  cpu.pool.strided   one numpy reduction over the kernel axes of the strided window view
                     (cpu.reference reduces one kernel offset at a time)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.kernels.cpu.base import cpu_tactic, float_layer
from polykit.compiler.ops.nn.conv_reference import padded, sliding_windows
from polykit.compiler.ops.nn.pool_reference import lowest_value, pool_geometry, window_counts


def _pool_layer(layer: Any) -> bool:
    return layer.domain == "" and float_layer(layer) and len([o for o in layer.outputs if o]) == 1


def _kernel_axes(win: Any, windows: np.ndarray) -> tuple[int, ...]:
    return tuple(range(windows.ndim - len(win.kernel), windows.ndim))


@cpu_tactic(["MaxPool"], "cpu.pool.strided", supports=_pool_layer)
def max_pool_strided(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    win = pool_geometry(node, x)
    windows = sliding_windows(padded(x, win, lowest_value(x.dtype)), win)
    return [windows.max(axis=_kernel_axes(win, windows))]


@cpu_tactic(["AveragePool"], "cpu.pool.strided", supports=_pool_layer)
def average_pool_strided(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    win = pool_geometry(node, x)
    windows = sliding_windows(padded(x.astype(np.float64), win, 0.0), win)
    counts = window_counts(win, x.shape[2:], bool(node.attrs.get("count_include_pad", 0)))
    return [(windows.sum(axis=_kernel_axes(win, windows)) / counts).astype(x.dtype)]
