"""Grouped-query attention blocks as exporters write them (onnx.helper, float32, random weights): the
cases fold_attention_layouts reads with `kv_groups` instead of repeating K and V.

x [B, S, E] -> q, k, v projections -> [B, S, H, D] -> Transpose (0, 2, 1, 3); K and V (Hkv heads)
then repeated to Hq = g Hkv heads, by form:

- "expand": Unsqueeze(2) -> Expand [B, Hkv, g, S, D] -> Reshape [B, Hq, S, D] (HF's repeat_kv);
- "tile": Unsqueeze(2) -> Tile [1, 1, g, 1, 1] -> Reshape (torch's repeat_interleave(g, dim=1));
- "interleaved": Unsqueeze(1) -> Expand [B, g, Hkv, S, D] -> Reshape: head h reads h % Hkv, which
  kv_groups cannot say (it must stay a copy).

K is scaled by a constant on its way (RoPE's place). Hq == Hkv repeats nothing. Masks: "causal" (an
additive [S, S] constant: 0 on and below the diagonal, -1e4 above), "additive" (a random [B, 1, 1, S]
input: padding), or none. `dynamic`: x is [B, S, E] with B and S named dims, every shape constant
copies or infers them (0 / -1, the Expand's shape [1, 1, g, 1, 1] broadcasts), K is not scaled.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.compiler.packed_qkv_models import add_mask, padding_mask

FORMS = ("expand", "tile")


def gqa_block(form: str, B: int, S: int, Hq: int, Hkv: int, D: int, mask: str | None = None, seed: int = 0,
              dynamic: bool = False):
    """The model: input x [B, S, Hq D] -> attention -> output y [B, S, Hq D]; input `m` [B, 1, 1, S]
    for mask "additive"."""
    E, g = Hq * D, Hq // Hkv
    lead = (0, 0) if dynamic else (B, S)  # shape constants that copy (0) or infer (-1) the named dims
    rng = np.random.default_rng(seed)
    inits = {f"w{n}": (rng.standard_normal((E, h * D)) / np.sqrt(E)).astype(np.float32)
             for n, h in (("q", Hq), ("k", Hkv), ("v", Hkv))}
    inits["scale"] = np.array(D ** -0.5, np.float32)
    if not dynamic:
        inits["rope"] = (1.0 + 0.1 * rng.standard_normal((S, D))).astype(np.float32)
    nodes = []
    if dynamic:
        B, S = "B", "S"

    def shape(name, dims):
        inits[name] = np.array(dims, np.int64)
        return name

    for n, h in (("q", Hq), ("k", Hkv), ("v", Hkv)):
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}p"]),
                  helper.make_node("Reshape", [f"{n}p", shape(f"{n}s4", [*lead, h, D])], [f"{n}4"]),
                  helper.make_node("Transpose", [f"{n}4"], [f"{n}h"], perm=[0, 2, 1, 3])]
    if not dynamic:
        nodes.append(helper.make_node("Mul", ["kh", "rope"], ["kr"]))
    heads = {"k": "kh" if dynamic else "kr", "v": "vh"}
    if g > 1:
        axis = 1 if form == "interleaved" else 2
        grown = [1, g, 1, 1, 1] if form == "interleaved" else [1, 1, g, 1, 1]
        if not dynamic:
            grown = [B, g, Hkv, S, D] if form == "interleaved" else [B, Hkv, g, S, D]
        for n, src in list(heads.items()):
            nodes.append(helper.make_node("Unsqueeze", [src, shape("axis", [axis])], [f"{n}u"]))
            if form == "tile":
                nodes.append(helper.make_node("Tile", [f"{n}u", shape("reps", [1, 1, g, 1, 1])], [f"{n}x"]))
            else:
                nodes.append(helper.make_node("Expand", [f"{n}u", shape("grown", grown)], [f"{n}x"]))
            nodes.append(helper.make_node("Reshape", [f"{n}x", shape("merged", [lead[0], Hq, -1 if dynamic else S, D])],
                                          [f"{n}g"]))
            heads[n] = f"{n}g"
    nodes += [helper.make_node("Transpose", [heads["k"]], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s1"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E])]
    scores = add_mask(mask, "s1", B, S, nodes, inits, inputs)
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1), helper.make_node("MatMul", ["p", heads["v"]], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", shape("out", [*lead, E])], ["y"])]
    graph = helper.make_graph(nodes, f"gqa_{form}", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, E])],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gqa_feeds(B: int, S: int, Hq: int, D: int, mask: str | None = None, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {"x": rng.standard_normal((B, S, Hq * D)).astype(np.float32)}
    if mask == "additive":
        out["m"] = padding_mask(rng, B, S)
    return out
