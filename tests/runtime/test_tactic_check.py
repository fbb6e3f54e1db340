"""A cuda plan carries no code (issue 34): the runtime regenerates every kernel from the layer's
tactic with polykit's own generators, byte for byte what the builder compiled, and a plan edited
to carry source, a define, a tactic parameter outside the tactic's own or a missing plugin is a
PlanError (exit 2 from `polykit inspect model` and `polykit run`). Plans build without a GPU."""

from __future__ import annotations

import importlib
import json
import re
from typing import Any, Callable

import pytest

import polykit.kernels.cuda as cuda_kernels
import polykit.kernels.cuda.base as cuda_base
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan, decode_plan
from polykit.errors import PlanError
from polykit.kernels.cuda.base import KernelSource, check_generated
from polykit.kernels.tactics import find_tactic
from polykit.runtime.tactic_check import check_tactics, plan_kernels
from polykit.tools.cli.app import main
from tests.compiler.test_plan_check import edited
from tests.cli_models import REPO, fault_plugin, fresh_plugins  # noqa: F401  (pytest fixtures)

TORCH = REPO / "tests" / "data" / "torch"
FP16 = BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0)


def _int8_convnet() -> Any:
    from polykit.compiler.graph.onnx_import import load_onnx
    from tests.compiler.int8_models import convnet

    graph = load_onnx(convnet())
    return graph, BuilderConfig(target="cuda", int8=True, builder_optimization_level=0,
                                tensor_ranges={"x": (-1.5, 1.2), "r1": (0.0, 3.0), "f": (0.0, 2.0)})


#: (model, config): conv (NCHW and fused epilogues), gemm + attention + layernorm + fused pointwise
#: (BERT, GPT-2, ViT), int8 convolutions and GEMM
MODELS: dict[str, Callable[[], tuple[Any, BuilderConfig]]] = {
    "convnet": lambda: (str(TORCH / "convnet_ts.onnx"), FP16),
    "bert": lambda: (str(TORCH / "bert_tiny_ts.onnx"), FP16),
    "gpt2": lambda: (str(TORCH / "gpt2_tiny_ts.onnx"), FP16),
    "vit": lambda: (str(TORCH / "vit_tiny_ts.onnx"), FP16),
    "int8": _int8_convnet,
}


def _build_recording(name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Plan, dict[str, list[KernelSource]]]:
    """The plan of MODELS[name] and the KernelSources the builder recorded for it (what it compiles)."""
    seen: dict[str, list[KernelSource]] = {}
    pack = cuda_base.pack_kernel_table

    def recording(per_layer: Any, layers: Any = ()) -> dict[str, Any]:
        seen.update({layer: list(sources) for layer, sources in per_layer.items()})
        return pack(per_layer, layers)

    monkeypatch.setattr(cuda_base, "pack_kernel_table", recording)
    model, config = MODELS[name]()
    plan = build_plan(model, config)
    monkeypatch.setattr(cuda_base, "pack_kernel_table", pack)
    return plan, seen


@pytest.fixture(scope="module")
def convnet_bytes() -> bytes:
    model, config = MODELS["convnet"]()
    return build_plan(model, config).serialize()


def _family(tactic_name: str, kind: str) -> str:
    return find_tactic("cuda", kind, tactic_name).enqueue_fn.__module__


# ---- regeneration ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_loaded_plan_regenerates_the_builders_nvrtc_inputs_byte_for_byte(name, monkeypatch):
    plan, built = _build_recording(name, monkeypatch)
    back = Plan.deserialize(plan.serialize(), expect_target="cuda")
    check_tactics(back)
    for layer in back.layers:
        regenerated = plan_kernels(back, layer)
        # what NVRTC gets: the rendered text and the architecture, per entry point
        assert sorted((k.name, k.arch, k.render()) for k in regenerated) == \
            sorted((k.name, k.arch, k.render()) for k in built[layer.name]), layer.name


def test_the_models_cover_the_main_kernel_families(monkeypatch):
    families = set()
    for name in MODELS:
        plan, _ = _build_recording(name, monkeypatch)
        families |= {_family(l.tactic, l.kind).rsplit(".", 2)[-2] for l in plan.layers}
    assert {"conv", "gemm", "attention", "pointwise", "reduce", "int8", "movement"} <= families


#: the families that generate kernels (collectives and control flow launch others' kernels, selection only copies,
#: conv_skinny's, pointwise_rows' and pointwise_concat's kernels are gemm_skinny's and pointwise's, compiled as theirs)
GENERATORS = [m for m in cuda_kernels.family_modules() if importlib.import_module(m).compile_variants()]


def test_the_generators_are_every_family_but_those_that_launch_others_kernels():
    assert sorted(set(cuda_kernels.family_modules()) - set(GENERATORS)) == [
        "polykit.kernels.cuda.conv.conv_skinny", "polykit.kernels.cuda.models.collective",
        "polykit.kernels.cuda.models.control_flow", "polykit.kernels.cuda.movement.selection",
        "polykit.kernels.cuda.pointwise.pointwise_concat", "polykit.kernels.cuda.pointwise.pointwise_rows"]


@pytest.mark.parametrize("module", GENERATORS)
def test_every_kernel_family_generates_what_the_generated_kernel_check_accepts(module):
    """Every family (its compile variants: every kernel it generates, per parameter set) passes
    check_generated, the guard the runtime applies to regenerated kernels, and generates the same
    text twice (regeneration is a pure function of the parameters)."""
    variants = importlib.import_module(module).compile_variants
    first, again = variants(), variants()
    for kernel in first:
        assert check_generated(kernel, module) is kernel
    assert [k.render() for k in first] == [k.render() for k in again]


@pytest.mark.parametrize("kernel", [
    KernelSource("gemm_simt", file="gemm.cu", defines=(("ELEM", 'float; asm("trap;")'),)),
    KernelSource("gemm_simt", file="gemm.cu", defines=(("ELEM\n#include </etc/passwd>", "float"),)),
    KernelSource("gemm_simt(); int x", file="gemm.cu"),
    KernelSource("gemm_simt", file="../../etc/passwd"),
    KernelSource("gemm_simt", file="gemm.cu", arch="sm_90 -I/etc"),
])
def test_a_generated_kernel_with_punctuation_where_an_identifier_goes_is_a_plan_error(kernel):
    with pytest.raises(PlanError):
        check_generated(kernel, "layer 'x'")


# ---- hostile plans ----------------------------------------------------------------------------------
def _layer(doc: dict, kind: str) -> dict:
    return next(entry for entry in doc["layers"] if entry["tactic"].startswith(f"cuda.{kind}"))


def _first_row(doc: dict) -> dict:
    return _rows(doc)[0]


def _rows(doc: dict) -> list:
    """The kernel rows of the first layer that records any."""
    return next(rows for rows in doc["metadata"]["kernels"]["layers"].values() if rows)


def _gemm_tile(doc: dict) -> None:
    params = _layer(doc, "gemm")["tactic_params"]
    params[next(k for k, v in params.items() if isinstance(v, int))] = 10 ** 9


def _string_tile(doc: dict) -> None:
    params = _layer(doc, "gemm")["tactic_params"]
    key = next(k for k, v in params.items() if isinstance(v, int))
    params[key] = str(params[key])


HOSTILE = {
    "include": (lambda d: _first_row(d).update(code='#include "/etc/passwd"\n'), "carries no kernel source"),
    "define": (lambda d: _first_row(d).update(defines=[["ELEM", "float"]]), "carries no kernel source"),
    "asm": (lambda d: d["metadata"]["kernels"].update(code={"0" * 24: 'asm("trap;");'}), "carries no kernel source"),
    "entry point": (lambda d: _first_row(d).update(name="k(){} asm"), r"\.name"),
    "tile 1e9": (_gemm_tile, "are not tactic 'cuda.gemm"),
    "string tile": (_string_tile, "are not tactic 'cuda.gemm"),
    "source key": (lambda d: _first_row(d).update(key="0" * 24), "records kernels this polykit"),
    # found by `fuzz --seed 3`: a row repeated (same kernels as a set) raised IndexError
    "repeated row": (lambda d: _rows(d).append(dict(_rows(d)[0])), "kernel rows recorded"),
    "bogus tactic": (lambda d: _layer(d, "gemm").update(tactic="cuda.nosuch"), "'cuda.nosuch' is not a cuda tactic"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_plan_is_refused_by_inspect_and_run_with_exit_2(case, convnet_bytes, tmp_path, capsys, fresh_plugins):
    edit, message = HOSTILE[case]
    path = tmp_path / "plan.polykit"
    path.write_bytes(edited(convnet_bytes, edit))
    for command in (["inspect", "model", str(path)], ["run", str(path), "--trt"]):
        assert main(command) == 2, (case, command)
        err = capsys.readouterr().err
        assert "PlanError" in err or "plan" in err, err
        assert re.search(message, " ".join(err.split())), (case, command, err)


def test_an_untouched_plan_passes_inspect(convnet_bytes, tmp_path, fresh_plugins):
    path = tmp_path / "plan.polykit"
    path.write_bytes(convnet_bytes)
    assert main(["inspect", "model", str(path)]) == 0


def test_a_plan_stores_small_kernel_rows(convnet_bytes):
    _, doc, _ = decode_plan(convnet_bytes)
    table = doc["metadata"]["kernels"]
    rows = [row for rows in table["layers"].values() for row in rows]
    assert len(json.dumps(table)) < 100 * len(rows)


# ---- format 1 --------------------------------------------------------------------------------------
def test_a_format_1_plan_loads_with_its_code_table_ignored_and_sources_regenerated(convnet_bytes, monkeypatch):
    import polykit.compiler.plan.file as plan_file

    evil = '#include "/etc/passwd"\nextern "C" __global__ void k() {}\n'

    def as_format_1(doc: dict) -> None:  # the old layout: a code table, rows with code_ref / file + defines
        doc["format"] = 1
        for rows in doc["metadata"]["kernels"]["layers"].values():
            for row in rows:
                row.pop("key")
                row.update(code_ref="a" * 24)
        doc["metadata"]["kernels"]["code"] = {"a" * 24: evil}

    monkeypatch.setattr(plan_file, "FORMAT_VERSION", 1)
    old = edited(convnet_bytes, as_format_1)
    monkeypatch.undo()
    assert old[8:12] == (1).to_bytes(4, "little")
    plan = Plan.deserialize(old)
    check_tactics(plan)
    fresh = Plan.deserialize(convnet_bytes)
    for layer in plan.layers:
        assert [k.render() for k in plan_kernels(plan, layer)] == [k.render() for k in plan_kernels(fresh, layer)]
        assert all("/etc/passwd" not in k.render() for k in plan_kernels(plan, layer))
    # its kernel table now records keys as format 2 does: saved again it is a format-2 plan
    assert Plan.deserialize(plan.serialize()).metadata["kernels"] == fresh.metadata["kernels"]


# ---- plugins ---------------------------------------------------------------------------------------
def test_a_plugin_tactic_is_recorded_with_its_plugin_and_refused_when_missing_or_another_version(fault_plugin,
                                                                                              monkeypatch):
    from polykit.plugins import reset_plugin_manager

    plan = build_plan(str(TORCH / "convnet_ts.onnx"), BuilderConfig(target="cuda", builder_optimization_level=0))
    plugins = plan.metadata["kernels"]["plugins"]
    assert plugins["fault.Conv"] == {"plugin": "polykit_fault", "version": ""}
    data = plan.serialize()
    check_tactics(Plan.deserialize(data))

    other = edited(data, lambda d: d["metadata"]["kernels"]["plugins"]["fault.Conv"].update(version="9.9"))
    with pytest.raises(PlanError, match=r"plugin 'polykit_fault' version 9\.9; here plugin 'polykit_fault' is "
                                        r"version \(unversioned\)") as info:
        check_tactics(Plan.deserialize(other))
    assert "install plugin 'polykit_fault' version 9.9" in info.value.hint

    unrecorded = edited(data, lambda d: d["metadata"]["kernels"].pop("plugins"))
    with pytest.raises(PlanError, match="records it as polykit's own"):
        check_tactics(Plan.deserialize(unrecorded))

    monkeypatch.delenv("POLYKIT_PLUGINS")
    reset_plugin_manager()
    with pytest.raises(PlanError, match="comes from plugin 'polykit_fault' version \\(unversioned\\), which is not "
                                        "installed here") as info:
        check_tactics(Plan.deserialize(data))
    assert "POLYKIT_PLUGINS" in info.value.hint


def test_an_entry_point_plugin_is_versioned_by_its_distribution(tmp_path, monkeypatch, fresh_plugins):
    from polykit.plugins import create_plugin_manager
    from tests.cli_models import FAULT_PLUGIN

    info = tmp_path / "polykit_fault_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "entry_points.txt").write_text("[polykit]\nfault = polykit_fault\n")
    monkeypatch.syspath_prepend(str(FAULT_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert create_plugin_manager(env={}).plugin_version("fault") == "0.1.0"


def test_the_plans_nested_in_control_flow_layers_regenerate_their_kernels_too():
    from tests.compiler.control_flow.test_control_flow import CASES

    for case, (make, _) in sorted(CASES.items()):
        plan = Plan.deserialize(build_plan(make(), BuilderConfig(target="cuda")).serialize())
        check_tactics(plan)
        bodies = [value for layer in plan.layers for value in layer.attrs.values() if isinstance(value, Plan)]
        assert bodies, case
        for body in bodies:
            assert all(plan_kernels(body, layer) for layer in body.layers), case
