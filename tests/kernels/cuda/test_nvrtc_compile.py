"""CI (no GPU): every kernel variant of every CUDA family compiles with NVRTC for sm_90 (cubins at NVRTC's fastest
level, ptxas too: nvrtc.check_compiles) and sm_80 (NVRTC's front end alone: tests/kernel_units.py's FRONT_END_ARCHES).

One test a kernel module and arch (a module of many units in parts, tests/kernel_units.py), so xdist
spreads the compile over its workers instead of one worker compiling every unit of an arch."""

from __future__ import annotations

import importlib

import pytest

import polykit.kernels.cuda as cuda_kernels
from polykit.runtime.cuda.nvrtc import unique_units
from tests.kernel_units import ARCHES, FRONT_END_ARCHES, module_chunks

CHUNKS = module_chunks()


def all_variants():
    return cuda_kernels.all_compile_variants()


def test_every_family_module_declares_its_variants():
    missing = [f for f in cuda_kernels.family_modules() if not hasattr(importlib.import_module(f), "compile_variants")]
    assert missing == []


@pytest.mark.parametrize("arch", ARCHES)
def test_the_chunks_hold_every_unit_once(arch):
    # the chunks below together compile exactly the units the one test of an arch compiled: every
    # unit of all_compile_variants(), once; units pinned to one arch (sm_90a) compile the same for
    # either parameter: once is enough (with the first arch)
    expected = [u.key() for u in unique_units(all_variants()) if not u.arch or arch == ARCHES[0]]
    chunked = [u.key() for c in CHUNKS if c.arch == arch for u in c.units]
    assert sorted(chunked) == sorted(expected)
    assert all(c.units for c in CHUNKS)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", CHUNKS, ids=[c.id for c in CHUNKS])
def test_all_kernel_variants_compile(chunk):
    # nothing cached: the optimized cubins are compiled by the tests and runs that need them
    from polykit.runtime.cuda.nvrtc import check_compiles, check_front_end

    check = check_front_end if chunk.arch in FRONT_END_ARCHES else check_compiles
    for unit in chunk.units:
        check(unit, chunk.arch)
