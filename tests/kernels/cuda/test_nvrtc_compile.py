"""CI (no GPU): every kernel variant of every CUDA family compiles with NVRTC for sm_80 and sm_90."""

from __future__ import annotations

import importlib
import os

import pytest

import polykit.kernels.cuda as cuda_kernels
from polykit.runtime.cuda.nvrtc import compile_many, unique_units


def all_variants():
    return cuda_kernels.all_compile_variants()


def test_every_family_module_declares_its_variants():
    missing = [f for f in cuda_kernels.family_modules() if not hasattr(importlib.import_module(f), "compile_variants")]
    assert missing == []


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_all_kernel_variants_compile(arch, shared_kernel_cache):
    # a cache that started empty in this test run: every unit really compiles with NVRTC in this
    # run (in worker processes, as a build does), once, here or in another test that needs it
    # units pinned to one arch (sm_90a) compile the same for either parameter: once is enough
    units = [u for u in unique_units(all_variants()) if not u.arch or arch == "sm_90"]
    cubins = compile_many(units, arch, workers=min(4, os.cpu_count() or 1))
    assert len(cubins) == len(units)
    assert all(blob[:4] == b"\x7fELF" for blob in cubins.values())
