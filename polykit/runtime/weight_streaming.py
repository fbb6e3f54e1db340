"""Weight streaming: run a plan whose weights do not all fit in device memory (TensorRT's
"Streaming Weights").

A plan built `--weight-streaming` records (metadata["weight_streaming"], `streaming_record`)
which weights each layer reads, in the order the layers run. With a budget of B bytes
(`Engine.set_weight_streaming_budget`) the weights read by the most layers, then the earliest
read, stay resident up to B bytes (`choose_resident`); the others live in host memory (pinned
on cuda) and are copied into a scratch region of each context before the layers that read
them (`schedule_streaming`): a ring of fixed-size slots, each weight in a run of contiguous
slots (a weight larger than a slot takes several), allocated in the order the layers need
them. A copy that overwrites slots waits for the last layer that read their old contents,
and is issued right after that layer is launched, so on cuda (a second stream and events)
layer i+1's copies overlap layer i's compute. The schedule depends only on the plan and the
budget, so every run (and a captured CUDA graph) does the same copies into the same slots.

The cpu target runs the same schedule synchronously into an emulated device buffer
(`HostStreamer`), so CPU tests exercise the slots, the evictions and the reuse: a copy issued
too early overwrites a weight a layer still reads and the outputs change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.errors import PlanError, UsageError

#: the plan metadata key of the record
RECORD_KEY = "weight_streaming"
#: alignment of every weight in the resident buffer and in the scratch slots (as the arena's)
ALIGN = 256
_REBUILD = "rebuild the plan with polykit convert --weight-streaming (BuilderConfig(weight_streaming=True))"


def align_up(n: int) -> int:
    return (int(n) + ALIGN - 1) // ALIGN * ALIGN


def layer_weights(layers: Sequence[Any], tensors: Mapping[str, Any]) -> list[list[str]]:
    """The weights each layer reads (its inputs of kind "weight", once each, in input order)."""
    return [list(dict.fromkeys(n for n in layer.inputs if n and n in tensors and tensors[n].kind == "weight"))
            for layer in layers]


def streaming_record(layers: Sequence[Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    """What a `--weight-streaming` plan records: per layer, in run order, the weights it reads."""
    return {"format": 1, "layers": layer_weights(layers, tensors)}


def read_record(plan: Any, where: str = "plan") -> list[list[str]] | None:
    """The recorded per-layer weights of a streaming plan (None for a plan built without the flag),
    checked against the plan's layers: PlanError when the record names a tensor that is not a weight
    or leaves out a weight a layer reads (a crafted or damaged plan)."""
    record = plan.metadata.get(RECORD_KEY)
    if record is None:
        return None
    if not isinstance(record, dict) or record.get("format") != 1 or not isinstance(record.get("layers"), list):
        raise PlanError("the plan's weight-streaming record is malformed", where=f"{where}: metadata.{RECORD_KEY}",
                        hint=_REBUILD)
    recorded = record["layers"]
    expected = layer_weights(plan.layers, plan.tensors)
    if len(recorded) != len(expected) or any(list(r) != e for r, e in zip(recorded, expected)):
        raise PlanError("the plan's weight-streaming record does not match the weights its layers read",
                        where=f"{where}: metadata.{RECORD_KEY}", hint=_REBUILD)
    return [list(r) for r in recorded]


@dataclass(frozen=True)
class Copy:
    """One host-to-scratch copy: weight `name` into scratch bytes [offset, offset + nbytes).
    `issue`: issued before layer `issue` is launched; `after`: it waits for layer `after` to finish
    (-1: for nothing of this run); `layer`: the first layer that reads it."""

    name: str
    offset: int
    nbytes: int
    issue: int
    after: int
    layer: int


@dataclass(frozen=True)
class StreamSchedule:
    """The copies of one run at one budget. `waits[i]`: index in `copies` of the last copy layer i
    needs (-1: none); `scratch_bytes`: the scratch region each context allocates."""

    budget: int
    resident: tuple[str, ...]
    streamed: tuple[str, ...]
    slot_bytes: int
    scratch_bytes: int
    copies: tuple[Copy, ...]
    waits: tuple[int, ...]

    def by_issue(self) -> dict[int, list[int]]:
        """Layer index -> indices in `copies` of the copies issued right before it is launched."""
        out: dict[int, list[int]] = {}
        for k, copy in enumerate(self.copies):
            out.setdefault(copy.issue, []).append(k)
        return out


class WeightStreaming:
    """A plan's weight-streaming state: which weights may stream, their sizes, the budget."""

    def __init__(self, plan: Any, where: str = "plan"):
        self.reads = read_record(plan, where)
        descs = {n: t for n, t in plan.tensors.items() if t.kind == "weight"}
        self.sizes = {n: align_up(t.nbytes) for n, t in descs.items()}
        read = self.reads or []
        #: the weights a layer reads, in first-read order: only these may stream
        self.streamable = list(dict.fromkeys(n for names in read for n in names))
        self.streamable_bytes = sum(self.sizes[n] for n in self.streamable)
        self.total_bytes = sum(self.sizes.values())
        self.budget = self.streamable_bytes if self.reads is not None else self.total_bytes
        self._schedule: StreamSchedule | None = None

    @property
    def enabled(self) -> bool:
        return self.reads is not None

    def set_budget(self, nbytes: int) -> None:
        """Bytes of streamable weights that stay resident: 0 streams them all, >= the streamable
        size keeps them all. UsageError for a bad value, or a budget below the weights of a plan
        built without --weight-streaming."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise UsageError(f"weight streaming budget {nbytes!r} is not a byte count >= 0",
                             hint="e.g. engine.set_weight_streaming_budget(engine.streamable_weights_size // 2)")
        nbytes = int(nbytes)
        if not self.enabled and nbytes < self.total_bytes:
            raise UsageError(f"the plan was built without --weight-streaming: all its {self.total_bytes} weight "
                             f"bytes stay resident, so a budget of {nbytes} bytes cannot hold them",
                             where="set_weight_streaming_budget", hint=_REBUILD)
        if nbytes != self.budget:
            self._schedule = None
        self.budget = nbytes

    @property
    def active(self) -> bool:
        """Whether some weight streams at the current budget."""
        return self.enabled and self.budget < self.streamable_bytes

    def schedule(self) -> StreamSchedule | None:
        """The copies at the current budget (None when every weight is resident)."""
        if not self.active:
            return None
        if self._schedule is None:
            resident = choose_resident(self.reads, self.sizes, self.budget)
            self._schedule = schedule_streaming(self.reads, self.sizes, resident, self.budget)
        return self._schedule

    def scratch_bytes(self) -> int:
        schedule = self.schedule()
        return schedule.scratch_bytes if schedule is not None else 0

    def automatic_budget(self, free: int | None, plan: Any) -> int:
        """The budget that leaves `free` device bytes room for one context (its arena, largest
        layer workspace and scratch at budget 0); the streamable size where `free` is None."""
        if free is None or not self.enabled:
            return self.streamable_bytes
        everything = choose_resident(self.reads, self.sizes, 0)
        scratch = schedule_streaming(self.reads, self.sizes, everything).scratch_bytes
        workspace = (plan.metadata.get("workspace") or {}).get("layers") or {}
        context = plan.memory.arena_bytes + scratch + max((int(v) for v in workspace.values()), default=0)
        return max(0, min(self.streamable_bytes, int(free) - context))

    def resident_bytes(self) -> int:
        """Device bytes of the weights that stay resident at the current budget."""
        schedule = self.schedule()
        if schedule is None:
            return self.total_bytes
        return self.total_bytes - sum(self.sizes[n] for n in schedule.streamed)


def choose_resident(reads: Sequence[Sequence[str]], sizes: Mapping[str, int], budget: int) -> tuple[str, ...]:
    """The streamable weights that stay resident within `budget` bytes: greedily, those read by the
    most layers first, then the earliest read, each taken when it still fits."""
    count: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, names in enumerate(reads):
        for name in names:
            count[name] = count.get(name, 0) + 1
            first.setdefault(name, index)
    chosen, left = [], budget
    for name in sorted(count, key=lambda n: (-count[n], first[n], n)):
        if sizes[name] <= left:
            chosen.append(name)
            left -= sizes[name]
    return tuple(sorted(chosen, key=lambda n: first[n]))


def slot_size(sizes: Sequence[int]) -> int:
    """The scratch slot: the smallest streamed weight (aligned), so a weight wastes less than one
    slot of the ring and every larger weight spans several."""
    return max(ALIGN, align_up(min(sizes))) if sizes else ALIGN


def schedule_streaming(reads: Sequence[Sequence[str]], sizes: Mapping[str, int], resident: Sequence[str],
                       budget: int = 0) -> StreamSchedule:
    """The copies that bring every non-resident weight into the scratch ring before its readers.

    The ring starts at twice the slots of the layer that streams the most (one layer's weights
    load while the previous layer computes) and grows until the schedule fits."""
    keep = set(resident)
    streams = [[n for n in names if n not in keep] for names in reads]
    streamed = tuple(dict.fromkeys(n for names in streams for n in names))
    slot = slot_size([sizes[n] for n in streamed])
    need = [sum(-(-sizes[n] // slot) for n in names) for names in streams]
    widest, total = max(need, default=0), sum(need)
    slots = min(2 * widest, total)
    while True:
        result = _simulate(streams, sizes, slot, slots)
        if result is not None:
            copies, waits = result
            return StreamSchedule(budget, tuple(resident), streamed, slot, slots * slot, tuple(copies), tuple(waits))
        slots = min(slots + max(widest, 1), total)  # at `total` slots nothing is ever evicted: it fits


def _simulate(streams: Sequence[Sequence[str]], sizes: Mapping[str, int], slot: int,
              slots: int) -> tuple[list[Copy], list[int]] | None:
    """One run through a ring of `slots` slots; None when a layer's weights do not fit together."""
    loaded: dict[str, list[int]] = {}  # name -> [first slot, end slot, last reader so far, copy index]
    copies: list[Copy] = []
    waits: list[int] = []
    head, issue = 0, 0
    for layer, names in enumerate(streams):
        last = -1
        for name in names:  # the layer's weights already in the ring stay there for it
            if name in loaded:
                loaded[name][2] = layer
        for name in names:
            entry = loaded.get(name)
            if entry is None:
                k = -(-sizes[name] // slot)
                start = _place(loaded, head, k, slots, layer)
                if start is None:
                    return None
                evicted = [n for n, e in loaded.items() if e[0] < start + k and start < e[1]]
                after = max((loaded.pop(n)[2] for n in evicted), default=-1)
                issue = max(issue, after + 1)
                copies.append(Copy(name, start * slot, sizes[name], issue, after, layer))
                entry = loaded[name] = [start, start + k, layer, len(copies) - 1]
                head = (start + k) % slots
            entry[2] = layer
            last = max(last, entry[3])
        waits.append(last)
    return copies, waits


def _place(loaded: Mapping[str, list[int]], head: int, k: int, slots: int, layer: int) -> int | None:
    """The first run of `k` slots from `head` on (wrapping to slot 0 when the end is too near) that
    holds no weight `layer` reads; None when the ring has none."""
    if k > slots:
        return None
    start, moved = head, 0
    while moved <= slots:
        if start + k > slots:
            moved += slots - start
            start = 0
            continue
        busy = [e[1] for e in loaded.values() if e[2] == layer and e[0] < start + k and start < e[1]]
        if not busy:
            return start
        end = max(busy)
        moved += end - start
        start = end % slots
    return None


class HostStreamer:
    """The schedule run synchronously into an emulated device buffer (the cpu target): before each
    layer the copies issued there land in `scratch` (uint8, schedule.scratch_bytes), and each
    streamed weight's entry in `env` is a view of its slots (a layer output that is a view of one
    is copied out by the target, as every view output). `weights` (the engine's, which a refit
    updates) are read at copy time."""

    def __init__(self, schedule: StreamSchedule, scratch: np.ndarray, tensors: Mapping[str, Any],
                 weights: Mapping[str, np.ndarray]):
        self.schedule = schedule
        self.scratch = scratch
        self._tensors = tensors
        self._weights = weights
        self._by_issue = schedule.by_issue()
        self._last = len(schedule.waits)
        #: copies done in the last run (tests read it: evictions and reuse show in it)
        self.copied: list[Copy] = []

    @property
    def nbytes(self) -> int:
        return self.scratch.nbytes

    def before(self, index: int, env: dict[str, np.ndarray]) -> None:
        if index <= self._last:  # a new run: nothing of the last one is reused
            self.copied = []
            for name in self.schedule.streamed:
                env.pop(name, None)
            start = 0
        else:
            start = self._last + 1
        for point in range(start, index + 1):
            for k in self._by_issue.get(point, ()):
                copy = self.schedule.copies[k]
                desc = self._tensors[copy.name]
                host = np.ascontiguousarray(self._weights[copy.name], dtype=desc.np_dtype)
                raw = host.reshape(-1).view(np.uint8)
                region = self.scratch[copy.offset:copy.offset + raw.nbytes]
                region[:] = raw
                env[copy.name] = region.view(desc.np_dtype).reshape(desc.shape)
                self.copied.append(copy)
        self._last = index


# ---- Polygraphy's runtime spelling (TrtRunner weight_streaming_budget= / _percent=) -----------
#: Polygraphy's weight_streaming_budget sentinels: -2 (like None) turns streaming off, -1 asks
#: for the engine's automatic budget
BUDGET_OFF, BUDGET_AUTO = -2, -1
_BUDGET_HINT = ("give -2 (off), -1 (automatic), N% with 0 <= N <= 100, or bytes >= 0 (K/M/G suffixes), "
                "e.g. --weight-streaming-budget 50% or 512M")


def check_budget_request(budget: Any = None, percent: Any = None, where: str = "weight_streaming_budget") -> None:
    """UsageError unless `budget` is None, -2, -1 or a byte count >= 0 and `percent` None or a
    number in [0, 100] (Polygraphy's TrtRunner arguments)."""
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, np.integer))
                               or budget < BUDGET_OFF):
        raise UsageError(f"weight streaming budget {budget!r} is not -2, -1 or a byte count >= 0", where=where,
                         hint=_BUDGET_HINT)
    if percent is not None and (isinstance(percent, bool) or not isinstance(percent, (int, float, np.number))
                                or not 0 <= float(percent) <= 100):
        raise UsageError(f"weight streaming percent {percent!r} is not a number from 0 to 100", where=where,
                         hint=_BUDGET_HINT)


def requested_budget(engine: Any, budget: int | None = None, percent: float | None = None) -> int | None:
    """The byte budget Polygraphy's (weight_streaming_budget, weight_streaming_percent) ask of
    `engine` (TensorRT's v2 path): None when nothing is asked, or streaming is asked off (-2,
    100%) on a plan built without --weight-streaming (all its weights are resident anyway);
    -2 / 100%: the streamable size (all resident); -1: the automatic budget; N%: N% of the
    streamable size; bytes as given. Bytes win when both are given, as in Polygraphy."""
    check_budget_request(budget, percent)
    streamable = int(engine.streamable_weights_size)
    if budget is None and percent is None:
        return None
    if budget == BUDGET_OFF or (budget is None and float(percent) == 100):
        return streamable if streamable else None
    if budget == BUDGET_AUTO:
        return int(engine.weight_streaming_automatic_budget)
    if budget is not None:
        return int(budget)
    return int(float(percent) / 100.0 * streamable)
