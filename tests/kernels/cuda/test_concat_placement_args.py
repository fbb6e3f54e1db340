"""Concat by placement on the cuda target, host side (no GPU): the channels-last implicit-GEMM
convolutions take Y's row stride as a runtime argument (conv_nhwc.cu's LDY) and compile with
NVRTC, the Concat copies only what was not placed, cuda fp16 plans place the convolution branches
and the runtime's tactic check refuses a placement whose producer cannot write it; on a GPU
(`gpu`), cuda fp16 plans with placements against the cpu plan."""

from __future__ import annotations

import os

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.records import LayerDesc
from polykit.errors import PlanError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.conv import conv_nhwc
from polykit.kernels.cuda.movement.movement import enqueue_concat
from polykit.kernels.tactics import find_tactic
from polykit.runtime.tactic_check import check_tactics
from tests.compiler.test_concat_placement import branches, _image, _run
from tests.compiler.test_plan_check import edited, layer
from tests.kernels.cuda.recording_launcher import RecordingLauncher

IGEMM = ("cuda.conv_nhwc.igemm_mma", "cuda.conv_nhwc.igemm_simt", "cuda.conv_nhwc.igemm_simt_wide")
F16 = np.dtype(np.float16)


def _conv_layer(x, w, y, **attrs):
    return LayerDesc("conv", "ConvNHWC", ("X", "W", "B"), ("Y",), dict(attrs), domain=POLYKIT_DOMAIN,
                     precision="fp16", in_dtypes=("float16",) * 3, out_dtypes=("float16",),
                     in_shapes=(x, w, (w[0],)), out_shapes=(y,))


def _tensors(x, w, y, row_stride=0):
    return {"X": DeviceTensor(0x10000, x, F16), "W": DeviceTensor(0x20000, w, F16),
            "B": DeviceTensor(0x30000, (w[0],), F16), "Y": DeviceTensor(0x40000, y, F16, row_stride)}


@pytest.mark.parametrize("tactic", IGEMM)
@pytest.mark.parametrize("stride", [0, 58, 90])
def test_igemm_nhwc_passes_the_row_stride_after_the_split_arguments(tactic, stride):
    x, w, y = (2, 6, 7, 8), (5, 3, 3, 8), (2, 6, 7, 5)
    layer = _conv_layer(x, w, y, pads=[1, 1, 1, 1])
    launcher = RecordingLauncher()
    find_tactic("cuda", "ConvNHWC", tactic).enqueue(layer, launcher, _tensors(x, w, y, stride))
    (name, args), = launcher.launches
    assert args[-3:-1] == [1, 0]  # splits, partial: no split at this size
    assert args[-1] == (stride or 5)  # LDY: the Concat's channels, or the conv's own M when dense


def test_a_split_k_launch_and_its_reduction_both_take_the_row_stride():
    x, w, y = (1, 5, 5, 96), (40, 3, 3, 96), (1, 5, 5, 40)
    layer = _conv_layer(x, w, y, pads=[1, 1, 1, 1])
    launcher = RecordingLauncher()
    find_tactic("cuda", "ConvNHWC", "cuda.conv_nhwc.igemm_simt").enqueue(layer, launcher, _tensors(x, w, y, 104))
    assert [name for name, _ in launcher.launches] == ["conv_nhwc_igemm_simt", "conv_nhwc_splitk_reduce"]
    assert all(args[-3] > 1 and args[-1] == 104 for _, args in launcher.launches)


def test_igemm_nhwc_places_whole_pixel_rows_only():
    layer = _conv_layer((2, 6, 7, 8), (5, 1, 1, 8), (2, 6, 7, 5))
    tactic = find_tactic("cuda", "ConvNHWC", "cuda.conv_nhwc.igemm_mma")
    assert tactic.places(layer, 5, 29, 24) and tactic.places(layer, 5, 5, 0)
    assert not tactic.places(layer, 5 * 7, 29 * 7, 0)  # rows of a Concat on another axis
    assert not tactic.places(layer, 5, 4, 0)
    sm90 = find_tactic("cuda", "ConvNHWC", "cuda.conv_nhwc.sm90_128x128")
    assert sm90 is not None and not sm90.places(layer, 5, 29, 24)  # its 16-byte stores take no row stride yet


def _concat_tensors(placed: set[int]):
    y = DeviceTensor(0x100000, (2, 4, 4, 9), F16)
    xs, start = {}, 0
    for i, c in enumerate((2, 3, 4)):
        if i in placed:
            xs[f"x{i}"] = DeviceTensor(y.ptr + start * 2, (2, 4, 4, c), F16, 9)
        else:
            xs[f"x{i}"] = DeviceTensor(0x200000 + 0x1000 * i, (2, 4, 4, c), F16)
        start += c
    return {**xs, "y": y}


@pytest.mark.parametrize("placed, copies", [(set(), 3), ({1}, 2), ({0, 2}, 1), ({0, 1, 2}, 0)])
def test_the_cuda_concat_copies_only_the_inputs_not_placed(placed, copies):
    layer = LayerDesc("cat", "Concat", ("x0", "x1", "x2"), ("y",), {"axis": 3})
    launcher = RecordingLauncher()
    enqueue_concat(layer, launcher, _concat_tensors(placed))
    assert len(launcher.launches) == copies


def test_a_cuda_fp16_plan_places_every_conv_branch_of_odd_channels():
    model, _ = branches((3, 5, 24, 58))
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    (cat,) = [lay for lay in plan.layers if lay.kind == "Concat"]
    assert sorted(plan.memory.placements) == sorted(cat.inputs)
    assert {p.stride for p in plan.memory.placements.values()} == {90}
    back = Plan.deserialize(plan.serialize())
    check_tactics(back)
    assert back.memory.placements == plan.memory.placements


def test_the_runtime_check_refuses_a_placed_tensor_whose_tactic_cannot_write_rows():
    model, _ = branches((8, 16))
    data = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0)).serialize()
    plan = Plan.deserialize(data)
    name = sorted(plan.memory.placements)[0]
    producer = next(lay.name for lay in plan.layers if name in lay.outputs)

    def to_sm90(doc):
        entry = layer(doc, producer)
        entry["tactic"] = "cuda.conv_nhwc.sm90_128x128"

    with pytest.raises(PlanError, match=r"memory\.placements.*writes rows"):
        check_tactics(Plan.deserialize(edited(data, to_sm90)))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_row_stride_kernels_compile(arch, tmp_path, monkeypatch):
    from polykit.runtime.cuda.nvrtc import compile_many, unique_units

    monkeypatch.setenv("POLYKIT_CACHE_DIR", str(tmp_path))
    units = unique_units(conv_nhwc.compile_variants())
    cubins = compile_many(units, arch, workers=min(2, os.cpu_count() or 1))
    assert len(cubins) == len(units) and all(blob[:4] == b"\x7fELF" for blob in cubins.values())


@pytest.mark.gpu
@pytest.mark.parametrize("channels", [(3, 5, 24, 58), (8, 16, 24, 64)])
@pytest.mark.parametrize("level", [0, 3])
def test_cuda_fp16_plan_with_placements_matches_the_cpu(channels, level):
    model, _ = branches(channels)
    image = _image()
    want = _run(build_plan(model, BuilderConfig(target="cpu")), {"image": image})
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level))
    got = _run(plan, {"image": image})
    for key, w in want.items():
        assert np.linalg.norm(got[key] - w) / np.linalg.norm(w) < 1e-2, key
