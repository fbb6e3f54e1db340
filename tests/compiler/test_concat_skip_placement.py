"""Concat by placement of an input with other readers (UNet's skip connections: the encoder's
activation feeds the decoder's Concat and the next MaxPool): placed when every other reader's
tactic reads it at its rows (Tactic.reads_placed), so its producer writes it once into the Concat's
output and nobody copies it. cpu plans (the readers get strided views of the root's slot) against
onnxruntime; cuda fp16 plans at level 0 (no GPU): which inputs are placed and which readers read
strided; the plan check's and the runtime tactic check's refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.memory import concat_rows
from polykit.errors import PlanError
from tests.compiler.test_concat_placement import _check_outputs, _model, keep_pixel_shuffles
from tests.compiler.test_plan_check import edited
from tests.conv_models import ModelBuilder

IMAGE = (2, 3, 8, 12)


def mini_unet(channels: tuple[int, int] = (5, 24), image: tuple = IMAGE, up: str = "ConvTranspose",
              seed: int = 21) -> tuple[onnx.ModelProto, list[str]]:
    """conv -> relu [skip0] -> MaxPool -> conv -> relu [skip1] -> MaxPool -> conv -> up (2x2/2
    ConvTranspose or a nearest 2x Resize, then a 1x1 conv) -> Concat(skip1, up) -> conv -> up ->
    Concat(skip0, up) -> conv: each skip read by its MaxPool and its Concat. Returns the model and
    the two skips."""
    b = ModelBuilder(seed)
    c0, c1 = channels
    skip0 = b.node("Relu", [b.conv("image", image[1], c0, 3)])
    skip1 = b.node("Relu", [b.conv(b.node("MaxPool", [skip0], kernel_shape=[2, 2], strides=[2, 2]), c0, c1, 3)])
    deep = b.node("Relu", [b.conv(b.node("MaxPool", [skip1], kernel_shape=[2, 2], strides=[2, 2]), c1, c1, 3)])

    def upsample(x: str, cin: int, cout: int) -> str:
        if up == "ConvTranspose":
            w = b.rng.standard_normal((cin, cout, 2, 2)) * 0.3
            return b.node("ConvTranspose", [x, b.init(w, "wt")], kernel_shape=[2, 2], strides=[2, 2])
        scales = b.init(np.array([1, 1, 2, 2], np.float32), "scales")
        return b.conv(b.node("Resize", [x, "", scales], mode="nearest"), cin, cout)

    merged = b.node("Relu", [b.conv(b.node("Concat", [skip1, upsample(deep, c1, c1)], axis=1), 2 * c1, c1, 3)])
    y = b.conv(b.node("Concat", [skip0, upsample(merged, c1, c0)], axis=1), 2 * c0, 3, 3)
    return _model(b, [y], image=image), [skip0, skip1]


def _feeds(image: tuple = IMAGE, seed: int = 5) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(seed).standard_normal(image).astype(np.float32)}


def _readers(plan: Plan, name: str) -> list[str]:
    return [layer.kind for layer in plan.layers if name in layer.inputs]


def _skips(plan: Plan) -> list[str]:
    """The Concat inputs a MaxPool reads too, in graph order."""
    pools = {n for layer in plan.layers if "MaxPool" in layer.kind for n in layer.inputs}
    return [n for layer in plan.layers if layer.kind == "Concat" for n in layer.inputs if n in pools]


# ---- cpu: the whole mechanism, against onnxruntime -----------------------------------------------
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("up", ["ConvTranspose", "Resize"])
@pytest.mark.parametrize("channels", [(5, 24), (3, 5)])
def test_cpu_mini_unet_places_its_skips_and_the_pools_read_them_strided(channels, up, channels_last, monkeypatch):
    from polykit.kernels.cpu.base import CpuTactic

    model, _ = mini_unet(channels, up=up)
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=channels_last))
    skips = _skips(plan)
    assert len(skips) == 2 and set(skips) <= set(plan.memory.placements)
    for name in skips:
        p = plan.memory.placements[name]
        cat = next(layer for layer in plan.layers if layer.outputs[0] == p.root)
        shape = plan.tensors[p.root].shape
        axis = cat.attrs.get("axis", 0) % len(shape)
        assert (p.offset, p.row, p.stride) == concat_rows(shape, axis, 0, plan.tensors[name].shape[axis])
        assert sorted(_readers(plan, name)) == sorted(["Concat", "MaxPoolNHWC" if channels_last else "MaxPool"])
    pools = []
    real = CpuTactic.run

    def run(self, node, inputs, *rest):
        if "MaxPool" in node.op_type:  # the pool gets the skip as a view of the Concat's rows
            pools.append(not inputs[0].flags.c_contiguous)
        return real(self, node, inputs, *rest)

    monkeypatch.setattr(CpuTactic, "run", run)
    _check_outputs(plan, model, _feeds())
    assert pools == [True, True]


def test_a_reader_after_the_concat_keeps_the_root_slot_alive():
    """The skip's MaxPool runs after the Concat (graph order): the root's slot lives until then, so
    the pool reads the skip's rows, not whatever a later tensor wrote there."""
    b = ModelBuilder(22)
    skip = b.node("Relu", [b.conv("image", 3, 5, 3)])
    side = b.conv("image", 3, 24, 3)
    merged = b.conv(b.node("Concat", [skip, side], axis=1), 29, 24, 3)
    late = b.conv(b.node("Relu", [merged]), 24, 24, 3)  # tensors born after the Concat, before the pool
    pooled = b.node("MaxPool", [skip], kernel_shape=[2, 2], strides=[2, 2])
    y = b.node("Add", [b.node("MaxPool", [late], kernel_shape=[2, 2], strides=[2, 2]),
                       b.conv(pooled, 5, 24)])
    model = _model(b, [y], image=IMAGE)
    plan = build_plan(model, BuilderConfig(target="cpu", fuse=False))
    p = plan.memory.placements[skip]
    order = [layer.kind for layer in plan.layers]
    reader = max(i for i, layer in enumerate(plan.layers) if skip in layer.inputs)
    assert order.index("Concat") < reader  # the pool reads it after the Concat
    assert plan.memory.lifetimes[skip][1] == reader
    root, start = plan.tensors[p.root], plan.memory.lifetimes[p.root]
    for name, (first, last) in plan.memory.lifetimes.items():  # nothing else in the root's bytes meanwhile
        t = plan.tensors[name]
        if name in plan.memory.placements or name == p.root or t.kind == "weight" or not t.nbytes:
            continue
        if first <= reader and last >= min(start[0], plan.memory.lifetimes[skip][0]):
            assert t.offset + t.nbytes <= root.offset or t.offset >= root.offset + root.nbytes, name
    _check_outputs(plan, model, _feeds())


def test_a_skip_read_by_two_concats_is_not_placed():
    b = ModelBuilder(23)
    skip = b.node("Relu", [b.conv("image", 3, 5, 3)])
    a, d = b.conv("image", 3, 3), b.conv("image", 3, 24, 3)
    y1 = b.conv(b.node("Concat", [skip, a], axis=1), 8, 4)
    y2 = b.conv(b.node("Concat", [d, skip], axis=1), 29, 4)
    model = _model(b, [b.node("Add", [y1, y2])], image=IMAGE)
    plan = build_plan(model, BuilderConfig(target="cpu", fuse=False))
    assert skip not in plan.memory.placements
    assert {a, d} <= set(plan.memory.placements)
    _check_outputs(plan, model, _feeds())


def test_a_skip_read_by_a_view_is_not_placed():
    b = ModelBuilder(24)
    skip = b.node("Relu", [b.conv("image", 3, 5, 3)])
    flat = b.node("Flatten", [skip])
    y = b.conv(b.node("Concat", [skip, b.conv("image", 3, 24, 3)], axis=1), 29, 4)
    model = _model(b, [y, b.node("Relu", [flat])], image=IMAGE)
    plan = build_plan(model, BuilderConfig(target="cpu", fuse=False))
    assert skip not in plan.memory.placements and len(plan.memory.placements) == 1
    _check_outputs(plan, model, _feeds())


def skip_and_relu(relu_first: bool = True) -> tuple[onnx.ModelProto, str]:
    """A skip read by a Concat and by a pointwise Relu (whose output joins the result)."""
    b = ModelBuilder(25)
    skip = b.node("Relu", [b.conv("image", 3, 8, 3)])
    cat = b.node("Concat", [skip, b.conv("image", 3, 24, 3)], axis=1)
    neg = b.node("Neg", [skip])
    y = b.node("Add", [b.conv(cat, 32, 8, 3), b.node("Sigmoid", [neg])])
    return _model(b, [y], image=IMAGE), skip


def test_cpu_a_skip_read_by_a_pointwise_layer_is_placed():
    model, skip = skip_and_relu()
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert skip in plan.memory.placements
    _check_outputs(plan, model, _feeds())


def lateral(k: int = 3, channels: int = 24) -> tuple[onnx.ModelProto, str]:
    """An FPN-style skip: read by the Concat and by a kxk convolution whose output joins the result."""
    b = ModelBuilder(26)
    skip = b.node("Relu", [b.conv("image", 3, channels, 3)])
    side = b.conv(skip, channels, 16, k)
    cat = b.conv(b.node("Concat", [skip, b.conv("image", 3, 16, 3)], axis=1), channels + 16, 16, 3)
    return _model(b, [b.node("Add", [cat, side])], image=IMAGE), skip


def test_cpu_a_skip_read_by_a_convolution_is_placed():
    model, _ = lateral()
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    (cat,) = [layer for layer in plan.layers if layer.kind == "Concat"]
    assert set(cat.inputs) <= set(plan.memory.placements)
    assert [layer.kind for layer in plan.layers if cat.inputs[0] in layer.inputs] == ["Concat", "ConvNHWC"]
    _check_outputs(plan, model, _feeds())


# ---- cuda fp16 plans (no GPU) --------------------------------------------------------------------
@pytest.mark.parametrize("up", ["ConvTranspose", "Resize"])
@pytest.mark.parametrize("channels", [(5, 24), (3, 5), (16, 24)])
def test_cuda_mini_unet_places_its_skips_and_the_nhwc_pools_read_them(channels, up):
    from polykit.runtime.tactic_check import check_tactics

    model, _ = mini_unet(channels, up=up)
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    skips = _skips(plan)
    assert len(skips) == 2 and set(skips) <= set(plan.memory.placements)
    assert sorted(plan.tensors[name].shape[-1] for name in skips) == sorted(channels)
    for name in skips:
        c = plan.tensors[name].shape[-1]
        p = plan.memory.placements[name]
        assert (p.offset, p.row, p.stride) == (0, c, 2 * c)  # channels last: the skip's channels first
        pool = next(layer for layer in plan.layers if layer.kind == "MaxPoolNHWC" and name in layer.inputs)
        assert pool.tactic == "cuda.pool_nhwc.window"
    check_tactics(Plan.deserialize(plan.serialize()))


def test_cuda_a_skip_read_by_a_pointwise_layer_is_copied():
    """cuda.pointwise reads dense inputs (its views are shapes and broadcasts, not row strides):
    such a skip keeps its slot and the Concat copies it."""
    model, skip = skip_and_relu()
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    (cat,) = [layer for layer in plan.layers if layer.kind == "Concat"]
    first = cat.inputs[0]
    assert first not in plan.memory.placements and cat.inputs[1] in plan.memory.placements
    assert any(layer.kind != "Concat" and first in layer.inputs for layer in plan.layers)


@pytest.mark.parametrize("k, channels", [(3, 24), (3, 5), (1, 24)])
def test_cuda_a_skip_read_by_a_convolution_is_placed_where_its_tactic_reads_rows(k, channels):
    """The implicit-GEMM convolutions read X's pixels LDX apart (conv_nhwc.cu); the sm90, skinny,
    depthwise and grouped tiles and the channel Pad (5 channels padded to 8 for the conv) do not,
    and a skip one of them reads is copied."""
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.tactic_check import check_tactics

    model, _ = lateral(k, channels)
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    (cat,) = [layer for layer in plan.layers if layer.kind == "Concat"]
    skip, total = cat.inputs[0], plan.tensors[cat.outputs[0]].shape[-1]
    others = [(layer, layer.inputs.index(skip)) for layer in plan.layers
              if layer.kind != "Concat" and skip in layer.inputs]
    reads = all(find_tactic("cuda", layer.kind, layer.tactic).reads_placed(layer, i, channels, total, 0)
                for layer, i in others)
    assert len(others) == 1 and (skip in plan.memory.placements) == reads
    if (k, channels) == (3, 24):  # a 3x3 conv at level 0: the igemm_mma tile, which reads rows
        assert others[0][0].tactic == "cuda.conv_nhwc.igemm_mma" and reads
        p = plan.memory.placements[skip]
        assert (p.offset, p.row, p.stride) == (0, 24, 40)
    if channels == 5:
        assert others[0][0].kind == "Pad" and not reads
    check_tactics(Plan.deserialize(plan.serialize()))


def test_the_runtime_check_refuses_a_reader_whose_tactic_cannot_read_rows(monkeypatch):
    from polykit.kernels.cuda.base import CudaTactic
    from polykit.runtime.tactic_check import check_tactics

    data = build_plan(mini_unet()[0], BuilderConfig(target="cuda", fp16=True,
                                                    builder_optimization_level=0)).serialize()
    check_tactics(Plan.deserialize(data))
    monkeypatch.setattr(CudaTactic, "reads_placed", lambda self, *args: False)
    with pytest.raises(PlanError, match=r"memory\.placements.*'maxpool.*cannot read rows"):
        check_tactics(Plan.deserialize(data))


# ---- the plan check -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def unet_bytes() -> bytes:
    """(With the pixel shuffles kept: their tensors are the skip-sized activations _a_view aliases.)"""
    with pytest.MonkeyPatch.context() as mp:
        keep_pixel_shuffles(mp)
        return build_plan(mini_unet()[0], BuilderConfig(target="cpu", channels_last=True)).serialize()


def _skip(doc: dict) -> str:
    pools = {n for layer in doc["layers"] if layer["kind"] == "MaxPoolNHWC" for n in layer["inputs"]}
    return sorted(n for n in doc["memory"]["placements"] if n in pools)[0]


def _second_concat(doc: dict) -> None:
    """The skip's MaxPool turned into a Concat of it alone (a second Concat reader)."""
    pool = next(layer for layer in doc["layers"] if layer["kind"] == "MaxPoolNHWC" and _skip(doc) in layer["inputs"])
    pool.update(kind="Concat", domain="", attrs={"axis": 3})


def _a_view(doc: dict) -> None:
    """A view of the placed skip (sharing its offset, as a Reshape's output would)."""
    name = _skip(doc)
    other = next(n for n, t in doc["tensors"].items()
                 if t["kind"] == "activation" and n not in doc["memory"]["placements"] and n != name
                 and n not in doc["memory"].get("aliases", {}) and t["nbytes"] == doc["tensors"][name]["nbytes"]
                 and n not in {p["root"] for p in doc["memory"]["placements"].values()})
    doc["memory"].setdefault("aliases", {})[other] = name


@pytest.mark.parametrize("edit, why", [
    (_second_concat, "by no other Concat"),
    (_a_view, "has views"),
])
def test_the_plan_check_refuses_a_placed_skip_read_by_a_concat_or_a_view(unet_bytes, edit, why):
    Plan.deserialize(unet_bytes)
    with pytest.raises(PlanError, match=why):
        Plan.deserialize(edited(unet_bytes, edit))

