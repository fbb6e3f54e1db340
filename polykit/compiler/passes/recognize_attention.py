"""recognize_attention: keep scaled dot-product attention as one ai.polykit `Attention` node.

    MatMul(Q, K^T) [* s | / s] [+ mask] -> Softmax(axis=-1) -> MatMul(., V)

K^T may be a Transpose of K (last two axes swapped) or any tensor (a Transpose is then
inserted to give K); scalar scales may also sit on Q and/or K^T before the first MatMul
(torch's scaled_dot_product_attention export multiplies both by sqrt(scale)), and the
probabilities may pass torch's guard for fully masked rows, Where(IsNaN(p), 0, p). The scores
[B*W, H, N, Nk] may also pass a windowed view before the Softmax (Swin's shifted windows):
Reshape [B, W, H, N, Nk] -> Add(term) -> Reshape back; the terms then become one mask (graph
ops that constant folding folds), and when B > 1 the Attention runs on the windowed view itself:
Q, K, V viewed [B, W, H, N, D] (batch dims B and W, so the mask [b, W, H, N, Nk] broadcasts over B)
and its [B, W, H, N, Dv] output viewed back. Every
intermediate must be read only inside the pattern. The form is one rule over the pattern
module (patterns.py). Format: docs/FUSION.md.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.passes.patterns import Const, Match, OneOf, Op, Rule, Scaled, Var, rewrite
from polykit.compiler.passes.rewrite import sole_reader


def _last_axis(node: Node, m: Match) -> bool:
    shape = m.graph.value(node.input(0)).shape
    return shape is not None and len(shape) >= 2 and int(node.attrs.get("axis", -1)) % len(shape) == len(shape) - 1


QK = Scaled(Op("MatMul", (Scaled(Var("q"), "q_scale"), Scaled(Var("kt"), "k_scale"))), "scale")
SCORES = OneOf(Op("Add", (QK, Var("mask")), commutative=True), QK)
#: scores [B*W, H, N, Nk] viewed [B, W, H, N, Nk] to add a per-window term, viewed back (Swin's shifted windows)
WINDOWED = Op("Reshape", (Op("Add", (Op("Reshape", (SCORES, Var("split_shape")), name="split"), Var("wmask")),
                             commutative=True), Var("merge_shape")))
SOFTMAX = Op("Softmax", (OneOf(SCORES, WINDOWED),), where=_last_axis)
PROBS = OneOf(Op("Where", (Op("IsNaN", (SOFTMAX,)), Const(lambda v: v == 0.0), SOFTMAX), node="guard"), SOFTMAX)
ATTENTION = Op("MatMul", (PROBS, Var("v")))


def _untransposed(m: Match, kt: str) -> str | None:
    """K when `kt` is a Transpose of K over its last two axes (spanned, to go, when only the
    pattern reads it), else None."""
    node = m.producers.get(kt)
    if node is None or node.op_type != "Transpose" or node.domain != "":
        return None
    perm = node.attrs.get("perm")
    n = len(perm) if perm is not None else None
    if n is None or n < 2 or list(perm) != list(range(n - 2)) + [n - 1, n - 2]:
        return None
    if sole_reader(m.graph, kt, m.readers, m.fixed) is not None:
        m.span(node)
    return node.input(0)


def _static(m: Match, tensor: str) -> tuple[int, ...] | None:
    shape = m.graph.value(tensor).shape
    return tuple(shape) if shape is not None and all(type(d) is int for d in shape) else None


def _fits(shape: tuple[int, ...] | None, full: tuple[int, ...]) -> bool:
    """`shape` broadcasts to `full` without growing it."""
    return shape is not None and len(shape) <= len(full) and all(
        d in (1, f) for d, f in zip(shape[::-1], full[::-1]))


def _windows(m: Match) -> tuple[int, int] | None:
    """(B, W) when the windowed view is [B, W, H, N, Nk] of scores [B*W, H, N, Nk] viewed back,
    Q, K^T and V are [B*W, H, ...] and the additive terms broadcast to their views; else None."""
    scores = m.producers[m["split"]].inputs[0]
    s4, s5 = _static(m, scores), _static(m, m["split"])
    if s4 is None or s5 is None or len(s4) != 4 or len(s5) != 5 or s5[2:] != s4[1:] or s5[0] * s5[1] != s4[0]:
        return None
    if _static(m, _softmax_input(m)) != s4 or not _fits(_static(m, m["wmask"]), s5) or not _real(m, "wmask"):
        return None
    if "mask" in m.tensors and (not _fits(_static(m, m["mask"]), s4) or not _real(m, "mask")):
        return None
    for name in ("q", "kt", "v"):
        shape = _static(m, m[name])
        if shape is None or len(shape) != 4 or shape[:2] != s4[:2]:
            return None
    return s5[0], s5[1]


def _real(m: Match, name: str) -> bool:
    dtype = m.graph.value(m[name]).dtype
    return dtype is not None and np.issubdtype(dtype, np.floating)


def _softmax_input(m: Match) -> str:
    return next(n for n in m.nodes if n.op_type == "Softmax").inputs[0]


def _accept(m: Match) -> bool:
    """Q and K^T are at least 2-D; a Transpose giving K^T is dropped when only the pattern reads
    it; a windowed view has the shapes `_windows` wants."""
    shape_q, shape_k = m.graph.value(m["q"]).shape, m.graph.value(m["kt"]).shape
    if shape_q is None or shape_k is None or len(shape_q) < 2 or len(shape_k) < 2:
        return False
    if "wmask" in m.tensors and _windows(m) is None:
        return False
    k = _untransposed(m, m["kt"])
    if k is not None:
        m.tensors["k"] = k
    return True


class _Emit:
    """Appends nodes (and shape constants) named after the root."""

    def __init__(self, m: Match):
        self.graph, self.root, self.nodes = m.graph, m.root, []

    def __call__(self, op: str, inputs: list[str], attrs: dict | None = None, out: str | None = None) -> str:
        out = out or self.graph.fresh_name(f"{self.root.name}_{op.lower()}")
        self.nodes.append(Node(op, inputs, [out], attrs or {}, name=self.graph.fresh_name(f"{self.root.name}_{op}")))
        return out

    def shape(self, dims) -> str:
        name = self.graph.fresh_name(f"{self.root.name}_shape")
        self.graph.initializers[name] = np.array([int(d) for d in dims], np.int64)
        return name

    def reshape(self, tensor: str, dims, out: str | None = None) -> str:
        return self("Reshape", [tensor, self.shape(dims)], out=out)


def _window_mask(m: Match, emit: _Emit, B: int, W: int) -> str:
    """The windowed view's additive terms as one mask: [W, H, n, k] for B = 1 (the scores' own
    shape), else [b, W, H, n, k] (b = 1 when no term varies over B) for the rank-5 view.
    Built from Reshape/Add/Expand nodes, so constant terms fold to one constant."""
    s5 = _static(m, m["split"])
    wshape = _static(m, m["wmask"])
    terms = [emit.reshape(m["wmask"], (1,) * (5 - len(wshape)) + wshape)]
    shapes = [(1,) * (5 - len(wshape)) + wshape]
    if "mask" in m.tensors:
        bias = (1,) * (4 - len(_static(m, m["mask"]))) + _static(m, m["mask"])
        five = ((1, 1) if bias[0] == 1 else (B, W)) + bias[1:]
        terms.append(emit.reshape(m["mask"], five))
        shapes.append(five)
    total = terms[0] if len(terms) == 1 else emit("Add", terms)
    full = [max(d) for d in zip(*shapes)]
    full[1:3] = s5[1:3]  # every window and head gets its own term
    total = emit("Expand", [total, emit.shape(full)])
    if B == 1:
        return emit.reshape(total, (W, s5[2], full[3], full[4]))
    return total


def _attention(m: Match) -> list[Node]:
    graph, root = m.graph, m.root
    emit = _Emit(m)
    k = m.tensors.get("k")
    if k is None:
        rank = len(graph.value(m["kt"]).shape)
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        k = emit("Transpose", [m["kt"]], {"perm": perm}, out=graph.fresh_name(f"{m['kt']}_untransposed"))
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    scale = m.values["scale"] * m.values["q_scale"] * m.values["k_scale"]
    attrs = {"scale": float(scale), "fused_from": [n.name for n in sorted(m.nodes, key=lambda n: order[id(n)])]}
    if "guard" in m.named:
        attrs["nan_probs_to_zero"] = 1
    q, v, out = m["q"], m["v"], root.outputs[0]
    mask = m.tensors.get("mask")
    windows = _windows(m) if "wmask" in m.tensors else None
    if windows is not None:
        (B, W), mask = windows, _window_mask(m, emit, *windows)
        if B > 1:  # attention over batch dims (B, W) of [B, W, H, N, d] views (row-major: a Reshape is exact)
            kt = _static(m, m["kt"])
            heads = [_static(m, q), kt[:2] + (kt[3], kt[2]), _static(m, v)]
            q, k, v = (emit.reshape(t, (B, W) + s[1:]) for t, s in zip((q, k, v), heads))
            out = graph.fresh_name(f"{out}_windows")
    inputs = [q, k, v] + ([mask] if mask is not None else [])
    emit.nodes.append(Node("Attention", inputs, [out], attrs, name=f"{root.name}_attention", domain=POLYKIT_DOMAIN))
    if out != root.outputs[0]:
        s4 = _static(m, m["q"])
        emit.reshape(out, s4[:3] + (_static(m, m["v"])[3],), out=root.outputs[0])
    return emit.nodes


RULES = (Rule(ATTENTION, _attention, _accept),)


def recognize_attention(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace attention subgraphs by Attention nodes; True if any."""
    return rewrite(graph, RULES, keep=keep)
