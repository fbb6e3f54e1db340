"""The plan's tensors: what each one is, and where it lives.

`describe_tensors` gives every tensor the plan touches its TensorDesc (dtype, shape, and in a
build for optimization profiles its dim expressions and largest size at any corner),
`stamp_layer` stamps a layer with its tensors' dtypes and shapes (what tactics judge it by),
`assign_memory` places them (arena offsets from polykit.compiler.plan.memory, views sharing
their source's slot, weight offsets) and `device_memory` sums what a context of the plan needs.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.builder.lower import Lowered
from polykit.compiler.ir.graph import Graph
from polykit.compiler.graph.shape_values import stopped_expression
from polykit.compiler.ir.symbolic import is_dynamic, remainder_size, term_of
from polykit.compiler.plan.file import weight_offsets
from polykit.compiler.plan.memory import Placement, align, compute_lifetimes, plan_memory
from polykit.compiler.plan.profiles import corner_size
from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.compiler.plan.schema import MAX_BYTES
from polykit.errors import BuildError


def stamp_layer(layer: LayerDesc, tensors: dict[str, TensorDesc]) -> LayerDesc:
    """The layer with its inputs' and outputs' dtypes and shapes (what tactics judge it by)."""
    def desc(names):
        return [tensors[n] if n else None for n in names]

    ins, outs = desc(layer.inputs), desc(layer.outputs)
    return replace(layer, in_dtypes=tuple(t.dtype if t else "" for t in ins),
                   out_dtypes=tuple(t.dtype if t else "" for t in outs),
                   in_shapes=tuple(tuple(t.shape) if t else () for t in ins),
                   out_shapes=tuple(tuple(t.shape) if t else () for t in outs))


def describe_tensors(g: Graph, lowered: Lowered, corners: Sequence[Mapping[str, int]] = (),
                     host: Mapping[str, np.ndarray] | None = None,
                     known: Mapping[str, np.ndarray] | None = None,
                     data: Mapping[str, Any] | None = None) -> dict[str, TensorDesc]:
    """TensorDesc of every tensor the plan touches (offsets filled in by assign_memory); a
    tensor with SymInt dims gets their expressions and its largest size at the profile
    `corners` (symbol values); one in `host` (a shape tensor of SymInts) its value's. `known`:
    the build-time values inference found, which an error about a non-static shape traces; `data`:
    the data symbols' bounds in bound order (what a dim that is not monotone is bounded by)."""
    names: list[str] = list(g.inputs)
    for layer in lowered.layers:
        names += [n for n in layer.inputs + layer.outputs if n]
    names += list(g.outputs)
    tensors: dict[str, TensorDesc] = {}
    outputs, inputs = set(g.outputs), set(g.inputs)
    for name in dict.fromkeys(names):
        if name in lowered.weights:
            arr = lowered.weights[name]
            tensors[name] = TensorDesc(name, arr.dtype.name, tuple(arr.shape), "weight", -1, int(arr.nbytes))
            continue
        v = g.value(name)
        dynamic = is_dynamic(v.shape) and all(isinstance(d, int) for d in v.shape)
        if v.dtype is None or not (v.is_static or dynamic):
            node, why = stopped_expression(g, dict(known or {}), name) if v.dtype is not None else (None, "")
            raise BuildError(
                f"tensor {name!r} has {'unknown dtype' if v.dtype is None else f'non-static shape {_fmt(v.shape)}'}"
                + (f": {why}" if why else ""),
                where=node.describe() if node is not None else f"graph {g.name!r}",
                hint="its shape depends on data or on a dynamic input; fix the input shapes or fold the graph",
            )
        dt = np.dtype(v.dtype)
        if dt == object:
            raise BuildError(f"tensor {name!r} holds strings, which plans cannot run", where=f"graph {g.name!r}",
                             hint="no target runs string tensors (docs/CONFORMANCE.md says why): do the string "
                                  "work before the engine, or evaluate the graph with evaluate_model")
        kind = "input" if name in inputs else "output" if name in outputs else "activation"
        shape = tuple(int(d) for d in v.shape)
        dims = tuple(term_of(d) for d in v.shape) if dynamic else ()
        nbytes = max([math.prod(shape), remainder_size(dims, corners, data)]
                     + [corner_size(name, dims, env) for env in corners if dims]) * dt.itemsize
        if nbytes > MAX_BYTES or min(shape, default=0) < 0:
            raise BuildError(f"tensor {name!r} has shape {_fmt(shape)}: {nbytes} bytes is beyond what a plan holds",
                             where=f"graph {g.name!r}", hint="check the model's and --input-shapes' dims")
        value = tuple(term_of(v) for v in host[name].ravel()) if host and name in host else ()
        tensors[name] = TensorDesc(name, dt.name, shape, kind, -1, nbytes, dims, value)
    return tensors


#: layer kinds whose output is its input's bytes under another shape (views, no copy)
VIEW_KINDS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def view_aliases(layers: list[LayerDesc], tensors: dict[str, TensorDesc], io: set[str],
                 placed: frozenset[str] | set[str] = frozenset()) -> dict[str, str]:
    """View tensor -> the tensor whose arena slot it shares (chains resolved to the root). A view
    layer's output shares its input's slot; where the output is an engine output (a slot of its
    own), the input's root, an activation, shares the output's instead: its producer then writes
    the engine output and the view copies nothing. `placed`: tensors that live in a Concat's slot
    (placed, or the root of placed ones), which stay where they are."""
    out: dict[str, str] = {}
    for layer in layers:
        if layer.domain or layer.kind not in VIEW_KINDS or not layer.inputs or not layer.outputs:
            continue
        src, dst = layer.inputs[0], layer.outputs[0]
        if not src or not dst or tensors[src].kind == "weight":
            continue
        if tensors[src].nbytes != tensors[dst].nbytes or tensors[src].dtype != tensors[dst].dtype:
            continue
        root = _root(src, out)
        if dst not in io:
            out[dst] = root
            continue
        if tensors[dst].kind == "output" and tensors[root].kind == "activation" and root not in io \
                and root not in placed:
            out[root] = dst
    return {view: _root(view, out) for view in out}


def _root(name: str, aliases: Mapping[str, str]) -> str:
    while name in aliases:
        name = aliases[name]
    return name


def assign_memory(layers: list[LayerDesc], tensors: dict[str, TensorDesc], inputs: list[str], outputs: list[str],
                  strategy: str, placements: Mapping[str, Placement] = {}):
    """Plan the arena and write each tensor's offset into its TensorDesc; `placements`: the
    Concat inputs placed in their Concat's output (polykit.compiler.builder.concat_placement),
    used unless the strategy is "none" (no slot shared)."""
    weights = {n for n, t in tensors.items() if t.kind == "weight"}
    inputs = list(inputs) + [n for n, t in tensors.items() if t.value and n not in inputs]  # set before the launches
    lifetimes = compute_lifetimes([(l.inputs, l.outputs) for l in layers], inputs, outputs, skip=weights)
    sizes = {n: tensors[n].nbytes for n in lifetimes}
    placements = placements if strategy != "none" else {}
    placed = set(placements) | {p.root for p in placements.values()}
    aliases = view_aliases(layers, tensors, set(inputs) | set(outputs), placed) if strategy != "none" else {}
    memory = plan_memory(sizes, lifetimes, io_names=list(inputs) + list(outputs), strategy=strategy,
                         aliases=aliases, placements=placements,
                         itemsizes={n: tensors[n].np_dtype.itemsize for n in placements})
    blob = weight_offsets({n: tensors[n].nbytes for n in weights})
    out = {}
    for name, t in tensors.items():
        out[name] = replace(t, offset=blob[name] if t.kind == "weight" else memory.offsets[name])
    return out, memory


def device_memory(arena: int, weights: dict[str, np.ndarray], workspace: dict[str, int]) -> dict[str, int]:
    """Device bytes a context of the plan needs: arena + weights + the largest layer workspace."""
    weight_bytes = sum(align(int(w.nbytes)) for w in weights.values())
    largest = max(workspace.values(), default=0)
    return {"arena_bytes": arena, "weight_bytes": weight_bytes, "workspace_bytes": largest,
            "total_bytes": arena + weight_bytes + largest}


def _fmt(shape: Any) -> str:
    return "None" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"
