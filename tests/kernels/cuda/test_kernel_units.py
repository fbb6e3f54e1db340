"""tests/kernel_units.py: the NVRTC test's split into chunks, and compile_once's lock a unit."""

from __future__ import annotations

import threading

from polykit.kernels.cuda.base import KernelSource
from polykit.runtime.cuda.nvrtc import cache_dir, cache_key
from tests.kernel_units import ARCHES, UNIT_SECONDS, _unit_lock, compile_once, module_chunks

GOOD = 'extern "C" __global__ void k{i}(float* x) {{ x[threadIdx.x] += {i}.0f; }}\n'


def test_a_slow_module_is_split_into_near_equal_interleaved_parts():
    chunks = [c for c in module_chunks(ARCHES[:1]) if c.module == "int8.weight_only"]
    assert UNIT_SECONDS["int8.weight_only"] > 0 and len(chunks) > 1
    assert [c.part for c in chunks] == list(range(1, len(chunks) + 1)) and {c.parts for c in chunks} == {len(chunks)}
    assert max(len(c.units) for c in chunks) - min(len(c.units) for c in chunks) <= 1
    from polykit.kernels.cuda.int8.weight_only import compile_variants
    from polykit.runtime.cuda.nvrtc import unique_units

    keys = [u.key() for u in unique_units(compile_variants())]
    assert [[u.key() for u in c.units] for c in chunks] == [keys[i::len(chunks)] for i in range(len(chunks))]
    assert chunks[0].id == f"{ARCHES[0]}-int8.weight_only-1of{len(chunks)}"


def test_units_pinned_to_an_arch_are_in_the_first_arch_chunks_only():
    chunks = module_chunks()
    assert any(u.arch for c in chunks if c.arch == ARCHES[0] for u in c.units)
    assert not any(u.arch for c in chunks if c.arch != ARCHES[0] for u in c.units)


def test_compile_once_compiles_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKIT_CACHE_DIR", str(tmp_path))
    units = [KernelSource(f"k{i}", code=GOOD.format(i=i)) for i in range(2)]
    cubins = compile_once(units + units[:1], "sm_80")  # a unit given twice compiles once
    assert sorted(cubins) == sorted(u.key() for u in units)
    assert all(blob[:4] == b"\x7fELF" for blob in cubins.values())
    assert len(list((tmp_path / "kernels" / "sm_80").glob("*.cubin"))) == 2


def test_a_unit_another_process_is_compiling_is_read_from_the_cache_after_it(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKIT_CACHE_DIR", str(tmp_path))
    busy, free = (KernelSource(f"k{i}", code=GOOD.format(i=i)) for i in range(2))
    entry = cache_dir() / "sm_80" / f"{cache_key(busy, 'sm_80')}.cubin"
    free_entry = cache_dir() / "sm_80" / f"{cache_key(free, 'sm_80')}.cubin"
    stand_in = b"\x7fELF built by the other process"
    result: dict = {}
    with _unit_lock(entry.with_suffix(".lock"), blocking=True) as held:  # "another process" holds `busy`
        assert held
        worker = threading.Thread(target=lambda: result.update(compile_once([busy, free], "sm_80")))
        worker.start()
        # `busy` comes first but is left for last: `free` compiles while `busy` is still locked
        pause = threading.Event()
        for _ in range(6000):  # a bound, not a timing check: at most 5 minutes
            if free_entry.is_file() or not worker.is_alive():
                break
            pause.wait(0.05)
        assert free_entry.is_file() and not entry.is_file()
        entry.write_bytes(stand_in)  # what the other process's compile leaves in the cache
    worker.join(timeout=300)
    assert not worker.is_alive()
    assert result[busy.key()] == stand_in  # read, not compiled a second time
    assert result[free.key()][:4] == b"\x7fELF" and result[free.key()] != stand_in
