"""Concat by placement (polykit.compiler.builder.concat_placement): the producers of a Concat's
inputs write into their rows of its output and the Concat copies only what was not placed.
cpu plans (where the whole mechanism runs) against onnxruntime, the plans' placements and arena,
and the plan check's refusal of placements a build never makes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder import builder as builder_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.memory import concat_rows
from polykit.compiler.plan.profiles import Profile
from polykit.errors import PlanError
from polykit.runtime.engine import Runtime
from tests.compiler.test_plan_check import edited
from tests.conv_models import ModelBuilder

IMAGE = (2, 3, 6, 7)


def _model(b: ModelBuilder, outputs: list[str], inputs: tuple[str, ...] = ("image",),
           image: tuple = IMAGE) -> onnx.ModelProto:
    g = helper.make_graph(b.nodes, "catplace", [helper.make_tensor_value_info(n, TensorProto.FLOAT, image)
                                                for n in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], b.inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model



def branches(channels: tuple[int, ...], out: int = 4, image: tuple = IMAGE) -> tuple[onnx.ModelProto, list[str]]:
    """One convolution branch per channel count (1x1 and 3x3 in turn) -> Concat -> 1x1 conv."""
    b = ModelBuilder(len(channels))
    feats = [b.conv("image", 3, c, 1 + 2 * (i % 2)) for i, c in enumerate(channels)]
    y = b.conv(b.node("Concat", feats, axis=1), sum(channels), out)
    return _model(b, [y], image=image), feats


def _run(plan: Plan, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ctx = Runtime().deserialize_engine(plan.serialize()).create_execution_context()  # through the plan file
    return ctx.execute(feeds)


def _expect(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _image(seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(IMAGE).astype(np.float32)


def _concat(plan: Plan):
    (cat,) = [layer for layer in plan.layers if layer.kind == "Concat"]
    return cat


def _check_outputs(plan: Plan, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    got = _run(plan, feeds)
    for name, want in zip((o.name for o in model.graph.output), _expect(model, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("channels", [(3, 5), (3, 5, 24), (3, 5, 24, 58)])
def test_every_conv_branch_writes_into_the_concat_and_the_plan_matches_onnxruntime(channels, channels_last):
    model, _ = branches(channels)
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=channels_last))
    cat = _concat(plan)
    shape = plan.tensors[cat.outputs[0]].shape
    axis = cat.attrs.get("axis", 0) % len(shape)
    assert axis == (3 if channels_last else 1)
    assert sorted(plan.memory.placements) == sorted(cat.inputs)
    start = 0
    for name, c in zip(cat.inputs, channels):  # each input at its slice's rows, in the root's slot
        p = plan.memory.placements[name]
        assert (p.root, p.offset, p.row, p.stride) == (cat.outputs[0], *concat_rows(shape, axis, start, c))
        assert plan.tensors[name].offset == plan.tensors[p.root].offset + p.offset * 4
        start += c
    _check_outputs(plan, model, {"image": _image()})


def test_placement_shrinks_the_arena_by_the_inputs_slots(monkeypatch):
    model, _ = branches((3, 5, 24))
    placed = build_plan(model, BuilderConfig(target="cpu"))
    monkeypatch.setattr(builder_module, "place_concat_inputs", lambda *args, **kwargs: {})
    copied = build_plan(model, BuilderConfig(target="cpu"))
    assert not copied.memory.placements and len(placed.memory.placements) == 3
    # copying, the Concat's output and all three inputs are live at once; placed, only the output
    out = 2 * 32 * 6 * 7 * 4
    assert placed.memory.arena_bytes < copied.memory.arena_bytes
    assert placed.memory.peak_bytes <= copied.memory.peak_bytes - out // 2
    image = _image()
    np.testing.assert_array_equal(*(list(_run(p, {"image": image}).values())[0] for p in (placed, copied)))


def test_the_cpu_concat_copies_only_the_inputs_not_placed(monkeypatch):
    """An input read twice stays in its own slot; the Concat copies it into its rows and leaves
    the placed ones as their producers wrote them."""
    b = ModelBuilder(7)
    a, d = b.conv("image", 3, 5), b.conv("image", 3, 24, 3)
    cat = b.node("Concat", [a, d], axis=1)
    y = b.conv(cat, 29, 4)
    side = b.node("Flatten", [a])  # a second reader of `a`, a view: `a` stays in its own slot
    model = _model(b, [y, side])
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert list(plan.memory.placements) == [d]
    from polykit.kernels.cpu.base import CpuTactic

    ran = []
    real = CpuTactic.run
    monkeypatch.setattr(CpuTactic, "run", lambda self, node, *rest: ran.append(node.op_type) or real(self, node, *rest))
    _check_outputs(plan, model, {"image": _image()})
    assert "Concat" not in ran and ran.count("Conv") == 3


def test_a_concat_input_that_is_an_engine_input_is_copied_and_the_rest_placed():
    b = ModelBuilder(8)
    a = b.conv("image", 3, 5)
    y = b.conv(b.node("Concat", [a, "extra"], axis=1), 8, 4)
    model = _model(b, [y], ("image", "extra"))
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert list(plan.memory.placements) == [a]
    _check_outputs(plan, model, {"image": _image(), "extra": _image(6)})


def test_a_concat_whose_output_is_an_engine_output_places_nothing():
    b = ModelBuilder(9)
    feats = [b.conv("image", 3, c) for c in (3, 5)]
    model = _model(b, [b.node("Concat", feats, axis=1)])
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert plan.memory.placements == {}
    _check_outputs(plan, model, {"image": _image()})


def test_a_branch_output_kept_as_an_engine_output_is_not_placed():
    model, feats = branches((3, 5, 24))
    model.graph.output.append(helper.make_tensor_value_info(feats[1], TensorProto.FLOAT, None))
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert sorted(plan.memory.placements) == sorted({feats[0], feats[2]})
    _check_outputs(plan, model, {"image": _image()})


def test_maxpool_and_conv_producers_on_the_last_axis():
    """An NHWC-style Concat on the last axis of MaxPool and Conv outputs, read by a convolution."""
    b = ModelBuilder(10)
    pool = b.node("MaxPool", ["image"], kernel_shape=[3, 3], pads=[1] * 4, strides=[1, 1])
    conv = b.conv("image", 3, 5, 3)
    cat = b.node("Concat", [b.node("Transpose", [pool], perm=[0, 2, 3, 1]),
                            b.node("Transpose", [conv], perm=[0, 2, 3, 1])], axis=-1)
    y = b.conv(b.node("Transpose", [cat], perm=[0, 3, 1, 2]), 8, 4)
    model = _model(b, [y])
    plan = build_plan(model, BuilderConfig(target="cpu", fuse=False))
    cat_layer = _concat(plan)
    assert sorted(plan.memory.placements) == sorted(cat_layer.inputs)
    assert {plan.memory.placements[n].stride for n in cat_layer.inputs} == {8}
    _check_outputs(plan, model, {"image": _image()})


def test_an_empty_concat_input_is_skipped_and_the_rest_placed():
    b = ModelBuilder(13)
    feats = [b.conv("image", 3, c) for c in (3, 5)]
    for name, value in (("s", 0), ("e", 0), ("a", 1)):
        b.inits.append(numpy_helper.from_array(np.array([value], np.int64), name))
    empty = b.node("Slice", ["image", "s", "e", "a"])  # [2, 0, 6, 7]
    y = b.conv(b.node("Concat", [feats[0], empty, feats[1]], axis=1), 8, 4)
    model = _model(b, [y])
    plan = build_plan(model, BuilderConfig(target="cpu", fuse=False))
    assert sorted(plan.memory.placements) == sorted(feats)
    _check_outputs(plan, model, {"image": _image()})


def up_block(channels: int = 8, skip_channels: int = 5) -> onnx.ModelProto:
    """UNet's up step: a 2x2/2 ConvTranspose (channels last: a 1x1 conv and the pixel shuffle,
    Reshape -> Transpose -> Reshape) beside a skip connection that a MaxPool reads too -> Concat -> conv."""
    b = ModelBuilder(14)
    skip = b.conv("image", 3, skip_channels, 3)
    down = b.conv(b.node("MaxPool", [skip], kernel_shape=[2, 2], strides=[2, 2]), skip_channels, channels, 3)
    w = b.rng.standard_normal((channels, skip_channels, 2, 2)) * 0.3
    up = b.node("ConvTranspose", [down, b.init(w, "wt")], kernel_shape=[2, 2], strides=[2, 2])
    return _model(b, [b.conv(b.node("Concat", [skip, up], axis=1), 2 * skip_channels, 4)], image=(2, 3, 6, 8))


def keep_pixel_shuffles(monkeypatch) -> None:
    """Build without fold_depth_to_space, so UNet's pixel shuffle stays a Reshape -> Transpose ->
    Reshape chain (the view placement's case: a shuffle after a producer that cannot store it)."""
    import polykit.compiler.passes as passes

    monkeypatch.setattr(passes, "fold_depth_to_space", lambda graph, keep=(): False)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_an_up_convolution_stores_its_pixel_shuffle_into_the_concat(target):
    """With fold_depth_to_space the up conv writes the shuffled pixels straight into its slice."""
    model = up_block()
    plan = build_plan(model, BuilderConfig(target=target, channels_last=True, fp16=target == "cuda",
                                           builder_optimization_level=0))
    (cat,) = [layer for layer in plan.layers if layer.kind == "Concat"]
    producers = {out: layer for layer in plan.layers for out in layer.outputs}
    up = producers[cat.inputs[1]]
    assert up.kind == "ConvNHWC" and up.attrs["depth_to_space"] == [2, 2]
    assert sorted(plan.memory.placements) == sorted(cat.inputs) and not plan.memory.aliases
    assert not [layer for layer in plan.layers if layer.kind == "Reshape"
                or (layer.kind == "Transpose" and len(layer.attrs["perm"]) != 4)]  # the exit's (to NCHW) stays
    if target == "cpu":
        image = np.random.default_rng(5).standard_normal((2, 3, 6, 8)).astype(np.float32)
        _check_outputs(plan, model, {"image": image})


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_pixel_shuffle_view_is_placed_through_its_transpose(target, monkeypatch):
    keep_pixel_shuffles(monkeypatch)
    model = up_block()
    plan = build_plan(model, BuilderConfig(target=target, channels_last=True, fp16=target == "cuda",
                                           builder_optimization_level=0))
    producers = {out: layer for layer in plan.layers for out in layer.outputs}
    (view,) = [n for n in plan.memory.placements if n in plan.memory.aliases]
    source = plan.memory.aliases[view]
    (cat,) = [layer for layer in plan.layers if layer.kind == "Concat"]
    skip = cat.inputs[0]  # read by the MaxPool too, which reads it at its rows
    assert sorted(plan.memory.placements) == sorted([view, source, skip])
    assert producers[skip].kind.startswith("Conv")
    assert producers[view].kind == "Reshape" and producers[source].kind == "Transpose"
    assert plan.memory.placements[view] == plan.memory.placements[source]
    assert plan.tensors[view].offset == plan.tensors[source].offset
    back = Plan.deserialize(plan.serialize())
    from polykit.runtime.tactic_check import check_tactics

    check_tactics(back)
    if target == "cpu":
        image = np.random.default_rng(5).standard_normal((2, 3, 6, 8)).astype(np.float32)
        _check_outputs(plan, model, {"image": image})


@pytest.mark.parametrize("tactic", ["cuda.conv_nhwc.halo_mma_persist_p32", "cuda.conv_nhwc.halo_mma_pipe_p32"])
def test_a_skip_conv_on_a_halo_tactic_writes_into_the_concat(tactic):
    """UNet's skip connection (issue 29): the encoder conv that the Concat and the MaxPool read, forced
    onto a halo-tile tactic (8 -> 8 channels), writes into its rows of the Concat's output, and the
    plan passes the runtime's tactic check."""
    from dataclasses import replace

    from polykit.runtime.tactic_check import check_tactics

    config = BuilderConfig(target="cuda", channels_last=True, fp16=True, builder_optimization_level=0)
    model = up_block(16, 8)
    first = build_plan(model, config)
    skip = _concat(first).inputs[0]
    (producer,) = [layer for layer in first.layers if skip in layer.outputs]
    plan = build_plan(model, replace(config, tactic_replay={producer.name: tactic}))
    cat = _concat(plan)
    chosen = {layer.name: layer.tactic for layer in plan.layers}
    assert chosen[producer.name] == tactic and cat.inputs[0] == skip
    assert plan.tensors[skip].shape[-1] == 8 and plan.tensors[cat.outputs[0]].shape[-1] == 16
    assert sorted(plan.memory.placements) == sorted(cat.inputs)
    p = plan.memory.placements[skip]
    assert (p.root, p.offset, p.row, p.stride) == (cat.outputs[0], *concat_rows(plan.tensors[p.root].shape, 3, 0, 8))
    check_tactics(Plan.deserialize(plan.serialize()))


@pytest.mark.parametrize("drop", ["source", "view"])
def test_the_plan_check_refuses_half_a_placed_view(drop, monkeypatch):
    """A view placed without its source or a source without its view: the one left unplaced sits
    at the other's unaligned offset, a slot of its own no plan has."""
    keep_pixel_shuffles(monkeypatch)
    why = "is not a multiple of 256"
    plan = build_plan(up_block(), BuilderConfig(target="cpu", channels_last=True))
    (view,) = [n for n in plan.memory.placements if n in plan.memory.aliases]
    name = plan.memory.aliases[view] if drop == "source" else view

    def unplace(doc):
        del doc["memory"]["placements"][name]

    with pytest.raises(PlanError, match=why):
        Plan.deserialize(edited(plan.serialize(), unplace))


def test_memory_strategy_none_places_nothing():
    model, _ = branches((3, 5))
    plan = build_plan(model, BuilderConfig(target="cpu", memory_strategy="none"))
    assert plan.memory.placements == {}
    _check_outputs(plan, model, {"image": _image()})


def test_a_version_compatible_plan_places_nothing():
    """(An older polykit, which would ignore memory.placements, may load such a plan.)"""
    model, _ = branches((3, 5))
    plan = build_plan(model, BuilderConfig(target="cpu", version_compatible=True))
    assert plan.memory.placements == {}
    _check_outputs(plan, model, {"image": _image()})


def test_a_plan_without_placements_keeps_its_memory_record_unchanged():
    b = ModelBuilder(11)
    model = _model(b, [b.node("Relu", [b.conv("image", 3, 5)])])
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert "placements" not in plan.memory.to_json()
    assert Plan.deserialize(plan.serialize()).memory.placements == {}


# ---- the plan check ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def placed_bytes() -> bytes:
    return build_plan(branches((3, 5, 24))[0], BuilderConfig(target="cpu")).serialize()


def _first(doc: dict) -> tuple[str, dict]:
    name = sorted(doc["memory"]["placements"])[0]
    return name, doc["memory"]["placements"][name]


def _set(key: str, value):
    def edit(doc):
        _first(doc)[1][key] = value
    return edit


def _reader(doc: dict) -> None:
    name, p = _first(doc)
    last = next(lay for lay in doc["layers"] if lay["outputs"][0] == p["root"])  # its Concat reads it twice
    last["inputs"].append(name)
    for key, value in (("in_dtypes", doc["tensors"][name]["dtype"]), ("in_shapes", doc["tensors"][name]["shape"])):
        if last.get(key):
            last[key].append(value)


def _chain(doc: dict) -> None:
    name, p = _first(doc)
    doc["memory"]["placements"][p["root"]] = {"root": name, "offset": 0, "row": 1, "stride": 1}


def _tensor_offset(doc: dict) -> None:
    name, _ = _first(doc)
    doc["tensors"][name]["offset"] += 4
    doc["memory"]["offsets"][name] += 4


@pytest.mark.parametrize("edit, field, why", [
    (_set("root", "nowhere"), "memory.placements", "no activation"),
    (_set("offset", 1), "memory.placements", "is not its slice"),
    (_set("stride", 10**9), "memory.placements", "is not its slice"),
    (_set("row", 0), "memory.placements", "out of range"),
    (_reader, "memory.placements", "not read exactly once by its Concat"),
    (_chain, "memory.placements", "is placed itself"),
    (_tensor_offset, "offset", "root's offset plus"),
])
def test_the_plan_check_refuses_placements_a_build_never_makes(placed_bytes, edit, field, why):
    Plan.deserialize(placed_bytes)  # the build's own plan loads
    with pytest.raises(PlanError) as info:
        Plan.deserialize(edited(placed_bytes, edit))
    assert field in str(info.value) and why in str(info.value)


def test_a_plan_for_profiles_places_no_dynamic_tensor_and_refuses_one_placed():
    model, _ = branches((3, 5), image=("N", 3, 6, 7))
    profile = Profile({"image": ((1, 3, 6, 7), (2, 3, 6, 7), (4, 3, 6, 7))})
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[profile]))
    cat = _concat(plan)
    assert plan.memory.placements == {} and plan.tensors[cat.outputs[0]].dims

    def place(doc):
        name = doc["layers"][[layer["name"] for layer in doc["layers"]].index(cat.name)]["inputs"][0]
        doc["memory"]["placements"] = {name: {"root": cat.outputs[0], "offset": 0, "row": 1, "stride": 1}}

    with pytest.raises(PlanError, match=r"memory\.placements.*static shape"):
        Plan.deserialize(edited(plan.serialize(), place))
