"""Sequence and optional values: their metadata (ir.Value.wrap) and their runtime form.

ONNX has three kinds of value besides tensors: a sequence of tensors of one element type, an
optional tensor and an optional sequence. polykit describes them with the element tensor's
dtype and shape plus `Value.wrap`, the containers around it outermost first, and, for a
sequence whose length the build knows, `Value.elements`, each element's shape.

At run time (the graph evaluator, the reference kernels, the engine's feeds and outputs) a
sequence is a Python list of arrays and an optional is None (empty) or its element (an array
or a list). The list structure lives on the host; each element is an ordinary array.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import OPTIONAL, SEQUENCE, Shape, Value
from polykit.errors import RuntimeInputError

#: the ONNX TypeProto field of each container
_FIELDS = {"sequence_type": SEQUENCE, "optional_type": OPTIONAL}


def value_of_type(name: str, type_proto: Any) -> Value:
    """The Value an ONNX TypeProto describes (a tensor, or a sequence/optional of one)."""
    wrap: list[str] = []
    tp = type_proto
    while tp.WhichOneof("value") in _FIELDS:
        kind = tp.WhichOneof("value")
        wrap.append(_FIELDS[kind])
        tp = getattr(tp, kind).elem_type
    tt = tp.tensor_type
    dt = dtypes.ONNX_TO_NUMPY.get(tt.elem_type) if tt.elem_type else None
    shape = None
    if tt.HasField("shape"):
        dims: list[Any] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:  # unknown, or a negative dim_value (some exporters write -1 for "dynamic")
                dims.append(None)
        shape = tuple(dims)
    return Value(name, dt, shape, tuple(wrap))


def type_of_value(v: Value) -> Any:
    """The ONNX TypeProto of a Value (the inverse of value_of_type)."""
    from onnx import helper

    elem = dtypes.to_onnx(v.dtype) if v.dtype is not None else 0
    shape = None if v.shape is None else [d if d is not None else None for d in v.shape]
    tp = helper.make_tensor_type_proto(elem, shape)
    for kind in reversed(v.wrap):
        tp = helper.make_sequence_type_proto(tp) if kind == SEQUENCE else helper.make_optional_type_proto(tp)
    return tp


def describe(v: Value) -> str:
    """A Value's type as text, e.g. "sequence(float32)" or "optional(sequence(int64))"."""
    text = np.dtype(v.dtype).name if v.dtype is not None else "?"
    for kind in reversed(v.wrap):
        text = f"{kind}({text})"
    return text


def merge_all(shapes: Sequence[Shape]) -> Shape:
    """The shape every one of `shapes` fits (equal dims kept, others unknown; None: ranks differ).
    An empty list gives None: nothing is known of an element that does not exist."""
    if not shapes or any(s is None for s in shapes):
        return None
    first = shapes[0]
    if any(len(s) != len(first) for s in shapes):
        return None
    return tuple(d if all(s[k] == d for s in shapes) else None for k, d in enumerate(first))


def sequence_value(dtype: Any, elements: Sequence[Shape] | None, shape: Shape = None) -> Value:
    """A sequence's Value from its elements' shapes (None: length unknown, every element `shape`)."""
    if elements is not None:
        elements = tuple(None if s is None else tuple(s) for s in elements)
        shape = merge_all(elements) if elements else shape
    return Value("", None if dtype is None else np.dtype(dtype), shape, (SEQUENCE,), elements)


def runtime_form(value: Any, v: Value, where: str) -> Any:
    """A fed value in its runtime form for input `v` (lists of arrays for sequences, None or the
    element for optionals), after checking it fits; RuntimeInputError names what does not."""
    if not v.wrap:
        return value
    kind, inner = v.wrap[0], v.with_(wrap=v.wrap[1:], elements=None)
    if kind == OPTIONAL:
        return None if value is None else runtime_form(value, inner, where)
    if not isinstance(value, (list, tuple)):
        raise RuntimeInputError(f"input {v.name!r} is a {describe(v)}, the feed is a {type(value).__name__}",
                                where=where, hint="feed a sequence as a Python list of numpy arrays")
    out = []
    for i, item in enumerate(value):
        arr = np.asarray(runtime_form(item, inner, where))
        if v.dtype is not None and arr.dtype != v.dtype:
            raise RuntimeInputError(f"element {i} of input {v.name!r} has dtype {arr.dtype}, the sequence holds "
                                    f"{np.dtype(v.dtype).name}", where=where,
                                    hint=f"convert it with .astype(np.{np.dtype(v.dtype).name})")
        out.append(arr)
    return out


def feed_shapes(value: Any) -> Any:
    """The shape signature of a runtime value: a tuple of ints for an array, a list of the
    elements' signatures for a sequence, None for an empty optional."""
    if value is None:
        return None
    if isinstance(value, list):
        return [feed_shapes(x) for x in value]
    return tuple(np.shape(value))


def copy_value(value: Any) -> Any:
    """An independent copy of a runtime value (arrays copied, lists rebuilt)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [copy_value(x) for x in value]
    return np.array(value, copy=True)


def merge_values(a: Value, b: Value) -> Value:
    """The Value both `a` and `b` fit (an If's two branches, a loop-carried value's iterations):
    element shapes merged, per-element shapes kept only when equal; an empty sequence fits any."""
    if a.elements == ():
        shape = b.shape
    elif b.elements == ():
        shape = a.shape
    else:
        shape = merge_all([a.shape, b.shape])
    return Value("", a.dtype or b.dtype, shape, a.wrap or b.wrap, a.elements if a.elements == b.elements else None)
