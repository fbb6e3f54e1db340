"""Concat by placement on the cuda target, host side (no GPU): the channels-last implicit-GEMM
convolutions take Y's row stride as a runtime argument (conv_nhwc.cu's LDY) and compile with
NVRTC, the Concat copies only what was not placed, cuda fp16 plans place the convolution branches
and the runtime's tactic check refuses a placement whose producer cannot write it; on a GPU
(`gpu`), cuda fp16 plans with placements against the cpu plan."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.records import LayerDesc
from polykit.errors import PlanError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.conv import conv_depthwise, conv_nhwc, conv_sm90, pool
from polykit.kernels.cuda.gemm import gemm_skinny
from polykit.kernels.cuda.movement import resize
from polykit.kernels.cuda.movement.movement import enqueue_concat
from polykit.kernels.tactics import find_tactic
from polykit.runtime.tactic_check import check_tactics
from tests.compiler.test_concat_placement import _image, _model, _run, branches
from tests.compiler.test_plan_check import edited, layer
from tests.conv_models import ModelBuilder
from tests.kernels.cuda.recording_launcher import RecordingLauncher

IGEMM = ("cuda.conv_nhwc.igemm_mma", "cuda.conv_nhwc.igemm_simt", "cuda.conv_nhwc.igemm_simt_wide")
SM90 = ("cuda.conv_nhwc.sm90_128x128", "cuda.conv_nhwc.sm90_64x128")
SKINNY = ("cuda.conv_nhwc.skinny_128x32", "cuda.conv_nhwc.skinny_64x64")
DEPTHWISE = ("cuda.conv_nhwc.depthwise_p8", "cuda.conv_nhwc.depthwise_p4")
F16 = np.dtype(np.float16)


def _conv_layer(x, w, y, **attrs):
    return LayerDesc("conv", "ConvNHWC", ("X", "W", "B"), ("Y",), dict(attrs), domain=POLYKIT_DOMAIN,
                     precision="fp16", in_dtypes=("float16",) * 3, out_dtypes=("float16",),
                     in_shapes=(x, w, (w[0],)), out_shapes=(y,))


def _tensors(x, w, y, row_stride=0):
    return {"X": DeviceTensor(0x10000, x, F16), "W": DeviceTensor(0x20000, w, F16),
            "B": DeviceTensor(0x30000, (w[0],), F16), "Y": DeviceTensor(0x40000, y, F16, row_stride)}


def _launched(tactic: str, x, w, y, stride: int, **attrs) -> tuple[str, list]:
    """(kernel name, args) of the one launch `tactic` makes for a ConvNHWC whose Y has `stride`."""
    launcher = RecordingLauncher()
    find_tactic("cuda", "ConvNHWC", tactic).enqueue(_conv_layer(x, w, y, **attrs), launcher, _tensors(x, w, y, stride))
    (launch,) = launcher.launches
    return launch


@pytest.mark.parametrize("tactic", IGEMM)
@pytest.mark.parametrize("stride", [0, 58, 90])
def test_igemm_nhwc_passes_the_row_stride_after_the_split_arguments(tactic, stride):
    _, args = _launched(tactic, (2, 6, 7, 8), (5, 3, 3, 8), (2, 6, 7, 5), stride, pads=[1, 1, 1, 1])
    assert args[-4:-2] == [1, 0]  # splits, partial: no split at this size
    assert args[-2] == (stride or 5)  # LDY: the Concat's channels, or the conv's own M when dense
    assert args[-1] == 8  # LDX: X dense


def test_a_split_k_launch_and_its_reduction_both_take_the_row_stride():
    x, w, y = (1, 5, 5, 96), (40, 3, 3, 96), (1, 5, 5, 40)
    layer = _conv_layer(x, w, y, pads=[1, 1, 1, 1])
    launcher = RecordingLauncher()
    find_tactic("cuda", "ConvNHWC", "cuda.conv_nhwc.igemm_simt").enqueue(layer, launcher, _tensors(x, w, y, 104))
    assert [name for name, _ in launcher.launches] == ["conv_nhwc_igemm_simt", "conv_nhwc_splitk_reduce"]
    assert all(args[-4] > 1 and args[-2:] == [104, 96] for _, args in launcher.launches)


@pytest.mark.parametrize("tactic", IGEMM + SM90 + SKINNY + DEPTHWISE)
def test_channels_last_convs_place_whole_pixel_rows_only(tactic):
    layer = _conv_layer((2, 6, 7, 8), (5, 1, 1, 8), (2, 6, 7, 5))
    tactic = find_tactic("cuda", "ConvNHWC", tactic)
    assert tactic.places(layer, 5, 29, 24) and tactic.places(layer, 5, 5, 0)
    assert not tactic.places(layer, 5 * 7, 29 * 7, 0)  # rows of a Concat on another axis
    assert not tactic.places(layer, 5, 4, 0)


@pytest.mark.parametrize("tactic", SM90)
@pytest.mark.parametrize("stride", [0, 24, 90])
def test_sm90_conv_passes_the_row_stride_after_the_dilations(tactic, stride):
    name, args = _launched(tactic, (2, 6, 7, 8), (16, 3, 3, 8), (2, 6, 7, 16), stride, pads=[1, 1, 1, 1])
    assert name == "conv_sm90" and len(args) == 21  # tm_w, X, B, Y, 15 geometry values, LDY, LDX
    assert [int(a) for a in args[13:19]] == [1, 1, 1, 1, 1, 1]  # strides, pads, dilations
    assert args[19:] == [stride or 16, 8]


@pytest.mark.parametrize("tactic", SKINNY)
@pytest.mark.parametrize("stride", [0, 24, 90])
def test_skinny_conv_passes_the_row_stride_after_beta(tactic, stride):
    name, args = _launched(tactic, (2, 6, 7, 8), (16, 1, 1, 8), (2, 6, 7, 16), stride)
    assert name == "gemm_skinny" and len(args) == 12  # A, W, C, Y, M, N, K, scm, scn, alpha, beta, LDY
    assert args[4:6] == [84, 16] and args[11] == (stride or 16)


def test_a_skinny_gemm_stores_dense_rows():
    from polykit.kernels.cuda.gemm.gemm_skinny import TILES, launch

    launcher = RecordingLauncher()
    a, w, y = (DeviceTensor(0x1000, (84, 8), F16), DeviceTensor(0x2000, (8, 16), F16),
               DeviceTensor(0x3000, (84, 16), F16))
    layer = LayerDesc("mm", "MatMul", ("A", "W"), ("Y",), {}, precision="fp16")
    launch(layer, TILES[0], launcher, {"A": a, "W": w, "Y": y}, a, w, None, y, 84, 16, 8, True, (0, 1), 1.0, 0.0)
    assert launcher.launches[0][1][11] == 16


@pytest.mark.parametrize("stride, vec_out", [(0, 1), (24, 1), (20, 0)])
def test_depthwise_passes_the_row_stride_after_vec_out(stride, vec_out):
    """(conv_depthwise emulated on the host with placed outputs: test_conv_depthwise_emulated.py)"""
    x, w, y = (2, 6, 7, 16), (16, 3, 3, 1), (2, 6, 7, 16)
    name, args = _launched(DEPTHWISE[0], x, w, y, stride, pads=[1, 1, 1, 1], group=16)
    assert name == "conv_depthwise_nhwc" and args[-2] == vec_out and args[-1] == (stride or 16)


MMA = ("cuda.conv_nhwc.grouped_mma_p32", "cuda.conv_nhwc.grouped_mma_pipe_p32", "cuda.conv_nhwc.grouped_mma_persist_p32")
HALO = ("cuda.conv_nhwc.halo_mma_persist_p32", "cuda.conv_nhwc.halo_mma_pipe_p32")


@pytest.mark.parametrize("tactic,group", [(t, 2) for t in MMA] + [(t, 1) for t in HALO])
@pytest.mark.parametrize("stride, vec_out", [(0, 1), (48, 1), (35, 0)])
def test_tensor_core_convs_pass_the_row_stride_after_vec_out(tactic, group, stride, vec_out):
    """The grouped mma and halo-tile tactics (conv_grouped_mma.cuh's gm_store, emulated with placed
    outputs in test_conv_grouped_mma_store_emulated.py): pair stores only where rows are an even
    number of elements apart."""
    x, w, y = (2, 6, 7, 32), (16, 3, 3, 32 // group), (2, 6, 7, 16)
    name, args = _launched(tactic, x, w, y, stride, pads=[1, 1, 1, 1], group=group)
    assert name.startswith("conv_grouped_mma") and len(args) == 28  # X, W, B, Y, 23 sizes, LDY
    assert args[-2] == vec_out and args[-1] == (stride or 16)
    layer = _conv_layer(x, w, y, group=group)
    assert find_tactic("cuda", "ConvNHWC", tactic).places(layer, 16, 48, 32)
    assert not find_tactic("cuda", "ConvNHWC", tactic).places(layer, 16 * 7, 48 * 7, 0)


def test_grouped_convs_do_not_place_yet():
    layer = _conv_layer((2, 6, 7, 16), (16, 3, 3, 4), (2, 6, 7, 16), group=4)
    assert not find_tactic("cuda", "ConvNHWC", "cuda.conv_nhwc.grouped_p2").places(layer, 16, 40, 0)


def test_int8_convs_on_conv_sm90_pass_a_dense_row_stride():
    from polykit.kernels.cuda.conv.conv_sm90 import plan_conv

    geo = plan_conv({"pads": [1, 1, 1, 1]}, (2, 6, 7, 8), (16, 3, 3, 8), (2, 6, 7, 16))
    assert geo.args()[-2:] == [16, 8]  # LDY, LDX dense: int8_sm90 / fp8_sm90 build their launches from these


def _pool_launch(stride: int, ptr_offset: int = 0, c: int = 16) -> tuple[str, list]:
    layer = LayerDesc("pool", "MaxPoolNHWC", ("X",), ("Y",), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
                      domain=POLYKIT_DOMAIN, precision="fp16", in_dtypes=("float16",), out_dtypes=("float16",),
                      in_shapes=((2, 6, 7, c),), out_shapes=((2, 6, 7, c),))
    tensors = {"X": DeviceTensor(0x10000, (2, 6, 7, c), F16),
               "Y": DeviceTensor(0x40000 + ptr_offset, (2, 6, 7, c), F16, stride)}
    launcher = RecordingLauncher()
    find_tactic("cuda", "MaxPoolNHWC", "cuda.pool_nhwc.window").enqueue(layer, launcher, tensors)
    (launch,) = launcher.launches
    return launch


@pytest.mark.parametrize("stride, ptr_offset, kernel", [
    (0, 0, "pool_window_nhwc_v8"), (40, 0, "pool_window_nhwc_v8"), (40, 16, "pool_window_nhwc_v8"),
    (44, 0, "pool_window_nhwc"),  # rows 88 bytes apart: no 16-byte stores
    (40, 6, "pool_window_nhwc"),  # the slice 3 channels into the row
])
def test_nhwc_pool_passes_the_row_stride_and_stores_16_bytes_only_where_aligned(stride, ptr_offset, kernel):
    name, args = _pool_launch(stride, ptr_offset)
    assert name == kernel and args[-2] == (stride or 16) and args[-1] == 16  # LDY, then X's dense LDX
    tactic = find_tactic("cuda", "MaxPoolNHWC", "cuda.pool_nhwc.window")
    layer = LayerDesc("pool", "MaxPoolNHWC", ("X",), ("Y",), {}, out_shapes=((2, 6, 7, 16),))
    assert tactic.places(layer, 16, 40, 3) and not tactic.places(layer, 16 * 7, 40 * 7, 0)


@pytest.mark.parametrize("stride", [0, 40])
def test_resize_passes_the_row_stride_last(stride):
    layer = LayerDesc("up", "Resize", ("X", "", "", "sizes"), ("Y",), {"mode": "nearest"},
                      out_shapes=((1, 6, 8, 16),))
    tensors = {"X": DeviceTensor(0x10000, (1, 3, 4, 16), F16), "sizes": DeviceTensor(0x20000, (4,), np.dtype(np.int64)),
               "Y": DeviceTensor(0x40000, (1, 6, 8, 16), F16, stride)}
    launcher = RecordingLauncher()
    tactic = find_tactic("cuda", "Resize", "cuda.resize")
    tactic.enqueue(layer, launcher, tensors)
    (_, args), = launcher.launches
    assert args[-1] == (stride or 16) and args[-2] == 0  # after `empty`
    assert tactic.places(layer, 16, 40, 24) and not tactic.places(layer, 8 * 16, 8 * 40, 0)


def test_a_placed_transpose_writes_its_last_dim_rows_apart():
    """UNet's pixel shuffle [1, 3, 4, 2, 2, 8] -> (0, 1, 3, 2, 4, 5) into 8 channels of 24: the
    copy's destination strides are the dense ones of [1, 3, 2, 4, 2, 24]."""
    layer = LayerDesc("shuffle", "Transpose", ("x",), ("y",), {"perm": [0, 1, 3, 2, 4, 5]},
                      out_shapes=((1, 3, 2, 4, 2, 8),))
    tactic = find_tactic("cuda", "Transpose", "cuda.movement.strided")
    assert tactic.places(layer, 8, 24, 8) and not tactic.places(layer, 16, 48, 0)
    assert not find_tactic("cuda", "Expand", "cuda.movement.strided").places(layer, 8, 24, 8)
    src = np.arange(3 * 4 * 2 * 2 * 8, dtype=np.float16).reshape(1, 3, 4, 2, 2, 8)
    launcher = RecordingLauncher()
    tactic.enqueue(layer, launcher, {"x": DeviceTensor(0x10000, src.shape, F16),
                                     "y": DeviceTensor(0x40000, (1, 3, 2, 4, 2, 8), F16, 24)})
    ((name, args),) = launcher.launches
    # the strided copy as movement.cu runs it: dst[dst_base + c . ds] = src[src_base + c . ss], in
    # units of the (widened) element size its name carries
    es = int(name.rsplit("_", 1)[1])
    n, rank = args[2], args[3]
    dims, ss, ds = args[4:4 + rank], args[12:12 + rank], args[20:20 + rank]
    raw, out = src.view(np.uint8).reshape(-1, es), np.full((3 * 2 * 4 * 2 * 24 * 2 // es, es), 0xFF, np.uint8)
    for c in np.ndindex(*dims):
        out[args[29] + int(np.dot(c, ds))] = raw[args[28] + int(np.dot(c, ss))]
    rows = out.reshape(-1).view(np.float16).reshape(-1, 24)
    assert int(np.prod(dims)) == n
    np.testing.assert_array_equal(rows[:, :8].reshape(1, 3, 2, 4, 2, 8), src.transpose(0, 1, 3, 2, 4, 5))
    assert (rows[:, 8:].view(np.uint16) == 0xFFFF).all()  # the other inputs' rows untouched


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
    """(A crafted plan: the producer's tactic swapped for the grouped one, which writes dense rows.)"""
    model, _ = branches((8, 16))
    data = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0)).serialize()
    plan = Plan.deserialize(data)
    name = sorted(plan.memory.placements)[0]
    producer = next(lay.name for lay in plan.layers if name in lay.outputs)

    def to_sm90(doc):
        entry = layer(doc, producer)
        entry["tactic"] = "cuda.conv_nhwc.grouped_p2"

    with pytest.raises(PlanError, match=r"memory\.placements.*writes rows"):
        check_tactics(Plan.deserialize(edited(data, to_sm90)))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_row_stride_kernels_compile(arch):
    """The half-storage unit of each family whose Y store takes the row stride (every variant of
    them compiles in test_nvrtc_compile.py's whole-table test, which CI runs)."""
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    families = [conv_nhwc, gemm_skinny, pool, resize, conv_depthwise] + ([conv_sm90] if arch == "sm_90" else [])
    units = unique_units([next(u for u in f.compile_variants() if ("ELEM", "half_t") in u.defines
                               or not any(k == "ELEM" for k, _ in u.defines)) for f in families])
    assert len(units) == len(families) and check_all(units, arch) == len(units)


def pool_and_convs(channels: tuple[int, ...] = (16, 24, 5)) -> onnx.ModelProto:
    """GoogLeNet's Inception form (a 3x3/1 MaxPool of the input beside conv branches) and DeepLab's
    pooled branch (a 2x2/2 AveragePool, a conv, a nearest 2x Resize) -> Concat -> conv."""
    b = ModelBuilder(12)
    x = b.conv("image", 3, 8, 3)
    feats = [b.node("MaxPool", [x], kernel_shape=[3, 3], pads=[1] * 4, strides=[1, 1])]
    feats += [b.conv(x, 8, c, 1 + 2 * (i % 2)) for i, c in enumerate(channels)]
    pooled = b.conv(b.node("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2]), 8, 8)
    scales = b.init(np.array([1, 1, 2, 2], np.float32), "scales")
    feats.append(b.node("Resize", [pooled, "", scales], mode="nearest"))
    return _model(b, [b.conv(b.node("Concat", feats, axis=1), 16 + sum(channels), 4)], image=(2, 3, 6, 8))


def test_a_cuda_fp16_plan_places_a_maxpool_and_a_resize_beside_the_convs():
    plan = build_plan(pool_and_convs(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    (cat,) = [lay for lay in plan.layers if lay.kind == "Concat"]
    producers = {out: lay.kind for lay in plan.layers for out in lay.outputs}
    assert sorted(plan.memory.placements) == sorted(cat.inputs)
    assert sorted(producers[n] for n in cat.inputs) == ["ConvNHWC"] * 3 + ["MaxPoolNHWC", "Resize"]


@pytest.mark.gpu
@pytest.mark.parametrize("level", [0, 3])
def test_cuda_fp16_plan_with_a_placed_maxpool_and_resize_matches_the_cpu(level):
    model = pool_and_convs()
    image = np.random.default_rng(5).standard_normal((2, 3, 6, 8)).astype(np.float32)
    want = _run(build_plan(model, BuilderConfig(target="cpu")), {"image": image})
    got = _run(build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level)),
               {"image": image})
    for key, w in want.items():
        assert np.linalg.norm(got[key] - w) / np.linalg.norm(w) < 1e-2, key


@pytest.mark.gpu
@pytest.mark.parametrize("level", [0, 3])
@pytest.mark.parametrize("fold", [True, False])
def test_cuda_fp16_up_block_with_a_placed_pixel_shuffle_matches_the_cpu(level, fold, monkeypatch):
    """The up conv storing its pixel shuffle into the Concat (fold_depth_to_space), or the shuffle
    kept and placed as a view through its Transpose."""
    from tests.compiler.test_concat_placement import keep_pixel_shuffles, up_block

    if not fold:
        keep_pixel_shuffles(monkeypatch)
    model = up_block(16, 8)
    image = np.random.default_rng(5).standard_normal((2, 3, 6, 8)).astype(np.float32)
    want = _run(build_plan(model, BuilderConfig(target="cpu")), {"image": image})
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level))
    if fold:
        assert any(l.attrs.get("depth_to_space") and l.outputs[0] in plan.memory.placements for l in plan.layers)
    else:
        assert any(n in plan.memory.aliases for n in plan.memory.placements)
    got = _run(plan, {"image": image})
    for key, w in want.items():
        assert np.linalg.norm(got[key] - w) / np.linalg.norm(w) < 1e-2, key


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


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", HALO)
def test_cuda_fp16_up_block_with_its_skip_on_a_halo_tactic_matches_the_cpu(tactic):
    """UNet's skip conv (read by the MaxPool too) forced onto a halo-tile tactic and placed in the
    Concat (issue 29; the plan's placement: test_concat_placement.py)."""
    from dataclasses import replace

    from tests.compiler.test_concat_placement import up_block

    model = up_block(16, 8)
    image = np.random.default_rng(5).standard_normal((2, 3, 6, 8)).astype(np.float32)
    config = BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0)
    first = build_plan(model, config)
    (cat,) = [lay for lay in first.layers if lay.kind == "Concat"]
    (skip,) = [lay for lay in first.layers if cat.inputs[0] in lay.outputs]
    plan = build_plan(model, replace(config, tactic_replay={skip.name: tactic}))
    assert cat.inputs[0] in plan.memory.placements
    assert {lay.name: lay.tactic for lay in plan.layers}[skip.name] == tactic
    want = _run(build_plan(model, BuilderConfig(target="cpu")), {"image": image})
    got = _run(plan, {"image": image})
    for key, w in want.items():
        assert np.linalg.norm(got[key] - w) / np.linalg.norm(w) < 1e-2, key
