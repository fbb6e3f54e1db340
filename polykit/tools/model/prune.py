"""`polykit surgeon prune`: Polygraphy's 2:4 pruning of a model's weights (polygraphy/tools/sparse.py,
SparsityPruner), for functional tests of sparse tactics: accuracy is not considered.

Which weights, along which axis (Polygraphy's walk): every MatMul's A along axis 1 and B along
axis 0, every Gemm's A along axis 0 (transA) or 1 and B along axis 1 (transB) or 0, every
Conv's weight along axis 1 (input channels). From each such input the walk looks back through
QuantizeLinear / DequantizeLinear / Cast (same axis) and Transpose (the axis through its perm)
to an initializer; it stops at any other producer. An initializer is pruned when it is float32,
float16 or bfloat16 and the axis' length is a multiple of 4: in every group of 4 consecutive
elements along the axis the 2 of smallest magnitude become 0 (polykit.compiler.plan.sparse24.prune:
ties keep the earlier element, as Polygraphy's first-minimum rule does).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from polykit.compiler.plan.sparse24 import prune

log = logging.getLogger("polykit")

#: producers the walk looks through with the axis unchanged
AXIS_PRESERVING = ("QuantizeLinear", "DequantizeLinear", "TRT_FP8QuantizeLinear", "TRT_FP8DequantizeLinear", "Cast")


@dataclass(frozen=True)
class PruneTarget:
    """An initializer to prune and the axis its groups of 4 run along."""

    name: str
    axis: int


def _int_attr(node: Any, name: str, default: int = 0) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def prune_targets(model: Any) -> list[PruneTarget]:
    """The initializers Polygraphy's walk prunes, each with its axis, in the order the walk meets them."""
    import onnx

    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    found: dict[str, PruneTarget] = {}

    def track(tensor: str, axis: int) -> None:
        seen = set()
        while tensor not in initializers:
            node = producers.get(tensor)
            if node is None or tensor in seen:
                return
            seen.add(tensor)
            if node.op_type in AXIS_PRESERVING:
                tensor = node.input[0]
            elif node.op_type == "Transpose":
                perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
                if perm is None or axis not in perm:
                    log.warning("Transpose %r has no perm naming axis %d: %r not pruned", node.name, axis, tensor)
                    return
                tensor, axis = node.input[0], perm.index(axis)
            else:
                return
        found[tensor] = PruneTarget(tensor, axis)

    for node in graph.node:
        if node.op_type == "MatMul":
            track(node.input[0], 1)
            track(node.input[1], 0)
        elif node.op_type == "Gemm":
            track(node.input[0], 0 if _int_attr(node, "transA") else 1)
            track(node.input[1], 1 if _int_attr(node, "transB") else 0)
        elif node.op_type == "Conv":
            track(node.input[1], 1)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    out = []
    for target in found.values():
        t = initializers[target.name]
        if t.data_type not in floats:
            log.warning("skipping %r: its dtype (%s) is not float32, float16 or bfloat16", t.name,
                        onnx.TensorProto.DataType.Name(t.data_type))
        elif target.axis >= len(t.dims) or t.dims[target.axis] % 4:
            log.info("skipping %r: axis %d of %s is not a multiple of 4", t.name, target.axis, list(t.dims))
        else:
            out.append(target)
    return out


def prune_model(model: Any) -> tuple[Any, list[PruneTarget]]:
    """`model` with its prune_targets pruned to 2:4 in place (and them)."""
    from onnx import numpy_helper

    targets = prune_targets(model)
    initializers = {t.name: t for t in model.graph.initializer}
    for target in targets:
        tensor = initializers[target.name]
        array = numpy_helper.to_array(tensor)
        if array.dtype.kind == "V" or array.dtype.name == "bfloat16":  # bfloat16 as raw 16-bit words
            array = array.view(np.uint16)
            magnitude = (array.astype(np.uint32) << 16).view(np.float32)
            keep = prune(magnitude, target.axis) != 0
            pruned = np.where(keep, array, np.uint16(0))
            tensor.raw_data = pruned.astype("<u2").tobytes()
            tensor.ClearField("int32_data")
            continue
        tensor.CopyFrom(numpy_helper.from_array(prune(array, target.axis), name=target.name))
    return model, targets

