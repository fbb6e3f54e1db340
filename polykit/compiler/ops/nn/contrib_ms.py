"""onnxruntime's com.microsoft norm, activation and embedding ops, lowered at import to standard ONNX ops.

`onnxruntime.transformers.optimizer.optimize_model` writes these into BERT / GPT-2 / ViT files
(the zoo's bert_base and gpt2 exports: 24 SkipLayerNormalization each, 12 BiasGelu / FastGelu).
Each becomes the standard ops it stands for, so the existing passes make of them what they make of
an exporter's own graph: the residual Add fuses into the previous GEMM's epilogue, LayerNormalization
/ RMSNormalization run on their kernels, Gelu (erf or tanh form) and the bias Add fuse into a
Pointwise or a GEMM epilogue -- one code path for the cpu target (the reference kernels, compared
with onnxruntime's contrib kernels by the tests) and the cuda target, and no second implementation
to keep equal to onnxruntime:

    SkipLayerNormalization(x, skip, gamma[, beta][, bias])   -> LayerNormalization(x + skip [+ bias])
        outputs: output, mean, inv_std_var (LayerNormalization's), input_skip_bias_sum (the sum)
    SkipSimplifiedLayerNormalization(x, skip, gamma[, bias]) -> RMSNormalization(x + skip [+ bias])
        outputs: output, input_skip_bias_sum (mean / inv_std_var: a NodeAttributeError)
    Gelu(x) -> Gelu;  BiasGelu(x, b) -> Gelu(x + b);  FastGelu(x[, b]) -> Gelu(x [+ b], approximate="tanh")
    QuickGelu(x; alpha = 1.702) -> x * Sigmoid(alpha * x);  BiasAdd(x, bias, skip) -> x + bias + skip

    EmbedLayerNormalization(ids, segment_ids?, word, position, segment?, gamma, beta?, mask?, position_ids?)
        -> LayerNormalization(Gather(word, ids) + Gather(position, position_ids or 0..S-1)
           [+ Gather(segment, segment_ids)]); mask_index: ReduceSum of (mask == 1) per row (zeros
           without a mask); embedding_sum: the sum. onnxruntime 1.32's optimizer does not emit it for
           the zoo's or tests/data's TorchScript BERT exports (their embeddings stay Gather + Add +
           LayerNormalization), but files prepared by older exports / optimizers have it.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.models.collective import MS_DOMAIN
from polykit.compiler.ops.node_emitter import NodeEmitter
from polykit.compiler.ops.registry import ImportContext, importer
from polykit.errors import NodeAttributeError


def _given(node: Node, i: int) -> str | None:
    return node.inputs[i] if i < len(node.inputs) and node.inputs[i] else None


def _output(node: Node, i: int) -> str | None:
    return node.outputs[i] if i < len(node.outputs) and node.outputs[i] else None


def _skip_sum(node: Node, emit: NodeEmitter, bias_at: int) -> str:
    """input + skip [+ bias], written to output 3 (input_skip_bias_sum) when the node has it."""
    total = emit("Add", [node.inputs[0], node.inputs[1]])
    bias = _given(node, bias_at)
    if bias is not None:
        total = emit("Add", [total, bias])
    kept = _output(node, 3)
    if kept is not None:
        total = emit("Identity", [total], output=kept)
    return total


@importer("SkipLayerNormalization", since=1, domain=MS_DOMAIN)
def _skip_layer_norm(node: Node, ctx: ImportContext) -> list[Node]:
    emit = NodeEmitter(node, ctx)
    total = _skip_sum(node, emit, bias_at=4)
    stats = [_output(node, 1) or "", _output(node, 2) or ""]
    outputs = [node.outputs[0]] + (stats if any(stats) else [])
    inputs = [total, node.inputs[2]] + ([node.inputs[3]] if _given(node, 3) else [])
    emit.nodes.append(Node("LayerNormalization", inputs, outputs,
                           {"axis": -1, "epsilon": float(node.attrs.get("epsilon", 1e-12))},
                           name=ctx.graph.fresh_name(f"{node.name}_LayerNormalization")))
    return emit.nodes


@importer("SkipSimplifiedLayerNormalization", since=1, domain=MS_DOMAIN)
def _skip_simplified_layer_norm(node: Node, ctx: ImportContext) -> list[Node]:
    for i, name in ((1, "mean"), (2, "inv_std_var")):
        if _output(node, i) is not None:
            raise NodeAttributeError(f"{MS_DOMAIN} SkipSimplifiedLayerNormalization: output {i} ({name}) is not supported",
                                     where=node.describe(), hint="use only output 0 (and 3, the sum); "
                                                                 "the statistics are an onnxruntime training aid")
    emit = NodeEmitter(node, ctx)
    total = _skip_sum(node, emit, bias_at=3)
    emit("RMSNormalization", [total, node.inputs[2]], output=node.outputs[0], axis=-1,
         epsilon=float(node.attrs.get("epsilon", 1e-12)))
    return emit.nodes


def _gelu(node: Node, ctx: ImportContext, approximate: str) -> list[Node]:
    emit = NodeEmitter(node, ctx)
    x = node.inputs[0]
    bias = _given(node, 1)
    if bias is not None:
        x = emit("Add", [x, bias])
    emit("Gelu", [x], output=node.outputs[0], approximate=approximate)
    return emit.nodes


@importer("Gelu", since=1, domain=MS_DOMAIN)
def _ms_gelu(node: Node, ctx: ImportContext) -> list[Node]:
    return _gelu(node, ctx, "none")


@importer("BiasGelu", since=1, domain=MS_DOMAIN)
def _bias_gelu(node: Node, ctx: ImportContext) -> list[Node]:
    return _gelu(node, ctx, "none")


@importer("FastGelu", since=1, domain=MS_DOMAIN)
def _fast_gelu(node: Node, ctx: ImportContext) -> list[Node]:
    return _gelu(node, ctx, "tanh")


@importer("QuickGelu", since=1, domain=MS_DOMAIN)
def _quick_gelu(node: Node, ctx: ImportContext) -> list[Node]:
    emit = NodeEmitter(node, ctx)
    x = node.inputs[0]
    alpha = emit("CastLike", [emit.const(np.asarray(float(node.attrs.get("alpha", 1.702)), np.float32), "alpha"), x])
    emit("Mul", [x, emit("Sigmoid", [emit("Mul", [x, alpha])])], output=node.outputs[0])
    return emit.nodes


@importer("BiasAdd", since=1, domain=MS_DOMAIN)
def _bias_add(node: Node, ctx: ImportContext) -> list[Node]:
    emit = NodeEmitter(node, ctx)
    emit("Add", [emit("Add", [node.inputs[0], node.inputs[1]]), node.inputs[2]], output=node.outputs[0])
    return emit.nodes


@importer("EmbedLayerNormalization", since=1, domain=MS_DOMAIN)
def _embed_layer_norm(node: Node, ctx: ImportContext) -> list[Node]:
    """input_ids, segment_ids?, word / position / segment? embeddings, gamma, beta?, mask?, position_ids?
    -> LayerNormalization(word[ids] + position[position_ids or 0..S-1] (+ segment[segment_ids])),
    mask_index (the count of 1s in each mask row; 0 without a mask), embedding_sum."""
    emit = NodeEmitter(node, ctx)
    ids = node.inputs[0]
    total = emit("Gather", [node.inputs[2], ids], axis=0)
    positions = _given(node, 8)
    if positions is None:
        shape = emit("Shape", [ids])
        length = emit("Squeeze", [emit("Gather", [shape, emit.const(np.asarray([1], np.int64), "axis")], axis=0),
                                  emit.const(np.asarray([0], np.int64), "axes")])
        positions = emit("Range", [emit.const(np.asarray(0, np.int64), "zero"), length,
                                   emit.const(np.asarray(1, np.int64), "one")])
    total = emit("Add", [total, emit("Gather", [node.inputs[3], positions], axis=0)])
    if _given(node, 1) is not None and _given(node, 4) is not None:
        total = emit("Add", [total, emit("Gather", [node.inputs[4], node.inputs[1]], axis=0)])
    if _output(node, 2) is not None:
        total = emit("Identity", [total], output=node.outputs[2])
    emit("LayerNormalization", [total, node.inputs[5]] + ([node.inputs[6]] if _given(node, 6) else []),
         output=node.outputs[0], axis=-1, epsilon=float(node.attrs.get("epsilon", 1e-12)))
    if _output(node, 1) is not None:
        mask = _given(node, 7)
        if mask is None:  # no mask: zeros, one per batch row
            rows = emit("Gather", [emit("Shape", [ids]), emit.const(np.asarray([0], np.int64), "axis")], axis=0)
            emit("ConstantOfShape", [rows], output=node.outputs[1], value=np.zeros(1, np.int32))
        else:
            ones = emit("Cast", [emit("Equal", [mask, emit("CastLike", [emit.const(np.asarray(1), "one"), mask])])], to=6)
            emit("ReduceSum", [ones, emit.const(np.asarray([1], np.int64), "axes")], output=node.outputs[1], keepdims=0)
    return emit.nodes
