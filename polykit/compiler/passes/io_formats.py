"""I/O formats: the dtype and memory layout of each engine input and output (trtexec's
`--inputIOFormats` / `--outputIOFormats`, spelled `fp16:chw`, `fp32:hwc`, `bf16:chw`, `int8:chw`).

`apply_io_formats` gives each named graph input or output the format asked: its value takes
the dtype (and, for `hwc`, the NHWC shape of a rank-4 NCHW tensor), and the conversion to what
the model computes in becomes ordinary nodes at the edge: a Transpose and a Cast after an input,
a Cast and a Transpose before an output. The passes that follow remove them where they match:
an fp16 build's own Cast after a float32 input meets the fp16 input's Cast back to float32
(`cancel_round_trip_casts`, an exact widening then its inverse), an output Cast to the dtype the
layer already writes is an identity (remove_identity), and a channels-last build's Transposes
cancel against the edge Transposes (cancel_transposes). What does not match stays as a layer
(TensorRT's reformat layers): an fp16 input of an fp32 build is cast once.

`int8` is accepted only for a tensor the model already has as int8: a float tensor would need
the quantization scale TensorRT takes from its dynamic range, which the format alone lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.dtypes import NUMPY_TO_ONNX
from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.rewrite import protected, rename_produced, replace_tensor
from polykit.errors import BuildError, UsageError

#: trtexec's dtype names -> numpy dtype names (names: bfloat16 is ml_dtypes', which a lean
#: runtime may not have, and this module is imported on the plan-loading path)
IO_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8"}
#: trtexec's format names this builder gives: linear NCHW and channels-last (rank-4 tensors)
IO_LAYOUTS = ("chw", "hwc")
#: float dtypes whose widening to the next is exact (so narrowing back gives the value again)
EXACT_WIDENING = {("float16", "float32"), ("bfloat16", "float32")}


@dataclass(frozen=True)
class IoFormat:
    """The dtype (numpy name) and layout ("chw": as the model has it, "hwc": NHWC) of one I/O tensor."""

    dtype: str
    layout: str = "chw"

    @staticmethod
    def parse(text: str) -> "IoFormat":
        """`fp16:chw` -> IoFormat("float16", "chw"); UsageError for anything else."""
        dtype, _, layout = str(text).strip().lower().partition(":")
        layout = layout or "chw"
        if dtype not in IO_DTYPES or layout not in IO_LAYOUTS:
            raise UsageError(f"I/O format {text!r} is not DTYPE:FORMAT with DTYPE one of {', '.join(IO_DTYPES)} "
                             f"and FORMAT one of {', '.join(IO_LAYOUTS)}", hint="e.g. fp16:chw or fp32:hwc")
        return IoFormat(IO_DTYPES[dtype], layout)

    def __str__(self) -> str:
        names = {dt: key for key, dt in IO_DTYPES.items()}
        return f"{names[self.dtype]}:{self.layout}"


def formats_by_name(formats: Sequence[str | IoFormat], names: Sequence[str], what: str) -> dict[str, IoFormat]:
    """One format per tensor of `names` (in order), or one for all; {} when none are given."""
    parsed = [f if isinstance(f, IoFormat) else IoFormat.parse(f) for f in formats]
    if not parsed:
        return {}
    if len(parsed) == 1:
        parsed = parsed * len(names)
    if len(parsed) != len(names):
        raise UsageError(f"{len(parsed)} {what} I/O formats for {len(names)} {what}s ({', '.join(names)})",
                         hint=f"give one format for all {what}s or one per {what}, in the model's order")
    return dict(zip(names, parsed))


def apply_io_formats(graph: Graph, formats: Mapping[str, IoFormat]) -> bool:
    """Give graph inputs and outputs the formats asked (module docstring); True if any changed."""
    changed = False
    for name, fmt in formats.items():
        if name in graph.inputs:
            changed |= _input(graph, name, fmt)
        elif name in graph.outputs:
            changed |= _output(graph, name, fmt)
        else:
            raise BuildError(f"I/O format {fmt} names {name!r}, which is no graph input or output",
                             hint="formats follow the model's inputs and outputs in order")
    if changed:
        graph.toposort()
    return changed


def _check(graph: Graph, name: str, fmt: IoFormat) -> tuple[np.dtype, np.dtype, tuple]:
    value = graph.value(name)
    have, want = value.dtype, np.dtype(fmt.dtype)
    if have is None or not value.is_tensor:
        raise BuildError(f"tensor {name!r} has no known tensor dtype; it cannot take I/O format {fmt}",
                         where=f"tensor {name!r}")
    if want != have and (want.kind not in "fV" or np.dtype(have).kind not in "fV"):
        raise BuildError(f"tensor {name!r} is {np.dtype(have).name}; I/O format {fmt} would need a conversion "
                         "polykit does not make (int8 I/O needs the tensor's quantization scale)",
                         where=f"tensor {name!r}", hint="give float tensors fp32/fp16/bf16 formats; int8 only to "
                                                        "tensors the model has as int8")
    shape = value.shape
    if fmt.layout == "hwc" and (shape is None or len(shape) != 4 or not value.is_static):
        raise BuildError(f"tensor {name!r} has shape {shape}; the hwc format is for static rank-4 NCHW tensors",
                         where=f"tensor {name!r}", hint="use chw for it, or give its shape with --input-shapes")
    return np.dtype(have), want, tuple(shape) if shape is not None else None


def _edge(graph: Graph, src: str, dst: str, steps: list[tuple[str, dict]], dtypes: list[np.dtype],
          shapes: list[tuple]) -> None:
    """Append nodes `steps` ((op, attrs) each) carrying `src` to `dst`, step k writing a tensor of
    dtypes[k] and shapes[k] (the last one `dst`, whose value the caller sets)."""
    for k, (op, attrs) in enumerate(steps):
        out = dst if k == len(steps) - 1 else graph.fresh_name(f"{dst}_{op.lower()}")
        graph.nodes.append(Node(op, [src], [out], attrs, name=graph.fresh_name(f"{dst}_io_{op.lower()}")))
        if out != dst:
            graph.set_value(graph.value(src).with_(name=out, dtype=dtypes[k], shape=shapes[k]))
        src = out


def _input(graph: Graph, name: str, fmt: IoFormat) -> bool:
    """The input takes `fmt`; a Cast to the model's dtype, then a Transpose to NCHW, feed its readers."""
    have, want, shape = _check(graph, name, fmt)
    if want == have and fmt.layout == "chw":
        return False
    outer = (shape[0], shape[2], shape[3], shape[1]) if fmt.layout == "hwc" else shape
    inner = graph.fresh_name(f"{name}_model")
    replace_tensor(graph, name, inner)  # the model's readers read the converted tensor
    model_value = graph.value(name).with_(name=inner)
    graph.set_value(graph.value(name).with_(dtype=want, shape=outer))
    steps = ([("Cast", {"to": NUMPY_TO_ONNX[have]})] if want != have else []) + \
        ([("Transpose", {"perm": [0, 3, 1, 2]})] if fmt.layout == "hwc" else [])
    _edge(graph, name, inner, steps, [have] * len(steps), [outer] * len(steps))
    graph.set_value(model_value)
    return True


def _output(graph: Graph, name: str, fmt: IoFormat) -> bool:
    """The output takes `fmt`; a Transpose to NHWC, then a Cast, follow the model's producer."""
    have, want, shape = _check(graph, name, fmt)
    if want == have and fmt.layout == "chw":
        return False
    if name in graph.inputs:
        raise BuildError(f"output {name!r} is also an input; it keeps the input's format", where=f"tensor {name!r}")
    outer = (shape[0], shape[2], shape[3], shape[1]) if fmt.layout == "hwc" else shape
    inner = graph.fresh_name(f"{name}_model")
    rename_produced(graph, name, inner)  # the model's producer writes `inner`; the edge nodes write `name`
    graph.outputs = [name if o == inner else o for o in graph.outputs]
    steps = ([("Transpose", {"perm": [0, 2, 3, 1]})] if fmt.layout == "hwc" else []) + \
        ([("Cast", {"to": NUMPY_TO_ONNX[want]})] if want != have else [])
    _edge(graph, inner, name, steps, [have] * len(steps), [outer] * len(steps))
    graph.set_value(graph.value(inner).with_(name=name, dtype=want, shape=outer))
    return True


def cancel_round_trip_casts(graph: Graph, keep: Iterable[str] = ()) -> bool:
    """Readers of Cast(Cast(a: exact widening), back to a's dtype) read `a` itself; True if any did."""
    producers = graph.producers()
    kept = protected(graph, keep)
    changed = False
    for node in graph.nodes:
        if node.op_type != "Cast" or node.domain or node.outputs[0] in kept:
            continue
        first = producers.get(node.input(0))
        if first is None or first.op_type != "Cast" or first.domain:
            continue
        a, mid = graph.value(first.input(0)).dtype, graph.value(first.outputs[0]).dtype
        back = graph.value(node.outputs[0]).dtype
        if a is None or mid is None or back is None:
            continue
        if np.dtype(back) == np.dtype(a) and (np.dtype(a).name, np.dtype(mid).name) in EXACT_WIDENING:
            replace_tensor(graph, node.outputs[0], first.input(0))
            changed = True
    return changed
