"""Concat by placement (TensorRT's concat elimination): producers write into the Concat's output.

A Concat copies each input into its slice of the output. When an input's only reader is the
Concat and its producer's chosen tactic can write its output with a row stride (Tactic.places),
the producer writes straight into that slice instead, and the Concat copies only the inputs
not placed (all placed: it moves nothing). Along axis `a` of an output of shape S, input i
(extent e_i along a, starting at o_i) is `outer = prod(S[:a])` rows of `e_i * inner` elements
(`inner = prod(S[a+1:])`), consecutive rows `S[a] * inner` elements apart, the first at `o_i *
inner`: for a channels-last Concat (the last axis) a producer's [pixels, C_i] rows land with
row stride C_total.

The step runs after tactic selection and before memory assignment (the memory plan gives a
placed tensor no slot of its own: polykit.compiler.plan.memory). It places only where nothing
else can see the tensor's own bytes: static shapes, neither tensor an engine input, output,
kept or observed tensor, weight, shape value or view, the input read once by its Concat, and
the Concat's output not itself placed (no chains). The input may have other readers (UNet's skip
connection: the encoder's activation feeds the Concat and the next MaxPool) when none is a Concat
or a view and each one's chosen tactic (every profile's) reads that input at its rows
(Tactic.reads_placed): the producer writes once, nobody copies, and the readers read strided.
An input that is a view (Reshape / Flatten / Squeeze / Unsqueeze, sharing its source's bytes)
is placed through its source when the source is read by the view alone and the view by the
Concat alone: both get the same rows.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from polykit.compiler.builder.plan_tensors import VIEW_KINDS
from polykit.compiler.plan.memory import Placement, concat_rows
from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.kernels.tactics import Tactic, find_tactic


def place_concat_inputs(layers: Sequence[LayerDesc], tensors: Mapping[str, TensorDesc], target: str,
                        keep: Sequence[str] = ()) -> dict[str, Placement]:
    """{tensor: Placement} of the Concat inputs whose producers write into their slice of the
    Concat's output (the module docstring); `keep`: the engine's inputs and outputs (marked and
    observed ones included), which are never placed nor roots."""
    keep = set(keep)
    readers: dict[str, int] = {}
    reads: dict[str, list[tuple[LayerDesc, int]]] = {}  # tensor -> (reader, input index) of each read
    producer: dict[str, LayerDesc] = {}
    for layer in layers:
        for index, name in enumerate(layer.inputs):
            if name:
                readers[name] = readers.get(name, 0) + 1
                reads.setdefault(name, []).append((layer, index))
        for name in layer.outputs:
            if name:
                producer[name] = layer
    out: dict[str, Placement] = {}
    for layer in layers:
        if layer.kind != "Concat" or layer.domain or len(layer.outputs) != 1:
            continue
        root = layer.outputs[0]
        if not _own_bytes(root, tensors, keep):
            continue
        shape = tensors[root].shape
        axis = int(layer.attrs.get("axis", 0)) % max(len(shape), 1)
        start = 0
        for name in layer.inputs:
            extent = int(tensors[name].shape[axis]) if name and len(tensors[name].shape) == len(shape) else 0
            rows = concat_rows(shape, axis, start, extent)
            start += extent
            if not (name and layer.inputs.count(name) == 1 and _own_bytes(name, tensors, keep)
                    and tensors[name].dtype == tensors[root].dtype):
                continue
            view = producer.get(name)
            source = view.inputs[0] if view is not None and view.kind in VIEW_KINDS and view.inputs else ""
            others = [(reader, index) for reader, index in reads[name] if reader is not layer]
            if others and not all(_reads(reader, index, target, rows) for reader, index in others):
                continue
            if _places(view, name, target, rows):
                out[name] = Placement(root, *rows)
            elif source and not others and readers.get(source) == 1 and _own_bytes(source, tensors, keep) and \
                    (tensors[source].dtype, tensors[source].nbytes) == (tensors[name].dtype, tensors[name].nbytes) \
                    and _places(producer.get(source), source, target, rows):
                # a view (UNet's pixel shuffle ends in a Reshape of a Transpose): its source, the same
                # elements in the same order, is placed at the same rows and the view shares them
                out[name] = out[source] = Placement(root, *rows)
    return out


def _own_bytes(name: str, tensors: Mapping[str, TensorDesc], keep: set[str]) -> bool:
    """Whether `name` is an activation of a static shape that no caller or host write sees."""
    t = tensors.get(name)
    return t is not None and t.kind == "activation" and name not in keep and not t.dims and not t.value \
        and t.nbytes > 0


def _places(layer: LayerDesc | None, name: str, target: str, rows: tuple[int, int, int]) -> bool:
    """Whether `layer` writes `name` (its first output) with the chosen tactic of every profile
    able to place it at (offset, row, stride)."""
    if layer is None or layer.kind in VIEW_KINDS or layer.kind == "Concat" or layer.outputs[0] != name:
        return False
    offset, row, stride = rows
    return _every_tactic(layer, target, lambda tactic: tactic.places(layer, row, stride, offset))


def _reads(layer: LayerDesc, index: int, target: str, rows: tuple[int, int, int]) -> bool:
    """Whether `layer`, another reader of a Concat input, reads its input `index` placed at (offset,
    row, stride) with the chosen tactic of every profile; a Concat or view reader never does (the
    input would be some other Concat's slice too, or share its bytes unstrided)."""
    if layer.kind in VIEW_KINDS or layer.kind == "Concat":
        return False
    offset, row, stride = rows
    return _every_tactic(layer, target, lambda tactic: tactic.reads_placed(layer, index, row, stride, offset))


def _every_tactic(layer: LayerDesc, target: str, test: Callable[[Tactic], bool]) -> bool:
    """Whether `test` holds for the chosen tactic of each of `layer`'s profiles."""
    tactics = [find_tactic(target, layer.kind, name) for name in layer.profile_tactics or (layer.tactic,)]
    return all(tactic is not None and test(tactic) for tactic in tactics)
