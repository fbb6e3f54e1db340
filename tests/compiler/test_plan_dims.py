"""The plan check of dynamic shapes: a crafted plan with impossible profiles or dim
expressions is a PlanError naming the field, before any target sees it."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.profiles import Profile
from polykit.errors import PlanError
from tests.compiler.test_plan_check import edited
from tests.dynamic_models import mlp


@pytest.fixture(scope="module")
def dynamic_bytes() -> bytes:
    profile = Profile({"x": ((1, 1, 16), (4, 8, 16), (8, 32, 16))})
    return build_plan(mlp(), BuilderConfig(target="cpu", profiles=[profile])).serialize()


def _set(key: str, value: Any) -> Callable[[dict], None]:
    def edit(doc):
        doc["tensors"]["y"][key] = value
    return edit


def _profiles(edit_profiles: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda doc: edit_profiles(doc["profiles"])


CRAFTED = [
    (_set("dims", ["batch", "seq", 8]), "tensors['y'].dims", "symbol 'seq' is not a dim of an engine input"),
    (_set("dims", ["batch", ["pow", "tokens", 2], 8]), "tensors['y'].dims", "is not an int, a symbol"),
    (_set("dims", ["batch", "tokens"]), "tensors['y'].dims", "one expression per dim"),
    (_set("dims", ["batch", "tokens", 9]), "tensors['y'].dims", "gives [4, 8, 9] at the first profile's opt"),
    (_set("dims", ["batch", ["+", "tokens", -40], 8]), "tensors['y'].dims", "negative shape"),
    (_set("dims", ["batch", ["//", "tokens", ["+", "batch", -1]], 8]), "tensors['y'].dims", "division by zero"),
    (_set("nbytes", 1024), "tensors['y'].nbytes", "its largest size at a profile corner"),
    (_profiles(lambda p: p["ranges"][0].update(batch=[4, 2, 8])), "profiles.ranges[0]['batch']",
     "min <= opt <= max"),
    (_profiles(lambda p: p["ranges"][0].pop("tokens")), "profiles.ranges[0]", "the inputs' symbols"),
    (_profiles(lambda p: p.update(ranges=[])), "profiles.ranges", "is empty"),
    (_profiles(lambda p: p["inputs"].update(x=["tokens", "batch", None])), "tensors['x'].dims", "differs from"),
    (lambda doc: doc.pop("profiles"), "tensors[", "a plan without profiles has no dynamic dims"),
    (_profiles(lambda p: p.update(sized=["data(y)[0]"])), "profiles.sized", "which is no data symbol"),
]


@pytest.mark.parametrize("edit, path, what", CRAFTED, ids=[c[1] + ": " + c[2] for c in CRAFTED])
def test_crafted_dynamic_plan_is_refused_naming_the_field(dynamic_bytes, edit, path, what):
    with pytest.raises(PlanError) as err:
        Plan.deserialize(edited(dynamic_bytes, edit))
    assert f"invalid plan field {path}" in err.value.what, err.value.what
    assert what in err.value.what


def test_untouched_dynamic_plan_passes_the_check(dynamic_bytes):
    assert Plan.deserialize(edited(dynamic_bytes, lambda doc: None)).profiles is not None


def _edit_value(change: Callable[[dict], None]) -> Callable[[dict], None]:
    def edit(doc):
        (t,) = [t for t in doc["tensors"].values() if "value" in t]
        change(t)
    return edit


@pytest.mark.parametrize("change, what", [
    (lambda t: t.update(value=["batch", "rows", 8]), "symbol 'rows' is not a dim of an engine input"),
    (lambda t: t.update(value=["batch"]), "one expression per element"),
    (lambda t: t.update(dtype="float32", nbytes=12), "a float32 tensor holds no dims"),
    (lambda t: t.update(kind="weight"), "only a statically shaped activation"),
])
def test_crafted_shape_tensor_value_is_refused(dynamic_bytes, change, what):
    with pytest.raises(PlanError, match="invalid plan field tensors\\[.*\\]") as err:
        Plan.deserialize(edited(dynamic_bytes, _edit_value(change)))
    assert what in err.value.what, err.value.what


def test_shape_tensor_values_are_written_by_the_engine_not_a_layer(dynamic_bytes):
    plan = Plan.deserialize(dynamic_bytes)
    (name,) = [n for n, t in plan.tensors.items() if t.value]
    assert [str(v) for v in plan.tensors[name].value] == ["batch", "tokens", "8"]
    assert not any(name in layer.outputs for layer in plan.layers)


def test_crafted_shape_tensor_input_profile_is_refused(dynamic_bytes):
    def edit(doc):
        doc["profiles"]["values"] = {"x": ["batch"]}

    with pytest.raises(PlanError, match=r"profiles.values\['x'\]: names no static integer engine input"):
        Plan.deserialize(edited(dynamic_bytes, edit))
