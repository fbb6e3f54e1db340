"""benchmarks/dynamic_screen.py: the interior shape sets it binds cover every dynamic dim of an export's
profile with odd and even values, and binding a cuda plan (built here, no GPU) lists every layer whose
tactic does not serve a shape set."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from benchmarks.dynamic_exports import model_names, shape_plan
from benchmarks.dynamic_screen import INTERIOR, dim_ranges, markdown, screen_candidates, screen_plan, shape_sets
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.profiles import Profile
from tests.dynamic_models import window_pad


def _spec(name):
    return json.loads(json.dumps(shape_plan(name)))  # as the export's .json holds it (string axis keys)


@pytest.mark.parametrize("name", ["swin_t", "bert_base", "wav2vec2_base", "unet", "fasterrcnn_mobilenet_v3_large_320_fpn"])
def test_interior_sets_vary_every_dim_with_odd_and_even_values_inside_the_profile(name):
    spec = _spec(name)
    sets = shape_sets(name, spec)
    assert sets == shape_sets(name, spec)  # deterministic
    labels = [label for label, _ in sets]
    assert labels[:4] == ["min", "opt", "odd", "max"]
    inside = [shapes for label, shapes in sets if label.startswith("in ")]
    assert len(inside) == INTERIOR and all(inside.count(s) == 1 for s in inside)
    assert not any(s in inside for label, s in sets if not label.startswith("in "))
    for dim, (low, high) in dim_ranges(spec).items():
        values = {shapes[n][int(a)] for shapes in inside for n, s in spec.items() for a, d in s["axes"].items() if d == dim}
        assert all(low <= v <= high for v in values) and len(values) >= min(3, high - low + 1)
        if name == "unet" and dim != "batch":
            assert all(v % 16 == 0 for v in values)
        else:
            assert {v % 2 for v in values} == {0, 1}


def test_the_detector_sets_include_its_float32_rounding_sizes():
    name = "fasterrcnn_mobilenet_v3_large_320_fpn"
    sets = dict(shape_sets(name, _spec(name)))
    assert sets["f32 1"]["x"] == (1, 3, 279, 279) and "f32 4" in sets


def test_every_model_gets_its_interior_sets_where_the_profile_has_them():
    for name in model_names():
        spec = _spec(name)
        inside = [s for label, s in shape_sets(name, spec) if label.startswith("in ")]
        ranges = dim_ranges(spec)
        room = 1
        for low, high in ranges.values():
            room *= high - low + 1
        assert len(inside) == INTERIOR or (len(ranges) == 1 and len(inside) <= room - 4), name


#: even corners: window_pad's Pad pads nothing at any of them (tests/runtime/test_dynamic_shapes.py)
WINDOW_PROFILE = Profile({"x": ((1, 4, 4, 8), (2, 6, 6, 8), (4, 8, 8, 8))})


def test_the_screen_lists_a_layer_whose_tactic_does_not_serve_an_odd_set(monkeypatch):
    """window_pad's cuda plan runs its Pad with pad_last, which serves an odd side through its fallback;
    without that `serves` the screen names the layer at every set whose side is odd, the others bind."""
    import polykit.runtime.shapes as shapes_module
    from polykit.kernels.tactics import find_tactic

    plan = build_plan(window_pad(), BuilderConfig(target="cuda", profiles=[WINDOW_PROFILE], builder_optimization_level=0))
    sets = [("min", {"x": (1, 4, 4, 8)}), ("odd", {"x": (3, 5, 7, 8)}), ("even", {"x": (2, 6, 8, 8)}),
            ("in 1", {"x": (1, 5, 4, 8)})]
    assert screen_plan(plan, sets)["failures"] == []
    without = replace(find_tactic("cuda", "Pad", "cuda.movement.pad_last"), serves=None)
    monkeypatch.setattr(shapes_module, "find_tactic", lambda target, kind, name: without if kind == "Pad" else
                        find_tactic(target, kind, name))
    found = screen_plan(plan, sets)
    assert found["bound"] == 4 and found["refused"] == []
    (failure,) = found["failures"]
    assert (failure["kind"], failure["tactic"]) == ("Pad", "cuda.movement.pad_last")
    assert [s["set"] for s in failure["shapes"]] == ["odd", "in 1"]
    assert failure["shapes"][0]["layer_out"] == [[3, 6, 8, 8]]
    table = markdown([{"model": "window_pad", "dynamic": ["batch", "height", "width"], "precision": "fp32",
                       "build_s": 0.1, **found}])
    assert f"| {failure['layer']} (Pad, cuda.movement.pad_last: odd, in 1) |" in table


def test_a_set_the_model_cannot_take_is_refused_not_a_failure():
    plan = build_plan(window_pad(), BuilderConfig(target="cuda", profiles=[WINDOW_PROFILE], builder_optimization_level=0))
    found = screen_plan(plan, [("outside", {"x": (5, 4, 4, 8)})])
    assert found["bound"] == 0 and found["failures"] == [] and found["refused"][0]["set"] == "outside"


def _window_plan_and_a_pad_last_without_its_fallback(monkeypatch):
    """window_pad's cuda plan, and the builder's candidates with pad_last's `serves` taken away (as before
    its run-time fallback: only where it pads the last axis alone)."""
    import polykit.compiler.builder.tuner as tuner

    cfg = BuilderConfig(target="cuda", profiles=[WINDOW_PROFILE], builder_optimization_level=0)
    plan = build_plan(window_pad(), cfg)
    real = tuner.candidates
    monkeypatch.setattr(tuner, "candidates", lambda *args, **kw: [
        replace(t, serves=None) if t.name == "cuda.movement.pad_last" else t for t in real(*args, **kw)])
    return plan, cfg


WINDOW_SETS = [("min", {"x": (1, 4, 4, 8)}), ("odd", {"x": (3, 5, 7, 8)}), ("even", {"x": (2, 6, 8, 8)})]


def test_the_candidates_screen_names_an_eligible_tactic_that_fails_between_the_corners(monkeypatch):
    """Without witness points the builder would let a timed build choose that pad_last for the Pad (it
    serves every even corner); the screen names it at the odd set, and every other pair it checked passes."""
    from polykit.compiler.plan.witnesses import Witnesses

    plan, cfg = _window_plan_and_a_pad_last_without_its_fallback(monkeypatch)
    monkeypatch.setattr(Witnesses, "corners", lambda self, layer: ())
    found = screen_candidates(plan, cfg, WINDOW_SETS)
    (failure,) = found["candidate_failures"]
    assert (failure["kind"], failure["tactic"]) == ("Pad", "cuda.movement.pad_last")
    assert [s["set"] for s in failure["shapes"]] == ["odd"] and found["candidates_checked"] > len(plan.layers)


def test_the_witness_points_keep_that_tactic_out_of_the_candidates(monkeypatch):
    plan, cfg = _window_plan_and_a_pad_last_without_its_fallback(monkeypatch)
    assert screen_candidates(plan, cfg, WINDOW_SETS)["candidate_failures"] == []
