"""The NVRTC compile path and the on-disk kernel cache (no GPU needed)."""

from __future__ import annotations

import json

import pytest

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import KernelSource
from polykit.runtime.cuda import nvrtc

SRC = KernelSource("fill", code='extern "C" __global__ void fill(float* x, long long n) {'
                                ' long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) x[i] = 3.f; }')


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKIT_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_compile_source_gives_a_cubin():
    assert nvrtc.compile_source(SRC, "sm_80")[:4] == b"\x7fELF"


def test_compile_error_names_the_kernel_and_carries_the_log():
    bad = KernelSource("broken_kernel", code='extern "C" __global__ void broken_kernel() { undeclared_thing(); }')
    with pytest.raises(DeviceError) as info:
        nvrtc.compile_source(bad, "sm_80")
    assert "broken_kernel" in str(info.value) and "undeclared_thing" in str(info.value)


def test_cached_compile_writes_one_entry_and_reuses_it(cache_root, monkeypatch):
    first = nvrtc.compile_cached(SRC, "sm_80")
    entries = list((cache_root / "kernels" / "sm_80").glob("*.cubin"))
    assert len(entries) == 1
    # beside it, which kernel the hash-named entry holds
    assert json.loads(entries[0].with_suffix(".json").read_text())["name"] == SRC.name
    monkeypatch.setattr(nvrtc, "compile_source", lambda *a: pytest.fail("recompiled despite a cache hit"))
    assert nvrtc.compile_cached(SRC, "sm_80") == first


def test_corrupt_cache_entry_is_rebuilt(cache_root):
    nvrtc.compile_cached(SRC, "sm_80")
    (entry,) = (cache_root / "kernels" / "sm_80").glob("*.cubin")
    entry.write_bytes(b"garbage")
    assert nvrtc.compile_cached(SRC, "sm_80")[:4] == b"\x7fELF"
    assert entry.read_bytes()[:4] == b"\x7fELF"


def test_cache_key_depends_on_arch_and_source():
    other = KernelSource("fill", code=SRC.code.replace("3.f", "4.f"))
    keys = {nvrtc.cache_key(SRC, "sm_80"), nvrtc.cache_key(SRC, "sm_90"), nvrtc.cache_key(other, "sm_80")}
    assert len(keys) == 3


def test_units_differing_only_in_kernel_name_compile_once():
    twin = KernelSource("other_name", code=SRC.code)
    assert len(nvrtc.unique_units([SRC, twin])) == 1


def test_check_front_end_passes_good_source_and_names_the_kernel_and_error_of_bad_source():
    """nvrtc.check_front_end (CI's sm_80 check, NVRTC's front end alone): a good source passes without a driver;
    a parse error and an error only a template's instantiation shows each raise DeviceError carrying NVRTC's
    message and the kernel's name."""
    good = KernelSource("fe_ok", code='extern "C" __global__ void fe_ok(float* y) { y[threadIdx.x] = 2.f; }')
    assert nvrtc.check_front_end(good, "sm_80") is None
    bad = KernelSource("fe_bad", code='extern "C" __global__ void fe_bad() { int x = ; }')
    with pytest.raises(DeviceError, match="fe_bad") as err:
        nvrtc.check_front_end(bad, "sm_80")
    assert "expected an expression" in str(err.value)
    late = KernelSource("fe_late", code="template <class T> __device__ int f(T t) { return t.nope(); }\n"
                        'extern "C" __global__ void fe_late(int* y) { *y = f(3); }')
    with pytest.raises(DeviceError, match="fe_late") as err:
        nvrtc.check_front_end(late, "sm_80")
    assert "class type" in str(err.value)


def test_check_compiles_assembles_inline_ptx_and_falls_back_to_the_full_compile(cache_root, monkeypatch):
    """nvrtc.check_compiles (CI's sm_90 check, NVRTC's fastest level): a good source passes and caches nothing; a
    C++ error and an inline-PTX error only ptxas sees (the front end and NVVM pass the asm text through) each raise
    DeviceError naming the kernel; where NVRTC refuses the fast level (here: an option it does not know), the full
    compile decides, for a good source and a bad one alike."""
    assert nvrtc.check_compiles(SRC, "sm_90") is None
    assert not list(cache_root.rglob("*.cubin"))
    bad = KernelSource("cc_bad", code='extern "C" __global__ void cc_bad() { int x = ; }')
    with pytest.raises(DeviceError, match="cc_bad") as err:
        nvrtc.check_compiles(bad, "sm_90")
    assert "expected an expression" in str(err.value)
    asm = KernelSource("cc_asm", code='extern "C" __global__ void cc_asm(unsigned* y) {'
                       ' unsigned d; asm volatile("no_such_op.b32 %0, %1;" : "=r"(d) : "r"(y[0])); y[1] = d; }')
    with pytest.raises(DeviceError, match="cc_asm") as err:
        nvrtc.check_compiles(asm, "sm_90")
    assert "no_such_op" in str(err.value)
    assert nvrtc.check_front_end(asm, "sm_90") is None  # what the front end alone misses
    full = []
    real = nvrtc.compile_source
    monkeypatch.setattr(nvrtc, "FAST_COMPILE", "--no-such-level")
    monkeypatch.setattr(nvrtc, "compile_source", lambda *a: full.append(a[0].name) or real(*a))
    assert nvrtc.check_compiles(SRC, "sm_90") is None
    with pytest.raises(DeviceError, match="cc_bad"):
        nvrtc.check_compiles(bad, "sm_90")
    assert full == [SRC.name, "cc_bad"]
