"""Float values of dims in shape chains: `int(x.shape[2] * 0.5)` or F.interpolate's recomputed
sizes, which exporters write as Cast(float) -> Mul -> Floor -> Cast(int64).

A `DimRatio` is a float that is num / den exactly: num a dim (an int or a SymInt, whose expression
it carries), den a positive int. A Cast of dims to a float type makes them (den 1); Mul, Div, Add,
Sub and Neg with float constants (each as the simplest fraction that rounds to the float32
constant: 0.5 -> 1/2, 0.7f -> 7/10, polykit.compiler.ir.symbolic.float32_fraction) or with each
other keep them; Floor, Ceil and a Cast back to an integer type (truncation, its sign decided at
opt) give dims again: `num // den`, ceil(num / den). Anything else (Sqrt, a quotient by a dim
expression) gives no value, so its consumers get no dim expression and the build says which node
stopped it (shape_values.stopped_expression).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ir.symbolic import SymInt, ceil_div, float32_fraction


class DimRatio(float):
    """num / den of a dim `num` (int or SymInt) and a positive int `den`; its float value at opt."""

    num: int
    den: int

    def __new__(cls, num: int, den: int) -> "DimRatio":
        obj = super().__new__(cls, int(num) / den)
        obj.num, obj.den = num, den
        return obj

    def __repr__(self) -> str:
        return f"DimRatio({self.num!r}/{self.den})"

    def __reduce__(self):  # copy.deepcopy keeps the parts
        return DimRatio, (self.num, self.den)


def ratio(num: int, den: int = 1) -> "DimRatio | float":
    """num / den: a DimRatio while num is a SymInt, else the plain float."""
    if den < 0:
        num, den = -num, -den
    return DimRatio(num, den) if isinstance(num, SymInt) else int(num) / den


def holds_ratios(value: "np.ndarray | None") -> bool:
    return value is not None and value.dtype == object and any(isinstance(v, DimRatio) for v in value.ravel())


def _parts(x) -> tuple[int, int]:
    """(num, den) of an operand element: a DimRatio's, a dim's (den 1), a float constant's fraction."""
    if isinstance(x, DimRatio):
        return x.num, x.den
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return x, 1
    f = float32_fraction(float(x))
    return f.numerator, f.denominator


def _add(a, b):
    (n1, d1), (n2, d2) = _parts(a), _parts(b)
    return ratio(n1 * d2 + n2 * d1, d1 * d2)


def _sub(a, b):
    (n1, d1), (n2, d2) = _parts(a), _parts(b)
    return ratio(n1 * d2 - n2 * d1, d1 * d2)


def _mul(a, b):
    (n1, d1), (n2, d2) = _parts(a), _parts(b)
    return ratio(n1 * n2, d1 * d2)


def _div(a, b):
    (n1, d1), (n2, d2) = _parts(a), _parts(b)
    if isinstance(n2, SymInt) or int(n2) == 0:
        raise ValueError("a quotient by a dim expression")
    return ratio(n1 * d2, d1 * int(n2))


def _floor(a):
    n, d = _parts(a)
    return ratio(n // d)


def _ceil(a):
    n, d = _parts(a)
    return ratio(ceil_div(n, d))


def to_int(a) -> int:
    """A float dim cast to an integer type: truncated toward zero (the sign decided at opt)."""
    n, d = _parts(a)
    return n // d if int(n) >= 0 else -((-n) // d)


def _elementwise(fn: Callable) -> Callable[[Node, list], list[np.ndarray]]:
    def run(node: Node, args: list) -> list[np.ndarray]:
        arrays = [np.asarray(a, dtype=object) for a in args if a is not None]
        return [np.asarray(np.vectorize(fn, otypes=[object])(*arrays), dtype=object).reshape(
            np.broadcast_shapes(*(a.shape for a in arrays)))]
    return run


#: op -> fn(node, args) over object arrays holding DimRatios (and float constants, dims)
RATIO_OPS: dict[str, Callable[[Node, list], list[np.ndarray]]] = {
    "Add": _elementwise(_add),
    "Sub": _elementwise(_sub),
    "Mul": _elementwise(_mul),
    "Div": _elementwise(_div),
    "Neg": _elementwise(lambda a: _mul(a, -1)),
    "Floor": _elementwise(_floor),
    "Ceil": _elementwise(_ceil),
}


def to_ratios(value: np.ndarray) -> np.ndarray:
    """Dims (ints and SymInts) cast to a float type."""
    out = np.empty(value.shape, dtype=object)
    out.ravel()[:] = [ratio(v) for v in value.ravel()]
    return out


def from_ratios(value: np.ndarray) -> np.ndarray:
    """Float dims cast to an integer type."""
    out = np.empty(value.shape, dtype=object)
    out.ravel()[:] = [to_int(v) for v in value.ravel()]
    return out

