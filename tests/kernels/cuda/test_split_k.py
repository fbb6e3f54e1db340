"""CPU: how the tiled GEMM / implicit-GEMM launches split K (the kernels are checked on the GPU
in test_gemm.py / test_conv.py)."""

from __future__ import annotations

import pytest

from polykit.kernels.cuda.base import KernelSource
from polykit.kernels.cuda.gemm.gemm import MAX_SPLITS, launch_tiled, split_k


class RecordingLauncher:
    def __init__(self, sm_count=132, workspace_ptr=0x1000):
        self.sm_count = sm_count
        self.launches = []
        self.requested = []
        self._ptr = workspace_ptr

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.launches.append((kernel.name, tuple(grid), list(args)))

    def workspace(self, nbytes):
        self.requested.append(nbytes)
        return self._ptr


def test_split_k_fills_about_two_blocks_per_sm_when_tiles_are_few():
    # ResNet-50 layer4 3x3 conv at batch 1 on 64x64 tiles: 8 tiles, K = 4608
    assert split_k(8, 4608, 16, 132, 1) == MAX_SPLITS
    assert split_k(24, 3072, 16, 132, 1) == 11  # BERT FFN2 at seq 128: ceil(264 / 24)
    assert split_k(6, 3072, 32, 132, 1) == 24  # same on 128x128x32 tiles: K // (4 * 32)


@pytest.mark.parametrize("tiles,K,items", [(132, 5000, 1), (500, 5000, 1), (4, 40, 1), (1, 63, 1)])
def test_split_k_keeps_one_slice_when_tiles_fill_the_gpu_or_k_is_shallow(tiles, K, items):
    assert split_k(tiles, K, 16, 132, items) == 1


def test_split_k_keeps_the_grid_z_in_range():
    assert split_k(1, 10**6, 16, 132, 30000) == 2  # 65535 // 30000


def test_launch_tiled_runs_the_slices_then_one_reduce_with_the_same_arguments():
    kernel = KernelSource("gemm_simt", file="gemm.cu", defines=(("ELEM", "float"),))
    L = RecordingLauncher()
    splits = launch_tiled(L, kernel, "gemm_splitk_reduce", 20, 45, 2000, 3, ["a"], ["e"])
    assert splits == min(-(-264 // 3), 2000 // 64, MAX_SPLITS)
    assert L.requested == [4 * splits * 3 * 20 * 45]
    (name1, grid1, args1), (name2, grid2, args2) = L.launches
    assert (name1, grid1) == ("gemm_simt", (1, 1, 3 * splits))
    assert (name2, grid2) == ("gemm_splitk_reduce", (4, 1, 3))
    assert args1 == args2 == ["a", splits, 0x1000, "e"]


def test_launch_tiled_without_a_split_passes_one_and_a_null_partial():
    kernel = KernelSource("conv_igemm_mma", file="conv.cu", defines=(("ELEM", "half_t"),))
    L = RecordingLauncher()
    assert launch_tiled(L, kernel, "conv_splitk_reduce", 256, 32 * 3136, 576, 1, [], []) == 1
    assert L.launches == [("conv_igemm_mma", (784, 2, 1), [1, 0])]
    assert L.requested == []


def test_launch_tiled_does_not_split_when_the_launcher_has_no_scratch_memory():
    kernel = KernelSource("gemm_simt", file="gemm.cu", defines=(("ELEM", "float"),))
    L = RecordingLauncher(workspace_ptr=0)
    assert launch_tiled(L, kernel, "gemm_splitk_reduce", 20, 45, 2000, 1, ["a"], []) == 1
    assert L.launches == [("gemm_simt", (1, 1, 1), ["a", 1, 0])]
