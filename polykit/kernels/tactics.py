"""The tactic table: named implementations of a layer kind on a target.

A tactic is the unit of autotuning and of debugging: a named parameter set (tile sizes,
algorithm, the GPU architectures it needs, the workspace it borrows) that runs one layer
kind on one target. The table is keyed by (target, domain, kind); a tactic registered for
domain "*" serves every domain (its `supports` decides), one for kind "*" every kind
(cpu.reference). Tactics reach the table only through the `polykit_tactics` plugin hook
(polykit.plugins), built-ins included, so a plugin's tactics are candidates exactly like
polykit's own; registering a second tactic under a taken name is a PluginError.

The table is filled per target on first use (the cuda tactics are descriptions only:
sources and parameters, importable without cuda-python, so CI compiles every variant).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

#: `domain` / `kind` of a tactic that serves any domain / any kind
ANY = "*"

#: workspace(layer, tensors, sm_count) -> bytes; tensors maps names to TensorDesc-like records
WorkspaceFn = Callable[[Any, Mapping[str, Any], int], int]


def no_workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
    return 0


@dataclass(frozen=True)
class Tactic:
    """A named implementation of layer `kind` on `target`, with fixed parameters.

    params: the values that shape its kernel (tile sizes, splits, algorithm): JSON-able
        numbers and strings that code reads, recorded in the plan per layer.
    supports(layer) -> bool: whether it can run the layer (shapes, dtypes, precision, attrs).
    priority: higher first; the order of the heuristic (builder optimization level 0).
    domain: the layer domain it serves ("*": any; `supports` then checks).
    archs: GPU architectures it runs on (e.g. ("sm_90",)); empty: any.
    workspace_fn(layer, tensors, sm_count) -> bytes of scratch memory it borrows for a layer.
    estimate_fn(layer, sm_count) -> a predicted cost (any unit shared by a family; lower is
        better) or None: among candidates of one priority, those that have one are tried in its
        order, ahead of the others, so a level-0 build takes the predicted best of a family
        (tactics of one family share a priority) and a pruned level times the likeliest.
    conservative: the kind's trusted choice (cpu.reference), which `conservative_tactic`
        prefers to the plainest kernel when bisecting a wrong build.
    dynamic_sizes: it reads the layer's sizes at run time, so it may serve a layer of a plan
        built for optimization profiles whose shapes change between runs (polykit.compiler.plan.profiles);
        a tactic whose kernel bakes sizes in at build time is not eligible for such a layer.
    serves(layer) -> bool, or None (then `supports`): whether it runs the layer correctly at these
        shapes, where `supports` also asks that it be worth a candidate there (a split reduction
        whose split would be 1, whose enqueue then runs its family's plain kernel). A profile's
        corners need only this (tuner.serves_corners); its opt still needs `supports`.
    places_fn(layer, row, stride, offset) -> bool, or None (it cannot): whether it can write the
        layer's first output as rows of `row` elements, consecutive rows `stride` elements apart,
        starting `offset` elements into a 256-byte aligned slot (concat by placement,
        polykit.compiler.builder.concat_placement).
    reads_placed_fn(layer, index, row, stride, offset) -> bool, or None (it cannot): whether it can
        read the layer's input `index` where that input is placed in a Concat's output (rows of
        `row` elements, `stride` elements apart, `offset` elements into a 256-byte aligned slot),
        so that a Concat input with other readers is placed too (concat_placement).
    variant_of: the tactic (of its kind) this one is a variant of, or None: the same kernel and tile compiled
        another way (the rolled-epilogue GEMM tiles, EPI_ROLL). Ranked below its twin, it is timed beside the twin
        where a capped level times the twin first of its family (tuner._with_variants), never in a slot of the cap.
    revision: the version of what the tactic computes and the layouts it reads and writes (its
        formats, how it wants its weights packed): a version-compatible plan names its tactics
        `name@revision` (versioned_name), and another polykit version loads it only where each
        has the same revision. Bump it when a change makes old plans of the tactic wrong.
    """

    target: str
    kind: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    supports: Callable[[Any], bool] = field(default=lambda layer: True, hash=False, compare=False)
    priority: int = 0
    domain: str = ANY
    archs: tuple[str, ...] = ()
    workspace_fn: WorkspaceFn = field(default=no_workspace, hash=False, compare=False)
    estimate_fn: Callable[[Any, int], float | None] | None = field(default=None, hash=False, compare=False)
    conservative: bool = False
    dynamic_sizes: bool = False
    revision: int = 1
    serves: Callable[[Any], bool] | None = field(default=None, hash=False, compare=False)
    places_fn: Callable[[Any, int, int, int], bool] | None = field(default=None, hash=False, compare=False)
    reads_placed_fn: Callable[[Any, int, int, int, int], bool] | None = field(default=None, hash=False,
                                                                              compare=False)
    variant_of: str | None = None

    def places(self, layer: Any, row: int, stride: int, offset: int) -> bool:
        """Whether the tactic can write `layer`'s first output as rows of `row` elements, `stride`
        elements apart, `offset` elements into its root's slot (which is 256-byte aligned)."""
        return self.places_fn is not None and bool(self.places_fn(layer, row, stride, offset))

    def reads_placed(self, layer: Any, index: int, row: int, stride: int, offset: int) -> bool:
        """Whether the tactic can read `layer`'s input `index` as rows of `row` elements, `stride`
        elements apart, `offset` elements into its root's slot (a Concat's output, 256-byte aligned)."""
        return self.reads_placed_fn is not None and bool(self.reads_placed_fn(layer, index, row, stride, offset))

    @property
    def versioned_name(self) -> str:
        return f"{self.name}@{self.revision}"

    def estimate(self, layer: Any, sm_count: int) -> float | None:
        """The predicted cost of running `layer` (None when the tactic makes no prediction)."""
        return None if self.estimate_fn is None else self.estimate_fn(layer, sm_count)

    def runs_on(self, arch: str) -> bool:
        """Whether the tactic runs on GPU architecture `arch` ("" = unknown: only arch-free tactics)."""
        return not self.archs or arch in self.archs

    def workspace(self, layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
        """Scratch bytes this tactic borrows to run `layer` on a device with `sm_count` SMs."""
        return int(self.workspace_fn(layer, tensors, sm_count))

    def source_key(self, layer: Any) -> str:
        """Identity of the code that runs `layer` (timing-cache key): the implementation's
        source text and the params; targets with generated kernels override it."""
        fn = getattr(self, "run_fn", None) or getattr(self, "enqueue_fn", None)
        text = f"{self.name}\n{sorted(self.params.items())!r}\n{function_source(fn) if fn is not None else ''}"
        return hashlib.sha256(text.encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=4096)
def function_source(fn: Callable[..., Any]) -> str:
    """The source text of `fn` (its qualified name where the source is not available)."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


@dataclass(frozen=True)
class PluginOrigin:
    """The installed plugin a tactic comes from (polykit's own tactics have none): a cuda plan
    records it beside the plugin's tactics (polykit.runtime.tactic_check compares at load)."""

    plugin: str
    version: str

    def to_json(self) -> dict[str, str]:
        return {"plugin": self.plugin, "version": self.version}


class TacticTable:
    """Tactics by (target, domain, kind), each bucket in priority order."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str, str], list[Tactic]] = {}
        self._origins: dict[tuple[str, str, str, str], PluginOrigin] = {}

    def origin(self, tactic: Tactic) -> PluginOrigin | None:
        """The plugin that registered `tactic` (None for polykit's own, or one registered directly)."""
        return self._origins.get((tactic.target, tactic.domain, tactic.kind, tactic.name))

    def register(self, tactic: Tactic, origin: PluginOrigin | None = None) -> Tactic:
        """Add `tactic` (from plugin `origin`); the same object again is a no-op, another under its
        name a PluginError."""
        from polykit.plugins import PluginError

        bucket = self._buckets.setdefault((tactic.target, tactic.domain, tactic.kind), [])
        for have in bucket:
            if have.name == tactic.name:
                if have is tactic:
                    return tactic
                raise PluginError(
                    f"two tactics named {tactic.name!r} for {tactic.target} {tactic.kind} layers "
                    f"(domain {tactic.domain!r})",
                    hint="each tactic of a layer kind needs its own name; rename the plugin's tactic")
        bucket.append(tactic)
        bucket.sort(key=lambda t: -t.priority)  # stable: registration order among equals
        if origin is not None:
            self._origins[(tactic.target, tactic.domain, tactic.kind, tactic.name)] = origin
        return tactic

    def of_kind(self, target: str, domain: str, kind: str) -> list[Tactic]:
        """Tactics registered for exactly this kind (domain-specific and any-domain), by priority."""
        found = self._buckets.get((target, domain, kind), []) + (
            self._buckets.get((target, ANY, kind), []) if domain != ANY else [])
        return sorted(found, key=lambda t: -t.priority)

    def of_target(self, target: str) -> list[Tactic]:
        return [t for (tg, _, _), bucket in sorted(self._buckets.items()) if tg == target for t in bucket]


@dataclass
class _State:
    table: TacticTable = field(default_factory=TacticTable)
    manager: Any = None
    loaded: set[str] = field(default_factory=set)
    lock: threading.RLock = field(default_factory=threading.RLock)


_STATE = _State()


class TacticRegistry:
    """What the `polykit_tactics` hook receives: the target whose tactics are wanted now and
    `register(tactic)`. A hook registers only tactics of `registry.target` (the cuda
    families are imported only when a cuda build or plan needs them)."""

    def __init__(self, table: TacticTable, target: str, origin: PluginOrigin | None = None):
        self._table = table
        self.target = target
        self._origin = origin  # the plugin whose hook is being called (None: polykit's own)

    def register(self, tactic: Tactic) -> Tactic:
        return self._table.register(tactic, self._origin)

    def register_all(self, tactics: Iterable[Tactic]) -> None:
        for t in tactics:
            if t.target == self.target:
                self.register(t)


def tactic_table(target: str) -> TacticTable:
    """The table with `target`'s tactics loaded through the plugin manager's hooks. A new
    process-wide plugin manager (polykit.plugins.reset_plugin_manager) starts a new table."""
    from polykit.plugins import plugin_manager

    pm = plugin_manager()
    with _STATE.lock:
        if _STATE.manager is not pm:
            _STATE.table, _STATE.manager, _STATE.loaded = TacticTable(), pm, set()
        if target not in _STATE.loaded:
            # each plugin's hook on its own (pluggy's calling order), so each tactic knows its plugin
            for impl in reversed(pm.hook.polykit_tactics.get_hookimpls()):
                origin = None if pm.is_builtin(impl.plugin_name) else PluginOrigin(
                    impl.plugin_name, pm.plugin_version(impl.plugin_name))
                impl.function(registry=TacticRegistry(_STATE.table, target, origin))
            _STATE.loaded.add(target)
        return _STATE.table


def tactic_origin(tactic: Tactic) -> PluginOrigin | None:
    """The installed plugin `tactic` comes from; None for polykit's own."""
    return tactic_table(tactic.target).origin(tactic)


def _candidates_of(target: str, layer: Any, kind: str) -> list[Tactic]:
    table = tactic_table(target)
    domain = getattr(layer, "domain", "") or ""
    found = table.of_kind(target, domain, kind)
    if kind != ANY:
        found += table.of_kind(target, domain, ANY)
    return sorted(found, key=lambda t: -t.priority)


def candidates(target: str, kind: str, layer: Any, *, arch: str | None = None) -> list[Tactic]:
    """Tactics of `target` that can run `layer` (kind given separately for fused kinds), by
    priority; with `arch`, only those that run on that GPU architecture. A layer whose weight
    was compressed 2:4 (attrs "sparse24", polykit.compiler.plan.sparse24) takes only the tactics that
    declare params {"sparse24": 1}, and those tactics only such layers."""
    sparse = "sparse24" in getattr(layer, "attrs", {})
    return [t for t in _candidates_of(target, layer, kind)
            if (arch is None or t.runs_on(arch)) and bool(t.params.get("sparse24")) == sparse and t.supports(layer)]


def conservative_tactic(target: str, kind: str, layer: Any, *, arch: str | None = None) -> Tactic | None:
    """The tactic to trust for `layer` (`polykit debug tactics`' good side): the first candidate
    marked `conservative` (cpu.reference), else the lowest-priority candidate, the plainest
    kernel (the SIMT GEMM and convolution on cuda); None when no tactic runs the layer."""
    found = candidates(target, kind, layer, arch=arch)
    return next((t for t in found if t.conservative), found[-1] if found else None)


#: what a family's geometry helper raises when it refuses a layer's shapes
REFUSALS = (ValueError, KeyError, IndexError, TypeError, AttributeError)


def serves_layer(tactic: Any, layer: Any) -> bool:
    """Whether `tactic` runs `layer` (stamped at some shapes) correctly: its `serves` (a tactic whose enqueue
    falls back to its family's plain kernel where its own does not apply), else its `supports`; False where
    the family's geometry helper refuses the shapes. The builder asks it at a profile's corners and witness
    points (tuner.serves_corners), the runtime at each new shape set (polykit.runtime.shapes)."""
    try:
        return bool((getattr(tactic, "serves", None) or tactic.supports)(layer))
    except REFUSALS:
        return False


def find_tactic(target: str, kind: str, name: str) -> Tactic | None:
    """The tactic called `name` that serves `kind` on `target` (any domain), else None."""
    table = tactic_table(target)
    for t in table.of_target(target):
        if t.name == name and t.kind in (kind, ANY):
            return t
    return None


def all_tactics(target: str) -> list[Tactic]:
    """Every tactic registered for `target` (after loading them)."""
    return tactic_table(target).of_target(target)


def tactic_set(target: str) -> str:
    """A digest of polykit's own tactics of `target` (plugins' left out: they carry their own
    versions): each one's kind, versioned name, parameters and archs. A plan records it, so two
    builds of one polykit version with different tactic tables (a modified tree) can be told apart."""
    table = tactic_table(target)
    rows = sorted(json.dumps([t.kind, t.domain, t.versioned_name, dict(t.params), list(t.archs)], sort_keys=True,
                             default=repr) for t in table.of_target(target) if table.origin(t) is None)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]
