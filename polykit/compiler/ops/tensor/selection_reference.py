"""Reference kernels of ai.polykit CheckRange and SelectByIndex (polykit.compiler.ops.tensor.selection)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.tensor.selection import CHECK_RANGE, SELECT_BY_INDEX
from polykit.errors import RuntimeInputError
from polykit.compiler.ops.references import reference


def checked(attrs: Mapping[str, Any], x: np.ndarray, where: str) -> np.ndarray:
    """`x` when its elements lie in [lo, hi] of a CheckRange's `attrs` (RuntimeInputError naming the
    value and the range otherwise), negative elements plus `wrap`."""
    lo, hi, wrap = int(attrs["lo"]), int(attrs["hi"]), int(attrs.get("wrap", 0))
    x = np.asarray(x)
    bad = (x < lo) | (x > hi)
    if bad.any():
        value = x[bad].reshape(-1)[0].item()
        raise RuntimeInputError(f"{attrs['what']} is {value}, outside its range [{lo}, {hi}]",
                                where=where, hint=f"feed a value in [{lo}, {hi}]")
    return np.where(x < 0, x + wrap, x).astype(x.dtype) if wrap else x.copy()


def chosen(attrs: Mapping[str, Any], index: np.ndarray, count: int, where: str) -> list[int]:
    """The candidate each of a SelectByIndex's `count` outputs takes: index[j], which must be one of
    row j of its `choices`."""
    width, choices = int(attrs["width"]), [int(c) for c in attrs["choices"]]
    flat = np.asarray(index).reshape(-1)
    if flat.size != count:
        raise RuntimeInputError(f"the index holds {flat.size} entries for {count} outputs", where=where,
                                hint="the index gives one candidate per output")
    picks = []
    for j, c in enumerate(int(v) for v in flat):
        row = [r for r in choices[j * width:(j + 1) * width] if r >= 0]
        if c not in row:
            raise RuntimeInputError(f"output {j} takes candidate {c}, not one of {row}", where=where,
                                    hint="check the index's range first (CheckRange)")
        picks.append(c)
    return picks


@reference(CHECK_RANGE, domain=POLYKIT_DOMAIN)
def check_range(node: Node, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [checked(node.attrs, inputs[0], node.describe())]


@reference(SELECT_BY_INDEX, domain=POLYKIT_DOMAIN)
def select_by_index(node: Node, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.array(inputs[1 + c]) for c in chosen(node.attrs, inputs[0], len(node.outputs), node.describe())]
