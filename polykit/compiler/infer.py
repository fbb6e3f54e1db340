"""Shape and dtype inference with polykit's own rules (onnx.shape_inference only cross-checks).

Walks the graph in order and asks each op's shape rule for its outputs. Small tensors
whose inputs are all known (shape chains: Shape -> Gather -> Concat -> Reshape) are
evaluated on the way with the reference kernels, so rules that read a shape from an
input (Reshape, Expand, Slice, ...) see it as a constant and give exact shapes.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import Graph, Node, Value
from polykit.compiler.registry import InferContext, find_shape_rule
from polykit.errors import PolykitError, ShapeError, UnsupportedModelError

#: Tensors up to this many elements are evaluated during inference when their inputs are known.
PROPAGATE_MAX_ELEMENTS = 4096

_NEVER_PROPAGATE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def infer_shapes(graph: Graph, strict: bool = True) -> dict[str, np.ndarray]:
    """Fill `graph.values` for every tensor; return the small constant values found.

    With strict=True an op without a shape rule raises UnsupportedModelError listing every
    such node; with strict=False their outputs stay unknown.
    """
    from polykit.kernels.registry import find_reference

    known: dict[str, np.ndarray] = {k: v for k, v in graph.initializers.items() if v.size <= PROPAGATE_MAX_ELEMENTS}
    # build-time values of inputs (BuilderConfig.input_values): shape tensors whose data shapes depend on
    for name, arr in (graph.metadata.get("input_values") or {}).items():
        if name in graph.inputs:
            known[name] = np.asarray(arr)
    missing: list[tuple[str, str, str, int]] = []
    for node in graph.nodes:
        rule = find_shape_rule(node.domain, node.op_type)
        if rule is None:
            missing.append((node.name, node.op_type, node.domain, graph.opsets.get(node.domain, graph.opset)))
            continue
        dtypes, shapes, consts = [], [], []
        for name in node.inputs:
            v = graph.value(name) if name else Value("")
            dtypes.append(v.dtype)
            shapes.append(v.shape)
            consts.append(known.get(name) if name else None)
        if node.op_type == "Shape" and node.domain == "" and shapes and shapes[0] is not None:
            pass  # handled by its rule + propagation below when the shape is static
        ctx = InferContext(node, dtypes, shapes, consts)
        try:
            results = rule(ctx)
        except PolykitError:
            raise
        except Exception as exc:  # a rule bug or a malformed node: report the node, not a bare error
            raise ShapeError(
                f"shape inference failed: {type(exc).__name__}: {exc}",
                where=node.describe(),
                hint="check the node's inputs and attributes against the ONNX spec",
            ) from exc
        if len(results) < len([o for o in node.outputs if o]):
            raise ShapeError(
                f"shape rule gave {len(results)} outputs for {len(node.outputs)} declared",
                where=node.describe(),
            )
        for out, (dt, shape) in zip(node.outputs, results):
            if out:
                graph.set_value(Value(out, None if dt is None else np.dtype(dt), None if shape is None else tuple(shape)))
        _propagate(node, graph, known, find_reference)
    if missing and strict:
        raise UnsupportedModelError(missing, where=f"graph {graph.name!r}")
    return known


def _propagate(node: Node, graph: Graph, known: dict[str, np.ndarray], find_reference) -> None:
    """Evaluate a node whose inputs are known and whose outputs are small."""
    if node.op_type in _NEVER_PROPAGATE:
        return
    if node.op_type == "Shape" and node.domain == "":
        shape = graph.value(node.inputs[0]).shape
        if shape is None or not all(isinstance(d, int) for d in shape):
            return
    elif node.op_type == "Size" and node.domain == "":
        shape = graph.value(node.inputs[0]).shape
        if shape is None or not all(isinstance(d, int) for d in shape):
            return
        known[node.outputs[0]] = np.array(int(np.prod(shape)), dtype=np.int64)
        return
    elif not all((not name) or name in known for name in node.inputs):
        return
    data_dependent = False
    for out in node.outputs:
        v = graph.value(out)
        if v.shape is not None and v.is_static and int(np.prod(v.shape)) > PROPAGATE_MAX_ELEMENTS:
            return
        data_dependent |= bool(out) and not (v.shape is not None and v.is_static)
    if data_dependent and (node.op_type in ("Shape", "Size") or not node.inputs or any(
            name and known[name].size > PROPAGATE_MAX_ELEMENTS for name in node.inputs)):
        return  # only small known inputs give an output whose shape depends on their values
    fn = find_reference(node.domain, node.op_type)
    if fn is None:
        return
    if node.op_type == "Shape" and node.domain == "":
        # Shape of a static tensor needs only its shape: give the kernel a stand-in of that shape.
        shape = graph.value(node.inputs[0]).shape
        args = [np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=shape, strides=(0,) * len(shape))]
    else:
        args = [known.get(name) if name else None for name in node.inputs]
    try:
        outs = fn(node, args)
    except Exception:
        return  # leave it unknown; constant folding reports real failures
    for name, arr in zip(node.outputs, outs):
        if not name:
            continue
        arr = np.asarray(arr)
        if data_dependent:  # the value fixes a shape its rule could not know (NonZero, Unique, ...)
            graph.set_value(Value(name, graph.value(name).dtype or arr.dtype, tuple(arr.shape)))
        if arr.size <= PROPAGATE_MAX_ELEMENTS:
            known[name] = arr
