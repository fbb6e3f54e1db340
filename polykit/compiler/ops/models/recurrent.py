"""RNN, LSTM and GRU -- attribute checks and shape rules.

Layout 0: X (seq, batch, input), Y (seq, dirs, batch, hidden), Y_h / Y_c (dirs, batch, hidden).
Layout 1: X (batch, seq, input), Y (batch, seq, dirs, hidden), Y_h / Y_c (batch, dirs, hidden).
W is (dirs, gates * hidden, input), R (dirs, gates * hidden, hidden). LSTM-1's `output_sequence`
(removed in opset 7) changes nothing polykit computes: Y is always produced when asked for, so
every opset shares one form and no importer is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

from polykit.compiler.ops.registry import InferContext, shape_rule
from polykit.errors import NodeAttributeError

#: op -> (gates, default activations per direction, state outputs)
CELLS = {"RNN": (1, ("Tanh",), 2), "GRU": (3, ("Sigmoid", "Tanh"), 2), "LSTM": (4, ("Sigmoid", "Tanh", "Tanh"), 3)}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
#: activation -> (default alpha, default beta); None where the function takes no such parameter
ACTIVATIONS = {
    "Relu": (None, None), "Tanh": (None, None), "Sigmoid": (None, None), "Softsign": (None, None),
    "Softplus": (None, None), "Affine": (1.0, 0.0), "LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None),
    "ScaledTanh": (1.0, 1.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, None),
}


@dataclass(frozen=True)
class Activation:
    name: str
    alpha: float
    beta: float


@dataclass(frozen=True)
class RecurrentAttrs:
    """A recurrent node's validated attributes, activations resolved per direction."""

    op: str
    gates: int
    directions: int
    reverse_only: bool
    hidden: int | None
    layout: int
    clip: float | None
    activations: tuple[tuple[Activation, ...], ...]  # per direction
    linear_before_reset: bool
    input_forget: bool


def _activation_names(op: str, attrs, directions: int, where: str) -> list[str]:
    defaults = CELLS[op][1]
    names = [str(a) for a in attrs.get("activations", [])] or list(defaults) * directions
    if len(names) != len(defaults) * directions:
        raise NodeAttributeError(f"{len(names)} activations for {directions} direction(s) of {op}",
                                 where=where, hint=f"give {len(defaults)} per direction ({', '.join(defaults)})")
    canon = {k.lower(): k for k in ACTIVATIONS}
    out = []
    for name in names:
        if name.lower() not in canon:
            raise NodeAttributeError(f"activation {name!r} is not one of {', '.join(ACTIVATIONS)}", where=where)
        out.append(canon[name.lower()])
    return out


def _resolve(names: list[str], alphas: list[float], betas: list[float]) -> list[Activation]:
    """alpha/beta lists are consumed in order by the activations that take them (onnxruntime's
    reading of the spec); the rest get the activation's defaults."""
    out = []
    ia = ib = 0
    for name in names:
        da, db = ACTIVATIONS[name]
        alpha = beta = 0.0
        if da is not None:
            alpha = float(alphas[ia]) if ia < len(alphas) else da
            ia += 1
        if db is not None:
            beta = float(betas[ib]) if ib < len(betas) else db
            ib += 1
        out.append(Activation(name, alpha, beta))
    return out


def recurrent_attrs(op: str, attrs, where: str) -> RecurrentAttrs:
    direction = attrs.get("direction", "forward")
    if direction not in DIRECTIONS:
        raise NodeAttributeError(f"direction {direction!r} is not one of {', '.join(DIRECTIONS)}", where=where)
    dirs = DIRECTIONS[direction]
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise NodeAttributeError(f"layout {layout} is not 0 or 1", where=where)
    clip = attrs.get("clip")
    if clip is not None and float(clip) <= 0:
        raise NodeAttributeError(f"clip {clip} must be positive", where=where)
    names = _activation_names(op, attrs, dirs, where)
    acts = _resolve(names, list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", [])))
    per = len(CELLS[op][1])
    hidden = attrs.get("hidden_size")
    return RecurrentAttrs(op, CELLS[op][0], dirs, direction == "reverse", None if hidden is None else int(hidden),
                          layout, None if clip is None else float(clip),
                          tuple(tuple(acts[d * per:(d + 1) * per]) for d in range(dirs)),
                          bool(attrs.get("linear_before_reset", 0)), bool(attrs.get("input_forget", 0)))


@shape_rule("RNN", "GRU", "LSTM")
def _recurrent(ctx: InferContext):
    op = ctx.node.op_type
    a = recurrent_attrs(op, ctx.node.attrs, ctx.node.describe())
    x, w, r = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    for name, shape in (("X", x), ("W", w), ("R", r)):
        if shape is not None and len(shape) != 3:
            raise ctx.fail(f"{name} has rank {len(shape)}, expected 3")
    hidden = a.hidden
    if hidden is None and r is not None and isinstance(r[2], int):
        hidden = r[2]
    if w is not None:
        if isinstance(w[0], int) and w[0] != a.directions:
            raise ctx.fail(f"W has {w[0]} directions, direction attribute says {a.directions}")
        if hidden is not None and isinstance(w[1], int) and w[1] != a.gates * hidden:
            raise ctx.fail(f"W has {w[1]} rows, expected {a.gates} gates x hidden_size {hidden}")
    if x is not None and w is not None and isinstance(x[2], int) and isinstance(w[2], int) and x[2] != w[2]:
        raise ctx.fail(f"X has {x[2]} input features, W expects {w[2]}")
    seq, batch = (None, None) if x is None else ((x[0], x[1]) if a.layout == 0 else (x[1], x[0]))
    if a.layout == 0:
        y, state = (seq, a.directions, batch, hidden), (a.directions, batch, hidden)
    else:
        y, state = (batch, seq, a.directions, hidden), (batch, a.directions, hidden)
    dt = ctx.dtype(0)
    return [(dt, y)] + [(dt, state)] * (CELLS[op][2] - 1)
