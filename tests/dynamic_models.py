"""ONNX models with dynamic input dims, built in code (random weights), for the dynamic-shape tests.

- `encoder`: a transformer encoder over [batch, seq, d] with an additive [batch, seq] mask,
  whose head split and merge reshape through Shape -> Gather -> Unsqueeze -> Concat chains as
  a torch export with dynamic axes has them.
- `mlp`: an MLP over [batch, tokens, features] that flattens the leading dims (Reshape -1)
  and restores them from Shape -> Slice -> Concat.
- `convnet`: tests.conv_models.resnet with a dynamic batch, height and width.
- `window_pad`: Swin's patch merging over channels-last [batch, height, width, 8]: a Pad whose
  pads (H % 2, W % 2 at the end of H and W) come from Shape -> Gather -> Mod -> Concat, then the
  four 2x2-strided Slices, their Concat and a MatMul. A profile of even corners needs no padding
  at any corner; an odd shape between them pads two axes that are not the last.
- `embedding`: token and position embeddings as exports build them: Range over the sequence
  length, Expand to the ids' shape, a Slice of the position table ending at the length, and a
  ConstantOfShape of the ids' shape.
- `tiny_bert`: a real exporter's graph: torch.onnx.export of a 2-layer HF BertModel (hidden 64,
  vocab 1000, opset 21, dynamic batch/seq), stored without its large weights
  (tests/data/tiny_bert_dynamic_graph.onnx), which get seeded random values here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conv_models import resnet


class _Graph:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, array, prefix: str = "c") -> str:
        self.count += 1
        name = f"{prefix}{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, *shape: int, scale: float = 0.3) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def op(self, op: str, *inputs: str, **attrs) -> str:
        self.count += 1
        out = f"{op.lower()}{self.count}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"{out}_node", **attrs))
        return out

    def linear(self, x: str, cin: int, cout: int) -> str:
        return self.op("Add", self.op("MatMul", x, self.weight(cin, cout)), self.weight(cout, scale=0.1))

    def layer_norm(self, x: str, d: int) -> str:
        scale = self.const((1 + 0.1 * self.rng.standard_normal(d)).astype(np.float32), "g")
        return self.op("LayerNormalization", x, scale, self.weight(d, scale=0.1), axis=-1, epsilon=1e-5)

    def model(self, inputs, outputs, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _dim(g: _Graph, shape: str, axis: int) -> str:
    """Unsqueeze(Gather(shape, axis)): one dim of a Shape output as a 1-element tensor."""
    return g.op("Unsqueeze", g.op("Gather", shape, g.const(np.int64(axis), "i"), axis=0), g.const(np.array([0])))


def encoder(layers: int = 2, d: int = 32, heads: int = 4, seed: int = 0) -> onnx.ModelProto:
    """Inputs "x" float [batch, seq, d] and "mask" float [batch, seq] (0 or -1e4); output "y"."""
    g = _Graph(seed)
    hd = d // heads
    x = "x"
    for _ in range(layers):
        shape = g.op("Shape", x)
        b, s = _dim(g, shape, 0), _dim(g, shape, 1)
        split = g.op("Concat", b, s, g.const(np.array([heads])), g.const(np.array([hd])), axis=0)

        def heads_of(perm, x=x, split=split):
            return g.op("Transpose", g.op("Reshape", g.linear(x, d, d), split), perm=perm)

        q, k, v = heads_of([0, 2, 1, 3]), heads_of([0, 2, 3, 1]), heads_of([0, 2, 1, 3])
        scores = g.op("Div", g.op("MatMul", q, k), g.const(np.float32(np.sqrt(hd))))
        bias = g.op("Unsqueeze", "mask", g.const(np.array([1, 2])))
        probs = g.op("Softmax", g.op("Add", scores, bias), axis=-1)
        merged = g.op("Reshape", g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3]),
                      g.op("Concat", b, s, g.const(np.array([d])), axis=0))
        x = g.layer_norm(g.op("Add", x, g.linear(merged, d, d)), d)
        h = g.linear(x, d, 2 * d)
        erf = g.op("Erf", g.op("Div", h, g.const(np.float32(np.sqrt(2.0)))))
        gelu = g.op("Mul", g.op("Mul", h, g.op("Add", erf, g.const(np.float32(1.0)))), g.const(np.float32(0.5)))
        x = g.layer_norm(g.op("Add", x, g.linear(gelu, 2 * d, d)), d)
    g.nodes.append(helper.make_node("Identity", [x], ["y"], name="y_node"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"])]
    return g.model(inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", d])], "encoder")


def mlp(features: int = 16, hidden: int = 32, classes: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Input "x" float [batch, tokens, features]; output "y" [batch, tokens, classes]."""
    g = _Graph(seed)
    flat = g.op("Reshape", "x", g.const(np.array([-1, features])))
    h = g.op("Relu", g.op("Gemm", flat, g.weight(features, hidden), g.weight(hidden, scale=0.1)))
    logits = g.op("Gemm", h, g.weight(hidden, classes), g.weight(classes, scale=0.1))
    lead = g.op("Slice", g.op("Shape", "x"), g.const(np.array([0])), g.const(np.array([-1])))
    g.nodes.append(helper.make_node("Reshape", [logits, g.op("Concat", lead, g.const(np.array([classes])), axis=0)],
                                    ["y"], name="y_node"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", features])]
    return g.model(inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], "mlp")


def convnet(seed: int = 0) -> onnx.ModelProto:
    """A small ResNet (input "image" [batch, 3, height, width], output "logits")."""
    model = resnet(depths=(1, 1), width=8, image=32, batch=2, seed=seed)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for axis, name in ((0, "batch"), (2, "height"), (3, "width")):
        dims[axis].dim_param = name
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    return model


def window_pad(channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Input "x" float [batch, height, width, channels]; output "y" float
    [batch, ceil(height / 2), ceil(width / 2), channels]."""
    g = _Graph(seed)
    shape, two, zeros = g.op("Shape", "x"), g.const(np.array([2])), g.const(np.zeros(5, np.int64))
    h_pad, w_pad = (g.op("Mod", _dim(g, shape, axis), two) for axis in (1, 2))
    pads = g.op("Concat", zeros, h_pad, w_pad, g.const(np.array([0])), axis=0)
    x = g.op("Pad", "x", pads, g.const(np.float32(0.0)), mode="constant")
    big = np.iinfo(np.int64).max
    parts = [g.op("Slice", x, g.const(np.array([i, j])), g.const(np.array([big, big])), g.const(np.array([1, 2])),
                  g.const(np.array([2, 2]))) for i, j in ((0, 0), (1, 0), (0, 1), (1, 1))]
    merged = g.op("Concat", *parts, axis=-1)
    g.nodes.append(helper.make_node("MatMul", [merged, g.weight(4 * channels, channels)], ["y"], name="y_node"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "height", "width", channels])]
    return g.model(inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], "window_pad")


def embedding(vocab: int = 100, positions: int = 64, d: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Input "ids" int64 [batch, seq] (seq <= positions); output "y" float [batch, seq, d]."""
    g = _Graph(seed)
    shape = g.op("Shape", "ids")
    seq = g.op("Gather", shape, g.const(np.int64(1)), axis=0)
    table = g.weight(positions, d)
    pos = g.op("Range", g.const(np.int64(0)), seq, g.const(np.int64(1)))
    pos = g.op("Expand", g.op("Unsqueeze", pos, g.const(np.array([0]))), shape)
    h = g.op("Add", g.op("Gather", g.weight(vocab, d), "ids"), g.op("Gather", table, pos))
    window = g.op("Slice", table, g.const(np.array([0])), g.op("Unsqueeze", seq, g.const(np.array([0]))),
                  g.const(np.array([0])))
    ones = g.op("ConstantOfShape", shape, value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))
    scale = g.op("Transpose", g.op("Unsqueeze", ones, g.const(np.array([1]))), perm=[0, 2, 1])
    g.nodes.append(helper.make_node("Mul", [g.op("Add", h, window), scale], ["y"], name="y_node"))
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])]
    return g.model(inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], "embedding")


TINY_BERT = Path(__file__).parent / "data" / "tiny_bert_dynamic_graph.onnx"


def tiny_bert(seed: int = 0) -> onnx.ModelProto:
    """Inputs "input_ids" and "attention_mask" int64 [batch, seq] (seq <= 512, ids < 1000);
    output "out" float [batch, seq, 64]. The stored graph's weights without data get
    N(0, 0.05) values (BERT's own init is N(0, 0.02); larger makes the layers matter)."""
    model = onnx.load(str(TINY_BERT))
    rng = np.random.default_rng(seed)
    for i, init in enumerate(model.graph.initializer):
        if not init.HasField("raw_data") and not init.float_data:
            values = (rng.standard_normal(tuple(init.dims)) * 0.05).astype(np.float32)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(values, init.name))
    return model
