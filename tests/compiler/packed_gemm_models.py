"""Transformer blocks whose projections read one tensor through SEPARATE GEMMs, as BERT, T5,
Whisper and LLaMA export them (onnx.helper, float32, random weights): the cases pack_gemms packs.

- `attention_block`: x [B, S, E] -> q, k, v MatMuls (+ bias Adds; `bias` "all", "none", or "qv":
  Whisper's k_proj has none) -> [B, S, H, D] -> Transpose -> softmax(q k^T * scale + mask) v ->
  [B, S, E] -> an output MatMul + bias -> y; with `q_scale`, q (not the scores) is scaled by
  D^-0.5 (Whisper's q_proj(x) * scaling); with `rope`, q is multiplied by a constant [S, D]
  table on its way (an elementwise reader of q's slice, RoPE's place);
- `gated_mlp`: x [B, S, E] -> gate and up MatMuls -> SiLU(gate) * up -> down MatMul -> y (LLaMA's MLP).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.compiler.packed_qkv_models import add_mask, padding_mask


def _model(nodes: list, inits: dict, inputs: list, y_shape: list, name: str):
    graph = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def attention_block(B: int | str, S: int | str, H: int, D: int, mask: str | None = None, bias: str = "all",
                    rope: bool = False, q_scale: bool = False, seed: int = 0):
    """The model: input x [B, S, H D] -> attention with three projections -> y [B, S, H D]; input `m`
    [B, 1, 1, S] for mask "additive". B and S may be dim names (dynamic axes: the head Reshapes
    then take [0, 0, H, D] and [0, 0, E], as exporters' shape chains fold to)."""
    E = H * D
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {"scale": np.array(D ** -0.5, np.float32)}
    nodes = []

    def shape(name, dims):
        inits[name] = np.array(dims, np.int64)
        return name

    for n in "qkvo":
        inits[f"w{n}"] = (rng.standard_normal((E, E)) / np.sqrt(E)).astype(np.float32)
        if bias == "all" or n == "o" or (bias == "qv" and n in "qv"):
            inits[f"b{n}"] = (0.1 * rng.standard_normal(E)).astype(np.float32)
    for n in "qkv":
        nodes.append(helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}m"], name=f"{n}_proj"))
        proj = f"{n}m"
        if f"b{n}" in inits:
            nodes.append(helper.make_node("Add", [proj, f"b{n}"], [f"{n}p"], name=f"{n}_bias"))
            proj = f"{n}p"
        if q_scale and n == "q":  # Whisper / BART: q_proj(x) * D^-0.5, the scores unscaled
            nodes.append(helper.make_node("Mul", [proj, "scale"], ["qsc"], name="q_scale"))
            proj = "qsc"
        nodes += [helper.make_node("Reshape", [proj, shape("bshd", [_dim(B), _dim(S), H, D])], [f"{n}4"]),
                  helper.make_node("Transpose", [f"{n}4"], [f"{n}h"], perm=[0, 2, 1, 3])]
    q = "qh"
    if rope:
        inits["rope"] = (1.0 + 0.1 * rng.standard_normal((S if isinstance(S, int) else 1, D))).astype(np.float32)
        nodes.append(helper.make_node("Mul", ["qh", "rope"], ["qr"]))
        q = "qr"
    nodes += [helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", [q, "kt"], ["s0"]),
              helper.make_node("Identity" if q_scale else "Mul", ["s0"] if q_scale else ["s0", "scale"], ["s1"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E])]
    scores = add_mask(mask, "s1", B, S, nodes, inits, inputs)
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1), helper.make_node("MatMul", ["p", "vh"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", shape("bse", [_dim(B), _dim(S), E])], ["o3"]),
              helper.make_node("MatMul", ["o3", "wo"], ["om"], name="o_proj"),
              helper.make_node("Add", ["om", "bo"], ["y"], name="o_bias")]
    return _model(nodes, inits, inputs, [B, S, E], "attention_block")


def _dim(d: int | str) -> int:
    """A Reshape target's entry for dim `d`: 0 (copy the input's) for a named, dynamic dim."""
    return 0 if isinstance(d, str) else d


def gated_mlp(B: int, S: int, E: int, F: int, seed: int = 0):
    """The model: x [B, S, E] -> SiLU(x Wg) * (x Wu) -> (.) Wd -> y [B, S, E]."""
    rng = np.random.default_rng(seed)
    inits = {"wg": (rng.standard_normal((E, F)) / np.sqrt(E)).astype(np.float32),
             "wu": (rng.standard_normal((E, F)) / np.sqrt(E)).astype(np.float32),
             "wd": (rng.standard_normal((F, E)) / np.sqrt(F)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"], name="gate_proj"),
             helper.make_node("MatMul", ["x", "wu"], ["u"], name="up_proj"),
             helper.make_node("Sigmoid", ["g"], ["gs"]), helper.make_node("Mul", ["g", "gs"], ["silu"]),
             helper.make_node("Mul", ["silu", "u"], ["h"]),
             helper.make_node("MatMul", ["h", "wd"], ["y"], name="down_proj")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E])]
    return _model(nodes, inits, inputs, [B, S, E], "gated_mlp")


def feeds(model, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = padding_mask(rng, shape[0], shape[-1]) if vi.name == "m" else \
            rng.standard_normal(shape).astype(np.float32)
    return out
