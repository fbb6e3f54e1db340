"""PermutedCopy layers the GPU test and the host emulation of permuted_copy.cu share: rolls (both
signs, several axes), wrapping windows, Swin's window partition and merge, q/k/v selections of a
transposed projection, odd shapes, 1- to 8-byte elements."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc

rng = np.random.default_rng(30)

CASES = {
    "roll_one_axis": ((3, 11, 5), {"starts": [0, 4, 0]}),
    "roll_two_axes_odd": ((1, 9, 7, 3), {"starts": [0, 6, 2, 0]}),
    "wrapping_window": ((7, 5), {"starts": [5, 1], "window": [4, 3]}),
    "window_partition": ((1, 14, 21, 6), {"starts": [0, 3, 3, 0], "view": [1, 2, 7, 3, 7, 6],
                                          "perm": [0, 1, 3, 2, 4, 5], "shape": [6, 49, 6]}),
    "window_merge": ((6, 49, 6), {"view": [1, 2, 3, 7, 7, 6], "perm": [0, 1, 3, 2, 4, 5], "shape": [1, 14, 21, 6],
                                  "out_shifts": [0, 3, -4, 0]}),
    "qkv_selection": ((4, 7, 3, 2, 8), {"starts": [0, 0, 2, 0, 0], "window": [4, 7, 1, 2, 8],
                                        "perm": [2, 0, 3, 1, 4], "shape": [4, 2, 7, 8]}),
    "transpose_odd": ((5, 3, 7), {"perm": [2, 0, 1]}),
    "roll_innermost": ((4, 10), {"starts": [0, 7]}),
}
DTYPES = (np.float16, np.float32, np.int64, np.uint8)


def layer_and_input(case: str, dtype) -> tuple[LayerDesc, np.ndarray]:
    shape, attrs = CASES[case]
    attrs = dict(attrs)
    if "shape" not in attrs:
        window = attrs.get("window", shape)
        view = attrs.get("view", window)
        attrs["shape"] = [view[p] for p in attrs.get("perm", range(len(view)))]
    x = rng.integers(0, 250, size=shape).astype(dtype)
    return LayerDesc(f"copy_{case}", "PermutedCopy", ("X",), ("Y",), attrs, domain=POLYKIT_DOMAIN), x
