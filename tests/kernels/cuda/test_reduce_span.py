"""cuda.reduce.span: the [O, R, I] view it derives from shapes (CPU) and its kernels against the reference (GPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.reduce import reduce_span as rs
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.reduce.reduce import OPS
from polykit.kernels.cuda.reduce.reduce_span import Span, cols_block, span_geometry
from tests.kernels.cuda.recording_launcher import RecordingLauncher

rng = np.random.default_rng(41)


def test_keepdims_views_follow_the_axes_the_output_shrinks():
    assert span_geometry((32, 7, 7, 2048), (32, 1, 1, 2048)) == Span(32, 49, 2048)
    assert span_geometry((8, 128, 768), (8, 128, 1)) == Span(1024, 768, 1)
    assert span_geometry((5, 1, 6), (1, 1, 1)) == Span(1, 30, 1)


def test_size_one_axes_do_not_split_a_run():
    assert span_geometry((3, 4, 1, 5, 2), (3, 1, 1, 1, 2)) == Span(3, 20, 2)


def test_axes_that_are_not_one_run_have_no_span():
    assert span_geometry((3, 4, 5, 6), (1, 4, 1, 6)) is None


def test_without_keepdims_a_unique_way_to_drop_axes_gives_the_span():
    assert span_geometry((32, 7, 7, 2048), (32, 2048)) == Span(32, 49, 2048)
    assert span_geometry((8, 128, 768), (8, 128)) == Span(1024, 768, 1)
    assert span_geometry((4, 5), ()) == Span(1, 20, 1)


def test_without_keepdims_ambiguous_drops_have_no_span():
    assert span_geometry((4, 4), (4,)) is None  # axis 0 or axis 1
    assert span_geometry((2, 3, 3, 2), (2, 3)) is None


def test_shapes_that_are_no_reduction_have_no_span():
    assert span_geometry((3, 4), (3, 5)) is None
    assert span_geometry((3, 0, 4), (3, 1, 4)) is None


def test_cols_block_splits_short_grids_along_the_reduced_rows():
    grid, block = cols_block(Span(32, 49, 2048), 8)
    assert block == (8, 32, 1) and grid == (32, 32, 1)
    grid, block = cols_block(Span(100000, 3, 2), 1)
    assert block[0] * block[1] * block[2] <= rs.BLOCK and block[2] > 1 and grid[1] <= rs.MAX_GRID_Y


def _layer(op, x_shape, y_shape, dtype="float16"):
    return LayerDesc("r", op, ("X", "axes"), ("Y",), {"keepdims": 1}, in_dtypes=(dtype, "int64"),
                     in_shapes=(x_shape, (2,)), out_dtypes=(dtype,), out_shapes=(y_shape,))


def test_span_takes_resnet_pool_and_bert_rows_but_not_logsumexp_or_few_long_rows():
    assert rs.supports(_layer("ReduceMean", (32, 7, 7, 2048), (32, 1, 1, 2048)))
    assert rs.supports(_layer("ReduceSum", (8, 128, 768), (8, 128, 1)))
    assert not rs.supports(_layer("ReduceLogSumExp", (32, 7, 7, 2048), (32, 1, 1, 2048)))
    assert not rs.supports(_layer("ReduceSum", (4, 100000), (4, 1)))
    assert not rs.supports(LayerDesc("r", "ReduceSum", ("X",), ("Y",)))  # no stamped shapes


def _enqueue(x_shape, y_shape, x_ptr=0x1000, dtype=np.float16, op="ReduceMean"):
    rec = RecordingLauncher()
    tensors = {"X": DeviceTensor(x_ptr, x_shape, np.dtype(dtype)), "axes": DeviceTensor(0x9000, (2,), np.dtype(np.int64)),
               "Y": DeviceTensor(0x20000, y_shape, np.dtype(dtype))}
    rs.enqueue_span(_layer(op, x_shape, y_shape), rec, tensors)
    return rec.launches


def test_enqueue_loads_16_bytes_only_from_aligned_pointers():
    (name, args), = _enqueue((32, 7, 7, 2048), (32, 1, 1, 2048))
    assert name == "reduce_cols_f16" and args[2:] == [OPS["ReduceMean"], 32, 49, 2048, 1]
    (name, args), = _enqueue((32, 7, 7, 2048), (32, 1, 1, 2048), x_ptr=0x1002)
    assert name == "reduce_cols_f16" and args[-1] == 0
    (name, args), = _enqueue((8, 128, 768), (8, 128, 1))
    assert name == "reduce_rows_f16" and args[2:] == [OPS["ReduceMean"], 1024, 768, 1]


def test_enqueue_runs_the_general_kernel_where_no_span_fits():
    (name, _), = _enqueue((3, 4, 5, 6), (1, 4, 1, 6))
    assert name == "reduce_f16"
    (name, _), = _enqueue((32, 7, 7, 64), (32, 1, 1, 64), op="ReduceLogSumExp")
    assert name == "reduce_f16"


# ---- GPU ---------------------------------------------------------------------------------------
POSITIVE = {"ReduceLogSum", "ReduceProd"}
#: odd sizes, size-1 axes inside the run, rows shorter and longer than a warp's 16-byte chunk
SHAPES = [((3, 5, 7, 24), [1, 2]), ((2, 9, 40), [1]), ((5, 3, 3, 13), [1, 2]), ((7, 1, 6, 1, 3), [1, 2]),
          ((33, 100), [1]), ((6, 17), [1]), ((4, 3, 1030), [2]), ((2, 49, 2048), [1])]


def _feeds(op, shape, axes, dtype):
    x = rng.uniform(0.5, 1.5, shape) if op in POSITIVE else rng.uniform(-2, 2, shape)
    return {"X": x.astype(dtype), "axes": np.array(axes, np.int64)}


def _stamped(op, feeds, keepdims=1, precision="fp32"):
    from polykit.runtime.cuda.harness import reference_layer

    lay = LayerDesc("r", op, ("X", "axes"), ("Y",), {"keepdims": keepdims}, precision=precision)
    y = reference_layer(lay, feeds)["Y"]
    return replace(lay, in_dtypes=(feeds["X"].dtype.name, "int64"), in_shapes=(feeds["X"].shape, (len(feeds["axes"]),)),
                   out_dtypes=(y.dtype.name,), out_shapes=(y.shape,))


@pytest.mark.gpu
@pytest.mark.parametrize("op", [k for k in OPS if k != "ReduceLogSumExp"])
@pytest.mark.parametrize("shape,axes", SHAPES)
def test_span_matches_reference_fp32(op, shape, axes):
    from polykit.runtime.cuda.harness import assert_matches_reference

    feeds = _feeds(op, shape, axes, np.float32)
    lay = _stamped(op, feeds)
    assert span_geometry(feeds["X"].shape, lay.out_shapes[0]) is not None, "the case must take the span kernels"
    assert_matches_reference(lay, feeds, tactic="cuda.reduce.span", rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [0, 2])
@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2"])
@pytest.mark.parametrize("shape,axes", SHAPES)
def test_span_fp16_with_and_without_16_byte_loads(op, shape, axes, misalign):
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    feeds = _feeds(op, shape, axes, np.float16)
    lay = _stamped(op, feeds, keepdims=0, precision="fp16")
    assert span_geometry(feeds["X"].shape, lay.out_shapes[0]) is not None, "the case must take the span kernels"
    got = run_layer(lay, feeds, tactic="cuda.reduce.span", misalign={"X": misalign})["Y"]
    want = reference_layer(lay, feeds)["Y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=3e-3, atol=3e-3,
                               err_msg=f"{op} {shape} axes {axes} misalign {misalign}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axes", SHAPES)
def test_span_bfloat16_sums_are_the_reference_bit_for_bit(shape, axes):
    from polykit.compiler.ir.dtypes import to_numpy
    from polykit.runtime.cuda.harness import reference_layer, run_layer
    from tests.kernels.cuda.ulps import bit_mismatches

    for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceSumSquare"):
        feeds = _feeds(op, shape, axes, to_numpy(16))
        lay = _stamped(op, feeds)
        got = run_layer(lay, feeds, tactic="cuda.reduce.span")["Y"]
        assert bit_mismatches(got, reference_layer(lay, feeds)["Y"]) == "", f"{op} {shape} axes {axes}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"])
def test_span_integers_and_doubles_exactly(dtype, op):
    from polykit.runtime.cuda.harness import assert_matches_reference

    x = rng.integers(-4, 5, size=(3, 3, 2, 4)).astype(dtype)
    x[x == 0] = 1
    feeds = {"X": x, "axes": np.array([1, 2], np.int64)}
    assert_matches_reference(_stamped(op, feeds), feeds, tactic="cuda.reduce.span", rtol=0, atol=0)


@pytest.mark.gpu
def test_span_max_propagates_nan_like_the_reference():
    from polykit.runtime.cuda.harness import assert_matches_reference

    feeds = _feeds("ReduceMax", (2, 9, 40), [1], np.float32)
    feeds["X"][1, 4, 7] = np.nan
    feeds["X"][0, 3, :] = np.nan
    assert_matches_reference(_stamped("ReduceMax", feeds), feeds, tactic="cuda.reduce.span", rtol=0, atol=0)


@pytest.mark.gpu
def test_span_resnet_global_pool_equals_the_general_kernel_within_fp32_rounding():
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    feeds = _feeds("ReduceMean", (32, 7, 7, 2048), [1, 2], np.float16)
    lay = _stamped("ReduceMean", feeds, precision="fp16")
    fast = run_layer(lay, feeds, tactic="cuda.reduce.span")["Y"]
    general = run_layer(lay, feeds, tactic="cuda.reduce")["Y"]
    want = reference_layer(lay, feeds)["Y"].astype(np.float32)
    assert np.abs(fast.astype(np.float32) - want).max() <= 1e-3
    assert np.abs(fast.astype(np.float32) - general.astype(np.float32)).max() <= 1e-3


# ---- the split (cuda.reduce.span.split) ------------------------------------------------------------

def test_split_cuts_long_columns_of_a_short_grid_into_chunks_over_grid_z():
    span = Span(32, 12544, 32)  # EfficientNet-B0's first squeeze-excitation pool, bs32, fp16
    grid, block = cols_block(span, 8)
    splits, chunk = rs.cols_split(span, grid, block)
    assert grid[0] * grid[1] < rs.TARGET_BLOCKS and splits > 1
    assert (splits - 1) * chunk < span.reduced <= splits * chunk
    assert chunk >= block[1] * rs.SPLIT_ROWS
    assert grid[0] * grid[1] * splits <= rs.TARGET_BLOCKS + grid[0] * grid[1]


def test_split_leaves_full_grids_and_short_columns_alone():
    for span, per in ((Span(32, 49, 2048), 8), (Span(32, 49, 1152), 8), (Span(4096, 300, 64), 8)):
        grid, block = cols_block(span, per)
        assert rs.cols_split(span, grid, block) == (1, span.reduced)


def test_split_supports_only_short_grids_of_column_spans():
    assert rs.supports_split(_layer("ReduceMean", (32, 112, 112, 32), (32, 1, 1, 32)))
    assert rs.supports_split(_layer("ReduceMax", (1, 56, 56, 96), (1, 1, 1, 96)))
    assert not rs.supports_split(_layer("ReduceMean", (32, 7, 7, 2048), (32, 1, 1, 2048)))
    assert not rs.supports_split(_layer("ReduceSum", (8, 128, 768), (8, 128, 1)))  # rows
    assert not rs.supports_split(LayerDesc("r", "ReduceSum", ("X",), ("Y",)))


def _enqueue_split(x_shape, y_shape, op="ReduceMean", dtype=np.float16):
    rec = RecordingLauncher(workspace_ptr=0x70000)
    x, y = DeviceTensor(0x1000, x_shape, np.dtype(dtype)), DeviceTensor(0x20000, y_shape, np.dtype(dtype))
    tensors = {"X": x, "axes": DeviceTensor(0x9000, (2,), np.dtype(np.int64)), "Y": y}
    lay = _layer(op, x_shape, y_shape, np.dtype(dtype).name)
    rs.enqueue_split(lay, rec, tensors)
    return rec, lay, tensors


def test_enqueue_split_writes_partials_then_joins_them():
    rec, lay, tensors = _enqueue_split((32, 112, 112, 32), (32, 1, 1, 32))
    (part, pargs), (join, jargs) = rec.launches
    splits, chunk = rs.cols_split(Span(32, 12544, 32), *cols_block(Span(32, 12544, 32), 8))
    assert part == "reduce_cols_part_f16" and pargs[1:] == [0x70000, OPS["ReduceMean"], 32, 12544, 32, 1, chunk]
    assert join == "reduce_cols_join_f16" and jargs[0] == 0x70000
    assert jargs[2:] == [OPS["ReduceMean"], 32 * 32, 12544, splits]
    assert rec.workspaces == [splits * 32 * 32 * 4]
    assert rs.split_workspace(lay, tensors, 132) == rec.workspaces[0]


def test_split_workspace_from_plan_tensor_descriptions():
    from polykit.compiler.plan.records import TensorDesc

    for dtype, acc in (("float16", 4), ("bfloat16", 8), ("float32", 4)):
        lay = _layer("ReduceSum", (1, 56, 56, 96), (1, 1, 1, 96), dtype)
        tensors = {"X": TensorDesc("X", dtype, (1, 56, 56, 96), "activation"),
                   "Y": TensorDesc("Y", dtype, (1, 1, 1, 96), "activation")}
        span = Span(1, 3136, 96)
        grid, block = cols_block(span, 16 // np.dtype(TensorDesc("X", dtype, (), "").np_dtype).itemsize)
        splits, _ = rs.cols_split(span, grid, block)
        assert splits > 1 and rs.split_workspace(lay, tensors, 132) == splits * 96 * acc


def test_enqueue_split_runs_the_span_kernel_where_no_split_helps():
    rec, lay, tensors = _enqueue_split((32, 7, 7, 2048), (32, 1, 1, 2048))
    assert [n for n, _ in rec.launches] == ["reduce_cols_f16"] and rec.workspaces == []
    assert rs.split_workspace(lay, tensors, 132) == 0


#: squeeze-excitation pools [N, H*W, C] -> [N, C] and odd ones: C = 1, 3, 7, 96, 1000; R = 1, 49, 12544; N = 1, 3
SPLIT_SHAPES = [(1, 12544, 96), (3, 12544, 7), (3, 12544, 1), (1, 3136, 1000), (3, 49, 96), (3, 1, 3),
                (1, 12544, 3), (3, 784, 1000)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
@pytest.mark.parametrize("shape", SPLIT_SHAPES)
def test_split_matches_reference(shape, op, dtype):
    from polykit.compiler.ir.dtypes import to_numpy
    from polykit.runtime.cuda.harness import assert_matches_reference

    dt = to_numpy(16) if dtype == "bfloat16" else np.dtype(dtype)
    feeds = {"X": rng.uniform(-2, 2, shape).astype(dt), "axes": np.array([1], np.int64)}
    lay = _stamped(op, feeds, precision="fp16" if dtype == "float16" else "fp32")
    # fp32: sums of 12544 values in another order than the reference's differ by ~1e-4
    rtol, atol = (1e-4, 5e-4) if dtype == "float32" else (1e-2, 1e-2)
    assert_matches_reference(lay, feeds, tactic="cuda.reduce.span.split", rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [0, 2])
def test_split_pool_equals_the_unsplit_span_within_fp32_rounding(misalign):
    from polykit.runtime.cuda.harness import run_layer

    feeds = _feeds("ReduceMean", (3, 112, 112, 32), [1, 2], np.float16)
    lay = _stamped("ReduceMean", feeds, precision="fp16")
    assert rs.supports_split(lay)
    split = run_layer(lay, feeds, tactic="cuda.reduce.span.split", misalign={"X": misalign})["Y"]
    plain = run_layer(lay, feeds, tactic="cuda.reduce.span")["Y"]
    want = feeds["X"].astype(np.float64).mean(axis=(1, 2), keepdims=True)
    assert np.abs(split.astype(np.float64) - want).max() <= 1e-3
    assert np.abs(split.astype(np.float32) - plain.astype(np.float32)).max() <= 1e-3
