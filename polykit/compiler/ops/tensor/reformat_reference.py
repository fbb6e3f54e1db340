"""Reference kernel of ai.polykit Reformat (polykit.compiler.ops.tensor.reformat): numpy's astype,
transpose and a zero pad of the last axis."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.references import reference
from polykit.compiler.ops.tensor.cast_reference import convert
from polykit.compiler.ops.tensor.reformat import REFORMAT, reformat_attrs
from polykit.errors import RuntimeInputError


@reference(REFORMAT, domain=POLYKIT_DOMAIN)
def reformat(node: Node, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    try:
        perm, to, pad = reformat_attrs(node, x.dtype)
    except ValueError as exc:
        raise RuntimeInputError(str(exc), where=node.describe(), hint="the node's attributes are not a Reformat's") from None
    if x.ndim != 4:
        raise RuntimeInputError(f"Reformat reads a rank-4 tensor, got shape {x.shape}", where=node.describe(),
                                hint="the input's shape is not the one the node was built for")
    y = convert(x, to).transpose(perm)
    if pad:
        y = np.concatenate([y, np.zeros(y.shape[:3] + (pad,), y.dtype)], axis=3)
    return [np.ascontiguousarray(y)]
