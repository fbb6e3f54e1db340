"""Memory planning: one activation arena, offsets reused across tensor lifetimes.

Every non-weight tensor of a plan gets a byte offset in ONE arena (what the cuda target
allocates once per execution context). Engine inputs and outputs get their own slots,
live for the whole run and never shared; activations are packed greedily by size: the
largest first, each at the lowest 256-byte-aligned offset (first-fit) or in the tightest
gap (best-fit) that no tensor with an overlapping lifetime occupies.

A lifetime is (first, last) in layer indices: the layer that writes the tensor and the
last layer that reads it. Engine inputs start at -1, engine outputs end at len(layers).

Views: a tensor in `aliases` (the output of a Reshape-like layer) takes its source's slot,
and the source's slot stays reserved until the view's last reader; the layer that "writes"
the view finds source and destination at one address and copies nothing. Where the view is
an engine output, its source (an activation) is the one in `aliases`: it takes the output's
slot, so its producer writes the output and the Reshape-like layer again copies nothing.

Placements (concat by placement, polykit.compiler.builder.concat_placement): a tensor in
`placements` has no slot of its own either: it lives inside its root's slot (a Concat's output)
as rows of `row` elements, `stride` elements apart, the first `offset` elements in. Its
producer writes it there with that row stride, and the Concat copies only the inputs not
placed. The root's slot is reserved from the first placed producer's layer on. A placed view
(in `aliases` too) is its source's bytes, its source placed with the same rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

ALIGNMENT = 256


@dataclass(frozen=True)
class Placement:
    """Where a placed tensor lives in its root's slot (all in elements of their one dtype): its
    rows of `row` elements start `offset` elements into the root, consecutive rows `stride` apart."""

    root: str
    offset: int
    row: int
    stride: int

    def to_json(self) -> dict:
        return {"root": self.root, "offset": self.offset, "row": self.row, "stride": self.stride}

    @staticmethod
    def from_json(d: Mapping) -> "Placement":
        return Placement(str(d["root"]), int(d["offset"]), int(d["row"]), int(d["stride"]))


@dataclass(frozen=True)
class MemoryPlan:
    """Where every non-weight tensor lives in the arena, and what reuse saved.

    arena_bytes: size of the arena the plan needs.
    peak_bytes: the most bytes (aligned) live at any one layer -- a lower bound for any plan.
    no_reuse_bytes: the arena size if no slot were ever shared.
    offsets: tensor name -> byte offset in the arena.
    lifetimes: tensor name -> (first layer, last layer) index.
    aliases: view tensor -> the tensor whose slot it shares (same offset, same bytes).
    placements: placed tensor -> its Placement in its root's slot (module docstring).
    """

    arena_bytes: int = 0
    peak_bytes: int = 0
    no_reuse_bytes: int = 0
    offsets: dict[str, int] = field(default_factory=dict, hash=False)
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict, hash=False)
    alignment: int = ALIGNMENT
    strategy: str = "best-fit"
    aliases: dict[str, str] = field(default_factory=dict, hash=False)
    placements: dict[str, Placement] = field(default_factory=dict, hash=False)

    def to_json(self) -> dict:
        out = {
            "aliases": dict(sorted(self.aliases.items())),
            "arena_bytes": self.arena_bytes,
            "peak_bytes": self.peak_bytes,
            "no_reuse_bytes": self.no_reuse_bytes,
            "offsets": dict(sorted(self.offsets.items())),
            "lifetimes": {k: list(v) for k, v in sorted(self.lifetimes.items())},
            "alignment": self.alignment,
            "strategy": self.strategy,
        }
        if self.placements:  # absent without placements: such plans keep their bytes
            out["placements"] = {k: v.to_json() for k, v in sorted(self.placements.items())}
        return out

    @staticmethod
    def from_json(d: Mapping) -> "MemoryPlan":
        return MemoryPlan(
            int(d["arena_bytes"]), int(d["peak_bytes"]), int(d["no_reuse_bytes"]),
            {k: int(v) for k, v in d["offsets"].items()},
            {k: (int(v[0]), int(v[1])) for k, v in d["lifetimes"].items()},
            int(d.get("alignment", ALIGNMENT)), str(d.get("strategy", "best-fit")),
            {str(k): str(v) for k, v in d.get("aliases", {}).items()},
            {str(k): Placement.from_json(v) for k, v in d.get("placements", {}).items()},
        )


def concat_rows(shape: Sequence[int], axis: int, start: int, extent: int) -> tuple[int, int, int]:
    """(offset, row, stride) in elements of the slice [start, start + extent) along `axis` of a
    contiguous tensor of `shape` seen as rows: prod(shape[:axis]) rows of extent * inner elements,
    shape[axis] * inner apart (inner = prod(shape[axis + 1:]))."""
    inner = math.prod(shape[axis + 1:])
    return start * inner, extent * inner, int(shape[axis]) * inner


def align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def compute_lifetimes(
    layers: Sequence[tuple[Sequence[str], Sequence[str]]],
    inputs: Iterable[str],
    outputs: Iterable[str],
    skip: Iterable[str] = (),
) -> dict[str, tuple[int, int]]:
    """(first, last) layer index of every tensor the layers (inputs, outputs) touch.

    `skip` names tensors that are not in the arena (weights). Engine inputs live from -1,
    engine outputs until len(layers)."""
    skip = set(skip)
    end = len(layers)
    life: dict[str, list[int]] = {}
    for name in inputs:
        if name not in skip:
            life[name] = [-1, end]
    for idx, (ins, outs) in enumerate(layers):
        for name in outs:
            if name and name not in skip and name not in life:
                life[name] = [idx, idx]
        for name in ins:
            if name and name not in skip:
                life.setdefault(name, [idx, idx])[1] = max(life[name][1], idx)
    for name in outputs:
        if name in life:
            life[name][1] = end
        elif name not in skip:
            life[name] = [-1, end]
    return {k: (v[0], v[1]) for k, v in life.items()}


def plan_memory(
    sizes: Mapping[str, int],
    lifetimes: Mapping[str, tuple[int, int]],
    io_names: Iterable[str] = (),
    strategy: str = "best-fit",
    alignment: int = ALIGNMENT,
    aliases: Mapping[str, str] = {},
    placements: Mapping[str, Placement] = {},
    itemsizes: Mapping[str, int] = {},
) -> MemoryPlan:
    """Assign arena offsets to every tensor in `lifetimes` (sizes in bytes).

    `io_names` (engine inputs and outputs) get dedicated slots first, in the order given.
    `aliases` maps view tensors to their sources, `placements` placed tensors to their place in
    a root's slot (`itemsizes`: bytes per element of each placed tensor; see the module
    docstring); neither is ever an engine input or output. Deterministic: ties are broken by name."""
    original = dict(lifetimes)
    aliases = {a: src for a, src in aliases.items() if a in original and src in original}
    placements = {t: p for t, p in placements.items() if t in original and p.root in original}
    own = {t: p for t, p in placements.items() if t not in aliases}  # the rest: views of placed tensors
    shared = {**aliases, **{t: p.root for t, p in own.items()}}
    lifetimes = {n: v for n, v in original.items() if n not in shared}
    for view in shared:
        root = view
        while root in shared:
            root = shared[root]
        first, last = lifetimes[root]
        lifetimes[root] = (min(first, original[view][0]), max(last, original[view][1]))
    offsets: dict[str, int] = {}
    cursor = 0
    io_list = [n for n in dict.fromkeys(io_names) if n in lifetimes]
    for name in io_list:
        offsets[name] = cursor
        cursor += align(sizes[name], alignment)
    io_end = cursor
    acts = sorted((n for n in lifetimes if n not in offsets), key=lambda n: (-align(sizes[n], alignment), n))
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    for name in acts:
        size = align(sizes[name], alignment)
        first, last = lifetimes[name]
        if strategy == "none":
            offsets[name] = cursor
            cursor += size
            continue
        busy = sorted((o, o + s) for o, s, f, l in placed if s and not (l < first or last < f))
        offsets[name] = _choose_offset(busy, size, io_end, strategy)
        placed.append((offsets[name], size, first, last))
    arena = max([cursor] + [o + s for o, s, _, _ in placed])
    no_reuse = sum(align(sizes[n], alignment) for n in original if n not in placements)
    for name, p in own.items():
        offsets[name] = offsets[p.root] + p.offset * itemsizes[name]
    for view, src in aliases.items():  # a view of a placed tensor: at its source's rows
        offsets[view] = offsets[src]
    return MemoryPlan(
        arena_bytes=arena,
        peak_bytes=peak_live_bytes(sizes, lifetimes, alignment),
        no_reuse_bytes=no_reuse,
        offsets=offsets,
        lifetimes=original,
        alignment=alignment,
        strategy=strategy,
        aliases=dict(aliases),
        placements=dict(placements),
    )


def _choose_offset(busy: list[tuple[int, int]], size: int, base: int, strategy: str) -> int:
    """Lowest (first-fit) or tightest (best-fit) gap of `size` bytes at or above `base`."""
    gaps: list[tuple[int, int]] = []  # (start, length); the last one is unbounded
    pos = base
    for start, end in busy:
        if start > pos:
            gaps.append((pos, start - pos))
        pos = max(pos, end)
    if size == 0:
        return base
    fitting = [(start, length) for start, length in gaps if length >= size]
    if not fitting:
        return pos
    if strategy == "first-fit":
        return fitting[0][0]
    return min(fitting, key=lambda g: (g[1], g[0]))[0]


def peak_live_bytes(sizes: Mapping[str, int], lifetimes: Mapping[str, tuple[int, int]],
                    alignment: int = ALIGNMENT) -> int:
    """The most aligned bytes live at once over the layer steps."""
    if not lifetimes:
        return 0
    # Sweep over layer steps: +size where a tensor is born, -size after its last step.
    delta: dict[int, int] = {}
    for name, (first, last) in lifetimes.items():
        size = align(sizes[name], alignment)
        delta[first] = delta.get(first, 0) + size
        delta[last + 1] = delta.get(last + 1, 0) - size
    peak = live = 0
    for step in sorted(delta):
        live += delta[step]
        peak = max(peak, live)
    return peak
