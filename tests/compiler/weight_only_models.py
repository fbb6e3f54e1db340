"""Weight-only quantized models as LLM exporters write them: DequantizeLinear of a constant
int4 / uint4 / float4_e2m1fn / int8 / uint8 weight (per tensor, per output channel, or in blocks
along K, ONNX 21's block_size) feeding MatMul or Gemm; built in code with seeded random values."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: weight type -> (ONNX type, value range drawn from, opset that has the type)
TYPES = {"int4": (TensorProto.INT4, (-8, 7), 21), "uint4": (TensorProto.UINT4, (0, 15), 21),
         "int8": (TensorProto.INT8, (-128, 127), 21), "uint8": (TensorProto.UINT8, (0, 255), 21),
         "float4_e2m1fn": (TensorProto.FLOAT4E2M1, None, 23)}
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def quantized(name: str, weight_type: str, shape, rng) -> onnx.TensorProto:
    onnx_type, bounds, _ = TYPES[weight_type]
    if bounds is None:
        values = rng.choice(FP4, shape).astype(np.float32)
    else:
        values = rng.integers(bounds[0], bounds[1] + 1, shape)
    return helper.make_tensor(name, onnx_type, list(shape), values.ravel().tolist())


def weight_only(weight_type: str = "int4", *, k: int = 72, n: int = 40, block: int | None = 16, zero_point: bool = True,
                op: str = "MatMul", x_shape=("batch", 3, None), trans_b: bool = False, bias: bool = False,
                elem: str = "float32", seed: int = 0) -> onnx.ModelProto:
    """x[*x_shape[:-1], K] -> DequantizeLinear(W) -> op -> y. `block` None: per output channel;
    0: per tensor; else blocked along K. Gemm takes x 2-D, `trans_b` (W stored [N, K]) and `bias`."""
    rng = np.random.default_rng(seed)
    onnx_type, _, opset = TYPES[weight_type]
    w_shape = (n, k) if trans_b else (k, n)
    k_axis = 1 if trans_b else 0
    if block is None:
        s_shape, attrs = (n,), {"axis": 1 - k_axis}
    elif block == 0:
        s_shape, attrs = (), {}
    else:
        s_shape = tuple(-(-k // block) if i == k_axis else n for i in range(2))
        attrs = {"axis": k_axis, "block_size": block}
    dtype = np.dtype(elem)
    inits = [quantized("wq", weight_type, w_shape, rng),
             numpy_helper.from_array((rng.uniform(0.005, 0.05, s_shape)).astype(dtype), "w_scale")]
    dq_inputs = ["wq", "w_scale"]
    if zero_point and weight_type != "float4_e2m1fn":
        inits.append(quantized("w_zero", weight_type, s_shape, rng))
        dq_inputs.append("w_zero")
    nodes = [helper.make_node("DequantizeLinear", dq_inputs, ["w"], name="dq_w", **attrs)]
    x_dims = [d for d in x_shape[:-1]] + [k]
    if op == "MatMul":
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"))
    else:
        gemm_in = ["x", "w"]
        if bias:
            inits.append(numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(dtype), "b"))
            gemm_in.append("b")
        nodes.append(helper.make_node("Gemm", gemm_in, ["y"], name="fc", transB=int(trans_b)))
    graph = helper.make_graph(nodes, f"weight_only_{weight_type}", [helper.make_tensor_value_info("x", ELEM[elem], x_dims)],
                              [helper.make_tensor_value_info("y", ELEM[elem], None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10 if opset < 23 else 11)


def mlp(weight_type: str = "int4", *, d: int = 64, hidden: int = 96, block: int = 32, seed: int = 0) -> onnx.ModelProto:
    """x[batch, seq, d] -> weight-only MatMul -> Add bias -> Relu -> weight-only MatMul -> y: two
    layers sharing nothing, the form of a transformer's MLP."""
    rng = np.random.default_rng(seed)
    onnx_type, _, opset = TYPES[weight_type]
    inits, nodes = [], []
    prev = "x"
    for i, (k, n) in enumerate(((d, hidden), (hidden, d))):
        inits += [quantized(f"w{i}", weight_type, (k, n), rng),
                  numpy_helper.from_array(rng.uniform(0.005, 0.05, (-(-k // block), n)).astype(np.float32), f"s{i}")]
        nodes.append(helper.make_node("DequantizeLinear", [f"w{i}", f"s{i}"], [f"wf{i}"], name=f"dq{i}", axis=0,
                                      block_size=block))
        nodes.append(helper.make_node("MatMul", [prev, f"wf{i}"], [f"mm{i}"], name=f"fc{i}"))
        prev = f"mm{i}"
        if i == 0:
            inits.append(numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), "b0"))
            nodes += [helper.make_node("Add", ["mm0", "b0"], ["h0"], name="bias0"),
                      helper.make_node("Relu", ["h0"], ["r0"], name="relu0")]
            prev = "r0"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "weight_only_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                       ["batch", "seq", d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10 if opset < 23 else 11)
