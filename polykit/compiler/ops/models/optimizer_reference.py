"""Reference kernels: Adagrad, Adam, Momentum (ai.onnx.preview.training), in float64 with one
rounding to each state's dtype."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ops.models.optimizer import GROUPS, TRAINING_DOMAIN, grouped
from polykit.compiler.ops.references import reference


def adagrad(a, r: float, t: int, x, g, h):
    g = a.get("norm_coefficient", 0.0) * x + g
    h_new = h + g * g
    return {"X": x - r / (1 + t * a.get("decay_factor", 0.0)) * g / (np.sqrt(h_new) + a.get("epsilon", 1e-6)),
            "H": h_new}


def adam(a, r: float, t: int, x, g, v, h):
    alpha, beta = a.get("alpha", 0.9), a.get("beta", 0.999)
    g = a.get("norm_coefficient", 0.0) * x + g
    v_new = alpha * v + (1 - alpha) * g
    h_new = beta * h + (1 - beta) * g * g
    rate = r * np.sqrt(1 - beta ** t) / (1 - alpha ** t) if t > 0 else r
    x_new = x - rate * (v_new / (np.sqrt(h_new) + a.get("epsilon", 1e-6)))
    return {"X": (1 - a.get("norm_coefficient_post", 0.0)) * x_new, "V": v_new, "H": h_new}


def momentum(a, r: float, t: int, x, g, v):
    alpha, beta = a["alpha"], a["beta"]  # required (the shape rule checks)
    g = a["norm_coefficient"] * x + g
    v_new = alpha * v + (beta if t > 0 else 1.0) * g
    step = g + alpha * v_new if a["mode"] == "nesterov" else v_new
    return {"X": x - r * step, "V": v_new}


UPDATES = {"Adagrad": adagrad, "Adam": adam, "Momentum": momentum}


@reference(*GROUPS, domain=TRAINING_DOMAIN)
def optimizer(node, inputs):
    op = node.op_type
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in node.attrs.items()}
    r, t = float(np.asarray(inputs[0]).reshape(())), int(np.asarray(inputs[1]).reshape(()))
    n, groups = grouped(op, inputs)
    news = [UPDATES[op](attrs, r, t, *(groups[k][i].astype(np.float64) for k in GROUPS[op][0])) for i in range(n)]
    return [news[i][k].astype(groups[k][i].dtype) for k in GROUPS[op][1] for i in range(n)]
