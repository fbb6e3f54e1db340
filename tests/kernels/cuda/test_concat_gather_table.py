"""ai.polykit ConcatGather on concat_gather_table (gather.cu): 32-bit index math, each output
position's (source, offset) in a shared table built once per block, a gather along the last axis as
rows. Host side: when it runs and what it launches; the kernel run on the host (block_emulation.py,
its shared table and barrier real) against the reference; GPU: against the reference."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.movement.gather import TABLE_MAX_COLUMNS, concat_gather_args, concat_gather_table_launch
from polykit.kernels.tactics import find_tactic
from tests.kernels.cuda.block_emulation import EmulatedLauncher, precompiled_prelude, run_builds
from tests.kernels.cuda.recording_launcher import RecordingLauncher

rng = np.random.default_rng(30)
TACTIC = "cuda.gather.concat"


def layer_of(n_sources: int, axis: int) -> LayerDesc:
    names = tuple(f"x{k}" for k in range(n_sources))
    return LayerDesc("cg", "ConcatGather", ("idx", *names), ("y",), {"axis": axis}, domain=POLYKIT_DOMAIN)


def shuffle_indices(extents) -> np.ndarray:
    """ShuffleNet's channel shuffle of the concatenation: positions interleaved source by source
    (for two equal halves: 0, c, 1, c + 1, ...), extra ones appended for odd extents."""
    starts = np.cumsum((0,) + tuple(extents))[:-1]
    out = [starts[s] + i for i in range(max(extents)) for s in range(len(extents)) if i < extents[s]]
    return np.asarray(out, np.int64)


def case(extents, axis, rest, dtype, idx=None):
    """(layer, feeds, reference output) of a ConcatGather of sources with `extents` along `axis` of
    shapes otherwise `rest` (a tuple with None at the axis)."""
    shapes = [tuple(e if d is None else d for d in rest) for e in extents]
    idx = shuffle_indices(extents) if idx is None else np.asarray(idx, np.int64)
    feeds = {"idx": idx, **{f"x{k}": (rng.standard_normal(s) * 10).astype(dtype) for k, s in enumerate(shapes)}}
    return layer_of(len(extents), axis), feeds, expected(feeds, axis)


def expected(feeds, axis) -> np.ndarray:
    """The gather of the concatenation; indices in [-total, total) (negative ones from the end)."""
    cat = np.concatenate([v for k, v in feeds.items() if k != "idx"], axis=axis)
    return np.take(cat, feeds["idx"] % cat.shape[axis], axis=axis)


def tensors_of(feeds, out_shape, dtype) -> dict:
    t = {k: DeviceTensor(0x10000 * (i + 1), v.shape, v.dtype) for i, (k, v) in enumerate(feeds.items())}
    t["y"] = DeviceTensor(0x900000, out_shape, np.dtype(dtype))
    return t


def test_a_channels_last_shuffle_runs_as_rows_with_a_table_of_its_columns():
    layer, feeds, want = case((58, 58), 3, (2, 28, 28, None), np.float16)
    tensors = tensors_of(feeds, want.shape, np.float16)
    name, n, args = concat_gather_args(layer, tensors)
    kernel, grid, block, c_args, smem = concat_gather_table_launch(args, sm_count=132)
    assert kernel == "concat_gather_table" and smem == 4 * 116 and block == (256, 1, 1)
    assert grid == (-(-(2 * 28 * 28) // 2), 1, 1)  # 2 rows of 116 a pass of 256 threads
    assert [int(a) for a in c_args[2:5]] == [2 * 28 * 28, 116, 1] and all(isinstance(a, np.int32) for a in c_args[2:5])
    assert [int(a) for a in c_args[9:]] == [58, 58, 0, 0] and c_args[7:9] == [0, 0]
    launcher = RecordingLauncher(sm_count=4)
    find_tactic("cuda", "ConcatGather", TACTIC).enqueue(layer, launcher, tensors)
    assert launcher.launches[0][0] == "concat_gather_table_2"


def test_an_nchw_shuffle_takes_the_table_kernel_with_a_grid_of_a_few_blocks_an_sm():
    layer, feeds, want = case((116, 116), 1, (32, None, 14, 14), np.float16)
    _, _, args = concat_gather_args(layer, tensors_of(feeds, want.shape, np.float16))
    kernel, grid, _, c_args, _ = concat_gather_table_launch(args, sm_count=132)
    assert grid == (132 * 8, 1, 1) and [int(a) for a in c_args[2:5]] == [32, 232, 196]


def test_too_many_positions_or_sizes_past_32_bits_keep_the_element_kernel():
    idx = np.zeros(TABLE_MAX_COLUMNS + 1, np.int64)
    layer, feeds, _ = case((4, 4), 1, (3, None), np.float32, idx=idx)
    tensors = tensors_of(feeds, (3, idx.size), np.float32)
    assert concat_gather_table_launch(concat_gather_args(layer, tensors)[2], 132) is None
    launcher = RecordingLauncher()
    find_tactic("cuda", "ConcatGather", TACTIC).enqueue(layer, launcher, tensors)
    assert launcher.launches[0][0] == "concat_gather_4"
    huge = {"idx": DeviceTensor(0x100, (4,), np.dtype(np.int64)),
            "x0": DeviceTensor(0x1000, (1 << 28, 2), np.dtype(np.float16)),
            "x1": DeviceTensor(0x2000, (1 << 28, 2), np.dtype(np.float16)),
            "y": DeviceTensor(0x3000, (1 << 28, 4), np.dtype(np.float16))}
    assert concat_gather_table_launch(concat_gather_args(layer_of(2, 1), huge)[2], 132) is None


def test_the_table_kernels_are_declared_for_every_element_size():
    kernels = {k.name for k in find_tactic("cuda", "ConcatGather", TACTIC).kernels(layer_of(2, 1))}
    assert kernels >= {f"concat_gather_table_{es}" for es in (1, 2, 4, 8)}


# ---- the kernel on the host ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    build = run_builds(tmp_path_factory)
    prelude = precompiled_prelude(build, cxx)
    return {es: EmulatedLauncher(build, cxx, f"CG_TABLE_PARAMS({ctype})", "CG_TABLE_ARGS", prelude=prelude)
            for es, ctype in ((2, "u16"), (4, "u32"), (8, "u64"))}


CASES = [
    ((58, 58), 3, (2, 5, 3, None), np.float16),      # ShuffleNet channels last: 116 columns, 2 rows a pass
    ((3, 5, 2, 7), 1, (2, None, 3, 5), np.float32),  # 4 sources, odd widths, inner 15: the element path
    ((7, 7, 6), -1, (11, None), np.float16),         # 3 sources, odd, 20 columns: 12 rows a pass
    ((150, 150), 1, (3, None), np.float32),          # 300 columns > 256 threads: a column loop
    ((1, 4), 0, (None, 6), np.int64),                # the axis first: outer 1, inner 6
]


@pytest.mark.parametrize("extents,axis,rest,dtype", CASES)
def test_the_emulated_table_kernel_equals_the_reference(emulated, extents, axis, rest, dtype):
    layer, feeds, want = case(extents, axis, rest, dtype)
    if len(extents) == 4:  # negative and repeated positions too
        feeds["idx"] = np.concatenate([rng.permutation(sum(extents)), [-1, 0, sum(extents) - 1]]).astype(np.int64)
        want = expected(feeds, axis)
    y = np.full(want.nbytes, 0xFF, np.uint8).view(want.dtype).reshape(want.shape)  # poisoned
    tensors = {k: DeviceTensor(v.ctypes.data, v.shape, v.dtype) for k, v in feeds.items()}
    tensors["y"] = DeviceTensor(y.ctypes.data, y.shape, y.dtype)
    launcher = emulated[want.dtype.itemsize]
    launcher.sm_count = 1  # few blocks: each strides over several row passes
    launcher.launches.clear()
    find_tactic("cuda", "ConcatGather", TACTIC).enqueue(layer, launcher, tensors)
    assert launcher.launches[-1][0].name.startswith("concat_gather_table_")
    np.testing.assert_array_equal(y, want)


# ---- GPU -------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("extents,axis,rest,dtype", CASES + [
    ((232, 232), 3, (32, 7, 7, None), np.float16),    # ShuffleNet's last stage, bs32
    ((116, 116), 1, (32, None, 28, 28), np.float16),  # the NCHW form
    ((5000, 4000), 1, (2, None), np.float32),         # 9000 positions, past the table: the element kernel
])
def test_concat_gather_table_on_the_gpu_matches_the_reference(extents, axis, rest, dtype):
    from polykit.runtime.cuda.harness import assert_matches_reference

    layer, feeds, _ = case(extents, axis, rest, dtype)
    assert_matches_reference(layer, feeds, tactic=TACTIC, rtol=0, atol=0)


@pytest.mark.gpu
def test_concat_gather_table_with_a_misaligned_output_on_the_gpu():
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    layer, feeds, _ = case((7, 9), 2, (3, 4, None), np.float16)
    got = run_layer(layer, feeds, tactic=TACTIC, misalign={"y": 2, "x1": 6})
    np.testing.assert_array_equal(got["y"], reference_layer(layer, feeds)["y"])
