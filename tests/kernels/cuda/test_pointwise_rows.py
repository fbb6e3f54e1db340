"""cuda.pointwise.rows: the [A, B, I] collapse, vector choice and launch it derives (CPU), its
kernels compiled with NVRTC, and its results against the reference on odd shapes (GPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.launch_geometry import BLOCK
from polykit.kernels.cuda.pointwise import pointwise_rows as pr
from polykit.kernels.cuda.pointwise import row_geometry as rg
from polykit.kernels.cuda.pointwise.pointwise import pointwise_kernels
from tests.kernels.cuda.recording_launcher import RecordingLauncher

rng = np.random.default_rng(29)


def test_squeeze_excitation_scale_collapses_to_batch_rows_channels():
    dims, per = rg.rows_geometry([(32, 112, 112, 32), (32, 1, 1, 32), (32, 112, 112, 32)], 1)
    assert dims == [32, 12544, 32] and per == [(401408, 32, 1), (32, 0, 1)]


def test_nchw_scale_broadcasts_along_the_inner_dim():
    dims, per = rg.rows_geometry([(2, 96, 7, 7), (2, 96, 1, 1), (2, 96, 7, 7)], 1)
    assert dims == [1, 192, 49] and per == [(0, 49, 1), (0, 1, 0)]


def test_bias_row_is_one_block_of_rows():
    dims, per = rg.rows_geometry([(1, 40), (17, 40), (17, 40)], 1)
    assert dims == [1, 17, 40] and per == [(0, 0, 1), (0, 40, 1)]


def test_four_dims_or_a_broadcast_output_have_no_row_geometry():
    assert rg.rows_geometry([(2, 1, 6, 1), (1, 5, 1, 3), (2, 5, 6, 3)], 1) is None
    assert rg.rows_geometry([(4, 3), (4, 1)], 1) is None  # the output [4, 1] is smaller than the space


def test_takes_broadcasts_but_leaves_same_shape_operands_to_the_vector_kernel():
    assert rg.takes([(8, 5, 16), (8, 1, 16), (8, 5, 16)], 1)
    assert not rg.takes([(8, 5, 16), (8, 5, 16), (8, 5, 16)], 1)
    assert not rg.takes([(8, 5, 16), (1,), (8, 5, 16)], 1)


def _stamped(kind, shapes, dtype="float16"):
    *ins, out = shapes
    names = tuple(f"x{k}" for k in range(len(ins)))
    return LayerDesc("m", kind, names, ("y",), {}, in_dtypes=(dtype,) * len(ins), in_shapes=tuple(ins),
                     out_dtypes=(dtype,), out_shapes=(out,), precision="fp16" if dtype == "float16" else "fp32")


def test_supports_needs_stamped_row_broadcast_shapes():
    assert rg.stamped_takes(_stamped("Mul", [(3, 49, 96), (3, 1, 96), (3, 49, 96)]))
    assert not rg.stamped_takes(_stamped("Mul", [(3, 49, 96), (3, 49, 96), (3, 49, 96)]))
    assert not rg.stamped_takes(LayerDesc("m", "Mul", ("a", "b"), ("y",)))
    assert not rg.stamped_takes(_stamped("Mul", [(3, 4, 5), (3, 1, 5), (3, 4, 5)], "float8_e4m3fn"))


def test_vectors_only_for_aligned_pointers_and_whole_chunks():
    dims, per = [32, 12544, 32], [(401408, 32, 1), (32, 0, 1)]
    f16 = np.dtype(np.float16)
    x, s, y = (DeviceTensor(p, (1,), f16) for p in (0x1000, 0x2000, 0x3000))
    assert rg.rows_vec(dims, per, [x, s], [y]) == 1
    assert rg.rows_vec(dims, per, [DeviceTensor(0x1008, (1,), f16), s], [y]) == 0
    assert rg.rows_vec(dims, per, [x, s], [DeviceTensor(0x3002, (1,), f16)]) == 0
    assert rg.rows_vec(dims, per, [x, DeviceTensor(0x2002, (1,), f16)], [y]) == 0
    assert rg.rows_vec([1, 192, 49], [(0, 49, 1), (0, 1, 0)], [x, s], [y]) == 0  # I = 49


def test_launch_covers_every_chunk_and_row_within_one_block_of_threads():
    for dims, vec in (([32, 12544, 32], 1), ([32, 49, 1152], 1), ([1, 1, 1000000], 1), ([1, 192, 49], 0),
                      ([3, 1, 7], 0), ([70000, 1, 8], 1)):
        grid, block = rg.rows_launch(dims, vec)
        chunks = -(-dims[2] // (8 if vec else 1))
        assert block[0] * block[1] <= BLOCK and block[2] == 1
        assert grid[0] * block[0] >= chunks and (grid[0] - 1) * block[0] < chunks
        assert grid[1] * block[1] >= dims[1] or grid[1] == rg.MAX_GRID_YZ
        assert 1 <= grid[2] <= min(dims[0], rg.MAX_GRID_YZ)


def _enqueue(shapes, ptrs):
    lay = _stamped("Mul", shapes)
    rec = RecordingLauncher()
    f16 = np.dtype(np.float16)
    tensors = {n: DeviceTensor(p, s, f16) for n, s, p in zip(("x0", "x1", "y"), shapes, ptrs)}
    pr.enqueue_rows(lay, rec, tensors)
    return rec.launches


def test_enqueue_launches_the_row_kernel_with_its_geometry():
    (name, args), = _enqueue([(4, 5, 5, 32), (4, 1, 1, 32), (4, 5, 5, 32)], (0x1000, 0x2000, 0x3000))
    assert name.endswith("_r") and args[3:] == [4, 25, 32, 800, 32, 1, 32, 0, 1, 1]


def test_the_row_kernel_lives_in_a_module_of_its_own_whatever_the_shapes():
    names = lambda lay, rows=False: [k.name for k in pointwise_kernels(lay, rows=rows)]  # noqa: E731
    scale, full = _stamped("Mul", [(3, 49, 96), (3, 1, 96), (3, 49, 96)]), _stamped("Mul", [(3, 49, 96)] * 3)
    assert [n[-2:] for n in names(scale)] == [n[-2:] for n in names(full)] == ["_s", "_v"]
    assert [n[-2:] for n in names(scale, True)] == ["_s", "_v", "_r"]
    assert not set(names(scale)) & set(names(scale, True))  # distinct entry names: two modules
    assert pointwise_kernels(scale) == pointwise_kernels(full)  # cuda.pointwise's code never depends on shapes


def test_a_loop_body_add_with_dynamic_dims_builds_for_cuda():
    """A body Add whose operands are [1] and [k] at opt but both [2] at a raised corner: cuda.pointwise
    declares the same kernels at every corner, so it serves the profile (the row module once made the
    declared code depend on the shapes, and this build failed with 'cannot serve the profile's shapes')."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from tests.backends.test_loop_body_shapes import _sliding_sum_model

    plan = build_plan(_sliding_sum_model(), BuilderConfig(target="cuda", input_shapes={"n": (), "cond": (), "y": (1,)}))
    body = next(lay for lay in plan.layers if lay.kind == "Loop").attrs["body"]
    assert any(lay.tactic == "cuda.pointwise" for lay in body.layers)


def test_enqueue_takes_the_vector_kernel_where_nothing_broadcasts():
    lay = _stamped("Mul", [(3, 49, 96), (3, 49, 96), (3, 49, 96)])
    rec = RecordingLauncher()
    f16 = np.dtype(np.float16)
    pr.enqueue_rows(lay, rec, {n: DeviceTensor(0x1000, (3, 49, 96), f16) for n in ("x0", "x1", "y")})
    assert [name[-2:] for name, _ in rec.launches] == ["_v"]


def test_enqueue_falls_back_to_the_strided_kernel_past_three_dims():
    (name, _), = _enqueue([(2, 1, 6, 1), (1, 5, 1, 3), (2, 5, 6, 3)], (0x1000, 0x2000, 0x3000))
    assert name.endswith("_s")


def test_row_kernels_compile_with_nvrtc_for_every_float_storage_type():
    from cuda.core import Program, ProgramOptions

    sigs = [((d, d), (d,)) for d in ("float16", "bfloat16", "float32")] + [(("float16", "float32"), ("float16",))]
    lay = LayerDesc("m", "Mul", ("a", "b"), ("y",), {}, precision="fp16")
    src = pointwise_kernels(lay, sigs, rows=True)[0].render()
    assert src.count("_r(") >= len(sigs)
    Program(src, "c++", ProgramOptions(arch="sm_80", std="c++17")).compile("cubin")


# ---- GPU ---------------------------------------------------------------------------------------
#: (x shape, s shape): channels-last and NCHW scales, bias rows, C = 1, 3, 7, 96, 1000; R = 1, 49, 12544
CASES = [((1, 7, 7, 96), (1, 1, 1, 96)), ((3, 7, 7, 1000), (3, 1, 1, 1000)), ((3, 1, 1, 7), (1, 1, 1, 7)),
         ((1, 112, 112, 3), (1, 1, 1, 3)), ((3, 49, 1), (3, 1, 1)), ((1, 12544, 96), (1, 1, 96)),
         ((3, 96, 7, 7), (3, 96, 1, 1)), ((49, 7), (1, 7)), ((2, 3, 1), (1, 3, 1)), ((3, 49, 96), (96,))]


def _gpu_layer(kind, feeds):
    from polykit.runtime.cuda.harness import reference_layer

    names = tuple(feeds)
    lay = LayerDesc("m", kind, names, ("y",), {}, precision="fp16")
    y = reference_layer(lay, feeds)["y"]
    return replace(lay, in_dtypes=tuple(a.dtype.name for a in feeds.values()),
                   in_shapes=tuple(a.shape for a in feeds.values()), out_dtypes=(y.dtype.name,), out_shapes=(y.shape,))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("x_shape,s_shape", CASES)
@pytest.mark.parametrize("kind", ["Mul", "Add"])
def test_row_broadcast_matches_reference(kind, x_shape, s_shape, dtype):
    from polykit.compiler.ir.dtypes import to_numpy
    from polykit.runtime.cuda.harness import assert_matches_reference

    dt = to_numpy(16) if dtype == "bfloat16" else np.dtype(dtype)
    feeds = {"x": rng.uniform(-2, 2, x_shape).astype(dt), "s": rng.uniform(0, 1, s_shape).astype(dt)}
    if x_shape[-1] % 2:  # the scale first, as EfficientNet's ONNX has it
        feeds = {"s": feeds["s"], "x": feeds["x"]}
    lay = _gpu_layer(kind, feeds)
    assert rg.stamped_takes(lay), "the case must take the row kernel"
    assert_matches_reference(lay, feeds, tactic="cuda.pointwise.rows", rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [0, 2, 8])
def test_misaligned_tensors_take_the_scalar_row_kernel(misalign):
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    feeds = {"x": rng.uniform(-2, 2, (3, 49, 96)).astype(np.float16),
             "s": rng.uniform(0, 1, (3, 1, 96)).astype(np.float16)}
    lay = _gpu_layer("Mul", feeds)
    got = run_layer(lay, feeds, tactic="cuda.pointwise.rows", misalign={"x": misalign, "y": misalign})["y"]
    np.testing.assert_array_equal(got, reference_layer(lay, feeds)["y"])
