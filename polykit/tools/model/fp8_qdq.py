"""Explicit FP8 quantization of an ONNX model's linear layers, as NVIDIA ModelOpt and onnxruntime export it:

    scales = calibrate_fp8(model, batches, input_shapes={"input_ids": (8, 128), ...})
    quantized = insert_fp8_qdq(model, scales)          # an onnx.ModelProto; the model is not changed

Every MatMul and Gemm (transA 0) whose activation A is a float32 tensor and whose weight B a rank-2
float32 initializer (a linear layer: attention's activation-by-activation products and softmax
stay as they are) reads A through `QuantizeLinear -> DequantizeLinear` to float8_e4m3fn (zero
point 0, one pair per tensor shared by its readers, per-tensor scale amax / 448 from a calibration
pass of the float model's own activations) and B as a constant e4m3 initializer behind a
DequantizeLinear with one scale per output channel (max |w| / 448, the values rounded to nearest
even and saturated: the compiler's `--fp8` weight rule, insert_qdq.quantize_weight_fp8). polykit's
compiler folds these into FP8 layers (docs/INT8.md "FP8"); onnxruntime runs them as written.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from polykit.errors import UsageError

#: float8_e4m3fn needs QuantizeLinear / DequantizeLinear of opset 19 and IR version 9
MIN_OPSET = 19
MIN_IR_VERSION = 9
LINEAR_OPS = ("MatMul", "Gemm")


def linear_layers(model: Any) -> list[tuple[Any, str, int]]:
    """(node, its activation input, its weight's output-channel axis) of every linear layer of the model's
    main graph, in graph order (module docstring: a float32 activation times a rank-2 float32 initializer)."""
    from onnx import TensorProto

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    found = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in LINEAR_OPS or len(node.input) < 2:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        x, w = node.input[0], node.input[1]
        if x in weights or w not in weights or attrs.get("transA", 0):
            continue
        if weights[w].data_type != TensorProto.FLOAT or len(weights[w].dims) != 2:
            continue  # (a float32 weight makes A float32 too: MatMul's and Gemm's operands share one type)
        axis = 0 if node.op_type == "Gemm" and attrs.get("transB", 0) else 1
        found.append((node, x, axis))
    return found


def calibrate_fp8(model: Any, data: Any, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
                  target: str = "cpu") -> dict[str, float]:
    """Per-tensor e4m3 scale (max |x| / 448 over the batches of `data`) of every linear layer's activation,
    from the float model's own activations: polykit's calibration engine (the fp32 plan of the model
    unfused, on `target`, at `input_shapes`) and its minmax calibrator, as `--fp8` builds calibrate."""
    from polykit.compiler.builder.calibrate import FP8_MAX, calibrate
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx

    names = list(dict.fromkeys(x for _, x, _ in linear_layers(model)))
    if not names:
        raise UsageError("the model has no MatMul or Gemm with a rank-2 float32 initializer weight to quantize",
                         where=f"model {model.graph.name!r}", hint="FP8 Q/DQ goes around linear layers only")
    build = BuilderConfig(target=target, input_shapes={k: tuple(v) for k, v in (input_shapes or {}).items()})
    return calibrate(load_onnx(model), names, data, target, "minmax", build=build, qmax=FP8_MAX)


def insert_fp8_qdq(model: Any, scales: Mapping[str, float]) -> Any:
    """A copy of `model` with FP8 Q/DQ around every linear layer whose activation has a scale in `scales`
    (module docstring). The model needs opset >= 19 (float8 Q/DQ): an older one is a UsageError."""
    import onnx
    from onnx import helper, numpy_helper

    from polykit.compiler.passes.insert_qdq import quantize_weight_fp8

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise UsageError(f"FP8 Q/DQ needs opset {MIN_OPSET} or later; the model has opset {opset}",
                         where=f"model {model.graph.name!r}",
                         hint=f"upgrade it first: polykit surgeon sanitize --upgrade-opset {MIN_OPSET} model.onnx")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.ir_version = max(out.ir_version, MIN_IR_VERSION)
    graph = out.graph
    weights = {t.name: t for t in graph.initializer}
    taken = ({t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
             | {i.name for i in graph.input})

    def fresh(stem: str) -> str:
        name, i = stem, 0
        while name in taken:
            i += 1
            name = f"{stem}_{i}"
        taken.add(name)
        return name

    def initializer(array: np.ndarray, stem: str) -> str:
        name = fresh(stem)
        graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    e4m3 = np.dtype(quantize_weight_fp8(np.ones((1, 1), np.float32), 0)[0].dtype)
    before: dict[int, list[Any]] = {}  # node index -> the Q/DQ nodes to place right before it
    shared: dict[str, str] = {}
    index = {n.output[0]: i for i, n in enumerate(graph.node)}  # protobuf hands out new wrappers: no id()
    for node, x, axis in linear_layers(out):
        if x not in scales:
            continue
        added = before.setdefault(index[node.output[0]], [])
        if x not in shared:
            s = initializer(np.array(scales[x], np.float32), f"{x}_fp8_scale")
            z = initializer(np.zeros((), e4m3), f"{x}_fp8_zero_point")
            q, dq = fresh(f"{x}_e4m3"), fresh(f"{x}_dq")
            added += [helper.make_node("QuantizeLinear", [x, s, z], [q], name=fresh(f"{x}_quantize")),
                      helper.make_node("DequantizeLinear", [q, s, z], [dq], name=fresh(f"{x}_dequantize"))]
            shared[x] = dq
        w = node.input[1]
        wq, w_scale = quantize_weight_fp8(numpy_helper.to_array(weights[w]), axis)
        w_dq = fresh(f"{w}_dq")
        added.append(helper.make_node(
            "DequantizeLinear", [initializer(wq, f"{w}_e4m3"), initializer(w_scale, f"{w}_scale"),
                                 initializer(np.zeros(w_scale.shape, e4m3), f"{w}_zero_point")],
            [w_dq], name=fresh(f"{node.name or w}_weight_dq"), axis=axis))
        node.input[0], node.input[1] = shared[x], w_dq
    nodes = [n for i, node in enumerate(graph.node) for n in (*before.get(i, ()), node)]
    graph.ClearField("node")
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name in used]  # the float weights now read by nobody
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    return out
