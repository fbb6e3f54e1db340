"""fold_qdq: explicit quantization into INT8 layers (ai.polykit QConv / QMatMul, docs/INT8.md).

    DequantizeLinear(Xq) ─┐
    DequantizeLinear(Wq) ─┴▶ Conv | Gemm | MatMul ─▶ [elementwise chain] ─▶ [QuantizeLinear]

becomes one INT8 layer reading Xq and Wq: the product accumulates in integers, the chain is its
float32 epilogue, and a QuantizeLinear that is the chain's sole reader becomes its fused
requantization (else the layer writes float32). A chain input read through a per-tensor
DequantizeLinear of an 8-bit activation (a residual) is read as the 8-bit tensor and dequantized
in the epilogue (`dequantizing_steps`). What a layer takes: X per tensor; W constant
for Conv and Gemm (per tensor, or per output channel: axis 0 of Conv's W, Gemm's N axis, the
last axis of MatMul's B), a MatMul's B may be an activation quantized per tensor; int8 or
uint8 with zero points; constant biases (Gemm's alpha and beta folded in; transA=0; a MatMul's bias
Add at the head of its chain too: leading_bias). Constants
are initializers, Constant nodes or Identity / Q/DQ of those (a QAT export's QuantizeLinear of a float
weight, a DequantizeLinear of an int32 bias), evaluated here. Anything else (blocked scales, float16
scales, per-axis activations, non-constant biases) stays as written: Q and DQ run as their own
layers and the op in float, which computes exactly what the model says (a MatMul/Gemm weight of
those is then kept packed by passes.fold_weight_only, when it qualifies).

FP8 (docs/INT8.md "FP8"): the same patterns with float8_e4m3fn X and W (zero points 0) make the
same layers on float8 operands, and a saturating QuantizeLinear to float8_e4m3fn after one is its
requantization; an 8-bit integer operand never pairs with a float8 one (it stays as written).

It runs before constant folding (which would turn weight DQs into float weights) and again
after insert_qdq has quantized a calibrated graph (polykit.compiler.builder.quantize).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.quant.int8 import F32, FP8, QUANT_DTYPES
from polykit.compiler.passes.fuse_bias_activation import epilogue_chain
from polykit.compiler.passes.fuse_pointwise import body_step
from polykit.compiler.passes.rewrite import const, json_safe, protected, replace_nodes, sole_reader

#: float op -> INT8 kind it folds into
FOLDS = {"Conv": "QConv", "Gemm": "QMatMul", "MatMul": "QMatMul"}
#: ops whose constant outputs the pass evaluates (it runs before constant folding; Identity: torch.onnx's export
#: reads an initializer that equals another, a BERT's zero biases among them, through an Identity of the first)
CONSTANT_OPS = frozenset({"Constant", "Identity", "QuantizeLinear", "DequantizeLinear"})
#: ONNX TensorProto codes a QuantizeLinear's output_dtype may name for a fused requantization
_Q_CODES = {0: np.dtype(np.uint8), 2: np.dtype(np.uint8), 3: np.dtype(np.int8),
            **({17: FP8} if FP8 is not None else {})}


@dataclass(frozen=True)
class Dequantized:
    """A tensor read through a DequantizeLinear: its int8/uint8/float8_e4m3fn source, float32 scale and
    zero point (both scalars, or 1-D along `axis`; axis None: per tensor)."""

    node: Node
    source: str
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None


def dequantized(graph: Graph, name: str, producers: dict[str, Node]) -> Dequantized | None:
    node = producers.get(name)
    if node is None or node.op_type != "DequantizeLinear" or node.domain != "":
        return None
    source = graph.value(node.input(0))
    scale = constant_value(graph, node.input(1), producers)
    if (source.dtype not in QUANT_DTYPES or source.shape is None or scale is None or scale.dtype != F32
            or int(node.attrs.get("block_size", 0)) > 0 or int(node.attrs.get("output_dtype", 0)) not in (0, 1)):
        return None
    zero = constant_value(graph, node.input(2), producers) if node.input(2) else np.zeros(scale.shape, source.dtype)
    if zero is None or zero.dtype != source.dtype or zero.size != scale.size or (zero.dtype == FP8 and np.any(zero)):
        return None
    if scale.size == 1:
        return Dequantized(node, node.input(0), scale.reshape(()), zero.reshape(()), None)
    axis = int(node.attrs.get("axis", 1)) % len(source.shape)
    return Dequantized(node, node.input(0), scale.reshape(-1), zero.reshape(-1), axis)


def requantizer(graph: Graph, node: Node | None, producers: dict[str, Node]) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, zero point) of a per-tensor QuantizeLinear to int8/uint8 (or a saturating one to
    float8_e4m3fn, zero point 0), or None."""
    if node is None or node.op_type != "QuantizeLinear" or node.domain != "":
        return None
    scale = constant_value(graph, node.input(1), producers)
    code = int(node.attrs.get("output_dtype", 0))
    if scale is None or scale.dtype != F32 or scale.size != 1 or code not in _Q_CODES:
        return None
    if int(node.attrs.get("precision", 0)) not in (0, 1) or int(node.attrs.get("block_size", 0)) > 0:
        return None
    zero = constant_value(graph, node.input(2), producers) if node.input(2) else np.zeros((), _Q_CODES[code])
    if zero is None or zero.size != 1 or zero.dtype not in QUANT_DTYPES:
        return None
    if zero.dtype == FP8 and (np.any(zero) or not int(node.attrs.get("saturate", 1))):
        return None
    return scale.reshape(()), zero.reshape(())


def fold_qdq(graph: Graph, *, keep: frozenset[str] = frozenset(), fp32_layers: Iterable[str] = ()) -> bool:
    """Replace every foldable Q/DQ pattern by an INT8 layer; True if any. Ops named in
    `fp32_layers` (node names or op types) stay float."""
    fixed = protected(graph, keep)
    pinned = set(fp32_layers)
    producers, readers = graph.producers(), graph.consumers()
    replacements: dict[int, Node] = {}
    dead: list[Node] = []
    claimed: set[int] = set()
    for base in graph.nodes:
        if base.domain or base.op_type not in FOLDS or {base.name, base.op_type} & pinned or len(base.outputs) != 1:
            continue
        operands = _operands(graph, base, producers)
        if operands is None:
            continue
        chain = epilogue_chain(graph, base, readers, fixed)
        if any(id(n) in claimed for n in chain):  # a residual Add another layer's epilogue took
            chain = []
        bias = leading_bias(graph, base, chain, readers, producers) if operands.bias is None else None
        if bias is not None:  # the chain's first step moves into the B slot
            operands = replace(operands, bias=bias)
        last = chain[-1].outputs[0] if chain else base.outputs[0]
        q = sole_reader(graph, last, readers, fixed)
        requant = requantizer(graph, q, producers)
        if requant is not None and (requant[1].dtype == FP8) != (operands.x.zero_point.dtype == FP8):
            requant = None  # an INT8 layer writes integers, an FP8 one float8
        tail = chain + ([q] if requant is not None else [])
        node = _int8_node(graph, base, operands, chain, q if requant is not None else None, requant, producers,
                          absorbed=bias is not None)
        if node is None:
            continue
        replacements[id(tail[-1] if tail else base)] = node
        claimed.update(id(n) for n in tail)
        dead.extend([base, *tail[:-1]])
    return replace_nodes(graph, replacements, dead)


@dataclass(frozen=True)
class _Operands:
    x: Dequantized
    w: Dequantized
    weight: str  # the int8 tensor the layer reads (Gemm's transB: a transposed copy)
    attrs: dict
    alpha: float
    bias: np.ndarray | None


def _operands(graph: Graph, base: Node, producers: dict[str, Node]) -> _Operands | None:
    x = dequantized(graph, base.input(0), producers)
    w = dequantized(graph, base.input(1), producers)
    if x is None or w is None or x.axis is not None or (x.zero_point.dtype == FP8) != (w.zero_point.dtype == FP8):
        return None
    wq = constant_value(graph, w.source, producers)
    rank = len(graph.value(w.source).shape)
    if base.op_type == "Conv":
        if wq is None or w.axis not in (None, 0):
            return None
        return _with_bias(graph, base, x, w, w.source, dict(base.attrs), 1.0, base.input(2), 1.0, wq.shape[0], producers)
    x_rank = len(graph.value(x.source).shape or ())
    if base.op_type == "MatMul":
        if x_rank < 2 or rank < 2 or w.axis not in (None, rank - 1) or (wq is None and w.axis is not None):
            return None
        return _Operands(x, w, w.source, {}, 1.0, None)
    trans_b = int(base.attrs.get("transB", 0))
    if wq is None or int(base.attrs.get("transA", 0)) or x_rank != 2 or w.axis not in (None, 0 if trans_b else 1):
        return None
    weight = graph.add_initializer(np.ascontiguousarray(wq.T), f"{base.name}_Bt") if trans_b else w.source
    n = wq.shape[0 if trans_b else 1]
    return _with_bias(graph, base, x, w, weight, {}, float(base.attrs.get("alpha", 1.0)), base.input(2),
                      float(base.attrs.get("beta", 1.0)), n, producers)


def _with_bias(graph: Graph, base: Node, x: Dequantized, w: Dequantized, weight: str, attrs: dict, alpha: float,
               bias_name: str, beta: float, channels: int, producers: dict[str, Node]) -> _Operands | None:
    if not bias_name:
        return _Operands(x, w, weight, attrs, alpha, None)
    bias = constant_value(graph, bias_name, producers)
    if bias is None or bias.dtype != F32 or bias.size not in (1, channels) or (bias.ndim == 2 and bias.shape[0] != 1):
        return None
    return _Operands(x, w, weight, attrs, alpha, np.broadcast_to(bias.reshape(-1) * np.float32(beta), (channels,)))


def leading_bias(graph: Graph, base: Node, chain: list[Node], readers: dict[str, list[Node]],
                 producers: dict[str, Node]) -> np.ndarray | None:
    """The [N] float32 bias of a MatMul / Gemm (no bias of its own) whose epilogue chain starts with `Add(product,
    c)`, c a float32 constant along the last axis (as a Linear's export writes it), or None. The layer computes
    `fl(fl(acc * scale) + B)` exactly as the epilogue's Add would on the product, so the step moves into the B
    slot: the epilogue loses its column input (with no other float input an INT8 / FP8 tile finishes in the
    accumulators' layout, gemm_sm90_epilogue.cuh I8_NATIVE; with no other step it has no epilogue), bit for bit
    the same values. Taken only where the product is read by that Add alone (a chain reading it twice keeps it)."""
    if base.op_type not in ("MatMul", "Gemm") or not chain:
        return None
    step, product = chain[0], base.outputs[0]
    if step.op_type != "Add" or step.domain or len(step.inputs) != 2 or product not in step.inputs \
            or [id(n) for n in readers.get(product, [])] != [id(step)]:
        return None
    other = step.inputs[1] if step.inputs[0] == product else step.inputs[0]
    value = constant_value(graph, other, producers) if other and other != product else None
    shape = graph.value(product).shape
    if value is None or value.dtype != F32 or value.ndim < 1 or not shape or value.ndim > len(shape) \
            or value.shape[-1] != shape[-1] or any(d != 1 for d in value.shape[:-1]):
        return None
    return np.ascontiguousarray(value.reshape(-1))


def constant_value(graph: Graph, name: str, producers: dict[str, Node]) -> np.ndarray | None:
    """An initializer, a Constant node's value, or an Identity / QuantizeLinear / DequantizeLinear of those
    (a shared or quantized weight or bias), evaluated: this pass runs before constant folding."""
    value = const(graph, name)
    node = producers.get(name) if name else None
    if value is not None or node is None or node.domain or node.op_type not in CONSTANT_OPS:
        return value
    if node.op_type == "Constant":
        return np.asarray(node.attrs["value"]) if "value" in node.attrs else None
    args = [constant_value(graph, n, producers) if n else None for n in node.inputs]
    if any(a is None for n, a in zip(node.inputs, args) if n):
        return None
    from polykit.compiler.ops.references import run_reference

    return run_reference(node, args)[0]


def dequantizing_steps(graph: Graph, chain: list[Node], producers: dict[str, Node]) -> list[Node]:
    """Epilogue steps that dequantize the 8-bit activations the chain reads through a per-tensor
    DequantizeLinear (a residual Add's other input): Cast to float32, Sub the zero point (when not 0),
    Mul the scale, which is DequantizeLinear's value exactly (an integer below 2^9 times a float32
    scale, rounded once), under the DQ output's own name. The layer then reads the 8-bit tensor."""
    inside = {n.outputs[0] for n in chain}
    steps: list[Node] = []
    for name in dict.fromkeys(x for n in chain for x in n.inputs if x and x not in inside):
        dq = dequantized(graph, name, producers)
        if dq is None or dq.axis is not None or constant_value(graph, dq.source, producers) is not None:
            continue
        value = graph.fresh_name(f"{name}_float")
        steps.append(Node("Cast", [dq.source], [value], {"to": 1}))
        if float(dq.zero_point) != 0:
            centered = graph.fresh_name(f"{name}_centered")
            zero = graph.add_initializer(dq.zero_point.astype(F32), f"{name}_zero_point_float")
            steps.append(Node("Sub", [value, zero], [centered]))
            value = centered
        steps.append(Node("Mul", [value, graph.add_initializer(dq.scale.astype(F32), f"{name}_scale")], [name]))
    return steps


def _int8_node(graph: Graph, base: Node, ops: _Operands, chain: list[Node], q: Node | None,
               requant: tuple[np.ndarray, np.ndarray] | None, producers: dict[str, Node], absorbed: bool = False
               ) -> Node | None:
    """The INT8 / FP8 layer of `base` and its `chain` (`absorbed`: the chain's first step is the bias Add now in
    ops.bias, leading_bias; the rest of the chain reads its output as the epilogue's input)."""
    body_chain = chain[1:] if absorbed else chain
    raw = chain[0].outputs[0] if absorbed else base.outputs[0]
    steps = dequantizing_steps(graph, body_chain, producers) + body_chain
    try:
        attrs = json_safe(ops.attrs)
        body = [body_step(n) for n in steps]
    except TypeError:  # an attribute a plan cannot store
        return None

    def add(array: np.ndarray, role: str) -> str:
        return graph.add_initializer(np.ascontiguousarray(array), f"{base.name}_{role}")

    scale = (ops.x.scale * ops.w.scale * np.float32(ops.alpha)).astype(np.float32)
    inputs = [ops.x.source, add(ops.x.zero_point, "x_zero_point"), ops.weight, add(ops.w.zero_point, "w_zero_point"),
              add(scale, "scale"), add(ops.bias.astype(np.float32), "bias") if ops.bias is not None else "",
              add(requant[0], "y_scale") if requant else "", add(requant[1], "y_zero_point") if requant else ""]
    inside = {raw} | {n.outputs[0] for n in steps}
    for n in steps:
        inputs += [name for name in n.inputs if name and name not in inside and name not in inputs[8:]]
    if body_chain:
        attrs["epilogue"] = {"input": raw, "body": body}
    tail = chain + ([q] if q is not None else [])
    attrs["fused_from"] = [ops.x.node.name, ops.w.node.name, base.name, *(n.name for n in tail)]
    output = tail[-1].outputs[0] if tail else base.outputs[0]
    return Node(FOLDS[base.op_type], inputs, [output], attrs, name=base.name, domain=POLYKIT_DOMAIN)
