"""insert_qdq: quantize a float graph from calibrated scales (implicit INT8, BuilderConfig.int8).

Every Conv, Gemm (transA=0) and MatMul whose weight is a float32 constant (rank 2 for Gemm and
MatMul) and whose activation input has a scale gets QuantizeLinear -> DequantizeLinear on that
input (int8, symmetric: zero point 0; one pair per tensor, shared by its readers) and its
weight quantized symmetrically per output channel from the channel's max-abs (int8 in
[-127, 127], scale max|w| / 127) behind a DequantizeLinear. fold_qdq, which runs right after,
folds them into INT8 layers; a layer's output is requantized when its sole reader is the next
layer's QuantizeLinear (TensorRT's int8 in, int8 out). A residual Add that joins a quantized
tensor to a quantized layer's output reads the tensor dequantized too (TensorRT's int8 residual):
the tensor's producer then writes int8 alone, and the Add's layer reads it as int8. A residual Add
of two quantized layers' outputs (a bottleneck's last conv and its downsampling shortcut) gets a
Q/DQ on the later layer's output where that has a scale (`residual_candidates`: calibrated beside
the layers' inputs): fold_qdq gives the Add to the earlier layer's epilogue, so the later one
writes its output 8-bit and the epilogue reads it so, where it was written and read as float32
(ResNet-50 bs32's four shortcuts: 193 MB each way in float32, 48 MB in 8 bits).
With fp8 (BuilderConfig.fp8) the same in float8_e4m3fn: activation Q/DQ to e4m3 (zero point 0),
weights per output channel with scale max|w| / 448, rounded to nearest even (fold_qdq then makes
FP8 layers).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ops.quant.int8 import F32, FP8
from polykit.compiler.graph.evaluator import RANDOM_OPS
from polykit.compiler.passes.rewrite import const

#: op -> the axis of its weight that holds the output channels (Gemm: with transB=0)
WEIGHT_AXIS = {"Conv": 0, "Gemm": 1, "MatMul": 1}
QMAX = 127
#: the largest finite float8_e4m3fn
FP8_MAX = 448.0


def constant_tensors(graph: Graph) -> set[str]:
    """Initializers and what nodes compute from them alone (folding will make them initializers)."""
    known = set(graph.initializers)
    for node in graph.nodes:
        if node.op_type not in RANDOM_OPS and all(not n or n in known for n in node.inputs):
            known.update(o for o in node.outputs if o)
    return known


def int8_candidates(graph: Graph, constants: set[str]) -> list[tuple[Node, str]]:
    """(node, its float32 activation input) of every op insert_qdq quantizes, in graph order."""
    found = []
    for node in graph.nodes:
        if node.domain or node.op_type not in WEIGHT_AXIS:
            continue
        x, w, b = graph.value(node.input(0)), graph.value(node.input(1)), node.input(2)
        if x.dtype != F32 or w.dtype != F32 or x.name in constants or w.name not in constants or w.shape is None:
            continue
        if b and b not in constants:
            continue
        rank = len(w.shape)
        if node.op_type == "Conv" and rank < 3 or node.op_type != "Conv" and rank != 2:
            continue
        if node.op_type == "Gemm" and int(node.attrs.get("transA", 0)):
            continue
        if node.op_type != "Conv" and len(x.shape or ()) < 2:
            continue
        found.append((node, x.name))
    return found


def residual_candidates(graph: Graph, candidates: list[tuple[Node, str]],
                        keep: frozenset[str] = frozenset()) -> list[str]:
    """The outputs of quantized ops (`candidates`, int8_candidates') that a residual Add alone reads beside
    another such output, the later of the two ops in graph order: fold_qdq gives the Add to the earlier op's
    epilogue (it takes chains in graph order), so this one is the Add's residual. An op's output read by a
    BatchNormalization alone stands for the norm's output (the name the op writes once the norm is folded):
    the imported graph and the folded one name the same tensors."""
    readers = graph.consumers()
    made: dict[str, int] = {}
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    for node, _ in candidates:
        y = node.outputs[0] if node.outputs else ""
        after = readers.get(y, [])
        if len(after) == 1 and after[0].op_type == "BatchNormalization" and not after[0].domain:
            y = after[0].outputs[0]
        if y:
            made[y] = order[id(node)]
    found = []
    for node in graph.nodes:
        if node.op_type != "Add" or node.domain or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        if a == b or a not in made or b not in made:
            continue
        late = a if made[a] > made[b] else b
        if [id(r) for r in readers.get(late, [])] == [id(node)] and late not in graph.outputs and late not in keep:
            found.append(late)
    return found


def weight_axis(node: Node) -> int:
    """The output-channel axis of the node's weight."""
    if node.op_type == "Gemm" and int(node.attrs.get("transB", 0)):
        return 0
    return WEIGHT_AXIS[node.op_type]


def quantize_weight(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per channel of `axis`): symmetric, scale = max|w| / 127
    (1 for an all-zero channel), values rounded half to even; a NaN weight becomes 0 (polykit's
    float -> integer rule, kernels/reference/cast.py)."""
    from polykit.compiler.ops.tensor.cast_reference import float_to_int

    others = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w.astype(np.float64)), axis=others)
    scale = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
    shape = [-1 if i == axis else 1 for i in range(w.ndim)]
    with np.errstate(invalid="ignore"):
        q = np.clip(np.rint(w.astype(np.float64) / scale.astype(np.float64).reshape(shape)), -QMAX, QMAX)
    return float_to_int(q, np.int8), scale


def quantize_weight_fp8(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(float8_e4m3fn weight, float32 scale per channel of `axis`): scale = max|w| / 448 (1 for an
    all-zero channel), w / scale rounded to nearest even and saturated to +-448; NaN stays NaN."""
    others = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w.astype(np.float32)), axis=others)
    scale = np.where(amax > 0, amax / np.float32(FP8_MAX), 1.0).astype(np.float32)
    shape = [-1 if i == axis else 1 for i in range(w.ndim)]
    with np.errstate(invalid="ignore"):
        q = np.clip(w.astype(np.float32) / scale.reshape(shape), -FP8_MAX, FP8_MAX)
    return q.astype(FP8), scale


def insert_qdq(graph: Graph, *, scales: Mapping[str, float], keep: frozenset[str] = frozenset(),
               fp32_layers: Iterable[str] = (), fp8: bool = False) -> bool:
    """Quantize the candidates whose activation has a scale; True if any. `fp32_layers` (node
    names or op types) stay float. `fp8`: to float8_e4m3fn instead of int8."""
    qtype = FP8 if fp8 else np.dtype(np.int8)
    pinned = set(fp32_layers)
    shared: dict[str, str] = {}
    quantized: set[str] = set()
    added: list[Node] = []
    candidates = int8_candidates(graph, set(graph.initializers))
    residuals = residual_candidates(graph, candidates, keep)
    for node, x in candidates:
        if {node.name, node.op_type} & pinned or x not in scales:
            continue
        if x not in shared:
            shared[x] = _fake_quantize(graph, x, float(scales[x]), added, qtype)
        axis = weight_axis(node)
        wq, w_scale = (quantize_weight_fp8 if fp8 else quantize_weight)(const(graph, node.input(1)), axis)
        w_out = graph.fresh_name(f"{node.input(1)}_dq")
        added.append(Node("DequantizeLinear", [graph.add_initializer(wq, f"{node.input(1)}_{qtype.name[:5]}"),
                                               graph.add_initializer(w_scale, f"{node.input(1)}_scale"),
                                               graph.add_initializer(np.zeros(w_scale.shape, qtype), "zero")],
                          [w_out], {"axis": axis}, name=graph.fresh_name(f"{node.name}_weight_dq")))
        node.inputs = [shared[x], w_out] + node.inputs[2:]
        quantized.add(node.outputs[0])
    residual_dq = {y: _fake_quantize(graph, y, float(scales[y]), added, qtype)
                   for y in residuals if y in quantized and y in scales and y not in shared}
    graph.nodes += added
    for node in graph.nodes:
        if node.op_type == "Add" and not node.domain:
            node.inputs = [residual_dq.get(name, name) for name in node.inputs]
    _quantize_residuals(graph, shared, quantized)
    return bool(added)


def _quantize_residuals(graph: Graph, shared: Mapping[str, str], quantized: set[str]) -> None:
    """Make each Add of a quantized tensor and a quantized layer's output read the tensor's DQ."""
    for node in graph.nodes:
        if node.op_type != "Add" or node.domain or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        if a in shared and b in quantized:
            node.inputs = [shared[a], b]
        elif b in shared and a in quantized:
            node.inputs = [a, shared[b]]


def _fake_quantize(graph: Graph, x: str, scale: float, added: list[Node], qtype: np.dtype) -> str:
    """QuantizeLinear -> DequantizeLinear of `x` (int8 or e4m3, zero point 0); the dequantized name."""
    s = graph.add_initializer(np.array(scale, np.float32), f"{x}_scale")
    zero = graph.add_initializer(np.zeros((), qtype), f"{x}_zero_point")
    q, dq = graph.fresh_name(f"{x}_{qtype.name[:5]}"), graph.fresh_name(f"{x}_dq")
    added.append(Node("QuantizeLinear", [x, s, zero], [q], name=graph.fresh_name(f"{x}_quantize")))
    added.append(Node("DequantizeLinear", [q, s, zero], [dq], name=graph.fresh_name(f"{x}_dequantize")))
    return dq
