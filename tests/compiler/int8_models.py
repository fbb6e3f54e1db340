"""Float models, structured data and onnxruntime-quantized copies for the INT8 tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conv_models import resnet

BATCH = 2


def images(seed: int, batch: int = BATCH, size: int = 16, channels: int = 3) -> np.ndarray:
    """Structured, non-zero images: a few sinusoidal gratings per channel plus a little noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, size), np.linspace(0, 1, size), indexing="ij")
    out = np.empty((batch, channels, size, size))
    for b in range(batch):
        for c in range(channels):
            fx, fy, phase = rng.uniform(0.5, 3), rng.uniform(0.5, 3), rng.uniform(0, 6)
            out[b, c] = np.sin(2 * np.pi * (fx * xx + fy * yy) + phase)
    return (out + 0.1 * rng.standard_normal(out.shape)).astype(np.float32)


def qat_conv_nodes() -> list[onnx.NodeProto]:
    """A QAT export's quantized conv, as it writes it: scales in Constant nodes, the float weight
    "w" QuantizeLinear'd with per-channel scales "ws" and zero points "wz" (the model's
    initializers), x -> Conv (pads 1) -> Relu -> y, activations Q/DQ'd per tensor."""
    scalar = lambda name, value: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))  # noqa: E731
    return [scalar("xs", np.array(0.02, np.float32)), scalar("xz", np.array(3, np.int8)),
            scalar("ys", np.array(0.05, np.float32)), scalar("yz", np.array(0, np.int8)),
            helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="xq"),
            helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="xdq"),
            helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="wq", axis=0),
            helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="wdq", axis=0),
            helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["rq"], name="rq"),
            helper.make_node("DequantizeLinear", ["rq", "ys", "yz"], ["y"], name="rdq")]


def convnet(size: int = 16) -> onnx.ModelProto:
    """x[2,3,16,16] -> Conv 3x3 (bias) -> Relu -> Conv 3x3/2 grouped -> Relu -> GlobalAveragePool ->
    Flatten -> Gemm (transB) -> y[2,10]."""
    rng = np.random.default_rng(3)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2], group=2),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1),
    ]
    inits = [init("w1", 8, 3, 3, 3), init("b1", 8, scale=0.1), init("w2", 16, 4, 3, 3), init("b2", 16, scale=0.1),
             init("w3", 10, 16), init("b3", 10, scale=0.1)]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def mlp() -> onnx.ModelProto:
    """x[4,16] -> MatMul + Add -> Relu -> Gemm -> y[4,10]."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in (("w1", (16, 32)), ("b1", (32,)), ("w2", (32, 10)), ("b2", (10,)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
             helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
             helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
             helper.make_node("Gemm", ["h2", "w2", "b2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def small_resnet() -> onnx.ModelProto:
    """A ResNet-50-shaped net (tests/conv_models.py), one block per stage, 16x16 images."""
    return resnet(depths=(1, 1, 1, 1), width=8, image=16, batch=BATCH)


def feeds_for(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    x = model.graph.input[0]
    dims = [d.dim_value for d in x.type.tensor_type.shape.dim]
    if len(dims) == 4:
        return {x.name: images(seed, dims[0], dims[2], dims[1])}
    return {x.name: np.random.default_rng(seed).standard_normal(dims).astype(np.float32)}


def quantize_with_onnxruntime(model: onnx.ModelProto, path: Path, *, activations: str, per_channel: bool,
                              reduce_range: bool = False, batches: int = 6) -> str:
    """The model quantized by onnxruntime.quantization.quantize_static (QDQ format), calibrated
    with a CalibrationDataReader on `batches` structured batches; `activations`: "uint8" or "int8";
    `reduce_range`: 7-bit weights (what onnxruntime's own x86 int8 kernels need to be exact)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([feeds_for(model, seed) for seed in range(batches)])

        def get_next(self):
            return next(self.feeds, None)

    float_path = path.with_suffix(".float.onnx")
    onnx.save(model, str(float_path))
    quantize_static(str(float_path), str(path), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    reduce_range=reduce_range, activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    return str(path)
