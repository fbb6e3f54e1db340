"""ai.onnx.ml ops polykit runs by rewriting them into default-domain ops (importers only):

    Binarizer(X)                 -> CastLike(Greater(X, CastLike(threshold, X)), X)
    ArrayFeatureExtractor(X, Y)  -> Gather(X, Reshape(Y, [-1]), axis=-1)   (1-D X: Unsqueeze first,
                                    giving [1, len(Y)] as onnxruntime and ONNX's reference do)
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.node_emitter import NodeEmitter
from polykit.compiler.ops.registry import ImportContext, importer
from polykit.errors import ShapeError

ML_DOMAIN = "ai.onnx.ml"


@importer("Binarizer", domain=ML_DOMAIN)
def _binarizer(node: Node, ctx: ImportContext) -> list[Node]:
    emit = NodeEmitter(node, ctx)
    x = node.inputs[0]
    threshold = emit("CastLike", [emit.const(np.float64(node.attrs.get("threshold", 0.0)), "threshold"), x])
    emit("CastLike", [emit("Greater", [x, threshold]), x], output=node.outputs[0])
    return emit.nodes


@importer("ArrayFeatureExtractor", domain=ML_DOMAIN)
def _array_feature_extractor(node: Node, ctx: ImportContext) -> list[Node]:
    emit = NodeEmitter(node, ctx)
    x, indices = node.inputs[0], node.inputs[1]
    shape = ctx.graph.value(x).shape
    if shape is None:
        raise ShapeError("ArrayFeatureExtractor of an input whose rank is unknown at import",
                                    where=node.describe(), hint="give the model input a shape")
    if len(shape) == 1:
        x = emit("Unsqueeze", [x, emit.const(np.array([0], np.int64), "row")])
    flat = emit("Reshape", [indices, emit.const(np.array([-1], np.int64), "flat")])
    emit("Gather", [x, flat], output=node.outputs[0], axis=-1)
    return emit.nodes
