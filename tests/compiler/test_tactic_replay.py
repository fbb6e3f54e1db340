"""Tactic replay files: save, load (untrusted: structure checked), force, and the errors of forcing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.tactic_replay import (LayerChoice, TacticReplay, build_with_tactics, load_replay,
                                            save_replay)
from polykit.errors import BuildError, PolykitError, UsageError
from polykit.runtime.engine import Runtime

REPO = Path(__file__).resolve().parents[2]
MLP = str(REPO / "examples" / "models" / "mlp.onnx")
CONVNET = str(REPO / "tests" / "data" / "torch" / "convnet_ts.onnx")


def test_save_then_load_gives_a_byte_identical_plan_on_cpu(tmp_path):
    saved = tmp_path / "tactics.json"
    first = build_plan(CONVNET, BuilderConfig(target="cpu", save_tactics=saved))
    again = build_plan(CONVNET, BuilderConfig(target="cpu", tactic_replay=saved))
    assert again.serialize() == first.serialize()


def test_a_forced_cuda_tactic_survives_save_and_load_byte_for_byte(tmp_path):
    """Plans for cuda build without a GPU: in an fp16 build, force one convolution off the
    tensor-core tactic the builder prefers, save, load."""
    cfg = BuilderConfig(target="cuda", fp16=True, channels_last=False)
    convs = [l.name for l in build_plan(CONVNET, cfg).layers if l.kind == "Conv"]
    saved = tmp_path / "tactics.json"
    forced = build_with_tactics(CONVNET, {convs[1]: "cuda.conv.igemm_simt"}, replace(cfg, save_tactics=saved))
    assert [forced.layer(n).tactic for n in convs[:3]] == ["cuda.conv.igemm_mma", "cuda.conv.igemm_simt",
                                                           "cuda.conv.igemm_mma"]
    again = build_plan(CONVNET, replace(cfg, tactic_replay=saved))
    assert again.serialize() == forced.serialize()


def test_saved_file_records_every_layer_with_its_tactic_and_dtypes(tmp_path):
    saved = tmp_path / "tactics.json"
    plan = build_plan(MLP, BuilderConfig(target="cpu", save_tactics=saved, builder_optimization_level=0))
    doc = json.loads(saved.read_text())
    assert doc["format"] == 1
    assert doc["layers"] == {l.name: {"tactic": l.tactic, "inputs": list(l.in_dtypes), "outputs": list(l.out_dtypes)}
                             for l in plan.layers}
    assert doc["layers"]["fc1"] == {"tactic": "cpu.reference", "inputs": ["float32"] * 3, "outputs": ["float32"]}


def test_plans_do_not_record_the_side_file_paths(tmp_path):
    plan = build_plan(MLP, BuilderConfig(target="cpu", save_tactics=tmp_path / "t.json"))
    assert "save_tactics" not in plan.metadata["builder_config"]
    assert "tactic_replay" not in plan.metadata["builder_config"]


def test_forced_plan_runs_and_matches_the_default_plan():
    """The default plan's tactics are timed, so they differ between machines and loads (winograd,
    im2col, blocked GEMM): they agree with the reference's within rounding, not bit for bit."""
    x = np.random.default_rng(2).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)
    default = build_plan(CONVNET, BuilderConfig(target="cpu"))
    forced = build_with_tactics(CONVNET, {l.name: "cpu.reference" for l in default.layers}, BuilderConfig(target="cpu"))
    assert {l.tactic for l in forced.layers} == {"cpu.reference"}
    run = lambda plan: Runtime().deserialize_engine(plan).create_execution_context().execute({plan.inputs[0]: x})  # noqa: E731
    np.testing.assert_allclose(run(forced)[forced.outputs[0]], run(default)[default.outputs[0]], rtol=1e-5, atol=1e-6)


def test_config_turns_a_dict_into_an_assignment():
    cfg = BuilderConfig(target="cpu", tactic_replay={"fc1": "cpu.reference"})
    assert cfg.tactic_replay == TacticReplay({"fc1": LayerChoice("cpu.reference")})
    assert build_plan(MLP, cfg).layer("fc1").tactic == "cpu.reference"


def test_unknown_layer_is_a_build_error_naming_layer_and_tactic(tmp_path):
    path = save_replay(tmp_path / "t.json", TacticReplay({"no_such_layer": LayerChoice("cpu.reference", ("float32",),
                                                                                        ("float32",))}))
    with pytest.raises(BuildError, match="no_such_layer") as info:
        build_plan(MLP, BuilderConfig(target="cpu", tactic_replay=path))
    assert "cpu.reference" in str(info.value) and str(path) in str(info.value)


def test_unknown_tactic_is_a_build_error_naming_layer_and_tactic():
    with pytest.raises(BuildError, match="cpu.imaginary") as info:
        build_with_tactics(MLP, {"fc2": "cpu.imaginary"}, BuilderConfig(target="cpu"))
    assert "layer 'fc2'" in str(info.value) and "Gemm" in str(info.value)


def test_a_tactic_of_another_kind_is_a_build_error():
    with pytest.raises(BuildError, match="'cuda.softmax'.*Gemm"):
        build_with_tactics(MLP, {"fc1": "cuda.softmax"}, BuilderConfig(target="cuda"))


def test_tactic_that_cannot_run_the_layer_is_a_build_error_naming_both():
    """cuda.gemm.mma runs fp16 Gemms only; fc1 is float32."""
    with pytest.raises(BuildError, match="forces tactic 'cuda.gemm.mma', which cannot run this Gemm") as info:
        build_with_tactics(MLP, {"fc1": "cuda.gemm.mma"}, BuilderConfig(target="cuda"))
    assert "layer 'fc1'" in str(info.value)


def test_replay_recorded_for_other_dtypes_is_a_build_error(tmp_path):
    path = tmp_path / "t.json"
    build_plan(MLP, BuilderConfig(target="cpu", save_tactics=path))
    doc = json.loads(path.read_text())
    doc["layers"]["softmax"]["inputs"] = ["float16"]
    path.write_text(json.dumps(doc))
    with pytest.raises(BuildError, match=r"input dtypes \['float16'\]; this build's layer has \['float32'\]"):
        build_plan(MLP, BuilderConfig(target="cpu", tactic_replay=path))


def test_a_replay_may_force_a_subset_of_layers(tmp_path):
    path = save_replay(tmp_path / "t.json", TacticReplay({"softmax": LayerChoice("cuda.softmax", ("float32",),
                                                                                  ("float32",))}))
    plan = build_plan(MLP, BuilderConfig(target="cuda", tactic_replay=path))
    assert [l.tactic for l in plan.layers] == ["cuda.gemm.simt", "cuda.gemm.simt", "cuda.softmax"]


GOOD = {"format": 1, "layers": {"fc1": {"tactic": "cpu.reference", "inputs": ["float32", ""], "outputs": ["float32"]}}}


def _mutated(**changes):
    doc = json.loads(json.dumps(GOOD))
    entry = doc["layers"]["fc1"]
    for key, value in changes.items():
        target = doc if key in ("format", "layers", "extra") else entry
        if value is _DELETE:
            del target[key]
        else:
            target[key] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize("doc, field", [
    ([], "top level"),
    ({"fc1": "cpu.reference"}, "format"),
    (_mutated(format="1"), "field format"),
    (_mutated(format=True), "field format"),
    (_mutated(format=2), "field format"),
    (_mutated(extra=1), "unknown field(s) ['extra']"),
    (_mutated(layers=[]), "field layers"),
    (_mutated(tactic=7), "field layers['fc1'].tactic"),
    (_mutated(tactic=""), "field layers['fc1'].tactic"),
    (_mutated(inputs="float32"), "field layers['fc1'].inputs"),
    (_mutated(inputs=["float33"]), "field layers['fc1'].inputs[0]"),
    (_mutated(outputs=[None]), "field layers['fc1'].outputs[0]"),
    (_mutated(outputs=_DELETE), "has no 'outputs'"),
    (_mutated(params={}), "unknown field(s) ['params']"),
])
def test_malformed_replay_files_are_usage_errors_naming_file_and_field(tmp_path, doc, field):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UsageError) as info:
        load_replay(path)
    assert str(path) in str(info.value) and field in str(info.value)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00", b""])
def test_unreadable_replay_files_are_usage_errors(tmp_path, content):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(UsageError, match="tactic replay"):
        load_replay(path)


def test_missing_replay_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="tactic replay file .* does not exist"):
        build_plan(MLP, BuilderConfig(target="cpu", tactic_replay=tmp_path / "none.json"))


def test_saving_into_a_missing_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot write the tactic replay file"):
        build_plan(MLP, BuilderConfig(target="cpu", save_tactics=tmp_path / "no" / "t.json"))


_names = st.text(min_size=1, max_size=12)
_dtype_lists = st.lists(st.sampled_from(["float32", "float16", "int64", "bool", ""]), max_size=4).map(tuple)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_names, st.builds(LayerChoice, _names, _dtype_lists, _dtype_lists), max_size=6))
def test_replays_round_trip_through_their_file_format(tmp_path_factory, layers):
    path = tmp_path_factory.mktemp("replay") / "t.json"
    save_replay(path, TacticReplay(layers))
    assert load_replay(path).layers == layers


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(st.one_of(_json, st.builds(lambda k, v: _mutated(**{k: v}),
                                  st.sampled_from(["format", "layers", "tactic", "inputs", "outputs", "extra"]), _json)))
def test_any_json_document_loads_or_is_a_polykit_error(doc):
    try:
        replay = TacticReplay.from_json(doc, "fuzz.json")
    except PolykitError as exc:
        assert "fuzz.json" in str(exc)
    else:
        assert all(isinstance(c.tactic, str) and c.tactic for c in replay.layers.values())
