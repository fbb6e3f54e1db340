"""Run-time-sized tensors on cuda: device memory per size set for tensors whose shapes a
shape-tensor input's value decides (dims naming a rule symbol, polykit.compiler.graph.shape_rules).

The arena is planned at build time; these tensors have no bound (a Reshape target, TopK's k,
Pad's pads or Expand's sizes fed as an input decide them). So each distinct set of their sizes
gets ONE DeviceBuffer (a region) holding all of them at offsets planned like the arena's
(polykit.compiler.plan.memory.plan_memory over the plan's lifetimes, with the bound sizes): apart
from the arena, so they never alias an arena tensor, and sharing bytes among themselves only
where lifetimes allow. A view (plan.memory.aliases) of such a tensor reads its bytes; a
run-time-sized view of an arena tensor keeps its arena slot (a view has its source's bytes).

Regions are cached per size set, bounded (MAX_SIZED_SETS; the least recently bound is evicted
and freed once the device drained, as runtime/cuda/staging.py's pinned blocks). A CUDA graph
captured with a region's pointers holds the region (`HeldReplay`) until the graph is closed,
so a replay never reads freed memory, and binding those sizes again finds the same region.

The tensors computed from an output whose size only its layer's run decides (a *sized* data symbol,
polykit.compiler.ops.data_dims: a Loop's scan outputs of a run-time iteration count) get regions of
their own (`data_sized_groups`: one family per set of sized symbols they name), keyed by the sized
symbols too: bound once the layers have run and reported those sizes (before that, `bind` gives
nothing; those tensors are not read yet). The layer's
outputs themselves are the layer's to allocate (polykit.runtime.cuda.layer_outputs).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from polykit.compiler.ops.data_dims import bounding_symbols, sized_tensors, with_data
from polykit.compiler.plan.memory import plan_memory
from polykit.compiler.graph.shape_rules import run_time_sized
from polykit.compiler.ir.symbolic import Expr, evaluate
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.memory import DeviceBuffer
from polykit.runtime.io_binding import root_of

#: regions (size sets) a context keeps besides those its captured graphs hold
MAX_SIZED_SETS = 8


@dataclass(frozen=True)
class SizedLayout:
    """Where each member lives in one size set's region: `offsets` (views at their source's),
    `nbytes` the region's size."""

    offsets: Mapping[str, int] = field(hash=False)
    nbytes: int


def sized_members(plan: Any) -> dict[str, str]:
    """{tensor: the root whose bytes it is} of the tensors a rule region holds: every tensor a shape
    rule sizes and every view of one (not weights, not host-computed shape tensors, not those naming
    a sized data symbol: `data_sized_members`)."""
    if plan.profiles is None or not plan.profiles.rules:
        return {}
    return _placed(plan, view_roots(plan, run_time_sized(plan.tensors, plan.profiles.rules) - sized_tensors(plan)))


def data_sized_members(plan: Any, layer_sized: Any = ()) -> dict[str, str]:
    """{tensor: root} of the tensors whose dims name a sized data symbol (polykit.compiler.ops.data_dims),
    and their views, but for the `layer_sized` outputs their layer allocates (and their views)."""
    roots = view_roots(plan, sized_tensors(plan))
    return _placed(plan, {n: r for n, r in roots.items() if r not in frozenset(layer_sized)})


def data_sized_groups(plan: Any, layer_sized: Any = ()) -> list[dict[str, str]]:
    """`data_sized_members` by the sized symbols their root names: one region family per group, so a
    tensor that one layer's size decides is placed before a later layer decides another's."""
    sized = plan.profiles.sized if plan.profiles is not None else frozenset()
    data = plan.profiles.data if plan.profiles is not None else {}
    groups: dict[frozenset, dict[str, str]] = {}
    for name, root in data_sized_members(plan, layer_sized).items():
        named = set().union(*(d.symbols() for d in plan.tensors[root].dims if isinstance(d, Expr)))
        # a data symbol whose bound names a sized one (a nested filter) waits for that one
        groups.setdefault(frozenset(bounding_symbols(named, data) & sized), {})[name] = root
    return [groups[k] for k in sorted(groups, key=sorted)]


def _placed(plan: Any, roots: Mapping[str, str]) -> dict[str, str]:
    """`roots` but weights and host-computed shape tensors (which live elsewhere)."""
    return {n: r for n, r in roots.items()
            if plan.tensors[n].kind != "weight" and not plan.tensors[n].value and not plan.tensors[r].value}


def view_roots(plan: Any, roots: Any) -> dict[str, str]:
    """{tensor: root} of the tensors whose bytes (plan.memory.aliases, followed) are one of `roots`."""
    found = {name: root_of(name, plan.memory.aliases) for name in plan.tensors}
    return {name: root for name, root in found.items() if root in roots}


def sized_layout(members: Mapping[str, str], sizes: Mapping[str, int], lifetimes: Mapping[str, tuple[int, int]],
                 outputs: Any = (), strategy: str = "best-fit") -> SizedLayout:
    """The region of one size set: `sizes` (root -> bytes) placed over the roots' `lifetimes`
    (views keep their sources live), engine `outputs` in slots of their own."""
    end = max((last for _, last in lifetimes.values()), default=0)
    life = {n: tuple(lifetimes.get(n, (-1, end))) for n in members}
    memory = plan_memory({n: sizes[r] for n, r in members.items()}, life,
                         io_names=[n for n in outputs if members.get(n) == n], strategy=strategy,
                         aliases={n: r for n, r in members.items() if n != r})
    return SizedLayout(dict(memory.offsets), memory.arena_bytes)


class _Region:
    def __init__(self, layout: SizedLayout, alloc: Callable[[int], Any]):
        self.buffer = alloc(layout.nbytes)
        self.pointers = {n: self.buffer.ptr + off for n, off in layout.offsets.items()}
        self.holds = 0
        self.cached = True


class SizedRegions:
    """The regions of one context, per size set: `bind(dims)` gives each member's pointer."""

    def __init__(self, plan: Any, alloc: Callable[[int], Any] | None = None,
                 drain: Callable[[], None] | None = None, members: Mapping[str, str] | None = None):
        """`alloc(nbytes)`: a buffer with `ptr` and `free()` (a DeviceBuffer by default);
        `drain()`: wait until the device finished with every region (cuCtxSynchronize);
        `members`: {tensor: root} the regions hold (sized_members by default)."""
        self.members = sized_members(plan) if members is None else dict(members)
        self._plan = plan
        self._alloc = alloc or (lambda n: DeviceBuffer(n, what="run-time-sized tensors"))
        self._drain = drain or (lambda: driver.call("cuCtxSynchronize", what="drain run-time-sized tensors"))
        roots = sorted(set(self.members.values()))
        self._roots = {r: plan.tensors[r] for r in roots}
        named = set().union(*(d.symbols() for t in self._roots.values() for d in t.dims if isinstance(d, Expr)))
        profiles = plan.profiles
        data = {s: b for s, b in profiles.data.items() if s not in profiles.sized} if profiles is not None else {}
        #: data symbols the roots name: sized at their bound, so a data-dependent size never moves a region
        #: (a sized one, which nothing bounds, is part of the key: `bind` waits for it)
        self._bounds = {s: data[s] for s in sorted(bounding_symbols(named, data))}
        bound_syms = set().union(*(b.symbols() for b in self._bounds.values() if isinstance(b, Expr))) - set(data)
        #: the symbols whose values decide the region (its key)
        self._symbols = tuple(sorted((named - set(data)) | bound_syms))
        self._regions: dict[tuple, _Region] = {}
        self._cached: OrderedDict[tuple, None] = OrderedDict()
        self._current: tuple | None = None

    def __bool__(self) -> bool:
        return bool(self.members)

    @property
    def live(self) -> int:
        """Regions allocated now (cached or held by a graph)."""
        return len(self._regions)

    def bind(self, dims: Mapping[str, int]) -> Mapping[str, int]:
        """{member: device pointer} in the region of these symbol values (a ShapeSet's dims); {} while
        a sized data symbol the region depends on is undecided (its layer has not run)."""
        if not set(self._symbols) <= set(dims):
            return {}
        key = tuple(int(dims[s]) for s in self._symbols)
        region = self._regions.get(key)
        if region is None:
            region = self._regions[key] = _Region(self.layout(dims), self._alloc)
        region.cached = True
        self._cached[key] = None
        self._cached.move_to_end(key)
        self._current = key
        while len(self._cached) > MAX_SIZED_SETS:
            old, _ = self._cached.popitem(last=False)
            self._regions[old].cached = False
            self._drop(old, self._regions[old])
        return region.pointers

    def layout(self, dims: Mapping[str, int]) -> SizedLayout:
        """The region layout for symbol values `dims` (data symbols at their bounds)."""
        env = with_data(dims, self._bounds)
        sizes = {r: math.prod(evaluate(d, env) for d in t.dims) * t.np_dtype.itemsize for r, t in self._roots.items()}
        memory = self._plan.memory
        return sized_layout(self.members, sizes, memory.lifetimes, self._plan.outputs, memory.strategy)

    def hold(self) -> Callable[[], None]:
        """Keep the region bound last until the returned release is called (a CUDA graph
        captured with its pointers); released and no longer cached, it is freed."""
        key, region = self._current, self._regions[self._current]
        region.holds += 1
        released = []

        def release() -> None:
            if not released:
                released.append(True)
                region.holds -= 1
                self._drop(key, region)

        return release

    def _drop(self, key: tuple, region: _Region) -> None:
        if region.holds == 0 and not region.cached and self._regions.get(key) is region:
            del self._regions[key]
            self._drain()  # a run on any stream may still read it
            region.buffer.free()

    def free(self) -> None:
        if self._regions:
            self._drain()
        for region in self._regions.values():
            region.buffer.free()
        self._regions.clear()
        self._cached.clear()


class HeldReplay:
    """A captured CUDA graph and the hold on the region its launches point into."""

    def __init__(self, graph: Any, release: Callable[[], None]):
        self.graph = graph
        self._release = release

    def launch(self, stream: Any) -> None:
        self.graph.launch(stream)

    def close(self) -> None:
        self.graph.close()
        self._release()
