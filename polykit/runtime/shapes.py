"""Run-time shape binding of a plan built for optimization profiles.

`ShapeBinder(plan).bind(input_shapes, profile)` checks the input shapes against the profile
(polykit.compiler.plan.profiles.ProfileSet.bind_shapes), evaluates every tensor's dim expressions
on the host and returns a `ShapeSet`: the concrete shape of each tensor of the plan for this
run, the values of its shape tensors (Shape -> Gather -> Concat chains, which no layer runs), and a key that names the set (equal input shapes, equal key: CUDA-graph replays and
per-shape launch parameters are cached by it). A tensor whose shape would need more bytes
than the plan reserved for it (its size at the profile's corners) is refused.

A new shape set is also checked against the tactics that will run it (`tactics_serve`): the builder
chose each dynamic layer's tactic where it serves the profile's corners (tuner.serves_corners), and a
property of the shapes that holds at min, opt and max may not hold between them (Swin's window padding
pads nothing at even sides, so a Pad tactic that grows only the last axis passed every corner of an
even profile and then ran an odd side wrong). A tactic that does not serve the bound shapes is a
PlanError naming the layer, instead of wrong outputs; cached sets are not checked again.

The same mechanism serves anything that learns shapes at run time: a ShapeSet is a plain
record a target reads in `TargetContext.bind_shapes`. Tensors whose shapes name a data symbol
(an output size a layer decides from values, polykit.compiler.ops.data_dims) wait: `bind_data`
evaluates them once the layer has reported the size (polykit.runtime.output_alloc).
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np

from polykit.compiler.ops.data_dims import sized_tensors
from polykit.compiler.graph.shape_rules import evaluate_rules, run_time_sized
from polykit.compiler.ir.symbolic import Expr, ShapeEvalError, Term, evaluate
from polykit.errors import PlanError, PolykitError, RuntimeInputError, UsageError
from polykit.kernels.profile_tactics import profile_layers
from polykit.kernels.tactics import find_tactic, serves_layer

#: distinct input shape sets whose evaluated shapes a binder keeps
MAX_CACHED_SHAPE_SETS = 64


@dataclass(frozen=True)
class ShapeSet:
    """The shapes of one run: `key` (profile, input shapes), every dynamic tensor's shape by
    name, the symbol values and the shape tensors' values (written before the launches)."""

    key: tuple
    shapes: Mapping[str, tuple[int, ...]] = field(hash=False)
    dims: Mapping[str, int] = field(hash=False)
    values: Mapping[str, np.ndarray] = field(default_factory=dict, hash=False)


class ShapeBinder:
    """Evaluates a plan's tensor shapes for given input shapes (cached per shape set)."""

    def __init__(self, plan: Any):
        self.plan = plan
        self.profiles = plan.profiles
        self._static = {n: tuple(plan.tensors[n].shape) for n in plan.inputs}
        self._dynamic = {n: t for n, t in plan.tensors.items() if t.dims}
        self._host = {n: t for n, t in plan.tensors.items() if t.value}
        data = set(self.profiles.data) if self.profiles is not None else set()
        #: data symbols each tensor's dims or value name: it waits for them (polykit.runtime.output_alloc)
        self._waits = {n: frozenset(data & set().union(*(_symbols(e) for e in t.dims + t.value)))
                       for n, t in plan.tensors.items() if t.dims or t.value}
        #: tensors a shape rule sizes at bind time (polykit.compiler.graph.shape_rules), or whose dims name a sized
        #: data symbol (polykit.compiler.ops.data_dims.sized_dim): no reserved bytes bound them
        self._run_time_sized = run_time_sized(self._dynamic, self.profiles.rules) | sized_tensors(plan) \
            if self.profiles is not None else set()
        self._cache: OrderedDict[tuple, ShapeSet] = OrderedDict()
        self._checks: dict[int, list[tuple[Any, Any]]] = {}  # per profile: (layer, tactic) of the dynamic layers

    @property
    def value_inputs(self) -> tuple[str, ...]:
        """Shape-tensor inputs: their host values take part in the shapes."""
        return tuple(self.profiles.values) if self.profiles is not None else ()

    @property
    def num_profiles(self) -> int:
        return len(self.profiles.ranges) if self.profiles is not None else 1

    def check_profile(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.num_profiles:
            raise UsageError(f"optimization profile {index!r} does not exist",
                             hint=f"the engine has {self.num_profiles} profile(s): 0..{self.num_profiles - 1}")
        return index

    def bind(self, input_shapes: Mapping[str, tuple[int, ...]], profile: int = 0,
             values: Mapping[str, Any] | None = None) -> ShapeSet:
        """The ShapeSet of `input_shapes` (every input) and the shape-tensor inputs' host
        `values` in optimization profile `profile`."""
        key, given = self._key(input_shapes, profile, values)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        if self.profiles is None:
            for name in self.plan.inputs:
                if tuple(input_shapes[name]) != self._static[name]:
                    raise RuntimeInputError(f"input {name!r} has shape {tuple(input_shapes[name])}, the engine "
                                            f"expects {self._static[name]}", where=f"tensor {name!r}",
                                            hint="rebuild the plan with --input-shapes, or with profiles "
                                                 "(--trt-min-shapes/--trt-opt-shapes/--trt-max-shapes)")
            found = ShapeSet(key, {}, {})
        else:
            found = self._shape_set(key, input_shapes, profile, given)
            self.tactics_serve(found, profile)
        self._cache[key] = found
        if len(self._cache) > MAX_CACHED_SHAPE_SETS:
            self._cache.popitem(last=False)
        return found

    def evaluate(self, input_shapes: Mapping[str, tuple[int, ...]], profile: int = 0,
                 values: Mapping[str, Any] | None = None) -> ShapeSet:
        """`bind`'s ShapeSet of a plan with profiles, evaluated anew: neither cached nor checked against the
        tactics (`unserved` lists what `tactics_serve` would refuse in it)."""
        key, given = self._key(input_shapes, profile, values)
        return self._shape_set(key, input_shapes, profile, given)

    def _key(self, input_shapes: Mapping[str, tuple[int, ...]], profile: int,
             values: Mapping[str, Any] | None) -> tuple[tuple, dict[str, tuple]]:
        """The ShapeSet key of a bind (profile, input shapes, shape-tensor values) and those values as tuples."""
        given = {n: tuple(np.asarray(values[n]).ravel().tolist()) for n in self.value_inputs if n in (values or {})}
        return (profile,) + tuple(tuple(input_shapes[n]) for n in self.plan.inputs) + tuple(sorted(given.items())), given

    def _shape_set(self, key: tuple, input_shapes: Mapping[str, tuple[int, ...]], profile: int,
                   given: Mapping[str, tuple]) -> ShapeSet:
        dims = self.profiles.bind_shapes(input_shapes, self._static, profile, given)
        if self.profiles.rules:
            dims = evaluate_rules(self.profiles.rules, dims)
        return ShapeSet(key, self._evaluate(dims), dims, self._values(dims))

    def bind_data(self, shapes: ShapeSet, sizes: Mapping[str, int]) -> ShapeSet:
        """`shapes` with data symbols bound to the `sizes` a layer reported: the shapes and
        shape-tensor values that waited for them are evaluated (RuntimeInputError past the
        reserved bytes; a size above its symbol's bound is a kernel bug, a PolykitError)."""
        dims = {**shapes.dims, **{name: int(size) for name, size in sizes.items()}}
        for name, size in sizes.items():  # a bound may name another data symbol (a nested size)
            bound = evaluate(self.profiles.data[name], dims) if name not in self.profiles.sized else size
            if not 0 <= size <= bound:
                raise PolykitError(f"a layer reported size {size} for {name}, outside [0, {bound}]",
                                   where=f"symbol {name!r}", hint="a kernel miscounted its output; please report this")
        key = shapes.key + tuple(sorted(sizes.items()))
        ready = {n for n, w in self._waits.items() if w and w <= set(dims) and not w <= set(shapes.dims)}
        return ShapeSet(key, {**shapes.shapes, **self._evaluate(dims, ready)}, dims,
                        {**shapes.values, **self._values(dims, ready)})

    def tactics_serve(self, shapes: ShapeSet, profile: int = 0) -> None:
        """PlanError when a layer's tactic (in `profile`) does not serve its tensors at `shapes` (the first
        of `unserved`)."""
        for layer, stamped in self.unserved(shapes, profile):
            dims = ", ".join(f"{n}={v}" for n, v in sorted(shapes.dims.items()))
            raise PlanError(f"tactic {layer.tactic} does not serve the layer's shapes in this "
                            f"run ({dims}: inputs {list(stamped.in_shapes)}, outputs {list(stamped.out_shapes)}); "
                            "the build checked it at the profile's min, opt and max only",
                            where=f"layer {layer.name!r}",
                            hint="rebuild with a profile that has these shapes as a corner (e.g. as opt), and "
                                 "please report this: the tactic should have been refused at build time")

    def unserved(self, shapes: ShapeSet, profile: int = 0) -> Iterator[tuple[Any, Any]]:
        """(layer, the layer stamped with the bound shapes) of each layer whose tactic (in `profile`) does not
        serve its tensors at `shapes`: the tactic's `serves` (a tactic whose enqueue falls back where its own
        kernel does not apply), else its `supports`, of the stamped layer. Layers with a tensor that waits for
        a data-dependent size are left out (their shapes are not all known yet), and so are layers at the
        shapes the build stamped (it chose the tactic there)."""
        if profile not in self._checks:
            checks = []
            for layer in profile_layers(self.plan, profile):
                if any(n in self._dynamic for n in (*layer.inputs, *layer.outputs) if n):
                    tactic = find_tactic(self.plan.target, layer.kind, layer.tactic)
                    if tactic is not None:
                        checks.append((layer, tactic))
            self._checks[profile] = checks
        bound = shapes.shapes
        for layer, tactic in self._checks[profile]:
            names = (*layer.inputs, *layer.outputs)
            if any(n and n in self._dynamic and n not in bound for n in names):
                continue
            stamped = unserved_at(tactic, layer, bound)
            if stamped is not None:
                yield layer, stamped

    def _ready(self, names: Any, dims: Mapping[str, int], only: "set[str] | None") -> list[str]:
        """Of `names`, those to evaluate: in `only` when given, else those waiting for no unbound symbol."""
        if only is not None:
            return [n for n in names if n in only]
        return [n for n in names if self._waits[n] <= set(dims)]

    def _values(self, dims: Mapping[str, int], only: "set[str] | None" = None) -> dict[str, np.ndarray]:
        out = {}
        memo: dict = {}  # subexpressions the tensors share (a loaded plan's are one object), evaluated once
        for name in self._ready(self._host, dims, only):
            t = self._host[name]
            try:
                value = np.asarray([evaluate(v, dims, memo) for v in t.value], dtype=t.np_dtype).reshape(t.shape)
            except (ShapeEvalError, OverflowError) as exc:
                raise RuntimeInputError(f"shape tensor {name!r} cannot be computed for these input shapes: {exc}",
                                        hint="feed shapes inside the optimization profile") from None
            value.setflags(write=False)
            out[name] = value
        return out

    def _evaluate(self, dims: Mapping[str, int], only: "set[str] | None" = None) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        memo: dict = {}  # subexpressions the tensors share (a loaded plan's are one object), evaluated once
        for name in self._ready(self._dynamic, dims, only):
            t = self._dynamic[name]
            try:
                shape = tuple(evaluate(d, dims, memo) for d in t.dims)
            except ShapeEvalError as exc:
                raise RuntimeInputError(f"the shape of tensor {name!r} cannot be computed for these input shapes: "
                                        f"{exc}", hint="feed shapes inside the optimization profile") from None
            if min(shape, default=0) < 0 or (math.prod(shape) * t.np_dtype.itemsize > t.nbytes
                                             and name not in self._run_time_sized):
                raise RuntimeInputError(
                    f"tensor {name!r} would have shape {shape} for these input shapes, beyond what the plan "
                    f"reserved for it ({t.nbytes} bytes)", where=f"tensor {name!r}",
                    hint="feed shapes inside the optimization profile, or rebuild with a wider profile")
            shapes[name] = shape
        return shapes


def unserved_at(tactic: Any, layer: Any, bound: Mapping[str, tuple[int, ...]]) -> Any:
    """`layer` stamped with the `bound` shapes of its tensors (the others as stamped) where `tactic` does
    not serve it there (its `serves`, else its `supports`), else None; None too at the shapes the build
    stamped (it chose the tactic there)."""
    ins = tuple(bound.get(n, s) for n, s in zip(layer.inputs, layer.in_shapes))
    outs = tuple(bound.get(n, s) for n, s in zip(layer.outputs, layer.out_shapes))
    if ins == tuple(layer.in_shapes) and outs == tuple(layer.out_shapes):
        return None
    stamped = copy.copy(layer)  # at_corner's stamp without dataclasses.replace's re-init (~2x the check's time)
    object.__setattr__(stamped, "in_shapes", ins)
    object.__setattr__(stamped, "out_shapes", outs)
    return None if serves_layer(tactic, stamped) else stamped


def _symbols(term: Term) -> set[str]:
    return term.symbols() if isinstance(term, Expr) else set()
