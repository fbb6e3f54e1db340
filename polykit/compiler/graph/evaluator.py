"""The one graph evaluator: nodes run with their registered reference kernels.

Whatever computes the values of a *graph* goes through `run_node` (one node, errors naming
it) and `evaluate_nodes` (the walk):

- the whole graph from feeds: `evaluate_graph` (the pass tests' oracle) and `evaluate_model`
  (an ONNX model in process: the debug tools' reference). Tensors nobody asked to keep are
  dropped after their last reader, so memory follows what is live, and `on_tensor` sees every
  tensor as it is produced (layerwise compares stream through it);
- only what known values determine, with `Partial`: constant folding walks the graph this
  way, and shape inference evaluates its small data-dependent nodes one at a time between
  shape rules with `try_node`.

*Plans* (layers with tactics, a memory plan) run through the engine's layer loop instead
(polykit.runtime.engine.run_layers): a cpu layer runs its tactic, which need not be the
reference kernel, the loop is the one the cuda target, the profiler and the tuner share, and
its lifetimes come from the plan's memory plan.
"""

from __future__ import annotations

import logging
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ir.sequences import runtime_form
from polykit.compiler.ops.control.bodies import BodyFn, register_body_runner
from polykit.compiler.ops.control.control_flow_reference import iteration_budget
from polykit.errors import LimitError, PolykitError, RuntimeInputError, UsageError
from polykit.compiler.ops.references import run_reference

log = logging.getLogger("polykit.passes")

#: ops whose outputs are random: evaluating them ahead of time would freeze one draw
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Multinomial", "Bernoulli"})

#: on_tensor(name, value, node): called for every tensor a node produces, as it is produced
TensorHook = Callable[[str, np.ndarray, Node], None]


def run_node(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """The outputs of `node`'s reference kernel on `inputs` (one array per node input, None
    for an omitted optional one), one per node output. A kernel that fails or returns too few
    outputs raises a PolykitError naming the node; an op without a kernel UnsupportedModelError."""
    try:
        outs = run_reference(node, inputs)
    except PolykitError:
        raise
    except Exception as exc:
        raise PolykitError(f"reference kernel failed: {type(exc).__name__}: {exc}", where=node.describe(),
                           hint="the inputs may be out of the op's domain: check the feeds and the node's "
                                "attributes against the ONNX spec") from exc
    needed = max((i + 1 for i, name in enumerate(node.outputs) if name), default=0)
    if len(outs) < needed:
        raise PolykitError(f"reference kernel gave {len(outs)} output(s) for {needed}", where=node.describe(),
                           hint="the op's reference kernel is incomplete; please report this")
    return outs[: len(node.outputs)]


@dataclass(frozen=True, eq=False)
class Partial:
    """Partial evaluation: run a node only when what it reads is known and its outputs are small.

    A node runs when it is deterministic (no random op, no Dropout with a training_mode
    input) and every value it reads is known; Shape and Size read only their input's static
    shape and CastLike only its target's dtype, both from `graph`'s metadata. Outputs of a
    known shape must fit `max_elements`; `materialize` says what the results are for:

    - True (constant folding: results become initializers): an output may also be as large
      as the node's inputs together (a Constant's value is already materialized), so folding
      never grows the model by more than small tensors; checked again on the results, and a
      node runs whole or not at all;
    - False (shape inference: results are read, small ones kept): an output whose shape
      depends on values is computed only from inputs of at most `max_elements` each, and
      the caller keeps what it needs.
    """

    graph: Graph
    max_elements: int
    materialize: bool = False


def try_node(node: Node, known: Mapping[str, np.ndarray], partial: Partial) -> list[np.ndarray] | None:
    """`node`'s outputs (one per output, arrays that own their data) when `partial` allows
    running it on the `known` values; None when it does not, or when its kernel fails."""
    args = _known_args(node, known, partial.graph)
    if args is None:
        return None
    in_size = sum(a.size for a in args if a is not None)
    if partial.materialize and node.op_type == "Constant" and node.domain == "":
        in_size = math.inf
    bound = max(partial.max_elements, in_size) if partial.materialize else partial.max_elements
    value_shaped = False
    for name in filter(None, node.outputs):
        v = partial.graph.value(name)
        if v.is_static and math.prod(v.shape) > bound:
            return None
        value_shaped |= not v.is_static
    if value_shaped and not partial.materialize and (
            not node.inputs or any(a is not None and a.size > partial.max_elements for a in args)):
        return None
    try:
        with iteration_budget("fold_iterations"):
            outs = run_node(node, args)
    except LimitError as exc:  # a loop on constants past the budget: folding says so, inference lets it be
        if partial.materialize:
            raise
        log.debug("%s not evaluated ahead: %s", node.describe(), exc.what)
        return None
    except PolykitError as exc:  # the node stays unevaluated; running the graph reports it with context
        log.debug("%s not evaluated ahead: %s", node.describe(), exc.what)
        return None
    if partial.materialize and any(o.size > bound for name, o in zip(node.outputs, outs) if name):
        return None
    return [o if o.flags.owndata else np.array(o) for o in outs]


def _known_args(node: Node, known: Mapping[str, np.ndarray], graph: Graph) -> list[np.ndarray | None] | None:
    """The kernel arguments of `node` from known values (stand-ins where only a shape or a
    dtype is read); None when something it reads is unknown or it must not run ahead."""
    if node.op_type in RANDOM_OPS or not node.outputs:
        return None
    if any(name and graph.value(name).wrap for name in (*node.inputs, *node.outputs)):
        return None  # sequences and optionals run with the graph, never ahead
    if node.domain == "" and node.op_type == "Dropout" and node.input(2):
        return None  # training_mode given as an input: may be random
    if node.domain == "" and node.op_type in ("Shape", "Size"):
        v = graph.value(node.input(0))
        return [_stand_in(v.shape, v.dtype)] if v.is_static else None
    if node.domain == "" and node.op_type == "CastLike" and node.input(0) in known:
        target = graph.value(node.input(1)).dtype
        return None if target is None else [known[node.input(0)], np.zeros((), target)]  # only its dtype is read
    if any(name and name not in known for name in node.inputs):
        return None
    return [known[name] if name else None for name in node.inputs]


def _stand_in(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An array of `shape` without memory (Shape and Size read only its shape)."""
    dt = np.dtype(dtype) if dtype is not None and np.dtype(dtype) != np.dtype(object) else np.dtype(np.float32)
    return np.lib.stride_tricks.as_strided(np.zeros(1, dt), shape=shape, strides=(0,) * len(shape))


def evaluate_nodes(nodes: Sequence[Node], env: Mapping[str, np.ndarray], *, keep: Iterable[str] | None = None,
                   on_tensor: TensorHook | None = None, partial: Partial | None = None) -> dict[str, np.ndarray]:
    """Run `nodes` in order over `env` (name -> array: feeds, initializers, values known so
    far) and return the tensors named in `keep`, or every value with keep=None.

    A tensor not in `keep` is dropped after its last reader (with keep=None nothing is).
    `on_tensor(name, value, node)` sees each tensor a node produces, before it may be dropped.
    Without `partial` every node runs and a failure raises a PolykitError naming the node;
    with it, a node that `partial` does not allow (`try_node`) is skipped and its outputs
    stay unknown.
    """
    values = dict(env)
    wanted = None if keep is None else list(dict.fromkeys(keep))
    if wanted is not None:
        produced = {name for node in nodes for name in node.outputs if name}
        unknown = [name for name in wanted if name not in values and name not in produced]
        if unknown:
            raise UsageError(f"no tensor named {unknown[0]!r} to keep", where=f"tensor {unknown[0]!r}",
                             hint="ask for tensors the nodes produce, or ones given in the environment")
    drop_after = _drop_points(nodes, set(wanted)) if wanted is not None else {}
    for index, node in enumerate(nodes):
        if partial is None:
            outs: list[np.ndarray] | None = run_node(node, [_read(values, name, node) for name in node.inputs])
        else:
            outs = try_node(node, values, partial)
        for name, value in zip(node.outputs, outs or ()):
            if name:
                values[name] = value
                if on_tensor is not None:
                    on_tensor(name, value, node)
        for name in drop_after.get(index, ()):
            values.pop(name, None)
    if wanted is None:
        return values
    missing = [name for name in wanted if name not in values]
    if missing:  # only partial evaluation leaves tensors unknown
        raise UsageError(f"tensor {missing[0]!r} could not be evaluated from what is known",
                         where=f"tensor {missing[0]!r}", hint="keep only tensors the known values determine")
    return {name: values[name] for name in wanted}


def _drop_points(nodes: Sequence[Node], keep: set[str]) -> dict[int, list[str]]:
    """Node index -> tensors to drop after it: the last node that reads or writes each one."""
    last: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in (*node.inputs, *node.outputs):
            if name:
                last[name] = index
    points: dict[int, list[str]] = {}
    for name, index in last.items():
        if name not in keep:
            points.setdefault(index, []).append(name)
    return points


def _read(values: Mapping[str, np.ndarray], name: str, node: Node) -> np.ndarray | None:
    if not name:
        return None
    try:
        return values[name]
    except KeyError:
        raise RuntimeInputError(f"{node.describe()} reads {name!r}, which no feed, initializer or earlier node "
                                "gives", where=node.describe(),
                                hint="feed it, or evaluate the node that computes it too") from None


def evaluate_graph(graph: Graph, feeds: Mapping[str, Any], *, outputs: Iterable[str] | None = None,
                   keep_all: bool = False, on_tensor: TensorHook | None = None) -> dict[str, np.ndarray]:
    """Run `graph` on the reference kernels: the values of `outputs` (default: the graph's
    outputs), or of every tensor (initializers and feeds included) with keep_all=True.

    Feeds are checked against the graph's inputs (names, dtypes, static dims); a graph input
    with an initializer may be left out or overridden. `on_tensor` streams every tensor a node
    produces (see evaluate_nodes); without keep_all, memory holds only the live tensors.
    """
    env = dict(graph.initializers)
    env.update(_checked_feeds(graph, feeds))
    keep = None if keep_all else list(graph.outputs if outputs is None else outputs)
    return evaluate_nodes(graph.nodes, env, keep=keep, on_tensor=on_tensor)


def _checked_feeds(graph: Graph, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    where = f"graph {graph.name!r}"
    if not isinstance(feeds, Mapping):
        raise RuntimeInputError(f"feeds must be a dict name -> array, got {type(feeds).__name__}", where=where)
    missing = [name for name in graph.inputs if name not in feeds and name not in graph.initializers]
    if missing:
        raise RuntimeInputError(f"no feed for graph input(s) {missing}", where=where,
                                hint="pass an array for every graph input")
    unknown = [name for name in feeds if name not in graph.inputs and name not in graph.initializers]
    if unknown:
        raise RuntimeInputError(f"feed {unknown[0]!r} is not an input of the graph", where=where,
                                hint=f"inputs are: {', '.join(graph.inputs)}")
    checked: dict[str, np.ndarray] = {}
    for name, value in feeds.items():
        v = graph.value(name)
        if v.wrap:  # a sequence (list of arrays) or an optional (None or its element)
            checked[name] = runtime_form(value, v, f"tensor {name!r}")
            continue
        arr = np.asarray(value)
        if v.dtype == np.dtype(object) and arr.dtype.kind in "US":
            arr = arr.astype(object)  # ONNX strings are object arrays
        if v.dtype is not None and arr.dtype != v.dtype:
            raise RuntimeInputError(f"input {name!r} has dtype {arr.dtype}, the graph expects {v.dtype}",
                                    where=f"tensor {name!r}", hint=f"convert it with .astype(np.{v.dtype})")
        if v.shape is not None and (len(v.shape) != arr.ndim or any(
                isinstance(d, int) and d != n for d, n in zip(v.shape, arr.shape))):
            raise RuntimeInputError(f"input {name!r} has shape {arr.shape}, the graph expects {v.shape}",
                                    where=f"tensor {name!r}", hint="feed an array of that shape (named dims are free)")
        checked[name] = arr
    return checked


def evaluate_model(model: "Graph | str | os.PathLike | Any", feeds: Mapping[str, Any], *,
                   outputs: Iterable[str] | None = None, on_tensor: TensorHook | None = None) -> dict[str, np.ndarray]:
    """Run an ONNX model (a path, a ModelProto, or a Graph already imported) in process on
    the reference kernels, as imported: no folding, fusion or precision change, so every ONNX
    tensor keeps its name and value. Returns `outputs` (default: the model's outputs);
    `on_tensor(name, value, node)` sees every tensor as it is produced, node being the
    imported node (ONNX name and op; an importer's canonicalization may add tensors of its own)."""
    if not isinstance(model, Graph):
        from polykit.compiler.graph.onnx_import import load_onnx

        model = load_onnx(model)
    return evaluate_graph(model, feeds, outputs=outputs, on_tensor=on_tensor)


@contextmanager
def run_body(body: Graph) -> Iterator[BodyFn]:
    """A control-flow body as a function of its inputs (positional) returning its outputs
    (positional): the Graph bodies' runner (polykit.compiler.ops.control.bodies.body_runner)."""
    def run(values: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = evaluate_graph(body, dict(zip(body.inputs, values)), outputs=body.outputs)
        return [out[name] for name in body.outputs]

    yield run


register_body_runner(Graph, run_body)
