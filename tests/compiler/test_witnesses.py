"""Witness points (polykit.compiler.plan.witnesses): points inside a profile where a layer's dims relate
as at no corner, where the builder asks tactics too."""

from __future__ import annotations

from polykit.compiler.ir.symbolic import Expr, evaluate, symbol
from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.compiler.plan.witnesses import MAX_WITNESSES, Witnesses, sample_points

H = symbol("h")
#: ceil(h / 32) * 32: the image a detector batches, padded to a multiple of 32
PADDED = Expr("*", (Expr("cdiv", (H, 32)), 32))
CORNERS = [{"h": 256, "n": 3}, {"h": 320, "n": 3}, {"h": 384, "n": 3}]


def _tensor(name, *dims):
    return TensorDesc(name, "float32", tuple(evaluate(d, CORNERS[1]) for d in dims), "activation", dims=tuple(dims))


def _pad_layer():
    tensors = {"x": _tensor("x", 1, H), "y": _tensor("y", 1, PADDED)}
    return LayerDesc("pad", "Pad", ("x",), ("y",)), tensors


def test_sample_points_stay_in_the_corners_ranges_and_repeat_from_build_to_build():
    points = sample_points(CORNERS, 64)
    assert len(points) == 64 and points == sample_points(CORNERS, 64)
    assert all(256 <= p["h"] <= 384 and p["n"] == 3 for p in points)
    assert len({p["h"] for p in points}) > 32


def test_a_pad_that_grows_nothing_at_any_corner_has_a_witness_where_it_grows():
    layer, tensors = _pad_layer()
    assert all(evaluate(H, env) == evaluate(PADDED, env) for env in CORNERS)
    found = Witnesses(tensors, CORNERS).envs(layer)
    assert found and 1 <= len(found) <= MAX_WITNESSES
    assert evaluate(H, found[0]) != evaluate(PADDED, found[0])
    corner, = Witnesses(tensors, CORNERS).corners(layer)[:1]
    assert corner["x"].shape[1] != corner["y"].shape[1]


def test_a_point_that_repeats_a_corners_relations_is_no_witness():
    """x and y equal everywhere, every dim's alignment and range seen at a corner (s = 1, 2, 4 cover
    gcd 1, 2, 4; 3 repeats s = 1): nothing to ask the tactics again."""
    s = symbol("s")
    corners = [{"s": 1}, {"s": 2}, {"s": 4}]
    tensors = {n: TensorDesc(n, "float32", (2,), "activation", dims=(s,)) for n in ("x", "y")}
    assert Witnesses(tensors, corners).envs(LayerDesc("relu", "Relu", ("x",), ("y",))) == []


def test_a_layer_of_static_tensors_or_a_profile_without_ranges_has_no_witness():
    layer, tensors = _pad_layer()
    static = {n: TensorDesc(n, "float32", (1, 8), "activation") for n in ("x", "y")}
    assert Witnesses(static, CORNERS).envs(layer) == []
    assert Witnesses(tensors, [CORNERS[1]]).envs(layer) == []
