"""Reference kernel: Det (LU with partial pivoting in float64, numpy.linalg.det)."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ops.references import reference


@reference("Det")
def det(node, inputs):
    x = inputs[0]
    return [np.asarray(np.linalg.det(x.astype(np.float64))).astype(x.dtype)]
