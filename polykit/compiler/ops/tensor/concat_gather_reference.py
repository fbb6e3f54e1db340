"""Reference kernel of ai.polykit ConcatGather (polykit.compiler.ops.tensor.concat_gather): numpy's
concatenate, then take."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.references import reference
from polykit.compiler.ops.tensor.concat_gather import CONCAT_GATHER
from polykit.errors import RuntimeInputError


@reference(CONCAT_GATHER, domain=POLYKIT_DOMAIN)
def concat_gather(node: Node, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    idx, sources = np.asarray(inputs[0]), [np.asarray(x) for x in inputs[1:]]
    axis = int(node.attrs.get("axis", 0))
    try:
        whole = np.concatenate(sources, axis=axis)
    except ValueError as exc:
        raise RuntimeInputError(f"sources do not concatenate: {exc}", where=node.describe(),
                                hint="the inputs' shapes are not the ones the node was built for") from None
    dim = whole.shape[axis]
    if idx.ndim != 1 or idx.dtype.kind not in "iu" or (idx.size and (idx.min() < -dim or idx.max() >= dim)):
        raise RuntimeInputError(f"indices must be 1-D integers in [-{dim}, {dim})", where=node.describe(),
                                hint="compose_concat_gathers makes them from a Gather's constant indices")
    return [np.ascontiguousarray(np.take(whole, idx.astype(np.int64), axis=axis))]
