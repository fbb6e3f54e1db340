"""fuse_movement: rolls, windows and transposes between views become single PermutedCopy layers.

Rules (static shapes only; format of the op: polykit.compiler.ops.tensor.permuted_copy):

0, 1. Slices of slices, rolls (torch.roll, rotate_half) and concatenated phases of a strided slicing
   become PermutedCopy nodes: polykit.compiler.passes.recognize_roll.
2. *Window selection*: a Gather with a scalar constant index, a step-1 Slice with constant bounds
   or a Split (each of its outputs) of the output of a Transpose or PermutedCopy (one that reshapes
   nothing between its window and its output and rolls no output axis; views that only add or
   drop size-1 dims may sit between) reads its element range straight from the producer's input:
   a PermutedCopy with that axis's start moved and window narrowed (Swin's and ViT's q, k, v =
   qkv[0], qkv[1], qkv[2], timm's qkv.unbind(0) as a Split, of a transposed projection: three
   copies of a third, no Transpose).
3. *Compose with readers*: a Transpose or PermutedCopy reading the whole of its input, where that
   input is (through Reshape / Flatten / Squeeze / Unsqueeze views) the output of a PermutedCopy that
   only selects and rolls (no perm but of size-1 dims, no output roll), reads that copy's input
   instead (Swin's window partition: roll, reshape, transpose, reshape is one copy; ViT's head
   transposes of the selected q, k, v). Two rolls of the same shape add up. A Transpose directly
   after a PermutedCopy that ends in its permuted view composes the perms (Swin's k^T of a
   selected k).
4. *Compose with a following roll*: a PermutedCopy that only rolls its output, reading (through
   views) the output of a Transpose or of a PermutedCopy that rolls no output axis, becomes that
   producer with the roll on its output (the window merge: reshape, transpose, reshape, roll back).
5. A PermutedCopy or Transpose that reads its whole input, rolls nothing and moves only size-1 dims
   is a Reshape (a view: ViT's [1, S, D] <-> [S, 1, D] transposes).

The intermediate tensors of rules 3 and 4 must have no other reader and not be kept; the rules
repeat until nothing changes, then what nobody reads any more (a roll's Slices) goes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.tensor.layout import split_sizes
from polykit.compiler.ops.tensor.permuted_copy import PERMUTED_COPY, CopySpec, copy_spec
from polykit.compiler.passes.cancel_transposes import perm_of
from polykit.compiler.passes.eliminate_dead_code import eliminate_dead_code
from polykit.compiler.passes.recognize_roll import (compose_slices, copy_node, recognize_rolls, replace_node,
                                                    slice_range, static_shape)
from polykit.compiler.passes.rewrite import const, protected

VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
#: sweeps over the graph before giving up (each applies every rule that matches)
MAX_SWEEPS = 16


def fuse_movement(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Apply the rules above until nothing changes; True if the graph changed."""
    fixed = protected(graph, keep)
    changed = False
    for _ in range(MAX_SWEEPS):
        step = False
        for rule in (compose_slices, recognize_rolls, _window_selections, _compose_readers, _compose_rolls, _plain_reshapes):
            step |= rule(graph, fixed)
        changed |= step
        if not step:
            break
    if changed:  # the Slices of a roll, a Transpose whose selections all moved: nobody reads them now
        eliminate_dead_code(graph, keep=keep)
    return changed


# ---- helpers --------------------------------------------------------------------------------
def spec_of(graph: Graph, node: Node) -> CopySpec | None:
    """A Transpose or PermutedCopy as a CopySpec over its static input shape (None otherwise)."""
    shape = static_shape(graph, node.input(0)) if node.inputs else None
    if shape is None:
        return None
    if node.domain == POLYKIT_DOMAIN and node.op_type == PERMUTED_COPY:
        try:
            return copy_spec(node.attrs, shape)
        except ValueError:
            return None
    perm = perm_of(graph, node)
    if perm is None or len(perm) != len(shape):
        return None
    return copy_spec({"perm": perm}, shape)

def _whole(spec: CopySpec) -> bool:
    """Reads its whole input from the start (no window, no roll on the input side)."""
    return not any(spec.starts) and spec.window == spec.in_shape


def _without_unit_dims(spec: CopySpec) -> CopySpec:
    """`spec` with the size-1 dims of its view left out (a view is any reshape of the window)."""
    keep = [i for i, d in enumerate(spec.view) if d != 1]
    return replace(spec, view=tuple(spec.view[i] for i in keep),
                   perm=tuple(keep.index(p) for p in spec.perm if spec.view[p] != 1))


def _plain_transpose(spec: CopySpec) -> bool:
    """A transpose of the whole input, nothing reshaped or rolled."""
    return _whole(spec) and spec.view == spec.in_shape and not any(spec.out_shifts) \
        and spec.shape == tuple(spec.view[p] for p in spec.perm)


def _selects_only(spec: CopySpec) -> bool:
    """Selects (window, roll) and reshapes, but permutes (size-1 dims aside) and rolls no output axis."""
    perm = _without_unit_dims(spec).perm
    return list(perm) == list(range(len(perm))) and not any(spec.out_shifts)


def _through_views(graph: Graph, name: str, producers: dict, readers: dict, fixed: set[str]) -> tuple[str, list[Node]]:
    """Walk up from `name` through views whose output only the next step reads; (the tensor above
    them, the views passed)."""
    views: list[Node] = []
    while True:
        node = producers.get(name)
        if node is None or node.domain or node.op_type not in VIEW_OPS or name in fixed \
                or len(readers.get(name, [])) != 1 or static_shape(graph, node.input(0)) is None:
            return name, views
        views.append(node)
        name = node.input(0)


def _view_source(graph: Graph, name: str, producers: dict) -> str:
    """The tensor above `name` and the views (of static shapes) that lead from it to `name`."""
    node = producers.get(name)
    while node is not None and not node.domain and node.op_type in VIEW_OPS and static_shape(graph, node.input(0)):
        name = node.input(0)
        node = producers.get(name)
    return name


def _sole_producer(graph: Graph, name: str, producers: dict, readers: dict, fixed: set[str]) -> Node | None:
    node = producers.get(name)
    if node is None or name in fixed or len(readers.get(name, [])) != 1:
        return None
    return node

# ---- rule 2: window selections of a transposed tensor ----------------------------------------------
def selection(graph: Graph, node: Node, shape: Sequence[int]) -> tuple[int, list[tuple[int, int]]] | None:
    """(axis, [(first, count) per output]) of a Gather with a scalar constant index, a step-1
    constant Slice or a Split with constant sizes (None otherwise)."""
    if node.op_type == "Gather" and len(node.inputs) == 2:
        index = const(graph, node.input(1))
        if index is None or index.ndim != 0 or index.dtype.kind not in "iu":
            return None
        axis = int(node.attrs.get("axis", 0))
        axis = axis + len(shape) if axis < 0 else axis
        k = int(index)
        k = k + shape[axis] if 0 <= axis < len(shape) and k < 0 else k
        return (axis, [(k, 1)]) if 0 <= axis < len(shape) and 0 <= k < shape[axis] else None
    if node.op_type == "Slice":
        rng = slice_range(graph, node, shape)
        return (rng[0], [(rng[1], rng[2] - rng[1])]) if rng is not None and rng[2] > rng[1] else None
    if node.op_type == "Split" and all(node.outputs):
        axis = int(node.attrs.get("axis", 0))
        axis = axis + len(shape) if axis < 0 else axis
        sizes = const(graph, node.input(1)) if node.input(1) else None
        if not 0 <= axis < len(shape) or (node.input(1) and sizes is None):
            return None
        sizes = split_sizes(shape[axis], len(node.outputs), None if sizes is None else [int(v) for v in sizes])
        if sizes is None or 0 in sizes:
            return None
        firsts = np.cumsum([0] + sizes[:-1])
        return axis, [(int(f), n) for f, n in zip(firsts, sizes)]
    return None


def _window_selections(graph: Graph, fixed: set[str]) -> bool:
    producers = graph.producers()
    changed = False
    for node in list(graph.nodes):
        if node.domain or node.op_type not in ("Gather", "Slice", "Split") or not node.inputs:
            continue
        top = _view_source(graph, node.input(0), producers)
        prod = producers.get(top)
        spec = spec_of(graph, prod) if prod is not None else None
        seen = static_shape(graph, node.input(0))
        if spec is None or seen is None or spec.view != spec.window or any(spec.out_shifts) \
                or spec.shape != tuple(spec.view[p] for p in spec.perm):
            continue
        sel = selection(graph, node, seen)
        big = [a for a, d in enumerate(spec.shape) if d != 1]  # the views between add or drop size-1 dims only
        outs = [static_shape(graph, o) for o in node.outputs]
        if sel is None or [d for d in seen if d != 1] != [spec.shape[a] for a in big] or None in outs:
            continue
        axis, pieces = sel
        if seen[axis] == 1:
            continue
        b = spec.perm[big[sum(1 for d in seen[:axis] if d != 1)]]
        copies = []
        for out, shape, (first, count) in zip(node.outputs, outs, pieces):
            starts, window = list(spec.starts), list(spec.window)
            starts[b] = (starts[b] + first) % max(spec.in_shape[b], 1)
            window[b] = count
            new = copy_spec({"starts": starts, "window": window, "perm": list(spec.perm), "shape": list(shape)},
                            spec.in_shape)
            copies.append(copy_node(graph, prod.input(0), out, new, node))
        at = graph.nodes.index(node)
        graph.nodes[at:at + 1] = copies
        changed = True
    return changed


# ---- rules 3 and 4: composition through views ----------------------------------------------------
def repeat_step(step, graph: Graph, fixed: set[str]) -> bool:
    """Apply `step` (one composition, then its maps are stale) until it finds nothing; each removes a node."""
    changed = False
    for _ in range(len(graph.nodes)):
        if not step(graph, fixed):
            break
        changed = True
    return changed


def _compose_readers(graph: Graph, fixed: set[str]) -> bool:
    return repeat_step(_compose_reader, graph, fixed)


def _compose_reader(graph: Graph, fixed: set[str]) -> bool:
    producers, readers = graph.producers(), graph.consumers()
    for node in graph.nodes:
        spec = spec_of(graph, node)
        if spec is None:
            continue
        top, views = _through_views(graph, node.input(0), producers, readers, fixed)
        prod = _sole_producer(graph, top, producers, readers, fixed)
        first = spec_of(graph, prod) if prod is not None and prod.op_type == PERMUTED_COPY else None
        if first is None:
            continue
        if not _selects_only(first):
            first = _without_unit_dims(first)
            if views or not _plain_transpose(spec) or any(first.out_shifts) \
                    or first.shape != tuple(first.view[p] for p in first.perm):
                continue
            new = replace(first, perm=tuple(first.perm[q] for q in spec.perm), shape=spec.shape,
                          out_shifts=(0,) * len(spec.shape))
        elif _whole(spec):
            new = CopySpec(first.in_shape, first.starts, first.window, spec.view, spec.perm, spec.shape,
                           spec.out_shifts)
        elif spec.in_shape == first.in_shape and first.window == first.in_shape and spec.window == spec.in_shape:
            starts = tuple((a + b) % max(d, 1) for a, b, d in zip(first.starts, spec.starts, spec.in_shape))
            new = CopySpec(first.in_shape, starts, spec.window, spec.view, spec.perm, spec.shape, spec.out_shifts)
        else:
            continue
        replace_node(graph, node, copy_node(graph, prod.input(0), node.outputs[0], new, node))
        graph.remove_nodes([prod, *views])
        return True  # producers/readers are stale: repeat_step calls again
    return False


def _as_output_roll(spec: CopySpec | None) -> CopySpec | None:
    """`spec` as a roll of its (reshaped) input on the output side, when it is one: no window,
    no perm, and input-side starts only where the output has the input's shape (then a start s is
    an output shift of -s)."""
    if spec is None or spec.window != spec.in_shape or list(spec.perm) != list(range(len(spec.perm))):
        return None
    if any(spec.starts):
        if spec.shape != spec.in_shape:
            return None
        shifts = tuple((o - s) % max(d, 1) for o, s, d in zip(spec.out_shifts, spec.starts, spec.shape))
        spec = CopySpec(spec.in_shape, (0,) * len(spec.starts), spec.window, spec.view, spec.perm, spec.shape,
                        shifts)
    return spec if any(spec.out_shifts) else None


def _compose_rolls(graph: Graph, fixed: set[str]) -> bool:
    return repeat_step(_compose_roll, graph, fixed)


def _compose_roll(graph: Graph, fixed: set[str]) -> bool:
    producers, readers = graph.producers(), graph.consumers()
    for node in graph.nodes:
        spec = _as_output_roll(spec_of(graph, node)) if node.op_type == PERMUTED_COPY else None
        if spec is None:
            continue
        top, views = _through_views(graph, node.input(0), producers, readers, fixed)
        prod = _sole_producer(graph, top, producers, readers, fixed)
        first = spec_of(graph, prod) if prod is not None else None
        if first is None:
            continue
        if not any(first.out_shifts):
            shifts = spec.out_shifts
        elif first.shape == spec.shape:
            shifts = tuple((a + b) % max(d, 1) for a, b, d in zip(first.out_shifts, spec.out_shifts, spec.shape))
        else:
            continue
        new = CopySpec(first.in_shape, first.starts, first.window, first.view, first.perm, spec.shape, shifts)
        replace_node(graph, node, copy_node(graph, prod.input(0), node.outputs[0], new, node))
        graph.remove_nodes([prod, *views])
        return True
    return False


# ---- rule 5 ---------------------------------------------------------------------------------------
def _plain_reshapes(graph: Graph, fixed: set[str]) -> bool:
    changed = False
    for node in list(graph.nodes):
        spec = spec_of(graph, node) if node.op_type in (PERMUTED_COPY, "Transpose") else None
        if spec is None or not _whole(spec) or not _selects_only(spec):
            continue
        shape = graph.fresh_name(f"{node.name}_shape")
        graph.initializers[shape] = np.array(spec.shape, np.int64)
        replace_node(graph, node, Node("Reshape", [node.input(0), shape], list(node.outputs), {}, name=node.name))
        changed = True
    return changed
