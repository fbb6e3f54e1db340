"""Version and hardware compatibility (issue 36, point 3): a plan records the polykit version,
format, compute capability and tactic set that built it; another polykit version loads it only
when it was built --version-compatible (and its tactics' revisions match), another compute
capability only under the plan's --hardware-compatibility-level. Timing and calibration caches
record where they come from and are ignored (with a warning) or refused elsewhere. No GPU here:
the device's capability is injected where the cuda target asks the driver for it."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polykit
from polykit.compiler.builder import builder as builder_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import FORMAT_VERSION, Plan, decode_plan
from polykit.errors import DataFileError, PlanError, UsageError
from polykit.kernels.tactics import find_tactic, tactic_set
from polykit.runtime.compatibility import check_hardware
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.driver import DeviceInfo
from polykit.runtime.engine import Engine, Runtime
from polykit.runtime.tactic_check import check_tactics
from polykit.tools.cli.app import main
from tests.compiler.test_plan_check import edited

OTHER = "0.0.9"  # a polykit version that is not this one


def _mlp():
    rng = np.random.default_rng(36)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w1", (16, 32)), ("b1", (32,)), ("w2", (32, 8)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    return helper.make_model(helper.make_graph(nodes, "mlp", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def _gemm(n: int = 256):
    """A MatMul large enough for the sm_90 wgmma tactics."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32), "w")
    return helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "gemm",
                                               [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])


def _device(arch: str) -> DeviceInfo:
    return DeviceInfo(0, f"test GPU {arch}", arch, 132, 80 << 30, 227 * 1024)


def _written_by(plan: Plan, version: str, monkeypatch: pytest.MonkeyPatch, edit=None) -> bytes:
    """The plan's bytes as polykit `version` writes them (its document edited by `edit` first)."""
    with monkeypatch.context() as m:
        m.setattr(polykit, "__version__", version)
        return edited(plan.serialize(), edit) if edit else plan.serialize()


def _run(plan_bytes: bytes, x: np.ndarray) -> np.ndarray:
    with Runtime().deserialize_engine(plan_bytes) as engine, engine.create_execution_context() as ctx:
        return ctx.execute({"x": x})["y"]


X = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def cpu_plan() -> Plan:
    return build_plan(_mlp(), BuilderConfig(target="cpu"))


@pytest.fixture(scope="module")
def compatible_plan() -> Plan:
    return build_plan(_mlp(), BuilderConfig(target="cpu", version_compatible=True))


# ---- what a plan records ----------------------------------------------------------------------
def test_a_plan_records_version_format_and_tactic_set(cpu_plan):
    header, doc, _ = decode_plan(cpu_plan.serialize())
    assert header["polykit_version"] == polykit.__version__ and doc["format"] == FORMAT_VERSION
    assert doc["compatibility"] == {"tactic_set": tactic_set("cpu"), "version_compatible": False,
                                    "hardware_compatibility_level": "none"}
    loaded = Plan.deserialize(cpu_plan.serialize())
    assert (loaded.compatibility.polykit, loaded.compatibility.tactic_set) == (polykit.__version__, tactic_set("cpu"))


def test_a_version_compatible_plan_names_its_tactics_with_their_revisions(compatible_plan):
    record = compatible_plan.compatibility
    assert record.version_compatible
    assert record.tactics == {layer.tactic: find_tactic("cpu", layer.kind, layer.tactic).revision
                              for layer in compatible_plan.layers}
    assert Plan.deserialize(compatible_plan.serialize()).compatibility.tactics == record.tactics


def test_a_cuda_plan_records_the_compute_capability_it_was_built_on(monkeypatch):
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: _device("sm_90"))
    plan = build_plan(_gemm(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    header, _, _ = decode_plan(plan.serialize())
    assert header["gpu_arch"] == "sm_90" and plan.compatibility.tactic_set == tactic_set("cuda")


# ---- version compatibility --------------------------------------------------------------------
def test_a_plan_from_another_polykit_version_is_a_plan_error_naming_both(cpu_plan, monkeypatch):
    data = _written_by(cpu_plan, OTHER, monkeypatch)
    with pytest.raises(PlanError) as err:
        Runtime().deserialize_engine(data)
    assert f"polykit {OTHER}" in err.value.what and f"polykit {polykit.__version__}" in err.value.what
    assert "--version-compatible" in err.value.hint


def test_the_cli_refuses_another_versions_plan_with_exit_code_2(cpu_plan, monkeypatch, tmp_path, capsys):
    path = tmp_path / "old.plan"
    path.write_bytes(_written_by(cpu_plan, OTHER, monkeypatch))
    assert main(["run", str(path), "--trt", "--target", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"built by polykit {OTHER}" in err and "--version-compatible" in err and "Traceback" not in err


def test_a_version_compatible_plan_from_another_version_runs_and_gives_the_same_outputs(compatible_plan, monkeypatch):
    want = _run(compatible_plan.serialize(), X)
    data = _written_by(compatible_plan, OTHER, monkeypatch)
    assert Plan.deserialize(data).compatibility.polykit == OTHER
    np.testing.assert_array_equal(_run(data, X), want)


def test_a_tactic_whose_revision_changed_refuses_a_version_compatible_plan(compatible_plan, monkeypatch):
    tactic = compatible_plan.layers[0].tactic
    data = _written_by(compatible_plan, OTHER, monkeypatch, lambda doc: doc["compatibility"]["tactics"].update({tactic: 0}))
    with pytest.raises(PlanError, match=f"{tactic}@0.*has {tactic}@1") as err:
        Runtime().deserialize_engine(data)
    assert "rebuild" in err.value.hint


def test_a_version_compatible_cuda_plan_takes_this_versions_kernels(monkeypatch):
    """The kernel keys another version recorded are its sources'; a version-compatible plan's kernels
    are regenerated from this version's (a plan of this version must match its keys exactly)."""
    plan = build_plan(_mlp(), BuilderConfig(target="cuda", builder_optimization_level=0, version_compatible=True))

    def other_sources(doc: dict) -> None:
        for rows in doc["metadata"]["kernels"]["layers"].values():
            for row in rows:
                row["key"] = "0" * len(row["key"])

    mine = Plan.deserialize(edited(plan.serialize(), other_sources))
    with pytest.raises(PlanError, match="does not generate"):
        check_tactics(mine)
    theirs = Plan.deserialize(_written_by(plan, OTHER, monkeypatch, other_sources))
    check_tactics(theirs)
    assert theirs.metadata["kernels"]["layers"] == plan.metadata["kernels"]["layers"]


# ---- hardware compatibility -------------------------------------------------------------------
def test_an_ampere_plus_build_takes_no_sm90_only_tactic(monkeypatch):
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: _device("sm_90"))
    native = build_plan(_gemm(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    portable = build_plan(_gemm(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                                 hardware_compatibility_level="ampere+"))
    archs = lambda plan: {a for layer in plan.layers for a in find_tactic("cuda", layer.kind, layer.tactic).archs}
    assert archs(native) == {"sm_90"}  # the wgmma GEMM where the device allows it
    assert archs(portable) == set() and portable.compatibility.hardware_level == "ampere+"


@pytest.fixture
def sm90_plans(monkeypatch) -> dict[str, Plan]:
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: _device("sm_90"))
    return {level: Plan.deserialize(build_plan(_gemm(), BuilderConfig(
        target="cuda", fp16=True, builder_optimization_level=0, hardware_compatibility_level=level)).serialize())
        for level in ("none", "ampere+")}


def test_a_plan_on_another_compute_capability_is_a_plan_error_naming_both(sm90_plans, monkeypatch):
    monkeypatch.setattr(driver, "current_device", lambda ordinal=0: _device("sm_80"))
    with pytest.raises(PlanError, match="built for compute capability sm_90; this GPU is sm_80") as err:
        Engine(sm90_plans["none"])
    assert "--hardware-compatibility-level ampere+" in err.value.hint


def test_an_ampere_plus_plan_refuses_a_gpu_older_than_ampere(sm90_plans, monkeypatch):
    monkeypatch.setattr(driver, "current_device", lambda ordinal=0: _device("sm_75"))
    with pytest.raises(PlanError, match=r"ampere\+ \(compute capability 8.0 and later\); this GPU is sm_75"):
        Engine(sm90_plans["ampere+"])


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100"])
def test_an_ampere_plus_plan_admits_every_gpu_from_ampere_on(sm90_plans, arch):
    check_hardware(sm90_plans["ampere+"], arch)


def test_the_build_gpu_itself_needs_no_level(sm90_plans):
    check_hardware(sm90_plans["none"], "sm_90")


def test_an_unknown_hardware_level_is_a_usage_error():
    with pytest.raises(UsageError, match="hardware compatibility level 'hopper\\+'"):
        BuilderConfig(hardware_compatibility_level="hopper+")


def test_the_cli_options_reach_the_plan(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_mlp().SerializeToString())
    out = tmp_path / "m.plan"
    assert main(["convert", str(path), "-o", str(out), "--target", "cpu", "--version-compatible",
                 "--hardware-compatibility-level", "ampere+"]) == 0
    record = Plan.load(out).compatibility
    assert (record.version_compatible, record.hardware_level) == (True, "ampere+") and record.tactics


# ---- timing and calibration caches ------------------------------------------------------------
def _timed(tmp_path, **options) -> Plan:
    return build_plan(_mlp(), BuilderConfig(target="cpu", builder_optimization_level=5, **options))


def test_a_timing_cache_records_the_device_and_version_that_measured_it(tmp_path):
    from polykit.runtime.cpu import CpuTarget

    cache = tmp_path / "timing.json"
    _timed(tmp_path, save_timing_cache=str(cache))
    doc = json.loads(cache.read_text())
    device = CpuTarget().device()
    assert (doc["format"], doc["polykit"], doc["device"], doc["arch"]) == (2, polykit.__version__, device.name,
                                                                           device.arch)


@pytest.mark.parametrize("field,value", [("device", "another machine"), ("arch", "sm_80"), ("polykit", OTHER)])
def test_a_timing_cache_from_elsewhere_is_ignored_with_a_warning(tmp_path, caplog, field, value):
    cache = tmp_path / "timing.json"
    _timed(tmp_path, save_timing_cache=str(cache))
    doc = json.loads(cache.read_text())
    doc[field] = value
    cache.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = _timed(tmp_path, load_timing_cache=str(cache), save_timing_cache=str(cache))
    assert f"{field} {value!r}" in caplog.text and "ignored" in caplog.text
    assert plan.metadata["tuning"]["cache_hits"] == 0 and plan.metadata["tuning"]["timed_tactics"] > 0
    assert json.loads(cache.read_text())[field] != value  # saved over: the file holds this build's times


def test_a_timing_cache_from_elsewhere_fails_a_build_that_may_not_time(tmp_path):
    cache = tmp_path / "timing.json"
    _timed(tmp_path, save_timing_cache=str(cache))
    doc = json.loads(cache.read_text())
    doc["arch"] = "sm_80"
    cache.write_text(json.dumps(doc))
    _timed(tmp_path, load_timing_cache=str(cache))  # ignored: timed again
    from polykit.errors import BuildError

    with pytest.raises(BuildError, match="the timing cache has no time"):
        _timed(tmp_path, load_timing_cache=str(cache), error_on_timing_cache_miss=True)


def _int8_build(tmp_path, cache, data: bool) -> Plan:
    from tests.compiler.int8_models import convnet

    batches = None
    if data:
        batches = [{"x": np.random.default_rng(i).standard_normal((2, 3, 16, 16)).astype(np.float32)} for i in range(2)]
    return build_plan(convnet(), BuilderConfig(target="cpu", int8=True, calibration_data=batches,
                                               calibration_cache=str(cache), builder_optimization_level=0))


def test_a_calibration_cache_of_another_version_is_refused_without_data_and_rewritten_with(tmp_path, caplog):
    cache = tmp_path / "calib.cache"
    _int8_build(tmp_path, cache, data=True)
    text = cache.read_text()
    assert f"polykit={polykit.__version__} " in text.splitlines()[0]
    cache.write_text(text.replace(f"polykit={polykit.__version__} ", f"polykit={OTHER} ", 1))
    with pytest.raises(DataFileError, match=f"written by polykit {OTHER}") as err:
        _int8_build(tmp_path, cache, data=False)
    assert "calibration data" in err.value.hint
    with caplog.at_level(logging.WARNING, logger="polykit"):
        _int8_build(tmp_path, cache, data=True)
    assert "ignored, calibrating again" in caplog.text
    assert cache.read_text() == text  # calibrated again with the same data: the same scales, this version's header


def test_inspect_shows_where_a_plan_may_load(compatible_plan, tmp_path, capsys):
    path = tmp_path / "m.plan"
    compatible_plan.save(path)
    assert main(["inspect", "model", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)["compatibility"]
    assert record["polykit"] == polykit.__version__ and record["version_compatible"] is True
    assert record["tactic_set"] == tactic_set("cpu") and record["hardware_compatibility_level"] == "none"


@pytest.mark.gpu
@pytest.mark.parametrize("level", ["none", "ampere+"])
def test_on_a_gpu_a_plan_stamped_with_another_capability_loads_only_under_its_level(level):
    """On the lent GPU: the plan's header and document say it was built on another Ampere-or-later
    GPU; an ampere+ plan runs and gives the outputs of the plan as built, a plain one is refused."""
    if not driver.is_available():
        pytest.skip("needs a CUDA GPU")
    plan = build_plan(_gemm(), BuilderConfig(target="cuda", fp16=True, hardware_compatibility_level=level))
    here = driver.current_device(0).arch
    other = "sm_86" if here != "sm_86" else "sm_80"
    x = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)

    def restamp(data: bytes) -> bytes:
        header, doc, blob = decode_plan(data)
        doc["gpu_arch"] = other
        from polykit.compiler.plan.file import encode_plan

        return encode_plan(doc, bytes(blob), header["target"], other)

    data = restamp(plan.serialize())
    if level == "none":
        with pytest.raises(PlanError, match=f"{other}; this GPU is {here}"):
            Runtime().deserialize_engine(data)
    else:
        np.testing.assert_array_equal(_run(data, x), _run(plan.serialize(), x))
