"""The reference-kernel table: one exact numpy implementation per op.

A reference kernel is `fn(node, inputs) -> list of outputs`: `inputs` holds one numpy
array per node input (None for an omitted optional input), and attributes come from
`node.attrs` (defaults applied by the kernel). It serves constant folding, the cpu target
and every CUDA kernel test as the oracle, so it favours clarity and exactness over speed.
Kernels register through the `polykit_ops` plugin hook (polykit.compiler.ops.registry.load_ops).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from polykit.compiler.ir.graph import Node

ReferenceFn = Callable[[Node, Sequence["np.ndarray | None"]], "list[np.ndarray]"]

REFERENCE: dict[tuple[str, str], ReferenceFn] = {}


def reference(*op_types: str, domain: str = "") -> Callable[[ReferenceFn], ReferenceFn]:
    """Register `fn` as the reference kernel of each op in `op_types`."""

    from polykit.compiler.ops.registry import refuse_duplicate

    def register(fn: ReferenceFn) -> ReferenceFn:
        for op in op_types:
            key = ("" if domain == "ai.onnx" else domain, op)
            if not refuse_duplicate(REFERENCE.get(key), fn, f"reference kernel of {domain or 'ai.onnx'}::{op}"):
                REFERENCE[key] = fn
        return fn

    return register


def find_reference(domain: str, op_type: str) -> ReferenceFn | None:
    from polykit.compiler.ops.registry import load_ops

    load_ops()
    return REFERENCE.get(("" if domain == "ai.onnx" else domain, op_type))


def run_reference(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Run the reference kernel of `node`; KeyError-free: raises PolykitError if unknown."""
    from polykit.errors import UnsupportedModelError

    fn = find_reference(node.domain, node.op_type)
    if fn is None:
        raise UnsupportedModelError([(node.name, node.op_type, node.domain, 0)])
    with np.errstate(all="ignore"):  # IEEE semantics, as ONNX has them: inf and NaN in, inf and NaN out, no warning
        return [as_value(o) for o in fn(node, inputs)]


def as_value(value: object) -> object:
    """A kernel's output as a runtime value: an array, or a sequence (a list of arrays) or an
    empty optional (None) as they are (polykit.compiler.ir.sequences)."""
    if value is None or isinstance(value, list):
        return value
    return np.asarray(value)
