"""permuted_copy.cu emulated on the host (no GPU): the tactic's own enqueue launches the kernel's
source compiled by g++ (block_emulation.py), output poisoned, bytes compared with the reference;
the widened 16-byte path and the element path of a misaligned output both run."""

from __future__ import annotations


import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.references import run_reference
from polykit.compiler.ops.tensor.permuted_copy import copy_spec
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.movement.permuted_copy import copy_phases, widened
from polykit.kernels.tactics import find_tactic
from tests.kernels.cuda.block_emulation import host_launcher
from tests.kernels.cuda.permuted_copy_cases import CASES, DTYPES, layer_and_input


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    return host_launcher(tmp_path_factory, "PC_PARAMS", "PC_ARGS")


def run_emulated(launcher, layer, x, shift_y=0):
    want = run_reference(Node("PermutedCopy", ["X"], ["Y"], dict(layer.attrs), layer.name, layer.domain), [x])[0]
    buf = np.full(want.nbytes + 64, 0xAB, np.uint8)
    raw = buf[shift_y * x.itemsize:][: want.nbytes]
    y = raw.view(x.dtype).reshape(want.shape) if raw.size else np.empty(want.shape, x.dtype)
    tensors = {"X": DeviceTensor(x.ctypes.data, x.shape, x.dtype), "Y": DeviceTensor(y.ctypes.data, want.shape, x.dtype)}
    find_tactic("cuda", "PermutedCopy", "cuda.movement.permuted_copy").enqueue(layer, launcher, tensors)
    return y, want


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_emulated_permuted_copy_equals_the_reference(launcher, case, dtype):
    layer, x = layer_and_input(case, dtype)
    y, want = run_emulated(launcher, layer, x)
    np.testing.assert_array_equal(y, want)


def test_a_contiguous_innermost_run_moves_16_bytes_per_thread(launcher):
    layer, x = layer_and_input("window_merge", np.float16)
    x = np.ascontiguousarray(np.repeat(x, 8, axis=-1)[..., :48])  # C = 48 halves: six 16-byte vectors
    layer = type(layer)(layer.name, layer.kind, layer.inputs, layer.outputs,
                        dict(layer.attrs, view=[1, 2, 3, 7, 7, 48], shape=[1, 14, 21, 48]), domain=layer.domain)
    launcher.launches.clear()
    y, want = run_emulated(launcher, layer, x)
    np.testing.assert_array_equal(y, want)
    assert launcher.launches[-1][0].name == "permuted_copy_16"


def test_a_misaligned_output_takes_the_element_path(launcher):
    layer, x = layer_and_input("window_partition", np.float16)
    launcher.launches.clear()
    y, want = run_emulated(launcher, layer, x, shift_y=1)
    np.testing.assert_array_equal(y, want)
    assert launcher.launches[-1][0].name == "permuted_copy_2"


def test_phases_of_a_plain_copy_are_all_skipped():
    spec = copy_spec({}, (4, 5, 6))
    ph = copy_phases(spec)
    assert not ph.out_dims and not ph.fine_dims and not ph.win_dims


def test_a_roll_keeps_only_the_window_phase_with_merged_whole_axes():
    ph = copy_phases(copy_spec({"starts": [0, 3, 0, 0]}, (2, 8, 5, 4)))
    assert not ph.out_dims and not ph.fine_dims
    assert ph.win_dims == (2, 160) and ph.win_starts == (0, 60) and ph.in_strides == (160, 1)


def test_widening_needs_the_innermost_axis_whole_and_unrolled():
    spec = copy_spec({"starts": [0, 2]}, (3, 16))
    assert widened(spec, 2, (0, 0))[1] == 2
    spec = copy_spec({"starts": [1, 0]}, (3, 16))
    assert widened(spec, 2, (0, 0))[1] == 16 and widened(spec, 2, (0, 4))[1] == 4 and widened(spec, 2, (0, 2))[1] == 2
