"""Small ONNX models for refit tests, each in two versions with the same structure and other
weights (the `seed`): one per way the builder derives a plan weight from initializers."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.compiler.int8_models import qat_conv_nodes
from tests.conv_models import resnet


def _model(nodes: list, inits: dict[str, np.ndarray], x_shape: list[int], y_shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "refit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def conv_bn(seed: int) -> onnx.ModelProto:
    """Convs with BatchNormalization (folded into the conv weights and biases), a residual, a Gemm."""
    return resnet((1, 1), width=8, image=16, batch=2, seed=seed)


def mlp(seed: int) -> onnx.ModelProto:
    """Gemm with transB (its weight transposed for the kernels where they want it), MatMul + Add."""
    rng = np.random.default_rng(seed)
    inits = {"fc1.weight": rng.standard_normal((32, 16)).astype(np.float32) * 0.25,
             "fc1.bias": rng.standard_normal(32).astype(np.float32) * 0.1,
             "fc2.weight": rng.standard_normal((32, 8)).astype(np.float32) * 0.2,
             "fc2.bias": rng.standard_normal(8).astype(np.float32) * 0.1}
    nodes = [helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], name="fc1", transB=1),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "fc2.weight"], ["m"], name="fc2"),
             helper.make_node("Add", ["m", "fc2.bias"], ["y"], name="fc2_bias")]
    return _model(nodes, inits, [4, 16], [4, 8])


def folded_chain(seed: int) -> onnx.ModelProto:
    """A weight computed from initializers only (Transpose, then Mul by a per-column scale): the
    builder's constant folding evaluates the chain into one plan weight."""
    rng = np.random.default_rng(seed)
    inits = {"w_t": rng.standard_normal((8, 16)).astype(np.float32) * 0.3,
             "w_scale": rng.uniform(0.5, 1.5, (16, 8)).astype(np.float32),
             "bias": rng.standard_normal(8).astype(np.float32) * 0.1}
    nodes = [helper.make_node("Transpose", ["w_t"], ["w"], name="w_transpose", perm=[1, 0]),
             helper.make_node("Mul", ["w", "w_scale"], ["w_scaled"], name="w_mul"),
             helper.make_node("MatMul", ["x", "w_scaled"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "bias"], ["a"], name="mm_bias"),
             helper.make_node("Tanh", ["a"], ["y"], name="tanh")]
    return _model(nodes, inits, [3, 16], [3, 8])


def qat_conv(seed: int) -> onnx.ModelProto:
    """A QAT export's quantized conv (int8_models.qat_conv_nodes): the builder folds the float
    weight and its per-channel scales into the int8 weight of a QConv."""
    rng = np.random.default_rng(seed)
    nodes = qat_conv_nodes()
    inits = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
             "ws": rng.uniform(0.002, 0.004, 8).astype(np.float32), "wz": np.zeros(8, np.int8)}
    return _model(nodes, inits, [1, 3, 8, 8], [1, 8, 8, 8])


def gelu_mlp(seed: int, half: float = 0.5) -> onnx.ModelProto:
    """MatMul then an erf GELU whose constants are initializers: the builder recognizes the
    GELU only for the value 0.5 of `half` (a value a fold depends on)."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.standard_normal((16, 16)).astype(np.float32) * 0.25, "half": np.array(half, np.float32),
             "one": np.array(1.0, np.float32), "sqrt2": np.array(np.sqrt(2.0), np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Div", ["h", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="add"),
             helper.make_node("Mul", ["h", "a"], ["m"], name="mul"),
             helper.make_node("Mul", ["m", "half"], ["y"], name="mul_half")]
    return _model(nodes, inits, [2, 16], [2, 16])


def projections(seed: int) -> onnx.ModelProto:
    """Three MatMuls reading one tensor (q, k with a bias Add, v without): the builder packs their
    weights and biases into one weight and one bias (passes.pack_gemms)."""
    rng = np.random.default_rng(seed)
    inits = {f"w{n}": rng.standard_normal((16, 8)).astype(np.float32) * 0.25 for n in "qkv"}
    inits.update({f"b{n}": rng.standard_normal(8).astype(np.float32) * 0.1 for n in "qk"})
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}m"], name=f"{n}_proj") for n in "qkv"]
    nodes += [helper.make_node("Add", [f"{n}m", f"b{n}"], [f"{n}b"], name=f"{n}_bias") for n in "qk"]
    nodes += [helper.make_node("Relu", [t], [f"{t}_relu"], name=f"{t}_relu") for t in ("qb", "kb", "vm")]
    nodes.append(helper.make_node("Concat", ["vm_relu", "qb_relu", "kb_relu"], ["y"], name="concat", axis=1))
    return _model(nodes, inits, [3, 16], [3, 24])


def feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out
