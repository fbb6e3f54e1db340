"""resize.cu's fast kernel emulated on the host (no GPU): the tactic's own enqueue launches the
kernel source compiled by g++ (block_emulation.py: every thread of a (BX, BY) block a real thread,
__syncthreads a barrier), output poisoned, against the reference -- the 32-row batches whose H taps
the block's first threads compute, a last partial batch, blocks striding over batches (a capped grid),
one resized axis, channels last, nearest and linear, and scales read on the device."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.movement import resize as resize_mod
from polykit.kernels.tactics import find_tactic
from tests.kernels.cuda.block_emulation import host_launcher
from tests.kernels.cuda.test_resize import reference

rng = np.random.default_rng(29)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    return host_launcher(tmp_path_factory, "RESIZE_PARAMS", "RESIZE_ARGS")


def run_emulated(launcher, lay, feeds, y_shape):
    x = feeds["X"]
    y = np.full(y_shape, np.nan, x.dtype)
    tensors = {"X": DeviceTensor(x.ctypes.data, x.shape, x.dtype), "Y": DeviceTensor(y.ctypes.data, y.shape, y.dtype)}
    for name in lay.inputs[1:]:
        if name:
            tensors[name] = DeviceTensor(feeds[name].ctypes.data, feeds[name].shape, feeds[name].dtype)
    find_tactic("cuda", "Resize", "cuda.resize").enqueue(lay, launcher, tensors)
    return y


def sized(mode, coord="half_pixel"):
    return LayerDesc("r", "Resize", ("X", "", "", "Z"), ("Y",),
                     {"mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": "floor"})


CASES = {  # x shape -> y shape: rows = the product of y's dims before W
    "nchw_two_axes": ((2, 3, 7, 9), (2, 3, 15, 20)),        # 90 rows: two full batches and a partial one
    "one_axis": ((3, 5, 11), (3, 5, 26)),                  # 15 rows, one axis
    "channels_last": ((2, 6, 5, 24), (2, 13, 11, 24)),     # inner 24, two axes, 26 rows
    "shrink": ((1, 2, 40, 12), (1, 2, 33, 7)),             # both axes shrink, 66 rows
}


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_emulated_fast_resize_matches_the_reference(launcher, mode, case):
    x_shape, y_shape = CASES[case]
    lay = sized(mode, "half_pixel" if mode == "linear" else "asymmetric")
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32), "Z": np.array(y_shape, np.int64)}
    launcher.launches.clear()
    y = run_emulated(launcher, lay, feeds, y_shape)
    assert launcher.launches[-1][0].name == f"resize_fast_{mode}_f32"
    np.testing.assert_allclose(y, reference(lay, feeds), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows", [32, 8])
def test_blocks_stride_over_the_row_batches_when_the_grid_is_capped(launcher, monkeypatch, rows):
    """FAST_BLOCKS 1: one block walks all the row batches of 90 rows (its barriers each batch); the
    batch is resize.py's FAST_ROWS, compiled into the kernel."""
    monkeypatch.setattr(resize_mod, "FAST_BLOCKS", 1)
    monkeypatch.setattr(resize_mod, "FAST_ROWS", rows)
    x_shape, y_shape = CASES["nchw_two_axes"]
    lay = sized("linear")
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32), "Z": np.array(y_shape, np.int64)}
    launcher.launches.clear()
    y = run_emulated(launcher, lay, feeds, y_shape)
    assert launcher.launches[-1][1] == (1, 1, 1)
    assert ("RESIZE_FAST_ROWS", str(rows)) in launcher.launches[-1][0].defines
    np.testing.assert_allclose(y, reference(lay, feeds), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scales", [[1, 1, 2.0, 1.5], [1, 1.2, 2.0, 2.0]])
def test_emulated_fast_resize_with_device_scales_and_the_general_fallback(launcher, scales):
    """[1, 1.2, 2, 2] on 3 channels keeps the channel axis's length with a device scale that is not
    1: the fast launch takes the general path, uniformly."""
    lay = LayerDesc("r", "Resize", ("X", "", "S"), ("Y",), {"mode": "linear"})
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    feeds = {"X": x, "S": np.array(scales, np.float32)}
    want = reference(lay, feeds)
    y = run_emulated(launcher, lay, feeds, want.shape)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
