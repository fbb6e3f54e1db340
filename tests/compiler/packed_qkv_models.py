"""Attention blocks whose q, k, v are selections of one packed QKV projection, as exporters write them
(onnx.helper, float32, random weights): the cases fold_attention_layouts turns into strided views.

- "vit": [B, S, 3, H, D] -> Transpose (2, 0, 3, 1, 4) -> Gather 0 / 1 / 2 (timm's and Swin's qkv[i]);
- "unbind": the same transpose, then a Split into three and Squeeze (timm's qkv.unbind(0));
- "torchvision": [S, B, 3E] (MultiheadAttention, batch second) -> unflatten, unsqueeze, transpose,
  squeeze -> [3, S, B, E] -> Gather -> [S, B*H, D] -> Transpose -> [B, H, S, D];
- "gpt2": [B, S, 3E] -> Split(E, axis 2) -> [B, S, H, D] -> Transpose (0, 2, 1, 3), K transposed
  (0, 2, 3, 1) for the scores (HF GPT-2's split and key.transpose(-1, -2)).

Masks: "causal" (an additive [S, S] constant: 0 on and below the diagonal, -1e4 above), "additive"
(a random [B, 1, 1, S] input: padding), or none.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

FORMS = ("vit", "unbind", "torchvision", "gpt2")


def packed_block(form: str, B: int, S: int, H: int, D: int, mask: str | None = None, seed: int = 0):
    """The model: input x ([B, S, E], torchvision [S, B, E]) -> packed projection -> attention ->
    [B, S, E] ([S, B, E]) output y; mask input `m` [B, 1, 1, S] for mask "additive"."""
    E = H * D
    rng = np.random.default_rng(seed)
    inits = {"w": (rng.standard_normal((E, 3 * E)) / np.sqrt(E)).astype(np.float32),
             "b": (0.1 * rng.standard_normal(3 * E)).astype(np.float32),
             "scale": np.array(D ** -0.5, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["qkv"])]

    def shape(name, dims):
        inits[name] = np.array(dims, np.int64)
        return name

    if form in ("vit", "unbind"):
        nodes += [helper.make_node("Reshape", ["qkv", shape("s5", [B, S, 3, H, D])], ["qkv5"]),
                  helper.make_node("Transpose", ["qkv5"], ["qkvt"], perm=[2, 0, 3, 1, 4])]
        if form == "vit":
            for i, n in enumerate("qkv"):
                inits[f"i{i}"] = np.array(i, np.int64)
                nodes.append(helper.make_node("Gather", ["qkvt", f"i{i}"], [n], axis=0))
        else:
            nodes.append(helper.make_node("Split", ["qkvt", shape("ones", [1, 1, 1])], ["q1", "k1", "v1"], axis=0))
            nodes += [helper.make_node("Squeeze", [f"{n}1", shape("ax0", [0])], [n]) for n in "qkv"]
        kt = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    elif form == "torchvision":
        nodes += [helper.make_node("Reshape", ["qkv", shape("s4", [S, B, 3, E])], ["qkv4"]),
                  helper.make_node("Unsqueeze", ["qkv4", shape("ax0", [0])], ["qkv5"]),
                  helper.make_node("Transpose", ["qkv5"], ["qkvt"], perm=[3, 1, 2, 0, 4]),
                  helper.make_node("Squeeze", ["qkvt", shape("ax3", [3])], ["proj"])]
        for i, n in enumerate("qkv"):
            inits[f"i{i}"] = np.array(i, np.int64)
            nodes += [helper.make_node("Gather", ["proj", f"i{i}"], [f"{n}sb"], axis=0),
                      helper.make_node("Reshape", [f"{n}sb", shape("sbh", [S, B * H, D])], [f"{n}3"]),
                      helper.make_node("Transpose", [f"{n}3"], [f"{n}bh"], perm=[1, 0, 2]),
                      helper.make_node("Reshape", [f"{n}bh", shape("bhsd", [B, H, S, D])], [n])]
        kt = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    elif form == "gpt2":
        nodes.append(helper.make_node("Split", ["qkv", shape("thirds", [E, E, E])], ["qs", "ks", "vs"], axis=2))
        for n in "qkv":
            nodes.append(helper.make_node("Reshape", [f"{n}s", shape("bshd", [B, S, H, D])], [f"{n}4"]))
        nodes += [helper.make_node("Transpose", ["q4"], ["q"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", ["v4"], ["v"], perm=[0, 2, 1, 3])]
        kt = [helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1])]
    else:
        raise ValueError(form)
    nodes += kt + [helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s1"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [S, B, E] if form == "torchvision" else [B, S, E])]
    scores = add_mask(mask, "s1", B, S, nodes, inits, inputs)
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"])]
    if form == "torchvision":  # [B, H, S, D] -> [S, B, H, D] -> [S, B, E]
        nodes += [helper.make_node("Transpose", ["o"], ["ot"], perm=[2, 0, 1, 3]),
                  helper.make_node("Reshape", ["ot", shape("out", [S, B, E])], ["y"])]
        out = [S, B, E]
    else:
        nodes += [helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["ot", shape("out", [B, S, E])], ["y"])]
        out = [B, S, E]
    graph = helper.make_graph(nodes, f"packed_{form}", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def add_mask(mask: str | None, scores: str, B: int, S: int, nodes: list, inits: dict, inputs: list) -> str:
    """Add mask "causal" (a constant) or "additive" (input `m`) to `scores`; the masked scores' name."""
    if mask == "causal":
        inits["causal"] = np.triu(np.full((S, S), -1e4, np.float32), 1)
    elif mask == "additive":
        inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [B, 1, 1, S]))
    else:
        return scores
    nodes.append(helper.make_node("Add", [scores, "causal" if mask == "causal" else "m"], [f"{scores}_masked"]))
    return f"{scores}_masked"


def padding_mask(rng: np.random.Generator, B: int, S: int) -> np.ndarray:
    """A random additive [B, 1, 1, S] padding mask (0 or -1e4) that keeps key 0 of every row."""
    m = np.where(rng.random((B, 1, 1, S)) > 0.25, 0.0, -1e4).astype(np.float32)
    m[..., 0] = 0.0
    return m


def feeds(form: str, B: int, S: int, H: int, D: int, mask: str | None = None, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    E = H * D
    out = {"x": rng.standard_normal((S, B, E) if form == "torchvision" else (B, S, E)).astype(np.float32)}
    if mask == "additive":
        out["m"] = padding_mask(rng, B, S)
    return out
