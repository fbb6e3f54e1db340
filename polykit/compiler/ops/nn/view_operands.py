"""View operands of a fused Pointwise node (pass absorb_views, docs/FUSION.md).

A Pointwise node may read one of its body's values through a view of a stored tensor, so the
Transpose / PermutedCopy that made the value copies nothing. Attribute `view` is a list of
`{"name", "input", "offset", "dims"}`, one per view operand: node input `input` is the stored
tensor (the source, static shape, read row-major flat); `name` is the value the body reads (no
input of the node); `dims` lists, per logical dim of the operand (outer first), a
`{"shift", "pieces"}`: logical index `i` of that dim (extent n = the product of the piece sizes)
first shifts cyclically, `j = (i + shift) mod n`, then splits into digits over `pieces`
(`[[size, stride], ...]`, outer first, mixed radix), each digit times its element stride. The
element read is `offset + sum over dims of those products`. A transpose is one piece per dim, a
reshape-transpose-reshape (a window merge) several, a roll a shift: Swin's shifted window merge
rolls before its 7-split, so the shift comes first, then the split.

Rules (checked here; the kernels rely on them): the innermost dim of extent > 1 reads its
innermost piece at stride 1 (coalesced reads); a shifted dim has at most MAX_SHIFTED_PIECES
pieces; at most MAX_PIECES pieces in all; shift in [0, n); every element addressed lies inside
the source. A node has `view` or `concat` entries, not both; its inputs may repeat (a source
may also be a plain input). The *logical* inputs of such a node -- what the body sees -- are its
inputs with each view's `input` replaced by the view's `name`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.errors import NodeAttributeError

#: most pieces of a shifted dim (the kernel splits a shifted index once: outer and inner digit)
MAX_SHIFTED_PIECES = 2
#: most pieces of one view in all (the strided kernel's iteration dims)
MAX_PIECES = 8


def view_operands(attrs: Mapping[str, Any], n_inputs: int, where: str = "",
                  source_sizes: Sequence[int | None] | None = None) -> list[dict[str, Any]]:
    """The node's `view` entries, validated against its input count (and, where `source_sizes`
    gives the element count of each input, that every addressed element lies inside it); []
    without the attribute; NodeAttributeError when malformed."""
    entries = attrs.get("view") or []
    if not isinstance(entries, list):
        raise _bad(where, "attribute 'view' is not a list")
    if entries and attrs.get("concat"):
        raise _bad(where, "a node has 'view' or 'concat' operands, not both")
    names: set[str] = set()
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"] or e["name"] in names:
            raise _bad(where, f"view entry {e!r} has no name (or repeats one)")
        names.add(e["name"])
        problem = _entry_problem(e, n_inputs)
        if problem:
            raise _bad(where, f"view entry {e['name']!r}: {problem}")
        size = source_sizes[e["input"]] if source_sizes is not None else None
        if size is not None and last_element(e) >= size:
            raise _bad(where, f"view entry {e['name']!r} addresses element {last_element(e)}, past the {size} "
                       "elements of its source")
    return entries


def _ints(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _entry_problem(e: Mapping[str, Any], n_inputs: int) -> str:
    first, offset, dims = e.get("input"), e.get("offset"), e.get("dims")
    if not _ints(first) or not 0 <= first < n_inputs:
        return f"input {first!r} is not one of the node's {n_inputs} inputs"
    if not _ints(offset) or offset < 0:
        return f"offset {offset!r} must be an integer >= 0"
    if not isinstance(dims, list) or not dims:
        return "dims must be a non-empty list"
    total = 0
    for k, d in enumerate(dims):
        pieces = d.get("pieces") if isinstance(d, dict) else None
        if not isinstance(pieces, list) or not pieces or not all(
                isinstance(p, list) and len(p) == 2 and all(_ints(v) for v in p) and p[0] >= 1 and p[1] >= 0
                for p in pieces):
            return f"dim {k}: pieces must be [[size >= 1, stride >= 0], ...]"
        shift, n = d.get("shift"), math.prod(p[0] for p in pieces)
        if not _ints(shift) or not 0 <= shift < n:
            return f"dim {k}: shift {shift!r} must lie in [0, {n})"
        if shift and len(pieces) > MAX_SHIFTED_PIECES:
            return f"dim {k}: a shifted dim has at most {MAX_SHIFTED_PIECES} pieces"
        total += len(pieces)
    if total > MAX_PIECES:
        return f"{total} pieces; at most {MAX_PIECES}"
    inner = [d for d in dims if extent(d) > 1]
    if inner and inner[-1]["pieces"][-1][1] != 1:
        return "the innermost dim must read its innermost piece at stride 1 (coalesced)"
    return ""


def _bad(where: str, what: str) -> NodeAttributeError:
    return NodeAttributeError(what, where=where or None,
                              hint="the attribute is written by pass absorb_views; rebuild the plan from the model")


def extent(dim: Mapping[str, Any]) -> int:
    return math.prod(p[0] for p in dim["pieces"])


def view_shape(entry: Mapping[str, Any]) -> tuple[int, ...]:
    """The logical shape of a view operand."""
    return tuple(extent(d) for d in entry["dims"])


def last_element(entry: Mapping[str, Any]) -> int:
    """The largest element offset the view addresses (a shift permutes a dim's indices)."""
    return entry["offset"] + sum((p[0] - 1) * p[1] for d in entry["dims"] for p in d["pieces"])


def dim_offsets(dim: Mapping[str, Any]) -> np.ndarray:
    """Element offset of each logical index of one dim: shift, then split into the pieces."""
    n = extent(dim)
    j = (np.arange(n, dtype=np.int64) + dim["shift"]) % n
    out = np.zeros(n, dtype=np.int64)
    for size, stride in reversed(dim["pieces"]):
        out += (j % size) * stride
        j //= size
    return out


def view_index(entry: Mapping[str, Any]) -> np.ndarray:
    """The source element (flat, row-major) of every logical element of a view operand."""
    dims = entry["dims"]
    idx = np.full(view_shape(entry), entry["offset"], dtype=np.int64)
    for k, d in enumerate(dims):
        idx = idx + dim_offsets(d).reshape((-1,) + (1,) * (len(dims) - k - 1))
    return idx


def gather_view(source: np.ndarray, entry: Mapping[str, Any]) -> np.ndarray:
    """The view operand's value: its elements gathered from `source` (the reference's reading)."""
    return np.ascontiguousarray(source).reshape(-1)[view_index(entry)]


def view_names(inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    """The node's inputs with each view's source replaced by the name its body reads."""
    names = list(inputs)
    for e in attrs.get("view") or ():
        names[e["input"]] = e["name"]
    return names


def fit_view(idx: np.ndarray, name: str, source: int) -> dict[str, Any] | None:
    """The view entry whose view_index equals `idx` (an int64 array of source element offsets,
    the operand's logical shape), or None when no shift-and-pieces view gives it or it breaks a
    rule above (fit_dims; the whole array is checked after)."""
    fitted = fit_dims(idx)
    if fitted is None:
        return None
    dims, base = fitted
    entry = {"name": name, "input": source, "offset": base, "dims": dims}
    if base < 0 or _entry_problem(entry, source + 1) or not np.array_equal(view_index(entry), idx):
        return None
    return entry


def fit_dims(idx: np.ndarray) -> tuple[list[dict[str, Any]], int] | None:
    """(dims, offset) of a shift-and-pieces map from the logical index of `idx` (an int64 array,
    its logical shape) to its values, unchecked against the whole array, or None when a dim fits
    no pieces. Per dim, the line through the origin gives the shift (where its smallest offset
    sits) and the pieces (runs of one stride, inner first)."""
    if idx.size == 0 or idx.ndim == 0 or idx.min() < 0:
        return None
    dims, base = [], int(idx.reshape(-1)[0])
    for k, n in enumerate(idx.shape):
        line = idx[(0,) * k + (slice(None),) + (0,) * (idx.ndim - k - 1)].astype(np.int64)
        low = int(np.argmin(line))
        shift = (n - low) % n
        g = np.roll(line, -low) - line[low]  # g[j]: the offset of j = (i + shift) mod n, from j = 0
        pieces = _pieces(g)
        if pieces is None:
            return None
        dims.append({"shift": shift, "pieces": pieces})
        base -= int(g[shift])
    return dims, base


def _pieces(g: np.ndarray) -> list[list[int]] | None:
    """Mixed-radix pieces (outer first) of a dim's offsets g (g[0] = 0), greedily from the inside."""
    pieces: list[list[int]] = []
    while len(g) > 1:
        stride = int(g[1] - g[0])
        run = g[0] + stride * np.arange(len(g), dtype=np.int64)
        size = int(np.argmin(g == run)) if not np.array_equal(g, run) else len(g)
        if len(g) % size:
            return None
        pieces.append([size, stride])
        g = g[::size]
    return list(reversed(pieces)) or [[1, 0]]
