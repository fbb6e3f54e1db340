"""Choosing each layer's tactic: builder optimization levels, timing, the timing cache.

Level (BuilderConfig.builder_optimization_level, TensorRT's 0-5):

  0  the heuristic: the first candidate by priority; nothing is timed
  1  layers with several candidates: time the best 2 by priority
  2  ... the best 3 (cpu: 2)
  3  ... the best 4 (cpu: 2), the default
  4  ... the best 8 (cpu: 3), and the cpu times a median of three runs
  5  every candidate of every layer, single-candidate layers included

A layer is timed only when random inputs are valid for it (float or bool activations,
layer_timing.timeable); any other takes its first candidate, and the log says so. Times
come from the timing cache when it has them (hits) and are measured otherwise (misses);
the choice minimizes the layer's time plus `reformat_ms` (nothing yet: every tactic reads
and writes linear tensors).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.layer_precision import precision_options
from polykit.compiler.builder.layer_timing import runs_for, time_candidates, timeable
from polykit.compiler.builder.sparsity import with_sparse_variants
from polykit.compiler.plan.sparse24 import ATTR
from polykit.compiler.plan.profiles import at_corner
from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.compiler.builder.timing_cache import TimingCache, load_timing_cache, origin_of, timing_key
from polykit import limits
from polykit.errors import BuildError, PolykitError
from polykit.kernels.tactics import REFUSALS, candidates, serves_layer

log = logging.getLogger("polykit")

Pair = tuple[LayerDesc, Any]  # (the layer at one precision, a tactic that supports it)


@dataclass(frozen=True)
class Level:
    """How much one optimization level times: at most `cap` candidates by priority (None:
    all; `cpu_cap` on the cpu, whose numpy kernels are slow to time), and whether layers
    with one candidate are timed too."""

    cap: int | None
    cpu_cap: int | None
    time_single: bool = False

    def limit(self, target: str) -> int | None:
        return self.cpu_cap if target == "cpu" else self.cap


LEVELS = {0: Level(0, 0), 1: Level(2, 2), 2: Level(3, 2), 3: Level(4, 2), 4: Level(8, 3), 5: Level(None, None, True)}


@dataclass
class TuningStats:
    """What tuning did (plan metadata "tuning"; the build log says it too)."""

    level: int
    timed_layers: int = 0
    timed_tactics: int = 0
    untimeable_layers: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    compile_s: float = 0.0
    time_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The counts (the level is in the plan's builder_config; seconds stay in the log, so
        plans do not vary by them)."""
        d = asdict(self)
        del d["level"], d["compile_s"], d["time_s"]
        return d


def reformat_ms(previous: Pair | None, pair: Pair) -> float:
    """Cost of converting what the previous layer's tactic writes into what `pair` reads.

    Every tactic reads and writes linear (NCHW) tensors today (params "formats" absent), so
    nothing is priced. When layout-changing tactics arrive, time the reformat layer between
    the two formats here (through layer_timing) and this sum makes the choice pay for it."""
    return 0.0


def precision_variants(layer: LayerDesc, cfg: BuilderConfig, target: str) -> list[LayerDesc]:
    """The layer at each precision it may run in, in preference order (layer_precision)."""
    precisions, unmet = precision_options(layer, cfg, target)
    if unmet:
        log.warning("layer %r asks for %s, which this build cannot give it; it runs in %s (precision "
                    "constraints: prefer)", layer.name, unmet, precisions[0])
    return [replace(layer, precision=p) for p in precisions]


def candidate_pairs(layer: LayerDesc, target: str, cfg: BuilderConfig, tensors: Mapping[str, TensorDesc], arch: str,
                    sm_count: int, corners: Sequence[Mapping[str, TensorDesc]] = (),
                    generic: Sequence[Mapping[str, TensorDesc]] = ()) -> list[Pair]:
    """(layer at a precision, tactic) candidates in preference order; BuildError when none.
    `corners` / `generic`: the dynamic tensors at each profile corner, exact and with dims of
    1 raised (serves_corners); a layer that reads or writes one takes only the tactics that
    serve it at every corner."""
    pairs, declined = [], []
    variants = with_sparse_variants(precision_variants(layer, cfg, target))
    dynamic = any(n in corner for corner in corners[:1] for n in layer.inputs + layer.outputs if n)
    for variant in variants:
        found = []
        for tactic in candidates(target, layer.kind, variant, arch=arch if target != "cpu" else None):
            need = workspace_over(tactic, variant, tensors, corners if dynamic else (), sm_count)
            if dynamic and not serves_corners(tactic, variant, corners, generic):
                declined.append(f"{tactic.name} cannot serve the profile's shapes")
            elif cfg.workspace_limit is not None and need > cfg.workspace_limit:
                declined.append(f"{tactic.name} needs {need} workspace bytes")
            else:
                found.append((variant, tactic))
        pairs += by_estimate(found, sm_count)
    if not pairs:
        detail = f" ({'; '.join(declined)}; --memory-pool-limit workspace:{cfg.workspace_limit})" if declined else ""
        if dynamic:
            why = "; ".join(declined) or f"no {target} tactic supports this layer's attributes at these shapes"
            raise BuildError(f"no {target} tactic can run this {layer.kind} layer with dynamic dims "
                             f"({dynamic_dims(layer, tensors, corners[0])}): {why}", where=f"layer {layer.name!r}",
                             hint="narrow the profile (or pin the dims this layer depends on), or use --target cpu")
        precisions = "/".join(v.precision for v in variants)
        raise BuildError(f"no {target} tactic can run this {layer.kind} layer in {precisions}{detail}",
                         where=f"layer {layer.name!r}",
                         hint="raise the workspace limit" if declined else
                         "try --target cpu, relax --precision-constraints, or report the layer's shapes and attributes")
    return pairs


def dynamic_dims(layer: LayerDesc, tensors: Mapping[str, TensorDesc], corner: Mapping[str, TensorDesc]) -> str:
    """The layer's tensors whose shapes the profile or the run decides, each with its dims (expressions
    of the input dims and data symbols), e.g. "kept_boxes (data(s_nz)[1], 4), keep_if (data(keep_if)[0],)"."""
    names = dict.fromkeys(n for n in (*layer.inputs, *layer.outputs) if n and n in corner)
    return ", ".join(f"{n} ({', '.join(str(d) for d in tensors[n].dims or corner[n].shape)}"
                     f"{',' if len(tensors[n].dims or corner[n].shape) == 1 else ''})" for n in names)


def serves_corners(tactic: Any, layer: LayerDesc, corners: Sequence[Mapping[str, TensorDesc]],
                   generic: Sequence[Mapping[str, TensorDesc]] = ()) -> bool:
    """Whether `tactic` takes sizes at run time, serves `layer` at every profile corner (its
    `serves`, else its `supports`: a tactic whose enqueue falls back to its family's plain
    kernel where its own does not pay, a split of 1, runs correctly there) and compiles the same
    kernels at every `generic` corner (the corners with dynamic dims of 1 raised to 2, where a
    family may pick an equivalent variant for a size-1 broadcast) as at opt: no size baked into
    its code."""
    if not tactic.dynamic_sizes:
        return False
    kernels = getattr(tactic, "kernels", None)
    if not all(serves_layer(tactic, at_corner(layer, corner)) for corner in corners):
        return False
    try:
        opt = kernels(layer) if kernels is not None and tactic.supports(layer) else None
        for corner in generic if kernels is not None else ():
            if kernels(at_corner(layer, corner)) != opt:
                return False
    except REFUSALS:
        return False  # a family's geometry helper refusing the corner's shapes
    return True


def workspace_over(tactic: Any, layer: LayerDesc, tensors: Mapping[str, TensorDesc],
                   corners: Sequence[Mapping[str, TensorDesc]], sm_count: int) -> int:
    """The most workspace `tactic` borrows for `layer` at its shapes or any profile corner."""
    need = tactic.workspace(layer, tensors, sm_count)
    for corner in corners:
        if any(n in corner for n in layer.inputs + layer.outputs if n):
            need = max(need, tactic.workspace(at_corner(layer, corner), {**tensors, **corner}, sm_count))
    return need


def by_estimate(pairs: list[Pair], sm_count: int) -> list[Pair]:
    """Pairs by priority (highest first); within one priority, tactics that predict their
    cost come first, cheapest first, the others after them in their order (stable)."""
    costs = [tactic.estimate(variant, sm_count) for variant, tactic in pairs]
    order = sorted(range(len(pairs)), key=lambda i: (-pairs[i][1].priority, costs[i] is None, costs[i] or 0.0, i))
    return [pairs[i] for i in order]


#: families a capped level times beyond its cap: the best candidate of each family the cap left out
EXTRA_FAMILIES = 2


def family(tactic_name: str) -> str:
    """A tactic's family: its name without the trailing tile or variant words that hold a digit
    (`cuda.conv_nhwc.sm90_64x128x2` and `cuda.conv_nhwc.sm90_128x128` are one family, `..skinny_128x32`
    another): candidates of one kernel that differ only in their tile."""
    head, _, last = tactic_name.rpartition(".")
    words = last.split("_")
    while len(words) > 1 and any(c.isdigit() for c in words[-1]):  # tiles, split counts: `sm90_128x128_sk2`
        words.pop()
    return f"{head}.{'_'.join(words)}" if head else "_".join(words)


def _with_families(pairs: Sequence[Pair], cap: int) -> list[Pair]:
    """The first `cap` pairs, and, when they hold several tiles of one family, the first pair of as
    many families they leave out (EXTRA_FAMILIES at most), so an estimate that ranks one kernel's
    tiles first never keeps another kernel from being timed; a cap of distinct tactics stays as it is."""
    chosen = list(pairs[:cap])
    seen = {family(p[1].name) for p in chosen}
    room = min(EXTRA_FAMILIES, len(chosen) - len(seen))  # slots the cap spent on a family's other tiles
    for p in pairs[cap:]:
        if len(chosen) >= cap + room:
            break
        key = family(p[1].name)
        if key not in seen and variant_of(p[1]) is None:  # (variants: _with_variants)
            seen.add(key)
            chosen.append(p)
    return chosen


def variant_of(tactic: Any) -> str | None:
    """The tactic `tactic` is a variant of (Tactic.variant_of: the same tile compiled another way, as the
    rolled-epilogue GEMM tiles), or None."""
    return getattr(tactic, "variant_of", None)


def _with_variants(chosen: list[Pair], pairs: Sequence[Pair]) -> list[Pair]:
    """`chosen` and, after it, the variants of each family's first pair in it: a variant (ranked below its twin, so
    that level 0 keeps the twin and a cap never spends a slot on it) is timed beside the one tile of its twin's
    kernel the cap ranks best, whatever else the cap took."""
    firsts, seen = set(), set()
    for _, tactic in chosen:
        if family(tactic.name) not in seen:
            seen.add(family(tactic.name))
            firsts.add(tactic.name)
    taken = {id(p) for p in chosen}
    return chosen + [p for p in pairs if id(p) not in taken and variant_of(p[1]) in firsts]


def capped(pairs: Sequence[Pair], cap: int | None) -> list[Pair]:
    """The pairs a level times: the first `cap` by priority (all for None) with the best of the
    families they leave out (`_with_families`) and the variants of each family's first pair there
    (`_with_variants`), and likewise of a layer's sparse variant (polykit.compiler.builder.sparsity)
    besides, so a sparse candidate is always timed against the dense ones."""
    if not cap:
        return list(pairs)
    dense = [p for p in pairs if ATTR not in p[0].attrs]
    sparse = [p for p in pairs if ATTR in p[0].attrs]
    return _with_variants(_with_families(dense, cap), dense) + _with_variants(_with_families(sparse, cap), sparse)


class Tuner:
    """Chooses among a layer's (precision, tactic) pairs for one build."""

    def __init__(self, target: str, cfg: BuilderConfig, tensors: Mapping[str, TensorDesc],
                 weights: Mapping[str, np.ndarray]):
        self.target = target
        self.cfg = cfg
        self.level = LEVELS[cfg.builder_optimization_level]
        self.tensors = tensors
        self.weights = weights
        self.cache = load_timing_cache(cfg.load_timing_cache) if cfg.load_timing_cache else TimingCache()
        self.stats = TuningStats(cfg.builder_optimization_level)
        self._device: Any = None
        self._previous: Pair | None = None

    def device(self) -> Any:
        """The device layers are timed on; None when the target has none usable here (a cuda
        plan built on a machine without a GPU: nothing can be timed, priorities decide)."""
        if self._device is None:
            from polykit.runtime.target import get_target

            try:
                self._device = get_target(self.target, self.cfg.device).device()
            except PolykitError as exc:
                log.warning("nothing can be timed for %s here (%s); tactics are chosen by priority",
                            self.target, exc.what)
                self._device = False
            else:
                self._adopt_cache(origin_of(self._device))
        return self._device or None

    def _adopt_cache(self, origin: dict[str, str]) -> None:
        """Keep the loaded timing cache only when it was measured here (TensorRT ignores a cache
        from another device, with a warning); its times are this device's from now on."""
        differs = self.cache.foreign_to(origin)
        if differs:
            log.warning("timing cache %s was measured with %s: ignored, layers are timed again",
                        self.cfg.load_timing_cache, differs)
            self.cache = TimingCache()
        self.cache.origin = origin

    def choose(self, layer: LayerDesc, pairs: Sequence[Pair], tensors: Mapping[str, TensorDesc] | None = None) -> Pair:
        """The pair to build `layer` with (pairs in priority order, at least one), timed with
        `tensors` (default the build's: shapes at the first profile's opt; profile_tactics
        passes another profile's)."""
        tensors = self.tensors if tensors is None else tensors
        level, cap = self.level, self.level.limit(self.target)
        if cap == 0 or (len(pairs) == 1 and not level.time_single):
            return self._chosen(pairs[0])
        pairs = capped(pairs, cap)
        if not timeable(layer, tensors):
            self.stats.untimeable_layers += 1
            log.info("layer %r: not timed (integer inputs); took %s, the first candidate by priority",
                     layer.name, pairs[0][1].name)
            return self._chosen(pairs[0])
        over = self.timing_over_budget(layer, tensors)
        if over:
            self.stats.untimeable_layers += 1
            log.warning("layer %r: not timed: %s; took %s, the first candidate by priority", layer.name, over,
                        pairs[0][1].name)
            return self._chosen(pairs[0])
        device = self.device()
        if device is None:
            return self._chosen(pairs[0])
        keys = [timing_key(variant, tactic, device) for variant, tactic in pairs]
        times = [self.cache.lookup(key) for key in keys]
        missing = [i for i, ms in enumerate(times) if ms is None]
        if missing and self.cfg.error_on_timing_cache_miss:
            raise BuildError(f"the timing cache has no time for tactic {pairs[missing[0]][1].name!r}",
                             where=f"layer {layer.name!r}",
                             hint="build once without --error-on-timing-cache-miss and --save-timing-cache")
        if missing:
            self._measure(layer, pairs, keys, times, missing, tensors)
        costs = [ms + reformat_ms(self._previous, pair) for ms, pair in zip(times, pairs)]
        best = min(range(len(pairs)), key=lambda i: (costs[i], i))
        if not math.isfinite(costs[best]):  # the layer cannot run on random inputs: keep the heuristic's choice
            log.warning("layer %r: no candidate could be timed; took %s, the first by priority", layer.name,
                        pairs[0][1].name)
        log.debug("layer %r: %s", layer.name,
                  ", ".join(f"{t.name}/{v.precision} {ms:.4f} ms" for (v, t), ms in zip(pairs, times)))
        return self._chosen(pairs[best])

    def timing_over_budget(self, layer: LayerDesc, tensors: Mapping[str, TensorDesc]) -> str:
        """Why timing `layer` would allocate too much ("" when it would not): its inputs and
        outputs, allocated once to time it, must fit the workspace limit (when set) and the
        memory limits (polykit.limits) of the host, which makes the inputs, and of the target."""
        need = sum(tensors[n].nbytes for n in dict.fromkeys((*layer.inputs, *layer.outputs)) if n and n in tensors)
        budgets = {"host_memory": limits.current().host_memory}
        if self.target == "cuda":
            budgets["device_memory"] = limits.current().device_memory
        if self.cfg.workspace_limit is not None:
            budgets["workspace limit"] = self.cfg.workspace_limit
        name, budget = min(budgets.items(), key=lambda kv: kv[1])
        if need <= budget:
            return ""
        return f"its tensors need {limits.size_text(need)}, more than the {name} ({limits.size_text(budget)})"

    def to_time(self, layer: LayerDesc, pairs: Sequence[Pair], tensors: Mapping[str, TensorDesc]) -> list[Pair]:
        """The pairs `choose` would time for `layer` (missing from the timing cache); none when
        it would take the first by priority. Counts no cache hits or misses."""
        level, cap = self.level, self.level.limit(self.target)
        if cap == 0 or (len(pairs) == 1 and not level.time_single) or not timeable(layer, tensors) \
                or self.timing_over_budget(layer, tensors):
            return []
        device = self.device()
        if device is None:
            return []
        pairs = capped(pairs, cap)
        return [pair for pair in pairs if timing_key(pair[0], pair[1], device) not in self.cache.entries]

    def prefetch(self, jobs: Sequence[tuple[LayerDesc, Sequence[Pair]]]) -> None:
        """Compile, in parallel and before any timing, the kernels of every pair `choose` will
        time for `jobs` ((stamped layer, candidates) per layer): a layer's timing plan then loads
        them from the kernel cache. Layers are otherwise timed one by one, each compiling its few
        candidates, which leaves most of the build machine's cores idle."""
        if self.target != "cuda" or not jobs:
            return
        sources = self.kernel_sources(jobs)
        if not sources:
            return
        from polykit.runtime.cuda.nvrtc import compile_many

        t0 = time.perf_counter()
        compile_many(sources, self.device().arch)
        self.stats.compile_s += time.perf_counter() - t0

    def kernel_sources(self, jobs: Sequence[tuple[LayerDesc, Sequence[Pair]]]) -> list:
        """The kernels of every pair `choose` will time for `jobs` (to_time; none without a device)."""
        sources = []
        for layer, pairs in jobs:
            for variant, tactic in self.to_time(layer, pairs, self.tensors):
                kernels = getattr(tactic, "kernels", None)
                if kernels is not None:
                    sources += kernels(replace(variant, tactic=tactic.name, tactic_params=dict(tactic.params)))
        return sources

    def _measure(self, layer: LayerDesc, pairs: list[Pair], keys: list[str], times: list, missing: list[int],
                 tensors: Mapping[str, TensorDesc]) -> None:
        measured = time_candidates(self.target, layer, [pairs[i] for i in missing], tensors, self.weights,
                                   runs_for(self.target, self.cfg.builder_optimization_level), self.cfg.device)
        self.stats.timed_layers += 1
        self.stats.timed_tactics += len(missing)
        self.stats.compile_s += measured.compile_s
        self.stats.time_s += measured.time_s
        device = self.device()
        for i, ms, error in zip(missing, measured.ms, measured.errors):
            variant, tactic = pairs[i]
            times[i] = ms
            if error:
                log.warning("layer %r: tactic %s failed while timing: %s", layer.name, tactic.name, error)
            self.cache.record(keys[i], ms, tactic.name, layer.kind, device.name)

    def _chosen(self, pair: Pair) -> Pair:
        self._previous = pair
        return pair

    def finish(self) -> dict[str, Any]:
        """Save the timing cache when asked, log what tuning did; the plan metadata record."""
        s = self.stats
        s.cache_hits, s.cache_misses = self.cache.hits, self.cache.misses
        if self.cfg.save_timing_cache:
            self.cache.save(self.cfg.save_timing_cache)
        if s.cache_hits or s.cache_misses:
            log.info("timing cache: %d hits, %d misses%s", s.cache_hits, s.cache_misses,
                     "; nothing timed" if not s.timed_tactics else "")
        if s.timed_layers:
            log.info("tuning (level %d): timed %d tactics of %d layers; compiling took %.2f s, timing %.2f s",
                     s.level, s.timed_tactics, s.timed_layers, s.compile_s, s.time_s)
        return s.to_json()


#: False while a caller shows its own progress over many builds (polykit debug tactics): a
#: build's bar would fight it for the terminal
SHOW_BUILD_PROGRESS: ContextVar[bool] = ContextVar("polykit_show_build_progress", default=True)


@contextmanager
def progress_bar(total: int | None, description: str) -> Iterator[Any]:
    """advance(text) for a rich progress bar on stderr (`total` steps, None: not known), shown only
    on a terminal (not with -q) or with -v, and not inside another command's progress display (SHOW_BUILD_PROGRESS)."""
    level = log.getEffectiveLevel()
    wanted = (sys.stderr.isatty() and level <= logging.WARNING) or level <= logging.INFO  # none under -q
    if total == 0 or not wanted or not SHOW_BUILD_PROGRESS.get():
        yield lambda name: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[layer]}"))
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=total, layer="")
        yield lambda name: progress.update(task, advance=1, layer=name)
