"""Tiny transformer blocks in the graph form HF's eager TorchScript exports take (the form
onnxruntime's transformer optimizer recognizes), and that optimizer run on them."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Graph:
    def __init__(self, seed: int):
        self.rng, self.nodes, self.inits, self.k = np.random.default_rng(seed), [], [], 0

    def const(self, value, dtype=np.float32) -> str:
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def weight(self, *shape, scale=0.2) -> str:
        return self.const(self.rng.standard_normal(shape) * scale)

    def __call__(self, op, *inputs, **attrs) -> str:
        self.k += 1
        out = f"t{self.k}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"{op}_{self.k}", **attrs))
        return out

    def linear(self, x, d_in, d_out) -> str:
        return self("Add", self("MatMul", x, self.weight(d_in, d_out)), self.weight(d_out, scale=0.1))

    def layer_norm(self, x, d) -> str:
        return self("LayerNormalization", x, self.const(1 + 0.1 * self.rng.standard_normal(d)),
                    self.weight(d, scale=0.1), axis=-1, epsilon=1e-12)

    def gelu(self, x) -> str:
        """The erf form (x * 0.5 * (1 + erf(x / sqrt 2))) the exporter writes for nn.GELU."""
        erf = self("Erf", self("Div", x, self.const(np.sqrt(2.0))))
        return self("Mul", self("Mul", x, self("Add", erf, self.const(1.0))), self.const(0.5))


def tiny_bert(batch=2, seq=7, hidden=32, heads=4, layers=2, seed=0) -> onnx.ModelProto:
    """Post-LN BERT encoder layers with HF's additive padding mask ((1 - mask) * -10000 from an
    int64 [B, S] attention_mask), erf GELU and residual Adds before each LayerNormalization."""
    g = _Graph(seed)
    h = hidden // heads
    x = g.layer_norm("embeddings", hidden)
    mask = g("Cast", g("Unsqueeze", g("Unsqueeze", "attention_mask", g.const([1], np.int64)), g.const([2], np.int64)),
             to=TensorProto.FLOAT)
    mask_add = g("Mul", g("Sub", g.const(1.0), mask), g.const(-10000.0))
    split_heads = g.const([0, 0, heads, h], np.int64)
    for _ in range(layers):
        q = g("Transpose", g("Reshape", g.linear(x, hidden, hidden), split_heads), perm=[0, 2, 1, 3])
        kt = g("Transpose", g("Reshape", g.linear(x, hidden, hidden), split_heads), perm=[0, 2, 3, 1])
        v = g("Transpose", g("Reshape", g.linear(x, hidden, hidden), split_heads), perm=[0, 2, 1, 3])
        scores = g("Add", g("Div", g("MatMul", q, kt), g.const(np.sqrt(h))), mask_add)
        ctx = g("MatMul", g("Softmax", scores, axis=-1), v)
        merged = g("Reshape", g("Transpose", ctx, perm=[0, 2, 1, 3]), g.const([0, 0, hidden], np.int64))
        x = g.layer_norm(g("Add", g.linear(merged, hidden, hidden), x), hidden)
        ffn = g.linear(g.gelu(g.linear(x, hidden, 4 * hidden)), 4 * hidden, hidden)
        x = g.layer_norm(g("Add", ffn, x), hidden)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    graph = helper.make_graph(g.nodes, "tiny_bert",
                              [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, [batch, seq, hidden]),
                               helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, seq])],
                              [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [batch, seq, hidden])],
                              g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def optimize(model: onnx.ModelProto, model_type: str, heads: int, hidden: int) -> onnx.ModelProto:
    """onnxruntime.transformers.optimizer.optimize_model on `model` (no symbolic shape inference:
    it needs sympy, which polykit does not depend on)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions(model_type)
    options.enable_shape_inference = False
    return optimize_model(copy.deepcopy(model), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0,
                          optimization_options=options).model


def tiny_gpt2(batch=2, seq=7, hidden=32, heads=4, layers=2, positions=16, seed=0) -> onnx.ModelProto:
    """Pre-LN GPT-2 blocks as HF's TorchScript export writes them: Conv1D as Reshape -> Gemm ->
    Reshape, the packed QKV Split, the causal mask sliced out of a bool [1, 1, P, P] buffer by the
    key/query lengths and applied by Where, the tanh GELU, residual Adds."""
    g = _Graph(seed)
    h = hidden // heads
    rows, cols = g.const([-1, hidden], np.int64), g.const([batch, seq, hidden], np.int64)

    def conv1d(x, d_in, d_out):
        out = g("Gemm", g("Reshape", x, g.const([-1, d_in], np.int64)), g.weight(d_in, d_out), g.weight(d_out, scale=0.1))
        return g("Reshape", out, g.const([batch, seq, d_out], np.int64))

    causal = g.const(np.tril(np.ones((positions, positions), bool))[None, None], np.bool_)
    x = "embeddings"
    for _ in range(layers):
        a = g.layer_norm(x, hidden)
        qkv = conv1d(a, hidden, 3 * hidden)
        q, k, v = (f"{qkv}_{n}" for n in "qkv")
        g.nodes.append(helper.make_node("Split", [qkv, g.const([hidden] * 3, np.int64)], [q, k, v], axis=2))
        split = g.const([0, 0, heads, h], np.int64)
        q = g("Transpose", g("Reshape", q, split), perm=[0, 2, 1, 3])
        kt = g("Transpose", g("Reshape", k, split), perm=[0, 2, 3, 1])
        v = g("Transpose", g("Reshape", v, split), perm=[0, 2, 1, 3])
        div = g("Div", g("MatMul", q, kt), g.const(np.sqrt(h)))
        shape = g("Shape", div)
        key_len = g("Squeeze", g("Slice", shape, g.const([-1], np.int64), g.const([2**62], np.int64)), g.const([0], np.int64))
        query_len = g("Squeeze", g("Slice", shape, g.const([-2], np.int64), g.const([-1], np.int64)), g.const([0], np.int64))
        end = g("Unsqueeze", key_len, g.const([0], np.int64))
        start = g("Unsqueeze", g("Sub", key_len, query_len), g.const([0], np.int64))
        rows_mask = g("Slice", causal, start, end, g.const([2], np.int64))
        mask = g("Slice", rows_mask, g.const([0], np.int64), end, g.const([3], np.int64))
        probs = g("Softmax", g("Where", mask, div, g.const(np.finfo(np.float32).min)), axis=-1)
        merged = g("Reshape", g("Transpose", g("MatMul", probs, v), perm=[0, 2, 1, 3]), cols)
        out = g("Reshape", g("Gemm", g("Reshape", merged, rows), g.weight(hidden, hidden), g.weight(hidden, scale=0.1)), cols)
        x = g("Add", x, out)
        m = conv1d(g.layer_norm(x, hidden), hidden, 4 * hidden)
        inner = g("Mul", g("Add", m, g("Mul", g("Pow", m, g.const(3.0)), g.const(0.044715))), g.const(np.sqrt(2 / np.pi)))
        m = g("Mul", g("Mul", g.const(0.5), m), g("Add", g.const(1.0), g("Tanh", inner)))
        x = g("Add", x, conv1d(m, 4 * hidden, hidden))
    g.nodes.append(helper.make_node("Identity", [g.layer_norm(x, hidden)], ["last_hidden_state"]))
    graph = helper.make_graph(g.nodes, "tiny_gpt2",
                              [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, [batch, seq, hidden])],
                              [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [batch, seq, hidden])],
                              g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
