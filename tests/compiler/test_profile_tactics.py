"""Tactics per optimization profile (cpu target): each profile's layers get the tactic its opt
shapes favour, the plan records and validates them, a context runs its profile's tactics (bit
for bit what a static plan with that tactic computes), and tactic replays carry them."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from polykit.compiler.builder import tuner as tuner_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.layer_timing import Measured
from polykit.compiler.plan.file import Plan, decode_plan
from polykit.compiler.plan.profiles import Profile
from polykit.compiler.builder.tactic_replay import load_replay
from polykit.errors import BuildError, PlanError, UsageError
from polykit.plugins import reset_plugin_manager
from polykit.runtime.engine import Engine
from tests.compiler.test_plan_check import edited, layer, loaded
from tests.dynamic_models import mlp

#: two Gemm tactics of one priority whose estimates favour few rows (M <= 8) or many; each
#: notes its calls, and they round differently on every machine (the float64 reference vs
#: products of operands rounded to float16: not BLAS's float32 order, which may round alike)
PLUGIN = '''
import numpy as np
from polykit.kernels.cpu.base import CpuTactic
from polykit.compiler.ops.references import run_reference
from polykit.plugins import hookimpl

CALLS = []


def _plain(layer):
    a = layer.attrs
    return layer.kind == "Gemm" and not layer.domain and not a.get("transA") and not a.get("transB") \\
        and a.get("alpha", 1.0) == 1.0 and a.get("beta", 1.0) == 1.0


def _rows(layer):
    return layer.in_shapes[0][0] if layer.in_shapes else 1


def few(node, inputs):
    CALLS.append("few")
    return run_reference(node, inputs)


def many(node, inputs):
    CALLS.append("many")
    y = (inputs[0].astype(np.float16).astype(np.float32) @ inputs[1].astype(np.float16).astype(np.float32))
    return [y + inputs[2] if len(inputs) > 2 and inputs[2] is not None else y]


FEW = CpuTactic("cpu", "Gemm", "plugin.rows.few", priority=100, supports=_plain, run_fn=few,
                estimate_fn=lambda layer, sm: 1.0 if _rows(layer) <= 8 else 100.0)
MANY = CpuTactic("cpu", "Gemm", "plugin.rows.many", priority=100, supports=_plain, run_fn=many,
                 estimate_fn=lambda layer, sm: 100.0 if _rows(layer) <= 8 else 1.0)


@hookimpl
def polykit_tactics(registry):
    if registry.target == "cpu":
        registry.register_all([FEW, MANY])
'''

SMALL = Profile({"x": ((1, 1, 16), (1, 4, 16), (2, 8, 16))})  # opt: M = 4 rows
LARGE = Profile({"x": ((2, 8, 16), (8, 16, 16), (8, 32, 16))})  # opt: M = 128 rows
BOTH = ("plugin.rows.few", "plugin.rows.many")


@pytest.fixture
def calls(tmp_path, monkeypatch):
    (tmp_path / "polykit_test_rows_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("POLYKIT_PLUGINS", "polykit_test_rows_plugin")
    reset_plugin_manager()
    module = __import__("polykit_test_rows_plugin")
    yield module.CALLS
    reset_plugin_manager()
    sys.modules.pop("polykit_test_rows_plugin", None)


def _build(**cfg):
    cfg.setdefault("builder_optimization_level", 0)
    return build_plan(mlp(), BuilderConfig(target="cpu", **cfg))


def _gemm(plan):
    return plan.layer("gemm9_node")  # the plain Gemm (gemm5 fuses a Relu: ai.polykit domain)


def _x(b, t):
    return np.random.default_rng(b * 100 + t).standard_normal((b, t, 16)).astype(np.float32)


def _run(plan, x, profile=0):
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        ctx.set_optimization_profile(profile)
        return ctx.execute({"x": x})["y"]


def test_two_profiles_get_the_tactics_their_opt_shapes_estimate_cheapest(calls):
    plan = _build(profiles=[SMALL, LARGE])
    gemm = _gemm(plan)
    assert gemm.profile_tactics == BOTH and gemm.tactic == "plugin.rows.few"
    assert plan.metadata["tactics"]["gemm9_node"] == "plugin.rows.few"  # profile 0's
    assert _build(profiles=[LARGE, SMALL]).layer("gemm9_node").profile_tactics == BOTH[::-1]
    fixed = [l for l in plan.layers if l.kind == "Reshape"]
    assert fixed and all(not l.profile_tactics for l in fixed)


def test_one_profile_or_agreeing_profiles_record_no_profile_tactics(calls):
    for profiles in ([SMALL], [LARGE], [SMALL, Profile({"x": ((1, 1, 16), (2, 2, 16), (2, 4, 16))})]):
        plan = _build(profiles=profiles)
        _, doc, _ = decode_plan(plan.serialize())
        assert not any("profile_tactics" in entry for entry in doc["layers"]), profiles


def test_each_profile_is_timed_at_its_own_opt_shapes(calls, monkeypatch):
    timed = []

    def fake_time(target, layer, pairs, tensors, weights, runs, device=None):
        rows = tensors[layer.inputs[0]].shape[0]
        timed.append((layer.name, layer.in_shapes[0], rows, [t.name for _, t in pairs]))
        return Measured([1.0 if (t.name == BOTH[0]) == (rows <= 8) else 2.0 for _, t in pairs], [""] * len(pairs))

    monkeypatch.setattr(tuner_module, "time_candidates", fake_time)
    plan = _build(profiles=[SMALL, LARGE], builder_optimization_level=3)
    assert _gemm(plan).profile_tactics == BOTH
    gemm = [(shape, rows) for name, shape, rows, names in timed if name == "gemm9_node"]
    assert gemm == [((4, 32), 4), ((128, 32), 128)]
    assert all(sorted(names) == list(BOTH) for name, _, _, names in timed if name == "gemm9_node")


def test_the_plan_round_trips_its_profile_tactics(calls):
    plan = _build(profiles=[SMALL, LARGE])
    data = plan.serialize()
    again = Plan.deserialize(data)
    assert again.layer("gemm9_node").profile_tactics == BOTH
    assert again.serialize() == data
    _, doc, _ = decode_plan(data)
    assert layer(doc, "gemm9_node")["profile_tactics"] == list(BOTH)


@pytest.mark.parametrize("profile, dims", [(0, (1, 4)), (1, (8, 16)), (0, (2, 8)), (1, (2, 8))])
def test_a_context_runs_its_profiles_tactic_bit_for_bit_like_a_static_plan_with_it(calls, profile, dims):
    x = _x(*dims)
    tactic = BOTH[profile]
    static = _build(input_shapes={"x": x.shape}, tactic_replay={"gemm9_node": tactic})
    assert _gemm(static).tactic == tactic
    want = _run(static, x)
    plan = Plan.deserialize(_build(profiles=[SMALL, LARGE]).serialize())
    calls.clear()
    got = _run(plan, x, profile)
    assert calls == [tactic.rsplit(".", 1)[1]], "the context ran another profile's tactic"
    assert np.array_equal(got, want)


def test_a_profiles_tactic_differs_from_the_others_where_they_round_differently(calls):
    x = _x(2, 8)  # inside both profiles
    plan = _build(profiles=[SMALL, LARGE])
    assert not np.array_equal(_run(plan, x, 0), _run(plan, x, 1))


@pytest.mark.parametrize("edit, field, what", [
    (lambda e: e.update(profile_tactics=["plugin.rows.few"]), "profile_tactics", "names 1 tactics; the plan has 2"),
    (lambda e: e.update(profile_tactics=list(BOTH) * 2), "profile_tactics", "names 4 tactics"),
    (lambda e: e.update(profile_tactics=["plugin.rows.many", "plugin.rows.few"]), r"profile_tactics\[0\]",
     "differs from the layer's tactic"),
    (lambda e: e.update(profile_tactics=[BOTH[0], BOTH[0]]), "profile_tactics", "names one tactic for every profile"),
    (lambda e: e.update(profile_tactics=[BOTH[0], "plugin.rows.none"]), r"profile_tactics\[1\]",
     "'plugin.rows.none' is not a cpu tactic for Gemm layers"),
    (lambda e: e.update(profile_tactics=[BOTH[0], 7]), r"profile_tactics\[1\]", "must be a string"),
])
def test_a_corrupted_per_profile_entry_is_a_plan_error_naming_the_layer(calls, edit, field, what):
    data = _build(profiles=[SMALL, LARGE]).serialize()
    with pytest.raises(PlanError, match=rf"layers\['gemm9_node'\]\.{field}: .*{what}"):
        loaded(edited(data, lambda doc: edit(layer(doc, "gemm9_node"))))


def test_a_single_profile_plan_with_profile_tactics_is_a_plan_error(calls):
    data = _build(profiles=[SMALL]).serialize()
    with pytest.raises(PlanError, match=r"layers\['gemm9_node'\]\.profile_tactics: names 2 tactics; the plan has 1"):
        Plan.deserialize(edited(data, lambda doc: layer(doc, "gemm9_node").update(profile_tactics=list(BOTH))))


def test_a_saved_replay_carries_per_profile_tactics_and_rebuilds_the_same_plan(calls, tmp_path):
    path = tmp_path / "tactics.json"
    plan = _build(profiles=[SMALL, LARGE], save_tactics=str(path))
    entry = json.loads(path.read_text())["layers"]["gemm9_node"]
    assert entry["tactic"] == BOTH[0] and entry["profiles"] == list(BOTH)
    assert load_replay(path).layers["gemm9_node"].profiles == BOTH
    forced = _build(profiles=[SMALL, LARGE], tactic_replay=str(path), builder_optimization_level=3)
    assert forced.layer("gemm9_node").profile_tactics == BOTH
    assert [l.tactic for l in forced.layers] == [l.tactic for l in plan.layers]


def test_a_replay_without_profiles_forces_its_tactic_in_every_profile(calls):
    plan = _build(profiles=[SMALL, LARGE], tactic_replay={"gemm9_node": "plugin.rows.many"})
    gemm = _gemm(plan)
    assert gemm.tactic == "plugin.rows.many" and gemm.profile_tactics == ()
    calls.clear()
    _run(plan, _x(1, 4), 0)
    assert calls == ["many"]


def test_a_replay_for_another_number_of_profiles_is_a_build_error(calls, tmp_path):
    path = tmp_path / "tactics.json"
    _build(profiles=[SMALL, LARGE], save_tactics=str(path))
    with pytest.raises(BuildError, match="tactics for 2 optimization profiles; this build has 3"):
        _build(profiles=[SMALL, LARGE, SMALL], tactic_replay=str(path))


@pytest.mark.parametrize("profiles, what", [
    (["plugin.rows.few"], "a list of two or more tactic names"),
    ("plugin.rows.few", "a list of two or more tactic names"),
    (["plugin.rows.few", ""], r"profiles\[1\] must be a tactic name"),
    (["plugin.rows.many", "plugin.rows.few"], r"profiles\[0\] must be the entry's tactic 'plugin.rows.few'"),
])
def test_a_malformed_profiles_entry_in_a_replay_file_is_a_usage_error(tmp_path, profiles, what):
    path = tmp_path / "tactics.json"
    entry = {"tactic": "plugin.rows.few", "inputs": ["float32"], "outputs": ["float32"], "profiles": profiles}
    path.write_text(json.dumps({"format": 1, "layers": {"gemm9_node": entry}}))
    with pytest.raises(UsageError, match=what):
        load_replay(path)


def test_inspect_shows_each_profiles_tactic_where_they_differ(calls, tmp_path, capsys, monkeypatch):
    from polykit.tools.cli.app import main

    monkeypatch.setenv("COLUMNS", "300")
    path = tmp_path / "m.plan"
    _build(profiles=[SMALL, LARGE], save_tactics=str(tmp_path / "t.json")).save(path)
    assert main(["inspect", "model", str(path), "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["layers"]}
    assert rows["gemm9_node"]["profile_tactics"] == list(BOTH)
    assert "profile_tactics" not in rows["y_node"]
    assert main(["inspect", "model", str(path)]) == 0
    assert "profile 0: plugin.rows.few, profile 1: plugin.rows.many" in capsys.readouterr().out
    assert main(["inspect", "tactics", str(tmp_path / "t.json")]) == 0
    assert "profile 0: plugin.rows.few, profile 1: plugin.rows.many" in capsys.readouterr().out


def test_a_cuda_plan_records_the_kernels_every_profile_launches(monkeypatch):
    """Built without a GPU for an sm_90 device (priority and estimates decide): for each profile the
    layers as the runtime runs them (its tactic, stamped at its opt) compile only recorded kernels."""
    import polykit.compiler.builder.builder as builder
    from polykit.kernels.profile_tactics import profile_layers
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.tactic_check import check_tactics
    from polykit.runtime.cuda.driver import DeviceInfo
    from tests.dynamic_models import tiny_bert

    monkeypatch.setattr(builder, "build_device", lambda target, device=None: DeviceInfo(0, "sm_90 device", "sm_90", 132, 80 << 30,
                                                                           227 << 10))
    ranges = (((1, 16), (1, 128), (2, 128)), ((4, 64), (8, 256), (8, 512)))
    profiles = [Profile({"input_ids": r, "attention_mask": r}) for r in ranges]
    plan = Plan.deserialize(build_plan(tiny_bert(), BuilderConfig(target="cuda", profiles=profiles)).serialize())
    table = plan.metadata["kernels"]
    assert any(t.startswith("cuda.gemm.sm90") for t in plan.metadata["tactics"].values())
    check_tactics(plan)  # the runtime regenerates every profile's kernels as the plan records them
    for profile in (0, 1):
        for ran in profile_layers(plan, profile):
            tactic = find_tactic("cuda", ran.kind, ran.tactic)
            recorded = {(row["name"], row["key"]) for row in table["layers"][ran.name]}
            missing = [k.name for k in tactic.kernels(ran) if (k.name, k.key()) not in recorded]
            assert not missing, (profile, ran.name, ran.tactic, missing)


def test_debug_tactics_trials_keep_the_bad_builds_per_profile_tactics_where_a_layer_stays_bad(calls):
    from polykit.tools.debug.tactics import _replay

    plan = _build(profiles=[SMALL, LARGE])
    bad = {l.name: l.tactic for l in plan.layers}
    kept = _replay(bad, plan.layers, "trial")
    assert kept.layers["gemm9_node"].profiles == BOTH
    rebuilt = _build(profiles=[SMALL, LARGE], tactic_replay=kept, builder_optimization_level=3)
    assert rebuilt.layer("gemm9_node").profile_tactics == BOTH
    swapped = _replay({**bad, "gemm9_node": "cpu.reference"}, plan.layers, "trial")
    assert swapped.layers["gemm9_node"].profiles == ()
    assert _build(profiles=[SMALL, LARGE], tactic_replay=swapped).layer("gemm9_node").tactic == "cpu.reference"
