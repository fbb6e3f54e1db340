"""Points inside an optimization profile where a layer's shapes relate as at no corner.

A tactic's `supports` looks at concrete shapes: equal dims (a Pad that grows only the last axis,
x.shape[:-1] == y.shape[:-1]), a dim of 1, a dim's alignment, a size limit. The builder asks it at
the profile's corners (polykit.compiler.builder.tuner.serves_corners), which is enough where a
relation that holds at every corner holds everywhere between them. It need not: torchvision's
detection transform resizes every square corner (256², 320², 384²) to 320 × 320, so the Pad to a
multiple of 32 after it pads nothing at any corner; but 279 × 279 resizes to 319 × 319 (float32)
and 340 × 300 to 362 × 320, which the Pad grows on both axes, and the last-axis-only pad kernel
chosen at the corners wrote wrong images there (issue 33, Faster R-CNN on cuda).

So for each layer with dynamic dims, `Witnesses.envs` evaluates its tensors' dims at
`SAMPLE_POINTS` points spread over the profile's symbol ranges (an additive recurrence on
irrational steps: deterministic, no random state, no regular stride that a divisor could
hide in) and returns the first point of each *signature* no corner has, at most
`MAX_WITNESSES`: the signature of a point is which of the layer's dims are equal, each dynamic
dim's alignment (gcd with 16) and whether it lies below, inside or above its range over the
corners. The builder then asks tactics at those points too. A relation that breaks at fewer
than about one in SAMPLE_POINTS of the profile's points can still be missed.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.symbolic import Expr, ShapeEvalError, Term, evaluate
from polykit.compiler.plan.profiles import tensors_at
from polykit.compiler.plan.records import LayerDesc, TensorDesc

#: points of the profile where each layer's dims are evaluated
SAMPLE_POINTS = 256
#: witness points (distinct new signatures) a layer gets at most
MAX_WITNESSES = 8
#: a dim's alignment the signature records: its gcd with this
ALIGN = 16


def sample_points(corners: Sequence[Mapping[str, int]], count: int = SAMPLE_POINTS) -> list[dict[str, int]]:
    """`count` symbol assignments spread over each symbol's [min, max] over `corners` (symbols equal
    at every corner keep their value): point k gives the i-th varying symbol the fraction
    frac((k + 1) * sqrt(p_i)) of its range, p_i the i-th prime."""
    if not corners:
        return []
    names = sorted(corners[0])
    low = {s: min(int(env[s]) for env in corners) for s in names}
    high = {s: max(int(env[s]) for env in corners) for s in names}
    varying = [s for s in names if high[s] > low[s]]
    if not varying:
        return []
    steps = [math.sqrt(p) % 1.0 for p in _primes(len(varying))]
    points = []
    for k in range(1, count + 1):
        env = dict(low)
        for s, step in zip(varying, steps):
            env[s] = low[s] + min(int((k * step) % 1.0 * (high[s] - low[s] + 1)), high[s] - low[s])
        points.append(env)
    return points


def _primes(n: int) -> list[int]:
    found: list[int] = []
    k = 2
    while len(found) < n:
        if all(k % p for p in found):
            found.append(k)
        k += 1
    return found


class Witnesses:
    """Witness points of layers over one profile's `corners` (symbol values), given the plan's
    `tensors` (their `dims` expressions); each dim expression is evaluated once per point."""

    def __init__(self, tensors: Mapping[str, TensorDesc], corners: Sequence[Mapping[str, int]],
                 count: int = SAMPLE_POINTS):
        self.tensors = tensors
        self.envs_at_corners = [dict(env) for env in corners]
        self.points = sample_points(self.envs_at_corners, count)
        self._values: dict[int, tuple[np.ndarray, Any]] = {}  # id(expr) -> (values at corners + points, the expr)
        self._memos: list[dict] = [{} for _ in self.envs_at_corners + self.points]

    def _dims(self, layer: LayerDesc) -> tuple[list[Term], list[bool]]:
        dims: list[Term] = []
        dynamic: list[bool] = []
        for name in dict.fromkeys(n for n in (*layer.inputs, *layer.outputs) if n):
            t = self.tensors.get(name)
            if t is None:
                continue
            dims += list(t.dims) if t.dims else [int(d) for d in t.shape]
            dynamic += [isinstance(d, Expr) for d in t.dims] if t.dims else [False] * len(t.shape)
        return dims, dynamic

    def _evaluated(self, term: Term) -> np.ndarray:
        """`term` at the corners then the points (a float NaN where it has no value)."""
        if not isinstance(term, Expr):
            return np.full(len(self._memos), float(term))
        known = self._values.get(id(term))
        if known is None:
            out = np.empty(len(self._memos))
            for k, env in enumerate(self.envs_at_corners + self.points):
                try:
                    out[k] = float(evaluate(term, env, self._memos[k]))
                except (ShapeEvalError, KeyError, OverflowError, ValueError):
                    out[k] = np.nan
            known = self._values[id(term)] = (out, term)  # the expr kept alive: its id stays its own
        return known[0]

    def envs(self, layer: LayerDesc) -> list[dict[str, int]]:
        """Points of the profile where `layer`'s dims relate as at no corner (the first point of each
        new signature, at most MAX_WITNESSES); none for a layer without dynamic dims."""
        dims, dynamic = self._dims(layer)
        if not self.points or not any(dynamic):
            return []
        values = np.stack([self._evaluated(d) for d in dims])  # dims x (corners + points)
        valid = ~np.isnan(values).any(axis=0)
        safe = np.where(np.isnan(values), -1.0, values).astype(np.int64)
        dyn = np.asarray(dynamic)
        at_corners = safe[:, :len(self.envs_at_corners)]
        low, high = at_corners.min(axis=1, keepdims=True), at_corners.max(axis=1, keepdims=True)
        signature = np.concatenate([
            (safe[:, None, :] == safe[None, :, :])[np.triu_indices(len(dims), 1)],
            np.gcd(safe[dyn], ALIGN), (safe[dyn] > high[dyn]).astype(np.int64) - (safe[dyn] < low[dyn])])
        seen = {signature[:, k].tobytes() for k in range(len(self.envs_at_corners)) if valid[k]}
        found = []
        for k in range(len(self.envs_at_corners), len(self.envs_at_corners) + len(self.points)):
            key = signature[:, k].tobytes()
            if valid[k] and key not in seen:
                seen.add(key)
                found.append(dict(self.points[k - len(self.envs_at_corners)]))
                if len(found) == MAX_WITNESSES:
                    break
        return found

    def corners(self, layer: LayerDesc) -> tuple[Mapping[str, TensorDesc], ...]:
        """`layer`'s dynamic tensors at each of its witness points (`envs`), as serves_corners takes corners."""
        found = self.envs(layer)
        if not found:
            return ()
        own = {n: self.tensors[n] for n in (*layer.inputs, *layer.outputs) if n and n in self.tensors}
        return tuple(tensors_at(own, env) for env in found)
