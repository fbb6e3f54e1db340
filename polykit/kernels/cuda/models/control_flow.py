"""If, Loop, Scan on the cuda target: host-driven layers that run their body plans on the device.

No kernels of their own: a body is a plan of cuda layers (polykit.compiler.builder.bodies), run once
per iteration on the layer's stream through `launcher.bodies` (polykit.runtime.cuda.bodies),
on device buffers only. What the host reads back:

- If: the condition, once per run.
- Loop: the trip count M once; the condition after every iteration only when the body can
  change it (a body that passes its condition through runs M iterations back to back without
  a host round trip). Iteration numbers are uploaded once as a device array.
- Scan: nothing; every iteration is enqueued back to back.

Loop-carried values and Scan states live in the layer's output buffers: each iteration reads
and writes them in place (the body copies its inputs into its own arena before it runs and its
outputs out after). A Scan slice along axis 0 is contiguous: the body reads it (and writes a
scan output's) at a byte offset. Along any other axis a slice is `rows` blocks of `width` bytes
(the dims before the axis times the bytes after it), one per row of the tensor: it is gathered
into, or scattered from, a workspace buffer with one strided copy per iteration
(BodyDriver.copy_rows). A Loop's scan outputs have the shape the plan was built for (a run whose
iteration count differs is a DeviceError), or, when the plan leaves their length to the run (a
sized data dim), buffers the layer allocates once it has read the trip count (growing by doubling
while the body's condition decides) and sizes (polykit.runtime.cuda.layer_outputs); an If's
outputs of branch-dependent shapes likewise take the taken branch's output shapes: known before it
runs, or, for an output whose length a layer of the branch decides from values (NonZero, NMS), room of
its bound, then the length the branch's run gave it (`_Branch`). An If branch built for a profile (a
filtered count reaches it) is bound to its inputs' shapes first.

A Loop body whose shapes change across iterations (built for a profile: polykit.compiler.builder.bodies)
is bound before each iteration to its inputs' shapes and the iteration number (`_BodyShapes`, the
host evaluating the body plan's shapes and rules) and runs uncaptured. Its carried values whose
dims the run sizes live in buffers of `launcher.outputs` that grow (doubling, keeping the value) to
the largest value carried (`_Carried`); its scan rows take iteration 0's shape, and an iteration
giving another is a RuntimeInputError naming it (onnxruntime refuses those too).
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.symbolic import Expr, ShapeEvalError, evaluate
from polykit.compiler.ops.data_dims import sized_tensors, with_data
from polykit.errors import DeviceError, RuntimeInputError
from polykit.kernels.cuda.base import DECLARED, CudaTactic, DeviceTensor

KINDS = ("If", "Loop", "Scan")
#: a Loop whose scan outputs the run sizes takes its trip count's rows at once up to these bytes, else
#: grows them by doubling (a trip count of INT64_MAX with a condition that ends the loop is common)
FIRST_ROOM_BYTES = 1 << 26


def compile_variants() -> list:
    return []  # no kernels: the bodies' layers bring their own


def _captured(layer: Any) -> int:
    return int(layer.attrs.get("polykit_captures", 0))


def _bind(plan: Any, inputs: Sequence[int], outputs: Sequence[int]) -> tuple[dict[str, int], list[tuple[int, int]]]:
    """Bindings of a body run (plan inputs and outputs, positional in the body's order) and the
    copies a body output listed twice needs after it: (destination, source) pointers."""
    bindings = dict(zip(plan.inputs, inputs))
    later: list[tuple[int, int]] = []
    first: dict[str, int] = {}
    for name, ptr in zip(plan.metadata["body_outputs"], outputs):
        if name in first:
            later.append((ptr, first[name]))
        else:
            first[name] = bindings[name] = ptr
    return bindings, later


def _run(bodies: Any, plan: Any, inputs: Sequence[int], outputs: Sequence[int], sizes: Sequence[int]) -> None:
    later = _launch(bodies, plan, inputs, outputs)
    _repeat(bodies, later, dict(zip(outputs, sizes)))


def _launch(bodies: Any, plan: Any, inputs: Sequence[int], outputs: Sequence[int]) -> list[tuple[int, int]]:
    """Run body `plan` once; the copies a body output listed twice still needs (`_bind`)."""
    bindings, later = _bind(plan, inputs, outputs)
    bodies.run(plan, bindings)
    return later


def _repeat(bodies: Any, later: Sequence[tuple[int, int]], nbytes: Mapping[int, int]) -> None:
    for dst, src in later:
        bodies.copy(dst, src, nbytes[dst])


def _nbytes(t: DeviceTensor) -> int:
    return t.size * t.dtype.itemsize


def _enqueue_if(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    bodies = launcher.bodies
    cond = bool(bodies.read(tensors[layer.inputs[0]]).reshape(-1)[0])
    plan = layer.attrs["then_branch" if cond else "else_branch"]
    inputs = [tensors[i] for i in layer.inputs[1:]]
    branch = _Branch(layer, bodies, plan, inputs)
    outs = [branch.room(launcher.outputs, k, tensors[o]) for k, o in enumerate(layer.outputs)]
    later = _launch(bodies, plan, [t.ptr for t in inputs], [t.ptr for t in outs])
    outs = branch.ran(launcher.outputs, outs)
    _repeat(bodies, later, {t.ptr: _nbytes(t) for t in outs})


class _Branch:
    """The branch an If runs: bound to its inputs' shapes first when it was built for a profile (the
    shapes of what reaches it change from run to run: polykit.compiler.builder.bodies), the host
    evaluating its output shapes; an output whose dims a layer of the branch decides from values
    (NonZero, NonMaxSuppression: a data symbol of the branch plan) is known once the branch ran (its
    context read the count back) and is written into room of its bound at these input shapes."""

    def __init__(self, layer: Any, bodies: Any, plan: Any, inputs: Sequence[DeviceTensor]):
        self.layer, self.bodies, self.plan = layer, bodies, plan
        self.names = list(plan.metadata["body_outputs"])
        self.where = f"layer {layer.name!r} (If)"
        if _varying(plan):
            tensors = plan.tensors
            shapes = {n: tuple(t.shape) for n, t in zip(plan.inputs, inputs) if tensors[n].dims}
            values = {n: bodies.read(t) for n, t in zip(plan.inputs, inputs) if n in plan.profiles.values}
            bound = bodies.bind(plan, shapes, values)
            self.shapes = [tuple(bound[n]) for n in self.names]
        else:
            self.shapes = [tuple(plan.tensors[n].shape) for n in self.names]
        self.decided = [_decided_by_run(plan, n) for n in self.names]
        self.env = _input_symbols(plan, [t.shape for t in inputs])  # where its outputs' data bounds are evaluated

    def room(self, outputs: Any, k: int, planned: DeviceTensor) -> DeviceTensor:
        """Where the branch writes the If's output k: its planned tensor, or, for an output the run
        sizes (branches of other shapes), room of the branch's output shape (of its bound when the
        branch's own run decides that shape: `ran` records the shape once it has)."""
        name = self.layer.outputs[k]
        if outputs is None or not outputs.sizes(name):
            if self.decided[k]:
                raise DeviceError(f"the branch's output {k} has a shape its own run decides, which the plan "
                                  "does not size at run time", where=self.where,
                                  hint="rebuild the plan with this polykit version, or run it on --target cpu")
            return planned
        desc = self.plan.tensors[self.names[k]]
        if not self.decided[k]:
            room = outputs.allocate(name, self.shapes[k], desc.np_dtype)
            outputs.done(name, self.shapes[k])
            return room
        if self.names[k] in sized_tensors(self.plan):
            raise DeviceError(f"the branch's output {k} has a shape that a control-flow layer inside the branch "
                              "sizes, with no bound to make room for", where=self.where,
                              hint="run this model on --target cpu")
        return outputs.allocate(name, _bound_shape(self.plan, self.names[k], self.env), desc.np_dtype)

    def ran(self, outputs: Any, outs: Sequence[DeviceTensor]) -> list[DeviceTensor]:
        """The If's outputs once the branch ran: those whose shape the branch's run decided take the
        shape it gave them (read from the branch's context) and are recorded as sized."""
        if not any(self.decided):
            return list(outs)
        shapes = self.bodies.shapes(self.plan)
        done = []
        for k, (name, t) in enumerate(zip(self.layer.outputs, outs)):
            if self.decided[k]:
                shape = tuple(shapes[self.names[k]])
                outputs.done(name, shape)
                t = DeviceTensor(t.ptr, shape, t.dtype)
            done.append(t)
        return done


def _input_symbols(plan: Any, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
    """{symbol: size} of the dims of `plan`'s inputs (positional `shapes`) that its profile names."""
    given = plan.profiles.inputs if plan.profiles is not None else {}
    return {sym: int(d) for n, shape in zip(plan.inputs, shapes) for sym, d in zip(given.get(n) or (), shape)
            if isinstance(sym, str)}


def _bound_shape(plan: Any, name: str, env: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of `plan`'s tensor `name` with its data symbols at their bounds for input symbol values
    `env` (no run gives it more: polykit.runtime.shapes.ShapeBinder.bind_data), or, where a bound names
    what `env` lacks (a ruled symbol), the elements the plan reserves for it."""
    desc = plan.tensors[name]
    try:
        full = with_data(env, plan.profiles.data)
        return tuple(evaluate(d, full) for d in desc.dims)
    except ShapeEvalError:
        return (desc.nbytes // desc.np_dtype.itemsize,)


def _decided_by_run(plan: Any, name: str) -> bool:
    """Whether a layer of `plan` decides a dim of its tensor `name` from values (a data symbol)."""
    data = set(plan.profiles.data) if plan.profiles is not None else set()
    return bool(data) and any(isinstance(d, Expr) and d.symbols() & data for d in plan.tensors[name].dims)


def _passes_condition(plan: Any) -> bool:
    """Whether the body's condition output is its condition input (it never stops the loop)."""
    return plan.metadata["body_outputs"][0] == plan.inputs[1]


class _ScanRoom:
    """A Loop's scan outputs: `room` iterations' rows of `row_shapes`. Those of the plan's shape, or,
    when the run sizes them (an iteration count only the run knows, rows a body of run-time shapes
    gives), buffers of `launcher.outputs` that grow by doubling; `sized` says which."""

    def __init__(self, launcher: Any, scans: list[DeviceTensor], names: Sequence[str], room: int | None,
                 row_shapes: Sequence[tuple[int, ...]]):
        self.names, self.outputs, self.stream = names, launcher.outputs, launcher.stream
        self.row_shapes = [tuple(r) for r in row_shapes]
        self.rows = [math.prod(r) * s.dtype.itemsize for s, r in zip(scans, self.row_shapes)]
        self.sized = bool(scans) and self.outputs is not None and all(self.outputs.sizes(o) for o in names)
        self.scans = scans
        self.room = scans[0].shape[0] if scans else None
        if self.sized:  # the trip count's rows when they fit FIRST_ROOM_BYTES (a body may stop sooner)
            fits = room is not None and room * sum(self.rows) <= FIRST_ROOM_BYTES
            self._resize(max(room if fits else self.room, 1), 0)

    def _resize(self, room: int, kept: int) -> None:
        self.room = room
        self.scans = [self.outputs.allocate(o, (room, *r), s.dtype, self.stream, keep=kept * b)
                      for o, s, r, b in zip(self.names, self.scans, self.row_shapes, self.rows)]

    def check(self, i: int, shapes: Sequence[tuple[int, ...]], first: int, where: str) -> None:
        """RuntimeInputError when iteration i's rows (body outputs `first`...) are not of one shape
        with the others (a body of run-time shapes may give them, as onnxruntime refuses too)."""
        for k, (shape, row) in enumerate(zip(shapes, self.row_shapes)):
            if tuple(shape) != row:
                raise RuntimeInputError(f"iteration {i} gives scan output {first + k} the shape {tuple(shape)}; "
                                        f"its rows have the shape {row}", where=where,
                                        hint="a scan output takes one shape in every iteration: feed values "
                                             "(e.g. a trip count) for which the body's shapes stay the same")

    def full(self, i: int) -> bool:
        """Whether iteration i has no row left (a sized room doubles first)."""
        if self.scans and i == self.room and self.sized:
            self._resize(2 * self.room, i)
        return bool(self.scans) and i == self.room

    def at(self, i: int) -> list[int]:
        return [s.ptr + i * r for s, r in zip(self.scans, self.rows)]

    def done(self, i: int) -> None:
        for o, r in zip(self.names, self.row_shapes):
            self.outputs.done(o, (i, *r))


class _Carried:
    """A Loop's carried values, read and written in place: the layer's planned outputs, or, for those
    whose dims the run sizes (a body whose shapes change across iterations), buffers of
    `launcher.outputs` holding the largest value carried so far (`sized` says which)."""

    def __init__(self, launcher: Any, names: Sequence[str], planned: Sequence[DeviceTensor],
                 initial: Sequence[DeviceTensor]):
        self.names, self.outputs, self.stream = names, launcher.outputs, launcher.stream
        self.sized = [self.outputs is not None and self.outputs.sizes(o) for o in names]
        self.values = [self._room(k, t.shape, t.dtype, 0) if s else p
                       for k, (s, p, t) in enumerate(zip(self.sized, planned, initial))]
        for v, src in zip(self.values, initial):
            launcher.bodies.copy(v.ptr, src.ptr, _nbytes(src))

    def _room(self, k: int, shape: tuple[int, ...], dtype: np.dtype, keep: int) -> DeviceTensor:
        room = self.outputs.allocate(self.names[k], (max(math.prod(shape), 1),), dtype, self.stream, keep=keep)
        return DeviceTensor(room.ptr, tuple(shape), dtype)

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(v.shape) for v in self.values]

    def make_room(self, i: int, shapes: Sequence[tuple[int, ...]], where: str) -> None:
        """Room for iteration i's values of `shapes` where the current ones live (a sized buffer grows,
        keeping the current value; a planned output takes only its plan's shape)."""
        for k, (v, shape) in enumerate(zip(self.values, shapes)):
            if tuple(shape) == tuple(v.shape):
                continue
            if not self.sized[k]:
                raise RuntimeInputError(f"iteration {i} gives loop-carried value {k} the shape {tuple(shape)}; "
                                        f"the plan's is {tuple(v.shape)}", where=where,
                                        hint="feed values for which the body keeps the carried shapes")
            if math.prod(shape) > math.prod(v.shape):
                self.values[k] = DeviceTensor(self._room(k, tuple(shape), v.dtype, _nbytes(v)).ptr, v.shape, v.dtype)

    def advance(self, shapes: Sequence[tuple[int, ...]]) -> None:
        self.values = [DeviceTensor(v.ptr, tuple(s), v.dtype) for v, s in zip(self.values, shapes)]

    def done(self) -> None:
        for name, v, sized in zip(self.names, self.values, self.sized):
            if sized:
                self.outputs.done(name, v.shape)


class _BodyShapes:
    """The shapes of a Loop body's outputs per iteration: a static body's are its plan's; a body built for
    a profile (its shapes change across iterations: polykit.compiler.builder.bodies) binds each iteration's
    input shapes and iteration number (its one ruled value, `_bodies_built`) and reads them back. A carried
    value whose length a layer of the body decides from values (a filter each iteration) takes its bound
    at the iteration's input shapes as room, and the length the iteration's run gave it after (`ran`)."""

    def __init__(self, bodies: Any, plan: Any):
        self.bodies, self.plan = bodies, plan
        self.names = list(plan.metadata["body_outputs"])
        self.bound = _varying(plan)
        self.values = tuple(plan.profiles.values) if self.bound else ()
        self.static = [tuple(plan.tensors[o].shape) for o in self.names]
        self.decided = [_decided_by_run(plan, o) for o in self.names]

    def bind(self, i: int, inputs: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Iteration i's output shapes (body output order), its inputs having the shapes `inputs` (a
        decided output's: its bound, the room it needs)."""
        if not self.bound:
            shapes = self.static
        else:
            tensors = self.plan.tensors
            given = {n: tuple(s) for n, s in zip(self.plan.inputs, inputs) if tensors[n].dims}
            values = {n: np.full(tensors[n].shape, i, tensors[n].np_dtype) for n in self.values}
            out = self.bodies.bind(self.plan, given, values)
            shapes = [tuple(out[n]) for n in self.names]
        if not any(self.decided):
            return shapes
        env = _input_symbols(self.plan, inputs)
        return [_bound_shape(self.plan, n, env) if d else s for n, d, s in zip(self.names, self.decided, shapes)]

    def ran(self, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The output shapes of the iteration that just ran: `shapes` (bind's), the decided ones as the
        body's context read them back."""
        if not any(self.decided):
            return list(shapes)
        got = self.bodies.shapes(self.plan)
        return [tuple(got[n]) if d else s for n, d, s in zip(self.names, self.decided, shapes)]


def _enqueue_loop(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    bodies, plan = launcher.bodies, layer.attrs["body"]
    where = f"layer {layer.name!r} (Loop)"
    n = len(layer.inputs) - 2 - _captured(layer)
    m_name, c_name = layer.inputs[0], layer.inputs[1]
    trip = max(int(bodies.read(tensors[m_name]).reshape(-1)[0]), 0) if m_name else None
    go = bool(bodies.read(tensors[c_name]).reshape(-1)[0]) if c_name else True
    state = _Carried(launcher, layer.outputs[:n], [tensors[o] for o in layer.outputs[:n]],
                     [tensors[s] for s in layer.inputs[2:2 + n]])
    captures = [tensors[i] for i in layer.inputs[2 + n:]]
    body = _BodyShapes(bodies, plan)
    shapes = body.bind(0, [(), (), *state.shapes, *(c.shape for c in captures)])
    fixed = trip is not None and _passes_condition(plan)
    scans = _ScanRoom(launcher, [tensors[o] for o in layer.outputs[n:]], layer.outputs[n:], trip, shapes[1 + n:])
    indices = launcher.workspace(8 * max(trip, 1) if fixed else 8)
    if fixed:
        bodies.write(indices, np.arange(trip, dtype=np.int64))
    cond_in, cond_out = launcher.workspace(1), launcher.workspace(1)
    bodies.write(cond_in, np.ones(1, np.bool_))
    flag = DeviceTensor(cond_out, (1,), np.dtype(np.bool_))
    i = 0
    while go and (trip is None or i < trip):
        if i:
            shapes = body.bind(i, [(), (), *state.shapes, *(c.shape for c in captures)])
        scans.check(i, shapes[1 + n:], 1 + n, where)
        if scans.full(i):
            break  # one more iteration than the plan's scan outputs hold: reported below
        state.make_room(i, shapes[1:1 + n], where)
        if not fixed:
            bodies.write(indices, np.array([i], np.int64))
        carried = [t.ptr for t in state.values]
        outs = [cond_out, *carried, *scans.at(i)]
        later = _launch(bodies, plan, [indices + 8 * i if fixed else indices, cond_in, *carried,
                                       *(c.ptr for c in captures)], outs)
        shapes = body.ran(shapes)
        sizes = [1] + [math.prod(s) * t.dtype.itemsize for s, t in zip(shapes[1:1 + n], state.values)] + scans.rows
        _repeat(bodies, later, dict(zip(outs, sizes)))
        state.advance(shapes[1:1 + n])
        i += 1
        if not fixed:
            go = bool(bodies.read(flag).reshape(-1)[0])
    bodies.finish()
    state.done()
    if scans.sized:
        scans.done(i)
    elif scans.scans and (i != scans.room or go and (trip is None or i < trip)):
        ran = f"{i}" if i != scans.room else f"more than {i}"
        raise DeviceError(f"the loop ran {ran} iterations; the plan's scan outputs hold {scans.room}", where=where,
                          hint="the trip count depends on data: rebuild the plan for these inputs' values "
                               "(BuilderConfig.input_values) or run it on --target cpu")


@dataclass(frozen=True)
class ScanSlices:
    """Slice t of a tensor along its scan axis: `rows` blocks of `width` bytes starting t * width
    bytes in, length * width bytes apart (the module docstring); contiguous when rows == 1."""

    ptr: int
    length: int
    rows: int
    width: int
    reverse: bool

    @staticmethod
    def of(t: DeviceTensor, axis: int, reverse: int) -> "ScanSlices":
        a = axis % max(len(t.shape), 1)
        rows = int(np.prod(t.shape[:a], dtype=np.int64))
        width = int(np.prod(t.shape[a + 1:], dtype=np.int64)) * t.dtype.itemsize
        return ScanSlices(t.ptr, int(t.shape[a]), rows, width, bool(reverse))

    @property
    def strided(self) -> bool:
        return self.rows > 1

    @property
    def pitch(self) -> int:
        return self.length * self.width

    def at(self, t: int) -> int:
        """The address iteration t's slice starts at."""
        return self.ptr + (self.length - 1 - t if self.reverse else t) * self.width


def _scan_slices(layer: Any, tensors: Mapping[str, DeviceTensor]) -> tuple[list[ScanSlices], list[ScanSlices]]:
    """The slices of a Scan layer's scan inputs and of its scan outputs."""
    m = int(layer.attrs["num_scan_inputs"])
    n = len(layer.inputs) - m - _captured(layer)
    k = len(layer.outputs) - n
    xs = [ScanSlices.of(tensors[i], a, d) for i, a, d in zip(layer.inputs[n:n + m], _attr(layer, "scan_input_axes", m),
                                                             _attr(layer, "scan_input_directions", m))]
    ys = [ScanSlices.of(tensors[o], a, d) for o, a, d in zip(layer.outputs[n:], _attr(layer, "scan_output_axes", k),
                                                             _attr(layer, "scan_output_directions", k))]
    return xs, ys


def _scan_workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
    """Bytes of the staging buffers of the strided slices (each taken 256-byte aligned); 0 where
    shapes are not known here (a pool of the context grows on the first run instead)."""
    names = [n for n in (*layer.inputs, *layer.outputs) if n]
    if layer.kind != "Scan" or not all(n in tensors and all(isinstance(d, int) for d in tensors[n].shape)
                                       for n in names):
        return 0
    shaped = {n: DeviceTensor(0, tuple(tensors[n].shape), np.dtype(tensors[n].dtype)) for n in names}
    xs, ys = _scan_slices(layer, shaped)
    return sum(-(-s.rows * s.width // 256) * 256 for s in (*xs, *ys) if s.strided)


def _enqueue_scan(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    bodies, plan = launcher.bodies, layer.attrs["body"]
    m = int(layer.attrs["num_scan_inputs"])
    n = len(layer.inputs) - m - _captured(layer)
    state = [tensors[o] for o in layer.outputs[:n]]
    for t, src in zip(state, layer.inputs[:n]):
        bodies.copy(t.ptr, tensors[src].ptr, _nbytes(t))
    xs, ys = _scan_slices(layer, tensors)
    staged_x = [launcher.workspace(x.rows * x.width) if x.strided else 0 for x in xs]
    staged_y = [launcher.workspace(y.rows * y.width) if y.strided else 0 for y in ys]
    captures = [tensors[i].ptr for i in layer.inputs[n + m:]]
    sizes = [_nbytes(x) for x in state] + [y.rows * y.width for y in ys]
    for t in range(xs[0].length):
        for x, buf in zip(xs, staged_x):
            if x.strided:
                bodies.copy_rows(buf, x.width, x.at(t), x.pitch, x.width, x.rows)
        slices = [buf if x.strided else x.at(t) for x, buf in zip(xs, staged_x)]
        outs = [buf if y.strided else y.at(t) for y, buf in zip(ys, staged_y)]
        _run(bodies, plan, [*(x.ptr for x in state), *slices, *captures], [x.ptr for x in state] + outs, sizes)
        for y, buf in zip(ys, staged_y):
            if y.strided:
                bodies.copy_rows(y.at(t), y.pitch, buf, y.width, y.width, y.rows)


def _attr(layer: Any, key: str, count: int) -> list[int]:
    """A Scan's per-input or per-output axes / directions (zeros when absent)."""
    return [int(v) for v in (layer.attrs.get(key) or [0] * count)]


_ENQUEUE = {"If": _enqueue_if, "Loop": _enqueue_loop, "Scan": _enqueue_scan}


def _bodies_built(layer: Any) -> bool:
    """The layer carries its bodies as plans (a build's lowering made them) that this tactic can bind:
    of static shapes, an If branch built for one profile (the shapes reaching it change from run to
    run: `_Branch` binds them), or a Loop body built for a profile (its shapes change across iterations)
    whose one ruled value is the iteration number and whose scan rows' sizes no layer of its own decides
    (`_BodyShapes` binds them; a carried value's it reads back after each iteration)."""
    bodies = [v for k, v in layer.attrs.items() if k in ("then_branch", "else_branch", "body")]
    carried = len(layer.inputs) - 2 - _captured(layer)
    return all(hasattr(v, "tensors") and (not _varying(v) or layer.kind == "Loop" and _bound_per_iteration(v, carried)
                                          or layer.kind == "If" and len(v.profiles.ranges) == 1)
               for v in bodies)


def _varying(plan: Any) -> bool:
    ranges = plan.profiles.ranges if plan.profiles is not None else ()
    return any(lo != hi for profile in ranges for lo, _, hi in profile.values())


def _bound_per_iteration(plan: Any, carried: int) -> bool:
    """One profile whose one ruled value is the iteration number, and no scan row (body outputs past the
    condition and the `carried` values) whose length a layer of the body decides."""
    profiles = plan.profiles
    rows = plan.metadata["body_outputs"][1 + carried:]
    return len(profiles.ranges) == 1 and set(profiles.values) <= {plan.inputs[0]} and \
        not any(_decided_by_run(plan, o) for o in rows)


for _kind in KINDS:
    DECLARED.append(CudaTactic("cuda", _kind, "cuda.control_flow", {},
                               _bodies_built, priority=0, workspace_fn=_scan_workspace,
                               kernels_fn=lambda layer: [], enqueue_fn=_ENQUEUE[_kind], host_driven=True))
