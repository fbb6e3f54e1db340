"""Reference kernels: RNN, LSTM and GRU (float64 math, one step at a time, per the ONNX spec).

Every attribute is honoured: directions, activations with their alpha/beta, clip (applied to
each gate's pre-activation), sequence_lens (steps past a batch item's length leave its state
alone and write zeros to Y; the reverse direction starts at the item's last valid step),
initial states, LSTM peepholes and input_forget, GRU linear_before_reset, layout 0/1.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.models.recurrent import Activation, RecurrentAttrs, recurrent_attrs
from polykit.errors import ShapeError
from polykit.compiler.ops.references import reference

ACTIVATION_FNS: dict[str, Callable[[np.ndarray, float, float], np.ndarray]] = {
    "Relu": lambda x, a, b: np.maximum(x, 0),
    "Tanh": lambda x, a, b: np.tanh(x),
    "Sigmoid": lambda x, a, b: 1 / (1 + np.exp(-x)),
    "Softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "Softplus": lambda x, a, b: np.logaddexp(0, x),
    "Affine": lambda x, a, b: a * x + b,
    "LeakyRelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "ThresholdedRelu": lambda x, a, b: np.where(x > a, x, 0),
    "ScaledTanh": lambda x, a, b: a * np.tanh(b * x),
    "HardSigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "Elu": lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)),
}


def _apply(act: Activation, x: np.ndarray) -> np.ndarray:
    return ACTIVATION_FNS[act.name](x, act.alpha, act.beta)


def _cell(a: RecurrentAttrs, d: int, pre: np.ndarray, h: np.ndarray, c: np.ndarray, R: np.ndarray,
          rb: np.ndarray, P: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """One step of direction d: `pre` = X_t W^T + Wb (batch, gates*H); returns (H_t, C_t)."""
    acts = a.activations[d]
    clip = (lambda v: np.clip(v, -a.clip, a.clip)) if a.clip is not None else (lambda v: v)
    H = h.shape[1]
    if a.op == "RNN":
        return _apply(acts[0], clip(pre + h @ R.T + rb)), c
    if a.op == "GRU":
        hr = h @ R.T
        z = _apply(acts[0], clip(pre[:, :H] + hr[:, :H] + rb[:H]))
        r = _apply(acts[0], clip(pre[:, H:2 * H] + hr[:, H:2 * H] + rb[H:2 * H]))
        if a.linear_before_reset:
            cand = pre[:, 2 * H:] + r * (hr[:, 2 * H:] + rb[2 * H:])
        else:
            cand = pre[:, 2 * H:] + (r * h) @ R[2 * H:].T + rb[2 * H:]
        return (1 - z) * _apply(acts[1], clip(cand)) + z * h, c
    g = pre + h @ R.T + rb  # LSTM gates i, o, f, c
    pi, po, pf = (P[:H], P[H:2 * H], P[2 * H:]) if P is not None else (0, 0, 0)
    i = _apply(acts[0], clip(g[:, :H] + pi * c))
    f = 1 - i if a.input_forget else _apply(acts[0], clip(g[:, 2 * H:3 * H] + pf * c))
    c_new = f * c + i * _apply(acts[1], clip(g[:, 3 * H:]))
    o = _apply(acts[0], clip(g[:, H:2 * H] + po * c_new))
    return o * _apply(acts[2], c_new), c_new


def _check(node: Node, a: RecurrentAttrs, X, W, R) -> int:
    if X.ndim != 3 or W.ndim != 3 or R.ndim != 3 or W.shape[0] != a.directions or R.shape[0] != a.directions:
        raise ShapeError(f"X {X.shape}, W {W.shape}, R {R.shape} do not fit {a.directions} direction(s)",
                         where=node.describe(), hint="X, W and R are rank 3; W and R have one slice per direction")
    H = R.shape[2]
    if W.shape[1] != a.gates * H or R.shape[1] != a.gates * H or W.shape[2] != X.shape[2]:
        raise ShapeError(f"W {W.shape} / R {R.shape} do not fit {a.gates} gates of hidden size {H} and "
                         f"{X.shape[2]} input features", where=node.describe())
    return H


@reference("RNN", "GRU", "LSTM")
def recurrent(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    a = recurrent_attrs(node.op_type, node.attrs, node.describe())
    ins = list(inputs) + [None] * (8 - len(inputs))
    X, W, R, B, lens, h0, c0, P = ins[:8]
    H = _check(node, a, X, W, R)
    dtype = X.dtype
    x = np.asarray(X, np.float64)
    if a.layout:
        x = x.transpose(1, 0, 2)
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    T, N = x.shape[:2]
    G, D = a.gates, a.directions
    lens = np.full(N, T, np.int64) if lens is None else np.asarray(lens, np.int64).reshape(N)
    B = np.zeros((D, 2 * G * H)) if B is None else np.asarray(B, np.float64)
    Y = np.zeros((T, D, N, H))
    Yh = np.zeros((D, N, H))
    Yc = np.zeros((D, N, H))
    for d in range(D):
        h = np.zeros((N, H)) if h0 is None else np.asarray(h0[d], np.float64)
        c = np.zeros((N, H)) if c0 is None else np.asarray(c0[d], np.float64)
        Wd, Rd = np.asarray(W[d], np.float64), np.asarray(R[d], np.float64)
        Pd = None if P is None else np.asarray(P[d], np.float64)
        reverse = d == 1 or a.reverse_only
        for s in range(T):
            live = s < lens
            t = np.where(live, lens - 1 - s, 0) if reverse else np.full(N, s)
            pre = np.einsum("ni,gi->ng", x[t, np.arange(N)], Wd) + B[d, :G * H]
            h_new, c_new = _cell(a, d, pre, h, c, Rd, B[d, G * H:], Pd)
            h = np.where(live[:, None], h_new, h)
            c = np.where(live[:, None], c_new, c)
            Y[t[live], d, np.flatnonzero(live)] = h[live]
        Yh[d], Yc[d] = h, c
    if a.layout:
        Y, Yh, Yc = Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2), Yc.transpose(1, 0, 2)
    outs = [Y, Yh, Yc][:len(node.outputs)]
    return [o.astype(dtype) for o in outs]
