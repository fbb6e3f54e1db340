"""Value ranges of shape-tensor inputs, read from the ops that consume them.

A small integer graph input whose values decide shapes (a Reshape target, TopK's k, the axes
of a reduction, Slice's starts...), or a float one that only ops' shape rules read (Resize's
scales, OneHot's depth, Range's operands: its range is a float domain), needs a range before
one engine can serve every value. `value_ranges(graph)` gives, per such input, a (low, high) per element implied by its
consumers: Reshape targets [-1, numel(data)], TopK's k [0, dim], axes [-rank, rank-1], Split
sizes [0, dim]; operands ONNX accepts at any size (Pad's pads, Slice's starts and ends, which ONNX
clamps, Range's limits) get the widest range a plan holds (UNBOUNDED), and sizes (Expand/Tile/
ConstantOfShape/Resize sizes and scales, OneHot's depth, window lengths...) [0, UNBOUNDED]. An
input used by several consumers gets the intersection.

Such ranges are validity domains, not corners (Reshape at [-1, -1] is no valid target), so
`ruled_profile` builds a Profile whose `ruled` inputs make their consumers' shapes shape rules
evaluated at bind time (polykit.compiler.graph.shape_rules); the ranges are checked per run and a
value outside one is a RuntimeInputError naming the input.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.plan.profiles import Profile
from polykit.compiler.graph.shape_values import CAST_OPS, MOVEMENT_OPS, SHAPE_VALUE_OPS
from polykit.compiler.ir.symbolic import MAX_VALUE
from polykit.errors import BuildError, PolykitError, UsageError

Bounds = tuple[int, int]
#: the widest range: what a plan's expressions hold
UNBOUNDED: Bounds = (-MAX_VALUE, MAX_VALUE)
#: shape-tensor inputs up to this many elements take ranges (infer.PROPAGATE_MAX_ELEMENTS)
MAX_ELEMENTS = 4096

#: fn(node, graph) -> the range of every element of the operand
RangeFn = Callable[[Node, Graph], Bounds]
#: (op type, operand index) -> its range
RANGE_RULES: dict[tuple[str, int], RangeFn] = {}


def range_rule(op: str, *operands: int) -> Callable[[RangeFn], RangeFn]:
    def register(fn: RangeFn) -> RangeFn:
        for i in operands:
            if (op, i) in RANGE_RULES:
                raise ValueError(f"range rule for {op} operand {i} registered twice")
            RANGE_RULES[(op, i)] = fn
        return fn
    return register


def _shape(node: Node, graph: Graph, i: int = 0) -> "tuple[int, ...] | None":
    v = graph.value(node.input(i))
    return tuple(v.shape) if v.is_static else None


def _axis_dim(node: Node, graph: Graph) -> Bounds:
    """[0, dim] along the node's `axis` attribute (TopK's k, Split's sizes)."""
    shape = _shape(node, graph)
    if shape is None or not shape:
        return (0, MAX_VALUE)
    return (0, shape[int(node.attrs.get("axis", -1 if node.op_type == "TopK" else 0)) % len(shape)])


def _axes(extra: int = 0) -> RangeFn:
    """Axes of the data operand (its rank plus `extra`): [-rank, rank-1]."""
    def fn(node: Node, graph: Graph) -> Bounds:
        shape = graph.value(node.input(0)).shape
        if shape is None:
            return UNBOUNDED
        rank = len(shape) + extra
        return (-rank, rank - 1)
    return fn


@range_rule("Reshape", 1)
def _reshape(node: Node, graph: Graph) -> Bounds:
    """[-1, numel(data)]; any size when the data is empty (a target with a 0 fits any other dims)."""
    shape = _shape(node, graph)
    return (-1, math.prod(shape)) if shape is not None and math.prod(shape) else (-1, MAX_VALUE)


range_rule("TopK", 1)(_axis_dim)
range_rule("Split", 1)(_axis_dim)


@range_rule("SplitToSequence", 1)
def _split_sizes(node: Node, graph: Graph) -> Bounds:
    """A 1-D split's sizes [0, dim] (the sequence's length is its element count: a Split of ruled
    sizes); a scalar chunk size [1, UNBOUNDED] (the sizes and the length are host values of it:
    passes.resolve_sequences)."""
    split = graph.value(node.input(1)).shape
    return _axis_dim(node, graph) if split is not None and len(split) == 1 else (1, MAX_VALUE)
for _op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
            "ReduceLogSumExp", "ReduceSumSquare", "Squeeze"):
    range_rule(_op, 1)(_axes())
range_rule("Slice", 3)(_axes())
range_rule("Pad", 3)(_axes())
range_rule("DFT", 2)(_axes())


@range_rule("Unsqueeze", 1)
def _unsqueeze(node: Node, graph: Graph) -> Bounds:
    count = graph.value(node.input(1)).shape
    return _axes(math.prod(count) if count is not None and all(isinstance(d, int) for d in count) else 0)(node, graph)


def _any(node: Node, graph: Graph) -> Bounds:
    return UNBOUNDED


def _sizes(node: Node, graph: Graph) -> Bounds:
    return (0, MAX_VALUE)


for _op, _operands in (("Slice", (1, 2, 4)), ("Pad", (1,)), ("Range", (0, 1, 2))):
    range_rule(_op, *_operands)(_any)
for _op, _operands in (("Expand", (1,)), ("Tile", (1,)), ("ConstantOfShape", (0,)), ("Resize", (2, 3)),
                       ("OneHot", (1,)), ("CenterCropPad", (1,)), ("Col2Im", (1, 2)), ("AffineGrid", (1,)),
                       ("BlackmanWindow", (0,)), ("HammingWindow", (0,)), ("HannWindow", (0,)), ("DFT", (1,)),
                       ("STFT", (1, 3)), ("MelWeightMatrix", (0, 1, 2)), ("MaxUnpool", (2,))):
    range_rule(_op, *_operands)(_sizes)


def value_ranges(graph: Graph) -> dict[str, tuple[Bounds, ...]]:
    """Per shape-tensor input of `graph` (a static integer input of at most MAX_ELEMENTS values,
    0-d or 1-D, some of whose uses decide shapes; a float one all of whose uses are shape rules'
    operands), (low, high) per element. `graph` has its
    inputs' shapes inferred (its values: shapes of the consumers' data operands)."""
    consumers = graph.consumers()
    out: dict[str, tuple[Bounds, ...]] = {}
    for name in graph.inputs:
        v = graph.value(name)
        if v.dtype is None or not (np.dtype(v.dtype).kind in "iu" or is_float(v.dtype)) or not v.is_static \
                or len(v.shape) > 1 or not v.is_tensor or math.prod(v.shape) > MAX_ELEMENTS:
            continue
        if is_float(v.dtype):  # a float shape operand: only ops' shape rules may read it
            bounds = _direct_uses(name, consumers, graph)
            bounds = None if bounds is None else (float(bounds[0]), float(bounds[1]))
        else:
            bounds = _uses(name, consumers, graph, depth=0)
        if bounds is not None:
            out[name] = (bounds,) * math.prod(v.shape)
    return out


def _direct_uses(name: str, consumers: Mapping[str, list[Node]], graph: Graph) -> "Bounds | None":
    """The intersection of the ranges of `name`'s uses when every one is an operand RANGE_RULES
    knows (Resize's scales, OneHot's depth, Range's operands); else None."""
    uses = [(node, i) for node in consumers.get(name, []) for i, inp in enumerate(node.inputs) if inp == name]
    if not uses or any(node.domain not in ("", "ai.onnx") or (node.op_type, i) not in RANGE_RULES for node, i in uses):
        return None
    low, high = UNBOUNDED
    for node, i in uses:
        lo, hi = RANGE_RULES[(node.op_type, i)](node, graph)
        low, high = max(low, lo), min(high, hi)
    return (low, high) if low <= high else None


def _uses(name: str, consumers: Mapping[str, list[Node]], graph: Graph, depth: int) -> "Bounds | None":
    """The intersection of the ranges of `name`'s uses that decide shapes, directly or through host
    shape-chain ops (Cast, Add, Concat...: any value, which their consumers check); None when no
    use does. Uses as data are allowed (a window's length also scales its angles): the engine
    still reads the input as a tensor, and no value computed from it is decided at opt."""
    if depth > 8:
        return None
    found, low, high = False, *UNBOUNDED
    for node in consumers.get(name, []):
        for i, inp in enumerate(node.inputs):
            if inp != name:
                continue
            fn = RANGE_RULES.get((node.op_type, i)) if node.domain in ("", "ai.onnx") else None
            if fn is not None:
                lo, hi = fn(node, graph)
            elif (node.op_type in SHAPE_VALUE_OPS or node.op_type in MOVEMENT_OPS or node.op_type in CAST_OPS) and \
                    any(_uses(o, consumers, graph, depth + 1) is not None for o in node.outputs if o):
                lo, hi = UNBOUNDED
            else:
                continue  # a use as data
            found, low, high = True, max(low, lo), min(high, hi)
    return (low, high) if found and low <= high else None


def ruled_profile(graph: Graph, shapes: Mapping[str, tuple[int, ...]],
                  values: Mapping[str, np.ndarray]) -> "Profile | None":
    """A one-profile Profile for static input `shapes` whose shape-tensor inputs range over their
    value_ranges with opt at `values` (ruled); None when the graph has none or a value lies
    outside its range."""
    ranges = value_ranges(_inferred(graph, shapes))
    if not ranges or any(n not in values for n in ranges):
        return None
    triples = {name: _triple(bounds, values[name]) for name, bounds in ranges.items()}
    if any(t is None for t in triples.values()):
        return None
    return Profile(values=triples, ruled=tuple(triples))


def derive_profiles(graph: Graph, profiles: Sequence[Profile], shapes: Mapping[str, tuple[int, ...]],
                    opt_values: Mapping[str, np.ndarray], fixed: Collection[str] = ()) -> tuple[Profile, ...]:
    """`profiles` (one with `shapes` when none) with every shape-tensor input of `graph` that
    neither they nor `fixed` (BuilderConfig.input_values) give values ranging over its
    value_ranges with opt at `opt_values` (ruled: BuilderConfig.shape_values). Ranges are read at
    each profile's max shapes. `opt_values` of inputs that decide no shape are not used.
    BuildError naming a shape-tensor input that has no value at all; UsageError for an opt value
    outside its range or naming no graph input."""
    stray = sorted(set(opt_values) - set(graph.inputs))
    if stray:
        raise UsageError(f"shape values are given for {stray[0]!r}, which is not a graph input",
                         hint=f"graph inputs are: {', '.join(graph.inputs)}")
    if not any(_may_decide_shapes(graph.value(n)) for n in graph.inputs if n not in fixed) \
            or any(n not in graph.inputs for n in fixed):  # (the builder names a stray input_values entry)
        return tuple(profiles)
    out = []
    for index, profile in enumerate(profiles or [Profile()]):
        at_max = {**shapes, **{name: triple[2] for name, triple in profile.shapes.items()}}
        ranges = value_ranges(_inferred(graph, at_max))
        if not ranges:
            out.append(profile)
            continue
        varying = sorted(name for name, (low, _, high) in profile.shapes.items() if low != high)
        if varying and any(n in opt_values and n not in profile.values for n in ranges):
            raise UsageError(f"profile {index} varies the shape of input {varying[0]!r}, and shape-tensor inputs "
                             f"take only opt values (ranges from the model): a plan cannot hold both yet",
                             hint="give the shape-tensor inputs min/opt/max values (--trt-min-shape-values, --trt-opt-shape-values, --trt-max-shape-values), "
                                  "or fix the shapes (--input-shapes)")
        missing = sorted(n for n in ranges if n not in fixed and n not in profile.values and n not in opt_values)
        if missing:
            raise BuildError(f"input {missing[0]!r} is a shape-tensor input (its values decide shapes) and has "
                             f"no value",
                             where=f"tensor {missing[0]!r}",
                             hint=f"give its opt values: --trt-opt-shape-values {missing[0]}:[...] (shape_values); "
                                  "`run` takes them from --load-inputs or a --data-loader-script; or fix them "
                                  "(input_values) or give a min/opt/max range (--trt-min-shape-values, --trt-opt-shape-values, --trt-max-shape-values)")
        triples = {}
        for name in sorted(n for n in ranges if n in opt_values and n not in fixed and n not in profile.values):
            triple = _triple(ranges[name], opt_values[name])
            if triple is None:
                opt = np.asarray(opt_values[name]).ravel().tolist()
                bad = next((i for i, (x, (lo, hi)) in enumerate(zip(opt, ranges[name])) if not lo <= x <= hi), None)
                what = (f"{len(opt)} values; it holds {len(ranges[name])}" if bad is None else
                        f"element {bad} = {opt[bad]}, outside [{ranges[name][bad][0]}, {ranges[name][bad][1]}] "
                        f"(what the model's ops allow)")
                raise UsageError(f"the opt values {opt} of shape-tensor input {name!r} give {what}",
                                 where=f"tensor {name!r}", hint="give values the model's ops accept")
            triples[name] = triple
        out.append(Profile(profile.shapes, {**profile.values, **triples}, profile.ruled + tuple(triples)))
    return tuple(out)


def _may_decide_shapes(v: Any) -> bool:
    """Whether an input could be a shape-tensor input (value_ranges reads it): a small 0-d/1-D number tensor."""
    return v.dtype is not None and (np.dtype(v.dtype).kind in "iu" or is_float(v.dtype)) and v.is_tensor \
        and v.shape is not None and len(v.shape) <= 1 and all(isinstance(d, int) for d in v.shape) \
        and math.prod(v.shape) <= MAX_ELEMENTS


def _inferred(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> Graph:
    """A copy of `graph` with input `shapes` and every shape inferred that needs no input value."""
    from polykit.compiler.graph.infer import infer_shapes
    from polykit.compiler.builder.builder import apply_input_shapes
    from polykit.compiler.passes.control.inline_if import inline_known_ifs

    g = graph.copy()
    apply_input_shapes(g, dict(shapes))
    inline_known_ifs(g)  # as a ruled build does: the taken branches' uses of a captured input count
    try:
        infer_shapes(g, strict=False)  # without the values: a data operand's dims a value decides stay unknown
    except PolykitError:
        pass  # the shapes before the failing node are known; later operands get the widest ranges
    return g


def _triple(bounds: tuple[Bounds, ...], values: Any) -> "tuple | None":
    """(lows, opt, highs) of an input with per-element `bounds` and opt `values`; None when a value lies outside."""
    opt = tuple(np.asarray(values).ravel().tolist())
    if len(opt) != len(bounds) or not all(lo <= x <= hi for x, (lo, hi) in zip(opt, bounds)):
        return None
    return (tuple(lo for lo, _ in bounds), opt, tuple(hi for _, hi in bounds))
