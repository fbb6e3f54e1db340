"""recognize_roll: slicings that move whole blocks become PermutedCopy nodes (rules 0 and 1 of
fuse_movement, which runs them; format of the op: polykit.compiler.ops.tensor.permuted_copy).

0. A Slice of a Slice (constant inputs, positive steps) is one Slice of the first one's input.
1. *Roll*: a Concat along axis a of step-1 Slices of one tensor x that keep all of x but axis a and
   whose pieces follow each other cyclically (torch.roll exports Concat(x[k:], x[:k])) is one
   PermutedCopy reading x from `starts_a` = the first piece's start, `window_a` = their total.
   Pieces may be negated (rotary embeddings' rotate_half: cat(-x[.., d/2:], x[.., :d/2])): the copy
   is then multiplied by a constant of signs along the axis, an elementwise op that fuses onward.
   A Concat of every phase of a strided slicing (x[.., p::k, ..] for p < k on one or more axes, the
   phases in the order of some nesting of those axes: space-to-depth, Swin's patch merging) is one
   PermutedCopy of x viewed as [.., d/k, k, ..] with the phase dims moved next to the Concat axis.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.tensor.layout import slice_bounds
from polykit.compiler.ops.tensor.permuted_copy import PERMUTED_COPY, CopySpec, copy_spec
from polykit.compiler.passes.rewrite import const


def static_shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    shape = graph.value(name).shape
    if shape is None or not all(type(d) is int for d in shape):  # a SymInt is an int subclass
        return None
    return tuple(shape)


def _attrs(spec: CopySpec) -> dict:
    """A spec's attributes, defaults left out."""
    attrs: dict = {"shape": list(spec.shape)}
    if any(spec.starts):
        attrs["starts"] = list(spec.starts)
    if spec.window != spec.in_shape:
        attrs["window"] = list(spec.window)
    if spec.view != spec.window:
        attrs["view"] = list(spec.view)
    if list(spec.perm) != list(range(len(spec.view))):
        attrs["perm"] = list(spec.perm)
    if any(spec.out_shifts):
        attrs["out_shifts"] = list(spec.out_shifts)
    return attrs


def copy_node(graph: Graph, src: str, out: str, spec: CopySpec, like: Node) -> Node:
    return Node(PERMUTED_COPY, [src], [out], _attrs(spec), name=graph.fresh_name(f"{like.name or 'movement'}_copy"),
                domain=POLYKIT_DOMAIN)


def replace_node(graph: Graph, old: Node, new: Node) -> None:
    graph.nodes[graph.nodes.index(old)] = new


# ---- rule 0: a Slice of a Slice --------------------------------------------------------------------
def compose_slices(graph: Graph, fixed: set[str]) -> bool:
    """Slice(Slice(x)) with constant inputs and positive steps -> one Slice of x (the inner one goes
    when nothing else reads it); torch exports x[:, a::2, b::2] so, and the phases then meet in rule 1b."""
    producers = graph.producers()
    changed = False
    for node in list(graph.nodes):
        inner = producers.get(node.input(0)) if node.op_type == "Slice" and not node.domain else None
        src = inner.input(0) if inner is not None else ""
        shape, mid = static_shape(graph, src) if src else None, static_shape(graph, node.input(0))
        first = slice_axes(graph, inner, shape) if inner is not None and shape is not None else None
        second = slice_axes(graph, node, mid) if first is not None and mid is not None else None
        if second is None:
            continue
        cut = [(a0 + b0 * a1, a1 * b1, bn) for (a0, a1, _), (b0, b1, bn) in zip(first, second)]
        consts = []
        for role, values in (("starts", [c[0] for c in cut]), ("ends", [c[0] + (c[2] - 1) * c[1] + 1 if c[2] else c[0]
                                                                         for c in cut]),
                             ("axes", list(range(len(cut)))), ("steps", [c[1] for c in cut])):
            name = graph.fresh_name(f"{node.name}_{role}")
            graph.initializers[name] = np.array(values, np.int64)
            consts.append(name)
        replace_node(graph, node, Node("Slice", [src, *consts], list(node.outputs), {}, name=node.name))
        if inner.outputs[0] not in fixed and not any(inner.outputs[0] in n.inputs for n in graph.nodes):
            graph.remove_nodes([inner])
        changed = True
    return changed


# ---- rule 1: rolls ----------------------------------------------------------------------------
def slice_axes(graph: Graph, node: Node, shape: Sequence[int]) -> list[tuple[int, int, int]] | None:
    """(first, step, count) on every axis of a Slice with constant inputs and positive steps."""
    if node.domain or node.op_type != "Slice" or len(node.inputs) < 3:
        return None
    starts, ends, axes, steps = (const(graph, node.input(i)) for i in range(1, 5))
    if starts is None or ends is None or (node.input(3) and axes is None) or (node.input(4) and steps is None):
        return None
    n = starts.size
    axes = [int(a) for a in axes.reshape(-1)] if axes is not None else list(range(n))
    steps = [int(s) for s in steps.reshape(-1)] if steps is not None else [1] * n
    out = [(0, 1, d) for d in shape]
    for a, s, e, st in zip(axes, starts.reshape(-1), ends.reshape(-1), steps):
        a = a + len(shape) if a < 0 else a
        if st < 1 or not 0 <= a < len(shape):
            return None
        lo, hi = slice_bounds(shape[a], int(s), int(e), st)
        out[a] = (lo, st, max(-(-(hi - lo) // st), 0))
    return out


def slice_range(graph: Graph, node: Node, shape: Sequence[int]) -> tuple[int, int, int] | None:
    """(axis, start, stop) of a step-1 constant Slice that keeps every axis but one whole."""
    cut = slice_axes(graph, node, shape)
    if cut is None or any(step != 1 for _, step, _ in cut):
        return None
    cut = [(a, lo, lo + count) for a, (lo, _, count) in enumerate(cut) if (lo, count) != (0, shape[a])]
    return cut[0] if len(cut) == 1 else None


def _sole_neg(graph: Graph, node: Node | None, readers: dict, fixed: set[str]) -> Node | None:
    """`node` when it is a Neg whose output only the Concat reads."""
    if node is None or node.domain or node.op_type != "Neg" or node.outputs[0] in fixed \
            or len(readers.get(node.outputs[0], [])) != 1:
        return None
    return node


def recognize_rolls(graph: Graph, fixed: set[str]) -> bool:
    producers, readers = graph.producers(), graph.consumers()
    changed = False
    for node in list(graph.nodes):
        if node.domain or node.op_type != "Concat" or len(node.inputs) < 2 or not all(node.inputs):
            continue
        pieces = [producers.get(name) for name in node.inputs]
        negs = [_sole_neg(graph, p, readers, fixed) for p in pieces]
        pieces = [producers.get(n.input(0)) if n is not None else p for p, n in zip(pieces, negs)]
        if any(p is None for p in pieces) or len({p.input(0) for p in pieces}) != 1:
            continue
        src = pieces[0].input(0)
        shape = static_shape(graph, src)
        if shape is None or not shape:
            continue
        axis = int(node.attrs.get("axis", 0))
        axis = axis + len(shape) if axis < 0 else axis
        ranges = [slice_range(graph, p, shape) for p in pieces]
        if any(r is None or r[0] != axis or r[2] == r[1] for r in ranges):
            spec = _phase_concat(graph, node, pieces, shape) if not any(negs) else None
            if spec is not None:
                _replace_concat(graph, node, pieces, src, spec, fixed)
                changed = True
            continue
        dim = shape[axis]
        if any(ranges[i][2] % dim != ranges[i + 1][1] for i in range(len(ranges) - 1)):
            continue
        total = sum(hi - lo for _, lo, hi in ranges)
        if total > dim:
            continue
        window = list(shape)
        window[axis] = total
        starts = [0] * len(shape)
        starts[axis] = ranges[0][1] % dim
        spec = copy_spec({"starts": starts, "window": window}, shape)
        if any(negs):  # rotate_half: cat(-x2, x1) is roll(x) times a sign per position on the axis
            sign = np.concatenate([np.full(hi - lo, -1 if n is not None else 1) for (_, lo, hi), n in zip(ranges, negs)])
            signs = graph.fresh_name(f"{node.name}_signs")
            graph.initializers[signs] = sign.reshape((-1,) + (1,) * (len(shape) - axis - 1)).astype(graph.value(src).dtype)
            rolled = graph.fresh_name(f"{node.outputs[0]}_rolled")
            copy = _replace_concat(graph, node, pieces, src, spec, fixed, rolled)
            graph.nodes.insert(graph.nodes.index(copy) + 1,
                               Node("Mul", [rolled, signs], [node.outputs[0]], {}, name=f"{node.name}_signs"))
            graph.remove_nodes([n for n in negs if n is not None])
        else:
            _replace_concat(graph, node, pieces, src, spec, fixed)
        changed = True
    return changed


def _replace_concat(graph: Graph, node: Node, pieces: list[Node], src: str, spec: CopySpec, fixed: set[str],
                    out: str = "") -> Node:
    """`node` (a Concat) becomes a PermutedCopy of `src` (writing `out`, default the Concat's output),
    returned; its pieces go when nothing else reads them."""
    copy = copy_node(graph, src, out or node.outputs[0], spec, node)
    replace_node(graph, node, copy)
    readers = graph.consumers()
    graph.remove_nodes([p for p in {id(p): p for p in pieces}.values() if p.outputs[0] not in fixed
                        and not readers.get(p.outputs[0])])
    return copy


# ---- rule 1b: every phase of a strided slicing, concatenated ------------------------------------
def _phase_concat(graph: Graph, node: Node, pieces: list[Node], shape: tuple[int, ...]) -> CopySpec | None:
    """The PermutedCopy of Concat(x[.., p0::k0, .., p1::k1, ..] for every phase (p0, p1, ..)) when the
    phases come in the order of some nesting of the stepped axes (space-to-depth, Swin's patch merging)."""
    cuts = [slice_axes(graph, p, shape) for p in pieces]
    if any(c is None for c in cuts):
        return None
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    steps = [c[1] for c in cuts[0]]
    stepped = [a for a, k in enumerate(steps) if k > 1]
    if not stepped or axis in stepped or len(pieces) != math.prod(steps[a] for a in stepped):
        return None
    phases = []
    for cut in cuts:
        for a, (lo, step, count) in enumerate(cut):
            whole = (lo, step, count) == (0, 1, shape[a])
            if step != steps[a] or (a not in stepped and not whole) or (a in stepped and (
                    shape[a] % step or lo >= step or count != shape[a] // step)):
                return None
        phases.append(tuple(cut[a][0] for a in stepped))
    for order in itertools.permutations(range(len(stepped))):  # which stepped axis is outermost in the concat
        nested = itertools.product(*(range(steps[stepped[o]]) for o in order))
        if phases == [tuple(t[order.index(i)] for i in range(len(stepped))) for t in nested]:
            break
    else:
        return None
    view, position = [], {}  # x as [.., d/k, k, ..]; position: (axis, part) -> view dim
    for a, d in enumerate(shape):
        for part, size in (((0, d // steps[a]), (1, steps[a])) if a in stepped else ((0, d),)):
            position[a, part] = len(view)
            view.append(size)
    perm = []
    for a in range(len(shape)):
        if a == axis:
            perm += [position[stepped[o], 1] for o in order]
        perm.append(position[a, 0])
    out = [d // steps[a] for a, d in enumerate(shape)]
    out[axis] *= len(pieces)
    return copy_spec({"view": view, "perm": perm, "shape": out}, shape)
