"""norm_row_maps: a row-permuting copy of a norm's output becomes the norm's row map, a copy before it its input map.

A LayerNormalization or RMSNormalization writes whole rows (its normalized axes, contiguous). A
Transpose or PermutedCopy that reads such a norm's output (through Reshape / Flatten / Squeeze /
Unsqueeze views), where nothing else reads the norm's output or the views and the norm's statistics
outputs are unread, only moves those rows when each of its output rows (its trailing elements, one
norm row's worth) is a whole input row: the norm then writes its rows to the copy's positions
itself (ai.polykit LayerNormalization / RMSNormalization with `row_map`, ops/nn/norm_row_map.py)
and the copy goes. Swin's window partitions: [B, h, 7, w, 7, C] perm [0, 1, 3, 2, 4, 5] of norm1's
output, and the shifted blocks' rolled ones (a PermutedCopy), each read by the QKV MatMul.

The copy's row permutation is found from its own semantics (the reference of the copy over an index
array), then fitted to the row map's form: per row dim (the copy's input dims above the row, or the
norm's), a cyclic shift and a mixed-radix split into at most two pieces with strides, dims without a
shift split further as needed; a copy whose permutation is no such map (it mixes dims or selects a
window) stays. A norm that has a map already composes the copy into it.

Then a Transpose / PermutedCopy whose output (through such views) only a norm reads, where it reads
each norm row as runs of S contiguous elements of its input (the longest such S dividing the row,
S-aligned; S at least 16 bytes), folds into the norm's `in_map`: the runs' sources fitted the same way, with an offset
(Swin's patch merging: [B, H, W, C] read as [B, H/2, W/2, 4C] in runs of C). Static shapes only; kept
tensors keep their names.
"""

from __future__ import annotations

import math

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.nn.norm_row_map import (IN_MAP, MAX_ROW_DIMS, NORM_KINDS, ROW_MAP, input_index,
                                                   logical_input, row_destinations)
from polykit.compiler.ops.nn.view_operands import fit_dims, view_index
from polykit.compiler.ops.tensor.permuted_copy import PERMUTED_COPY, CopySpec
from polykit.compiler.ops.tensor.permuted_copy_reference import permuted_copy
from polykit.compiler.passes.fuse_movement import repeat_step, spec_of
from polykit.compiler.passes.recognize_roll import static_shape
from polykit.compiler.passes.rewrite import protected

COPIES = frozenset({("", "Transpose"), (POLYKIT_DOMAIN, PERMUTED_COPY)})
SPEC_KEYS = ("starts", "window", "view", "perm", "shape", "out_shifts")
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
#: elements a copy may hold for its permutation to be computed (an index array of that many)
MAX_ELEMENTS = 1 << 26
#: bytes an input map's run holds at least (one 16-byte vector: the norm's reads stay coalesced;
#: shorter runs, a transpose that moves the normalized axis, are left to the copy kernels' tiles)
MIN_RUN_BYTES = 16


def fold_norm_row_maps(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Fold every row-permuting copy of a norm's output into the norm (rules above); True if changed."""
    fixed = protected(graph, keep)
    return repeat_step(_fold_one, graph, fixed) | repeat_step(_fold_input, graph, fixed)


def _fold_one(graph: Graph, fixed: set[str]) -> bool:
    producers, readers = graph.producers(), graph.consumers()
    for node in graph.nodes:
        spec = spec_of(graph, node) if (node.domain, node.op_type) in COPIES else None
        if spec is None:
            continue
        name, views = _above_views(node.input(0), producers, readers, fixed)
        norm = producers.get(name)
        if norm is None or norm.op_type not in NORM_KINDS or not _sole(name, readers, fixed) \
                or norm.domain not in ("", POLYKIT_DOMAIN) or (norm.domain and ROW_MAP not in norm.attrs) \
                or any(o and (readers.get(o) or o in fixed) for o in norm.outputs[1:]):
            continue
        row_map = _folded_map(graph, norm, spec, static_shape(graph, node.outputs[0]))
        if row_map is None:
            continue
        attrs = {k: v for k, v in norm.attrs.items() if k != ROW_MAP}
        folded = Node(norm.op_type, list(norm.inputs), [node.outputs[0]], {**attrs, ROW_MAP: row_map},
                      name=norm.name, domain=POLYKIT_DOMAIN)
        graph.nodes[graph.nodes.index(norm)] = folded
        graph.remove_nodes([node, *views])
        return True  # producers / readers are stale
    return False


def _fold_input(graph: Graph, fixed: set[str]) -> bool:
    """Fold the copy that produces a norm's input (through views) into the norm's in_map."""
    producers, readers = graph.producers(), graph.consumers()
    for norm in graph.nodes:
        if norm.op_type not in NORM_KINDS or norm.domain not in ("", POLYKIT_DOMAIN) \
                or (norm.domain and ROW_MAP not in norm.attrs and IN_MAP not in norm.attrs) \
                or any(o and (readers.get(o) or o in fixed) for o in norm.outputs[1:]):
            continue
        name, views = _above_views(norm.input(0), producers, readers, fixed)
        copy = producers.get(name)
        spec = spec_of(graph, copy) if copy is not None and (copy.domain, copy.op_type) in COPIES else None
        if spec is None or not _sole(name, readers, fixed) or norm.inputs[1:].count(name) or copy.input(0) in fixed:
            continue
        in_map = _input_map(graph, norm, spec)
        if in_map is None:
            continue
        attrs = {**norm.attrs, IN_MAP: in_map}
        folded = Node(norm.op_type, [copy.input(0), *norm.inputs[1:]], [norm.outputs[0]], attrs, name=norm.name,
                      domain=POLYKIT_DOMAIN)
        graph.nodes[graph.nodes.index(norm)] = folded
        graph.remove_nodes([copy, *views])
        return True
    return False


def _input_map(graph: Graph, norm: Node, spec: CopySpec) -> dict | None:
    """`norm`'s in_map reading through the copy `spec` (its output the norm's input seen through
    views), or None when the copy's segments are no map."""
    x_shape = static_shape(graph, norm.input(0))
    size = math.prod(spec.in_shape)
    if x_shape is None or not x_shape or size > MAX_ELEMENTS or not size:
        return None
    logical = logical_input(norm.attrs, x_shape)
    axis = int(norm.attrs.get("axis", -1)) % len(logical)
    length = math.prod(logical[axis:])
    copy = Node(PERMUTED_COPY, ["x"], ["y"], {k: list(getattr(spec, k)) for k in SPEC_KEYS}, domain=POLYKIT_DOMAIN)
    src = permuted_copy(copy, [np.arange(size, dtype=np.int64).reshape(spec.in_shape)])[0].reshape(-1)
    if IN_MAP in norm.attrs:
        src = src[input_index(norm.attrs[IN_MAP], x_shape).reshape(-1)]
    for seg in (d for d in range(length, 0, -1) if length % d == 0):
        blocks = src.reshape(-1, seg)
        if np.array_equal(blocks, blocks[:, :1] + np.arange(seg)) and not (blocks[:, 0] % seg).any():
            break
    if seg * graph.value(norm.input(0)).dtype.itemsize < MIN_RUN_BYTES:
        return None
    first = blocks[:, 0] // seg
    view = tuple(spec.view[p] for p in spec.perm)
    for dims in (_row_dims(view, seg), (*logical[:axis], length // seg), (first.size,)):
        fitted = fit_map(first, dims) if dims is not None else None
        if fitted is not None:
            return {"segment": seg, "offset": fitted[1], "dims": fitted[0], "shape": list(logical)}
    return None


def _above_views(name: str, producers: dict, readers: dict, fixed: set[str]) -> tuple[str, list[Node]]:
    """The tensor above the Reshape-family views that lead (each output read by the next alone) to
    `name`, and those views."""
    views = []
    while (prod := producers.get(name)) is not None and not prod.domain and prod.op_type in VIEW_OPS \
            and _sole(name, readers, fixed):
        views.append(prod)
        name = prod.input(0)
    return name, views


def _sole(name: str, readers: dict, fixed: set[str]) -> bool:
    return name not in fixed and len(readers.get(name, [])) == 1


def _folded_map(graph: Graph, norm: Node, spec: CopySpec, out_shape: tuple[int, ...] | None) -> dict | None:
    """The row map of `norm` followed by the copy `spec` (its input the norm's output seen through
    views), or None when the copy moves anything but whole rows or the permutation is no map."""
    x_shape, in_shape = static_shape(graph, norm.input(0)), spec.in_shape
    if x_shape is None or out_shape is None or not x_shape:
        return None
    x_shape = logical_input(norm.attrs, x_shape)
    if not x_shape:
        return None
    axis = int(norm.attrs.get("axis", -1)) % len(x_shape)
    length, size = math.prod(x_shape[axis:]), math.prod(x_shape)
    if not length or size > MAX_ELEMENTS or math.prod(in_shape) != size or _row_dims(out_shape, length) is None:
        return None
    rows = size // length
    index = np.arange(size, dtype=np.int64).reshape(in_shape)
    copy = Node(PERMUTED_COPY, ["x"], ["y"], {k: list(getattr(spec, k)) for k in SPEC_KEYS}, domain=POLYKIT_DOMAIN)
    moved = permuted_copy(copy, [index])[0].reshape(-1, length) if size else np.zeros((0, length), np.int64)
    if moved.shape[0] != rows:
        return None
    src = moved[:, 0] // length  # output row o holds input row src[o] when every row moved whole
    if not np.array_equal(moved, src[:, None] * length + np.arange(length)) \
            or not np.array_equal(np.sort(src), np.arange(rows)):
        return None
    dest = np.empty(rows, np.int64)
    dest[src] = np.arange(rows)
    before = row_destinations(norm.attrs[ROW_MAP]) if ROW_MAP in norm.attrs else np.arange(rows)
    dest = dest[before]  # the copy moves the rows where the norm put them
    for dims in (_row_dims(in_shape, length), x_shape[:axis], (rows,)):
        fitted = fit_row_map(dest, dims) if dims is not None else None
        if fitted is not None:
            return {"dims": fitted, "shape": list(out_shape)}
    return None


def _row_dims(shape: tuple[int, ...], length: int) -> tuple[int, ...] | None:
    """The leading dims of `shape` above trailing dims that hold `length` elements (None if none do)."""
    tail = 1
    for k in range(len(shape), -1, -1):
        if tail == length:
            return shape[:k]
        if k == 0 or tail > length:
            return None
        tail *= shape[k - 1]
    return None


# ---- fitting a permutation to the map's form ---------------------------------------------------
def fit_row_map(dest: np.ndarray, dims) -> list[dict] | None:
    """`dest` (the destination of every row, rows split over `dims` row-major) as row map dims
    (outer first: {"shift", "pieces"}), or None when no map of at most MAX_ROW_DIMS dims gives it."""
    fitted = fit_map(dest, dims)
    return fitted[0] if fitted is not None and fitted[1] == 0 else None


def fit_map(values: np.ndarray, dims) -> tuple[list[dict], int] | None:
    """(map dims, offset) with view_index = `values` (split over `dims` row-major):
    view_operands.fit_dims per dim, then dims without a shift split to at most two pieces and
    neighbours that form one run merged; None when no such map of at most MAX_ROW_DIMS dims gives it."""
    dims = tuple(int(d) for d in dims if d != 1) or (1,)
    if math.prod(dims) != values.size:
        return None
    fitted = fit_dims(values.reshape(dims).astype(np.int64))
    if fitted is None or fitted[1] < 0:
        return None
    out: list[dict] = []
    for d in fitted[0]:
        if d["shift"] and len(d["pieces"]) > 2:
            return None
        out.extend([d] if d["shift"] or len(d["pieces"]) <= 2 else ({"shift": 0, "pieces": [p]} for p in d["pieces"]))
    out = _merged(out)
    if len(out) > MAX_ROW_DIMS or not np.array_equal(view_index({"offset": fitted[1], "dims": out}).reshape(-1),
                                                     values.reshape(-1)):
        return None
    return out, fitted[1]


def _merged(dims: list[dict]) -> list[dict]:
    """Neighbouring unshifted one-piece dims that form one run (outer stride = inner size x stride) as one."""
    out: list[dict] = []
    for d in dims:
        prev = out[-1] if out else None
        if prev is not None and not prev["shift"] and not d["shift"] and len(prev["pieces"]) == 1 \
                and len(d["pieces"]) == 1 and prev["pieces"][0][1] == d["pieces"][0][0] * d["pieces"][0][1]:
            size, stride = d["pieces"][0]
            prev["pieces"] = [[prev["pieces"][0][0] * size, stride]]
        else:
            out.append({"shift": d["shift"], "pieces": [list(p) for p in d["pieces"]]})
    return out
