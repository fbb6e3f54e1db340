"""The plan schema check: a well-formed, re-checksummed plan with impossible contents is a
PlanError naming the field, before any target sees it."""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan, decode_plan, encode_plan
from polykit.errors import PlanError
from polykit.kernels.cuda.base import KernelSource
from polykit.runtime.engine import Engine
from polykit.runtime.tactic_check import check_tactics


def _model():
    rng = np.random.default_rng(3)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["t"], name="mul"),
             helper.make_node("Softmax", ["t"], ["s"], name="softmax", axis=-1),
             helper.make_node("Abs", ["s"], ["y"], name="abs")]
    graph = helper.make_graph(nodes, "check", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.fixture(scope="module")
def cpu_bytes() -> bytes:
    return build_plan(_model(), BuilderConfig(target="cpu", fuse=False)).serialize()


@pytest.fixture(scope="module")
def cuda_bytes() -> bytes:
    return build_plan(_model(), BuilderConfig(target="cuda", fuse=False)).serialize()


def edited(data: bytes, edit: Callable[[dict], Any]) -> bytes:
    """The plan with its JSON document edited, lengths and checksum recomputed (a crafted file)."""
    header, doc, blob = decode_plan(data)
    doc = copy.deepcopy(doc)
    edit(doc)
    return encode_plan(doc, bytes(blob), header["target"], header["gpu_arch"])


def layer(doc: dict, name: str) -> dict:
    return next(entry for entry in doc["layers"] if entry["name"] == name)


def loaded(data: bytes, where: str = "plan") -> Engine:
    """The plan as the runtime loads it: the plan's own check, then the tactic check (the kernel
    files and tactics of this polykit), both before the target sees it."""
    return Engine(Plan.deserialize(data, where=where), where=where)


def test_an_untouched_plan_passes_and_runs(cpu_bytes):
    plan = Plan.deserialize(edited(cpu_bytes, lambda doc: None))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    with Engine(plan).create_execution_context() as ctx:
        assert ctx.execute({"x": x})["y"].shape == (2, 3)


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["memory"]["lifetimes"].pop("t"), r"memory\.lifetimes\['t'\]: is missing"),
    (lambda d: d["tensors"]["t"].update(offset=2**40), r"tensors\['t'\]\.offset: .*outside the arena"),
    (lambda d: d["tensors"]["t"].update(shape=[4, 3]), r"tensors\['t'\]\.nbytes: 24 != 48"),
    (lambda d: d["tensors"]["t"].update(shape=[-2, 3]), r"tensors\['t'\]\.shape\[0\]: -2 is out of range"),
    (lambda d: d["tensors"]["t"].update(dtype="object"), r"tensors\['t'\]\.dtype: 'object' is not an element type"),
    (lambda d: d["tensors"]["t"].update(offset="0"), r"tensors\['t'\]\.offset: must be an integer, not a string"),
    (lambda d: d["tensors"]["x"].pop("kind"), r"tensors\['x'\]\.kind: is missing"),
    (lambda d: d["weights"]["w"].update(offset=1 << 20), r"weights\['w'\]\.offset: .*outside the weight blob"),
    (lambda d: layer(d, "softmax")["attrs"].update(axis=-2**40), r"layers\['softmax'\]: fails its op's shape rule: "
                                                                    r"axis -1099511627776 is out of range"),
    (lambda d: layer(d, "abs").update(inputs=["nosuch"]), r"layers\['abs'\]\.inputs\[0\]: 'nosuch' is not a tensor"),
    (lambda d: layer(d, "mul").update(inputs=["x", "s"]), r"layers\['mul'\]\.inputs\[1\]: 's' is read before"),
    (lambda d: layer(d, "abs").update(kind="NoSuchOp"), r"layers\['abs'\]\.kind: 'NoSuchOp' .* op this polykit does not"),
    (lambda d: layer(d, "abs").update(tactic="cpu.fast"), r"layers\['abs'\]\.tactic: 'cpu.fast' is not a cpu tactic"),
    (lambda d: layer(d, "abs").update(precision="fp4"), r"layers\['abs'\]\.precision: 'fp4' is not one of"),
    (lambda d: layer(d, "abs").update(out_dtypes=["float16"]), r"layers\['abs'\]\.out_dtypes\[0\]: 'float16' differs"),
    (lambda d: d["memory"]["lifetimes"].update(t=[0, 0]), r"memory\.lifetimes\['t'\]: \[0, 0\] does not cover"),
    (lambda d: d["memory"]["lifetimes"].update(t=[3, 1]), r"memory\.lifetimes\['t'\]: \[3, 1\] is not an interval"),
    (lambda d: d["outputs"].append("t"), r"tensors\['t'\]\.kind: 'activation' for an engine output"),
    (lambda d: d["inputs"].append("x"), r"inputs\[1\]: 'x' is listed twice"),
    (lambda d: d.pop("layers"), r"field layers: is missing"),
    (lambda d: d.update(target="tpu"), r"field target: 'tpu' is not one of"),
])
def test_a_crafted_field_is_a_plan_error_naming_it(cpu_bytes, edit, field):
    with pytest.raises(PlanError, match=field):
        loaded(edited(cpu_bytes, edit), where="m.plan")


def test_the_error_names_the_file_and_says_to_rebuild(cpu_bytes):
    with pytest.raises(PlanError) as info:
        Plan.deserialize(edited(cpu_bytes, lambda d: d["tensors"]["t"].update(offset=2**40)), where="m.plan")
    assert str(info.value).startswith("m.plan: invalid plan field tensors['t'].offset")
    assert "rebuild" in info.value.hint


def test_two_live_tensors_sharing_bytes_are_rejected(cpu_bytes):
    def alias(doc):
        doc["tensors"]["s"]["offset"] = doc["tensors"]["t"]["offset"]
        doc["memory"]["offsets"]["s"] = doc["tensors"]["t"]["offset"]

    with pytest.raises(PlanError, match=r"tensors\['[st]'\]\.offset: its bytes overlap '[st]''s while both are live"):
        Plan.deserialize(edited(cpu_bytes, alias))


def test_unknown_optional_fields_are_ignored(cpu_bytes):
    def add(doc):
        layer(doc, "abs")["workspace_bytes"] = 0
        doc["tensors"]["t"]["format"] = "nchw"

    assert len(Plan.deserialize(edited(cpu_bytes, add)).layers) == 3


def test_array_attribute_with_a_wrong_byte_count_is_named(cpu_bytes):
    bad = {"__ndarray__": {"dtype": "float32", "shape": [4], "data": "AAAA"}}
    with pytest.raises(PlanError, match=r"layers\['abs'\]\.attrs\['v'\]\.__ndarray__\.data: holds 3 bytes, .* need 16"):
        Plan.deserialize(edited(cpu_bytes, lambda d: layer(d, "abs")["attrs"].update(v=bad)))


def test_inspect_of_a_crafted_plan_is_a_plan_error(cpu_bytes, tmp_path, capsys):
    from polykit.tools.cli.app import main

    path = tmp_path / "m.plan"
    path.write_bytes(edited(cpu_bytes, lambda d: d["memory"]["lifetimes"].pop("t")))
    assert main(["inspect", "model", str(path), "--json"]) == 2
    assert "memory.lifetimes['t']" in capsys.readouterr().err


# ---- cuda plans (checked without a GPU: the check needs no device) ---------------------------
def test_a_cuda_plan_passes_the_check(cuda_bytes):
    plan = Plan.deserialize(cuda_bytes)
    check_tactics(plan)
    assert plan.target == "cuda"


def _first_row(doc: dict) -> dict:
    return next(row for rows in doc["metadata"]["kernels"]["layers"].values() for row in rows)


@pytest.mark.parametrize("field, value", [
    ("file", "../../../etc/hostname"), ("file", "softmax.cu"), ("code", '#include "/etc/passwd"\n'),
    ("code_ref", "0" * 24), ("defines", [["X", "1\nint evil;"]]), ("defines", [["ELEM", "float"]])])
def test_a_kernel_row_that_carries_source_is_rejected(cuda_bytes, field, value):
    """A plan names its kernels (entry point, source key); any field that would hand source text,
    a file or a define to NVRTC is refused, a well-formed one too."""
    with pytest.raises(PlanError, match=rf"metadata\.kernels\.layers\['\w+'\]\[0\]\.{field}: a plan carries no "
                                        "kernel source"):
        Plan.deserialize(edited(cuda_bytes, lambda d: _first_row(d).update({field: value})))


def test_a_code_table_is_rejected(cuda_bytes):
    with pytest.raises(PlanError, match=r"metadata\.kernels\.code: a plan carries no kernel source"):
        Plan.deserialize(edited(cuda_bytes, lambda d: d["metadata"]["kernels"].update(code={"a" * 24: "int x;"})))


def test_a_kernel_row_of_format_2_without_its_source_key_is_rejected(cuda_bytes):
    with pytest.raises(PlanError, match=r"metadata\.kernels\.layers\['\w+'\]\[0\]\.key: is missing"):
        Plan.deserialize(edited(cuda_bytes, lambda d: _first_row(d).pop("key")))


def test_a_layer_without_kernels_in_a_cuda_plan_is_rejected(cuda_bytes):
    with pytest.raises(PlanError, match=r"metadata\.kernels\.layers\['abs'\]: is missing"):
        Plan.deserialize(edited(cuda_bytes, lambda d: d["metadata"]["kernels"]["layers"].pop("abs")))


def test_a_cuda_tactic_of_another_layer_kind_is_rejected(cuda_bytes):
    with pytest.raises(PlanError, match=r"layers\['abs'\]\.tactic: 'cuda.softmax' is not a cuda tactic for Abs"):
        loaded(edited(cuda_bytes, lambda d: layer(d, "abs").update(tactic="cuda.softmax")))


@pytest.mark.parametrize("name", ["../../../etc/hostname", "sub/gemm.cu", None])
def test_kernel_source_render_refuses_a_file_outside_the_kernel_folder(name):
    with pytest.raises(PlanError, match="not a .cu file of polykit's kernel folder"):
        KernelSource("k", file=name).render()


def test_a_view_must_share_its_source_offset(tmp_path):
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from tests.compiler.test_memory import _view_model

    data = build_plan(_view_model(), BuilderConfig(target="cpu", fuse=False)).serialize()
    assert Plan.deserialize(data).memory.aliases == {"v": "r"}

    def shift(d):  # onto the engine input's slot: inside the arena, but not the source's bytes
        d["tensors"]["v"]["offset"] = d["memory"]["offsets"]["v"] = d["tensors"]["x"]["offset"]

    with pytest.raises(PlanError, match=r"memory\.aliases\['v'\]"):
        Plan.deserialize(edited(data, shift))
