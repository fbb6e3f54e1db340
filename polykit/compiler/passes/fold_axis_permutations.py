"""fold_axis_permutations: a Reshape -> Transpose -> Reshape that only reorders one axis becomes a Gather.

ShuffleNet's channel shuffle is `x.view(N, g, C / g, H, W).transpose(1, 2).reshape(N, C, H, W)`:
a rank-5 detour that reorders the channels. When the first Reshape splits one axis `a` of X into
consecutive factors (the other dims as they are), the Transpose permutes only those factors among
themselves and the second Reshape gives X's shape back, the three are `Gather(X, idx, axis=a)` with
the constant `idx = arange(X.shape[a]).reshape(factors).transpose(their perm).reshape(-1)`: one
copy either way, but a Gather on rank-4 tensors is layout-free (plan_layouts runs it on the NHWC
channel axis), where the rank-5 Transpose pins the region to NCHW. The intermediates must be read
only inside the chain and not be kept.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.cancel_transposes import perm_of
from polykit.compiler.passes.rewrite import protected, sole_reader


def _split_axis(before: tuple, after: tuple) -> tuple[int, int] | None:
    """(axis, factor count) when `after` is `before` with one axis split into two or more dims."""
    if len(after) <= len(before):
        return None
    extra = len(after) - len(before)
    for a in range(len(before)):
        if (after[:a] == before[:a] and after[a + extra + 1:] == before[a + 1:]
                and int(np.prod(after[a:a + extra + 1])) == before[a]):
            return a, extra + 1
    return None


def axis_permutation(graph: Graph, first: Node, readers: dict[str, list[Node]],
                     fixed: set[str]) -> tuple[Node, Node, int, np.ndarray] | None:
    """(the Transpose, the last Reshape, the axis, the index) of a chain starting at Reshape `first`
    that only reorders one axis of its input, or None."""
    if first.op_type != "Reshape" or first.domain != "":
        return None
    transpose = sole_reader(graph, first.outputs[0], readers, fixed)
    perm = perm_of(graph, transpose) if transpose is not None else None
    last = sole_reader(graph, transpose.outputs[0], readers, fixed) if perm is not None else None
    if last is None or last.op_type != "Reshape" or last.domain != "":
        return None
    shapes = [graph.value(n).shape for n in (first.input(0), first.outputs[0], last.outputs[0])]
    if any(s is None or not all(isinstance(d, int) for d in s) for s in shapes) or shapes[2] != shapes[0]:
        return None
    split = _split_axis(tuple(shapes[0]), tuple(shapes[1]))
    if split is None:
        return None
    axis, count = split
    inside = list(range(axis, axis + count))
    if [p for p in perm if p not in inside] != [p for p in range(len(perm)) if p not in inside] \
            or sorted(perm[axis:axis + count]) != inside:
        return None  # it moves another axis, or moves a factor out of the split axis's place
    local = [p - axis for p in perm[axis:axis + count]]
    idx = np.arange(shapes[0][axis]).reshape(shapes[1][axis:axis + count]).transpose(local).reshape(-1)
    return transpose, last, axis, idx


def fold_axis_permutations(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace each Reshape -> Transpose -> Reshape that reorders one axis by a Gather; True if any."""
    fixed = protected(graph, keep)
    readers = graph.consumers()
    dead: list[Node] = []
    for node in list(graph.nodes):
        found = axis_permutation(graph, node, readers, fixed)
        if found is None:
            continue
        transpose, last, axis, idx = found
        index = graph.add_initializer(idx.astype(np.int64), f"{last.name}_order")
        graph.nodes[graph.nodes.index(last)] = Node("Gather", [node.input(0), index], list(last.outputs),
                                                    {"axis": axis}, name=last.name)
        dead += [node, transpose]
    graph.remove_nodes(dead)
    return bool(dead)
