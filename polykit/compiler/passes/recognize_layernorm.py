"""recognize_layernorm: turn the exported layer-norm chain back into ONNX LayerNormalization,
and the RMS norm's (LLaMA, T5, Mistral, Gemma) into RMSNormalization.

    mean = ReduceMean(x, axes)          d = x - mean
    var  = ReduceMean(d^2 | d*d, axes)  n = d / Sqrt(var + eps)   (or d * Reciprocal(Sqrt(..)))
    y = n [* gamma] [+ beta]

as PyTorch and TF export it, over trailing axes (keepdims=1), and TF's folded form
y = x * r + (beta - mean * r) with r = Reciprocal(Sqrt(var + eps)) [* gamma]. gamma/beta must
be constants (broadcastable to the normalized shape) or tensors of exactly the normalized
shape. Every intermediate must be read only inside the pattern. The forms are rules over the
pattern module (patterns.py), the fullest first.

    ms = ReduceMean(x^2 | x*x, axes)     n = x / Sqrt(ms + eps)   (or x * Reciprocal(Sqrt(..)),
    y = n [* gamma]                                                or x * (1 / Sqrt(..)): torch.rsqrt)

is RMSNormalization (axis, epsilon; a scale of ones without gamma): one norm layer where the
export runs five (LLaMA's 17 and T5's 13 norms: Pow, ReduceMean, Add + Sqrt + Div, Mul, Mul).
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.patterns import Const, Match, OneOf, Op, Rule, Var, rewrite
from polykit.compiler.passes.rewrite import const
from polykit.compiler.ops.registry import is_supported

X = Var("x")


def _keepdims(node: Node, m: Match) -> bool:
    return int(node.attrs.get("keepdims", 1)) == 1


MEAN = Op("ReduceMean", (X,), name="mean", rest=True, where=_keepdims, node="mean")
D = Op("Sub", (X, MEAN), name="d")
SQUARE = OneOf(Op("Mul", (D, D)), Op("Pow", (D, Const(lambda v: v == 2.0))))
STD = Op("Sqrt", (Op("Add", (Op("ReduceMean", (SQUARE,), rest=True, where=_keepdims, node="var"), Const(name="eps")),
                     commutative=True),))
#: d / std, or d * (1 / std)
NORM = OneOf(Op("Div", (D, STD), name="n"), Op("Mul", (D, Op("Reciprocal", (STD,))), name="n", commutative=True))


def _scaled(x: Op) -> Op:
    return Op("Mul", (x, Var("gamma")), name="scaled", commutative=True)


def _shifted(x: Op) -> Op:
    return Op("Add", (x, Var("beta")), commutative=True)


#: TF: r = 1 / sqrt(var + eps) [* gamma]; y = x * r + (beta - mean * r)
def _tf(r: Op) -> Op:
    return Op("Add", (Op("Mul", (X, r), commutative=True), Op("Sub", (Var("beta"), Op("Mul", (MEAN, r), commutative=True)))),
              commutative=True)


R_SCALED = Op("Mul", (Op("Reciprocal", (STD,)), Var("gamma")), name="r", commutative=True)
R_PLAIN = Op("Reciprocal", (STD,), name="r")


RMS_SQUARE = OneOf(Op("Mul", (X, X)), Op("Pow", (X, Const(lambda v: v == 2.0))))
RMS_STD = Op("Sqrt", (Op("Add", (Op("ReduceMean", (RMS_SQUARE,), rest=True, where=_keepdims, node="ms"),
                                 Const(name="eps")), commutative=True),))
#: x / std, x * (1 / std), x * Reciprocal(std)
RMS_NORM = OneOf(Op("Div", (X, RMS_STD)),
                 Op("Mul", (X, Op("Reciprocal", (RMS_STD,))), commutative=True),
                 Op("Mul", (X, Op("Div", (Const(lambda v: v == 1.0), RMS_STD))), commutative=True))


def _axes(graph: Graph, node: Node, rank: int) -> tuple[int, ...] | None:
    axes = const(graph, node.input(1)) if node.input(1) else node.attrs.get("axes")
    if axes is None:
        return None
    axes = sorted(int(a) % rank for a in np.asarray(axes).reshape(-1))
    return tuple(axes) if axes and axes == list(range(rank - len(axes), rank)) else None


def _param(graph: Graph, name: str, norm_shape: tuple, dtype) -> tuple[bool, np.ndarray | None]:
    """(usable, constant value broadcast to the normalized shape) for a gamma/beta operand."""
    value = const(graph, name)
    if value is None:
        return tuple(graph.value(name).shape or ()) == norm_shape, None
    lead = value.ndim - len(norm_shape)
    if lead > 0 and all(d == 1 for d in value.shape[:lead]):
        value = value.reshape(value.shape[lead:])
    try:
        if value.ndim > len(norm_shape) or np.broadcast_shapes(value.shape, norm_shape) != norm_shape:
            return False, None
    except ValueError:
        return False, None
    return True, np.broadcast_to(value, norm_shape).astype(dtype)


def _operands(m: Match, gamma: bool, beta: bool, stats: tuple[str, ...] = ("mean", "var")):
    """(axes, norm_shape, {"gamma"/"beta": (name, constant value or None)}) when the match is a
    norm over trailing axes (its `stats` reductions, by node name, over the same ones) with usable
    gamma/beta, else None."""
    graph, x = m.graph, m["x"]
    xv = graph.value(x)
    if xv.shape is None or xv.dtype is None:
        return None
    rank = len(xv.shape)
    axes = _axes(graph, m.named[stats[0]], rank)
    if not axes or any(_axes(graph, m.named[s], rank) != axes for s in stats[1:]):
        return None
    norm_shape = tuple(xv.shape[rank - len(axes):])
    if not gamma and not all(isinstance(k, int) for k in norm_shape):
        return None
    found = {}
    for key in [k for k, wanted in (("gamma", gamma), ("beta", beta)) if wanted]:
        usable, value = _param(graph, m[key], norm_shape, xv.dtype)
        producer = m.producers.get(m[key])
        if not usable or any(producer is n for n in m.nodes):
            return None
        found[key] = (m[key], value)
    return axes, norm_shape, found


def _layernorm(gamma: bool, beta: bool):
    """(build, accept) of the rule whose pattern has gamma / beta as given."""
    def build(m: Match) -> list[Node]:
        graph, x = m.graph, m["x"]
        axes, norm_shape, found = _operands(m, gamma, beta)

        def operand(key: str, prefix: str) -> str:
            name, value = found[key]
            return name if value is None else graph.add_initializer(value, prefix)

        dtype = graph.value(x).dtype
        scale = operand("gamma", "ln_scale") if gamma else graph.add_initializer(np.ones(norm_shape, dtype), "ln_scale")
        inputs = [x, scale] + ([operand("beta", "ln_bias")] if beta else [])
        return [Node("LayerNormalization", inputs, [m.root.outputs[0]],
                     {"axis": -len(axes), "epsilon": float(m.values["eps"])}, name=f"{m.named['mean'].name}_layernorm")]

    return build, lambda m: _operands(m, gamma, beta) is not None


def _rmsnorm(gamma: bool):
    """(build, accept) of the RMS norm rule with or without gamma."""
    def build(m: Match) -> list[Node]:
        graph, x = m.graph, m["x"]
        axes, norm_shape, found = _operands(m, gamma, False, ("ms",))
        name, value = found.get("gamma", ("", np.ones(norm_shape, graph.value(x).dtype)))
        scale = name if value is None else graph.add_initializer(value, "rms_scale")
        return [Node("RMSNormalization", [x, scale], [m.root.outputs[0]],
                     {"axis": -len(axes), "epsilon": float(m.values["eps"])}, name=f"{m.named['ms'].name}_rmsnorm")]

    return build, lambda m: _operands(m, gamma, False, ("ms",)) is not None


RULES = (
    Rule(_shifted(_scaled(NORM)), *_layernorm(True, True)),
    Rule(_shifted(NORM), *_layernorm(False, True)),
    Rule(_tf(R_SCALED), *_layernorm(True, True)),
    Rule(_tf(R_PLAIN), *_layernorm(False, True)),
    Rule(_scaled(NORM), *_layernorm(True, False)),
    Rule(NORM, *_layernorm(False, False)),
)
RMS_RULES = (Rule(_scaled(RMS_NORM), *_rmsnorm(True)), Rule(RMS_NORM, *_rmsnorm(False)))


def recognize_layernorm(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace layer-norm chains by LayerNormalization nodes, RMS norm chains by RMSNormalization;
    True if any."""
    rules = (RULES if is_supported("", "LayerNormalization") else ()) + \
        (RMS_RULES if is_supported("", "RMSNormalization") else ())
    return bool(rules) and rewrite(graph, rules, keep=keep)
