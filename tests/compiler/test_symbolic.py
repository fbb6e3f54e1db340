"""Symbolic dims: SymInt arithmetic builds expressions that evaluate to what ints compute."""

from __future__ import annotations

import json
import operator

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from polykit.compiler.ir.symbolic import MAX_VALUE, SymInt, bounds, ceil_div, evaluate, expr_from_json, expr_to_json, \
    float32_fraction, remainder_size, symbol, term_of

OPS = [operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod]


@st.composite
def programs(draw):
    """A random straight-line dim computation over symbols a, b and small constants."""
    steps = draw(st.lists(st.tuples(st.sampled_from(range(len(OPS) + 1)), st.integers(0, 5), st.integers(0, 5),
                                    st.integers(1, 9)), min_size=1, max_size=8))
    return steps


def _trace(steps, a, b):
    """Every value the computation makes, in order."""
    vals = [a, b]
    for op, i, j, k in steps:
        x, y = vals[i % len(vals)], vals[j % len(vals)]
        if op == len(OPS):
            vals.append(ceil_div(x, k))
        elif OPS[op] in (operator.floordiv, operator.mod):
            vals.append(OPS[op](x, k))
        else:
            vals.append(OPS[op](x, y))
    return vals


def _run(steps, a, b):
    return _trace(steps, a, b)[-1]


@settings(max_examples=200, deadline=None)
@given(programs(), st.integers(1, 50), st.integers(1, 50), st.integers(1, 50), st.integers(1, 50))
def test_expression_of_a_computation_evaluates_to_the_computation_at_any_dims(steps, a_opt, b_opt, a, b):
    sym = _run(steps, SymInt(a_opt, symbol("a")), SymInt(b_opt, symbol("b")))
    assert int(sym) == _run(steps, a_opt, b_opt)
    values = _trace(steps, a, b)
    assume(max(abs(v) for v in values) <= MAX_VALUE)  # evaluate refuses values beyond a plan's bound
    assert evaluate(term_of(sym), {"a": a, "b": b}) == values[-1]


@settings(max_examples=100, deadline=None)
@given(programs(), st.integers(1, 50), st.integers(1, 50))
def test_expression_survives_its_json_form(steps, a, b):
    term = term_of(_run(steps, SymInt(3, symbol("a")), SymInt(5, symbol("b"))))
    back = expr_from_json(json.loads(json.dumps(expr_to_json(term))), {"a", "b"})
    assert back == term
    assert evaluate(back, {"a": a, "b": b}) == evaluate(term, {"a": a, "b": b})


def test_reshape_quotient_cancels_to_the_remaining_symbol():
    b, s = SymInt(8, symbol("batch")), SymInt(128, symbol("seq"))
    assert expr_to_json(term_of(b * s * 768 // (b * 12))) == ["*", 64, "seq"]
    assert term_of(b * s // b) == symbol("seq")


def test_a_symbolic_dim_is_no_longer_symbolic_once_it_cancels_to_a_constant():
    b = SymInt(8, symbol("batch"))
    assert type(b * 4 // b) is int and b * 4 // b == 4


@pytest.mark.parametrize("bad, what", [
    (["pow", 1, 2], "not an int, a symbol"),
    (["//", 1], "takes 2 args"),
    ("z", "is not a dim of an engine input"),
    (1 << 60, "beyond"),
    (True, "not an int"),
    ([], "not an int"),
])
def test_malformed_expression_is_refused_with_what_is_wrong(bad, what):
    with pytest.raises(ValueError, match=what):
        expr_from_json(bad, {"a"})


def test_deeply_nested_expression_is_refused():
    value = "a"
    for _ in range(100):
        value = ["+", value, 1]
    with pytest.raises(ValueError, match="deeper"):
        expr_from_json(value, {"a"})


def test_bounds_of_an_expression_hold_every_value_over_the_symbol_ranges():
    h, w = SymInt(8, symbol("h")), SymInt(12, symbol("w"))
    ranges = {"h": (4, 12), "w": (6, 20)}
    for dim in (h * w, (-w) % 7, w + (-w) % 7, ceil_div(h, 3) * 2, (h + 6) // 7, -h + 30):
        low, high = bounds(term_of(dim), ranges)
        values = [evaluate(term_of(dim), {"h": a, "w": b}) for a in range(4, 13) for b in range(6, 21)]
        assert low <= min(values) and max(values) <= high, dim


def test_remainder_size_bounds_a_dim_the_corners_miss():
    pad = term_of((-SymInt(12, symbol("w"))) % 7)  # 0 at w = 7, 14 and 21; 6 at w = 8
    corners = [{"w": 7}, {"w": 14}, {"w": 21}]
    assert max(evaluate(pad, env) for env in corners) == 0
    assert remainder_size((pad, 3), corners) == 6 * 3
    assert remainder_size((term_of(SymInt(12, symbol("w"))), 3), corners) == 0  # monotone: the corners hold it


@pytest.mark.parametrize("value,fraction", [(0.5, (1, 2)), (2.0, (2, 1)), (0.7, (7, 10)), (1 / 3, (1, 3)),
                                            (1.25, (5, 4)), (0.1, (1, 10))])
def test_float32_fraction_is_the_simplest_fraction_that_rounds_to_the_float32_value(value, fraction):
    got = float32_fraction(value)
    assert (got.numerator, got.denominator) == fraction
    assert np.float32(got.numerator / got.denominator) == np.float32(value)


def test_float32_fraction_refuses_what_is_no_number():
    with pytest.raises(ValueError):
        float32_fraction(float("inf"))
