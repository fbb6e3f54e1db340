"""Data movement on the GPU (Transpose, Expand, Concat, Split, Slice, Pad, Tile, DepthToSpace,
reshape-family copies) against the reference kernels; host-side dim merging without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.movement.movement import contiguous_strides, merge_dims

rng = np.random.default_rng(21)


def rand(shape, dtype=np.float32):
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(1, 100, size=shape).astype(dtype)
    return (rng.standard_normal(shape) + 3.0).astype(dtype)


def test_merge_dims_fuses_contiguous_neighbours_and_drops_ones():
    dims, (s,) = merge_dims([2, 1, 3, 4], [contiguous_strides([2, 1, 3, 4])])
    assert dims == [24] and s == [1]


def test_merge_dims_keeps_a_transposed_pair_apart():
    dims, (src, dst) = merge_dims([3, 4, 5], [[1, 15, 3], [20, 5, 1]])
    assert dims == [3, 20] and src == [1, 3] and dst == [20, 1]


@pytest.mark.parametrize("kind", ["Reshape", "Flatten", "Squeeze", "Unsqueeze"])
def test_a_reshape_family_layer_sharing_its_inputs_bytes_is_idle_and_launches_nothing(kind):
    """The view the memory plan makes (the runtime's profiler charges it no time, the engine
    launches nothing); a copy where the bytes differ, and a Transpose is never idle."""
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import find_tactic
    from tests.kernels.cuda.recording_launcher import RecordingLauncher

    lay = LayerDesc("v", kind, ["x"], ["y"], {}, tactic="cuda.movement.copy")
    tactic = find_tactic("cuda", kind, "cuda.movement.copy")
    for y_ptr, idle in ((0x1000, True), (0x2000, False)):
        tensors = {"x": DeviceTensor(0x1000, (2, 6), np.dtype(np.float32)),
                   "y": DeviceTensor(y_ptr, (3, 4), np.dtype(np.float32))}
        launcher = RecordingLauncher()
        tactic.enqueue(lay, launcher, tensors)
        assert tactic.idle(lay, tensors) is idle and (launcher.launches == []) is idle
    transpose = LayerDesc("t", "Transpose", ["x"], ["y"], {"perm": [1, 0]}, tactic="cuda.movement.strided")
    assert not find_tactic("cuda", "Transpose", "cuda.movement.strided").idle(transpose, tensors)


DEPTH_SPACE_CASES = [("DepthToSpace", {"blocksize": 2, "mode": "DCR"}, (2, 8, 3, 5)),
                     ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, (2, 8, 3, 5)),
                     ("SpaceToDepth", {"blocksize": 2, "mode": "DCR"}, (2, 3, 4, 6)),
                     ("SpaceToDepth", {"blocksize": 2, "mode": "CRD"}, (2, 3, 4, 6)),
                     ("SpaceToDepth", {"blocksize": 3}, (1, 2, 6, 9))]


@pytest.mark.parametrize("kind,attrs,shape", DEPTH_SPACE_CASES)
def test_depth_space_view_copies_to_the_reference_output(kind, attrs, shape):
    from polykit.compiler.ir.graph import Node
    from polykit.kernels.cuda.movement.movement import depth_space_view
    from polykit.compiler.ops.references import run_reference

    x = rand(shape)
    dims, src = depth_space_view(kind, attrs, shape)
    view = np.lib.stride_tricks.as_strided(x, dims, [s * x.itemsize for s in src])
    expected = run_reference(Node(kind, ["X"], ["Y"], dict(attrs)), [x])[0]
    np.testing.assert_array_equal(np.ascontiguousarray(view).reshape(expected.shape), expected)


def check(lay, feeds):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, rtol=0, atol=0)


DTYPES = [np.float32, np.float16, np.int64, np.uint8, np.bool_]


@pytest.mark.gpu
@pytest.mark.parametrize("shape,perm", [((3, 5), (1, 0)), ((2, 3, 4, 5), (0, 2, 3, 1)), ((7,), (0,)),
                                        ((4, 33, 65), (2, 1, 0)), ((2, 3, 4, 5, 6), (4, 0, 3, 1, 2)),
                                        ((1, 12, 128, 64), (0, 2, 1, 3)), ((3, 515, 77), (0, 2, 1)),
                                        ((70000, 2, 3), (2, 1, 0))])
@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose(shape, perm, dtype):
    check(LayerDesc("t", "Transpose", ("X",), ("Y",), {"perm": list(perm)}), {"X": rand(shape, dtype)})


@pytest.mark.gpu
@pytest.mark.parametrize("shape,to", [((3, 1), (2, 3, 4)), ((1,), (5, 7)), ((4, 1, 6), (4, 5, 6)), ((5,), (5,))])
def test_expand(shape, to):
    check(LayerDesc("e", "Expand", ("X", "S"), ("Y",)), {"X": rand(shape), "S": np.array(to, np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_concat_three_inputs(axis, dtype):
    shapes = {0: [(1, 4, 5), (3, 4, 5), (2, 4, 5)], 1: [(2, 1, 5), (2, 7, 5), (2, 2, 5)],
              -1: [(2, 4, 3), (2, 4, 1), (2, 4, 8)]}[axis]
    feeds = {f"X{i}": rand(s, dtype) for i, s in enumerate(shapes)}
    check(LayerDesc("c", "Concat", tuple(feeds), ("Y",), {"axis": axis}), feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("axis,split", [(0, [1, 2, 3]), (1, [4, 4]), (-1, [5, 1, 3])])
def test_split(axis, split):
    shape = {0: (6, 4, 9), 1: (3, 8, 9), -1: (3, 4, 9)}[axis]
    outs = tuple(f"Y{i}" for i in range(len(split)))
    lay = LayerDesc("s", "Split", ("X", "split"), outs, {"axis": axis})
    check(lay, {"X": rand(shape), "split": np.array(split, np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("shape,starts,ends,axes,steps", [
    ((10,), [2], [7], None, None), ((5, 7), [1, -3], [4, 100], [0, 1], [1, 1]), ((5, 7, 9), [4, 0], [0, 9], [0, 2], [-1, 3]),
    ((4, 6), [-1], [-100], [1], [-2]), ((3, 4, 5), [0], [2], [-1], None), ((8, 8), [1, 1], [8, 8], None, [2, 2])])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_slice_with_negative_steps_and_clamping(shape, starts, ends, axes, steps, index_dtype):
    feeds = {"X": rand(shape), "st": np.array(starts, index_dtype), "en": np.array(ends, index_dtype)}
    ins = ["X", "st", "en", "", ""]
    if axes is not None:
        feeds["ax"], ins[3] = np.array(axes, index_dtype), "ax"
    if steps is not None:
        feeds["sp"], ins[4] = np.array(steps, index_dtype), "sp"
    while ins[-1] == "":
        ins.pop()
    check(LayerDesc("sl", "Slice", tuple(ins), ("Y",)), feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("shape,pads", [((3, 4), [1, 2, 2, 1]), ((2, 3, 5), [0, 1, 2, 0, 2, 3]), ((6,), [3, 2])])
def test_pad_modes(mode, shape, pads):
    feeds = {"X": rand(shape), "P": np.array(pads, np.int64), "V": np.array(1.5, np.float32)}
    ins = ("X", "P", "V") if mode == "constant" else ("X", "P")
    check(LayerDesc("p", "Pad", ins, ("Y",), {"mode": mode}), {k: feeds[k] for k in ins})


@pytest.mark.gpu
def test_pad_with_axes_and_negative_pads():
    feeds = {"X": rand((4, 5, 6)), "P": np.array([1, -1, 2, 0], np.int64), "A": np.array([0, 2], np.int64)}
    check(LayerDesc("p", "Pad", ("X", "P", "", "A"), ("Y",), {"mode": "constant"}), feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,reps", [((3,), [4]), ((2, 3), [2, 3]), ((2, 1, 3), [1, 5, 2])])
def test_tile(shape, reps):
    check(LayerDesc("t", "Tile", ("X", "R"), ("Y",)), {"X": rand(shape, np.int32), "R": np.array(reps, np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("kind,attrs", [("DepthToSpace", {"blocksize": 2, "mode": "DCR"}),
                                        ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}),
                                        ("DepthToSpace", {"blocksize": 3}), ("SpaceToDepth", {"blocksize": 2}),
                                        ("SpaceToDepth", {"blocksize": 2, "mode": "CRD"})])
def test_depth_space(kind, attrs):
    b = attrs["blocksize"]
    shape = (2, 2 * b * b, 3, 5) if kind == "DepthToSpace" else (2, 3, 4, 6)
    check(LayerDesc("d", kind, ("X",), ("Y",), attrs), {"X": rand(shape)})


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 4096, 4099])
def test_reshape_family_copies_bytes(n):
    x = rand((n,), np.float16)
    check(LayerDesc("r", "Reshape", ("X", "S"), ("Y",)), {"X": x, "S": np.array([1, n], np.int64)})
    check(LayerDesc("u", "Unsqueeze", ("X", "A"), ("Y",)), {"X": x, "A": np.array([0], np.int64)})
    check(LayerDesc("f", "Flatten", ("X",), ("Y",), {"axis": 0}), {"X": x})


def test_widen_moves_contiguous_inner_runs_in_16_byte_elements():
    from polykit.kernels.cuda.movement.movement import widen

    es, dims, ss, ds, bases = widen(4, [8, 12, 128, 64], [98304, 64, 768, 1], [98304, 8192, 64, 1], (0, 0), (256, 512))
    assert es == 16 and dims == [8, 12, 128, 16] and ss == [24576, 16, 192, 1] and ds == [24576, 2048, 16, 1]


def test_widen_keeps_elements_when_the_inner_run_is_strided():
    from polykit.kernels.cuda.movement.movement import widen

    assert widen(4, [3, 5], [1, 3], [5, 1], (0, 0), (0, 0))[0] == 4
