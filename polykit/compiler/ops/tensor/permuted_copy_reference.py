"""Reference kernel of ai.polykit PermutedCopy (polykit.compiler.ops.tensor.permuted_copy), in numpy's
own terms: an indexed window, reshape, transpose, reshape, np.roll."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.references import reference
from polykit.compiler.ops.tensor.permuted_copy import PERMUTED_COPY, copy_spec
from polykit.errors import RuntimeInputError


@reference(PERMUTED_COPY, domain=POLYKIT_DOMAIN)
def permuted_copy(node: Node, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    try:
        spec = copy_spec(node.attrs, x.shape)
    except ValueError as exc:
        raise RuntimeInputError(str(exc), where=node.describe(), hint="the input's shape is not the one the node "
                                "was built for") from None
    index = np.ix_(*[(np.arange(w) + s) % max(d, 1) for s, w, d in zip(spec.starts, spec.window, x.shape)])
    y = x[index] if x.ndim else x
    y = y.reshape(spec.view).transpose(spec.perm).reshape(spec.shape)
    shifted = [(s, a) for a, s in enumerate(spec.out_shifts) if s]
    if shifted:
        y = np.roll(y, [s for s, _ in shifted], axis=[a for _, a in shifted])
    return [np.ascontiguousarray(y)]
