"""Compile units for the tests that check kernels compile with NVRTC (no GPU needed).

`module_chunks` splits every unit that `polykit.kernels.cuda.all_compile_variants()` declares into small
tests (one kernel module, or a part of a slow one, and one arch) so xdist spreads CI's NVRTC compile
over all its workers. `compile_once` compiles units through this run's shared kernel cache
(`shared_kernel_cache` in tests/conftest.py) with a lock a unit: two tests that need the same unit at
the same time (the NVRTC test's chunk and a kernel family's own compile test) compile it once.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from typing import Iterable, NamedTuple

#: NVRTC seconds a unit of a module takes on one core at full optimization (compile_source), for splitting the
#: compile into tests of about CHUNK_SECONDS each. ESTIMATES: the mean of two units a module and arch, timed once on a
#: 2-core CI-like machine (weight_only's units took 6 to 21 s each), reduce.norm and flash_attention_sm90 from their
#: chunks' times in a first split (norm_warp's NW_MAPS units with 16 or 32 chunks: 24 to 30 s each);
#: any other module counts DEFAULT_UNIT_SECONDS.
#: Only the split depends on them: every unit compiles whatever they say.
UNIT_SECONDS = {"int8.weight_only": 14.0, "int8.int8": 13.0, "pointwise.pointwise": 9.0, "conv.conv_nhwc": 6.0,
                "reduce.norm": 6.0, "int8.fp8_gemm_sm90": 3.0, "int8.fp8_conv_sm90": 3.0, "int8.int8_sm90": 3.0,
                "int8.int8_gemm_sm90": 3.0,  # (an estimate: int8_sm90's; its units took 1 to 5 s with ptxas -v here)
                "attention.flash_attention_sm90": 3.0}
DEFAULT_UNIT_SECONDS = 2.0
CHUNK_SECONDS = 30.0

ARCHES = ("sm_90", "sm_80")
#: arches whose chunks run NVRTC's front end alone (nvrtc.check_front_end: every C++ / CUDA error of the
#: `__CUDA_ARCH__ < 900` branches, template instantiations included, no optimizer or ptxas): the second arch's
#: checks; its inline PTX is what sm_90's cubins assemble too. Units pinned to an arch (sm_90a) compile with the first.
#: (Before 2026-12-07 this compiled PTX: ~40 % of a cubin's NVRTC time, ~9 CI minutes of 2 cores' CPU.)
FRONT_END_ARCHES = ("sm_80",)
#: a front-end unit's share of a cubin unit's NVRTC seconds (measured 2026-12-07: a pointwise unit 0.09 / 9.1 s,
#: weight_only's first unit under 0.05 / 4.7 s)
FRONT_END_SHARE = 0.02
#: the other arches' chunks compile cubins at NVRTC's fastest level (nvrtc.check_compiles: code generation and
#: ptxas over every instruction, inline PTX included; the optimized cubins are the GPU runs'): a unit's share of its
#: full compile (measured 2026-12-07, one unit a module, NVRTC 13.5: 0.05 to 0.33, 0.16 for weight_only, 0.27 for
#: pointwise). int8.int8's units fail at that level in NVRTC 13.5 and compile whole (FAST_SHARE_OF: 1).
FAST_SHARE = 0.25
FAST_SHARE_OF = {"int8.int8": 1.0}


def unit_seconds(module: str, arch: str) -> float:
    """A unit's estimated NVRTC seconds in its chunk test (only the split depends on it)."""
    full = UNIT_SECONDS.get(module, DEFAULT_UNIT_SECONDS)
    return full * (FRONT_END_SHARE if arch in FRONT_END_ARCHES else FAST_SHARE_OF.get(module, FAST_SHARE))


class Chunk(NamedTuple):
    arch: str
    module: str  # the module's name under polykit.kernels.cuda
    part: int  # 1-based
    parts: int
    units: tuple

    @property
    def id(self) -> str:
        return f"{self.arch}-{self.module}" + (f"-{self.part}of{self.parts}" if self.parts > 1 else "")


def module_units() -> list[tuple[str, list]]:
    """(module, its units) for every module with compile variants, in `kernel_modules()` order; a unit
    that several modules declare (the same rendered source) belongs to the first one only."""
    import polykit.kernels.cuda as cuda_kernels
    from polykit.runtime.cuda.nvrtc import unique_units

    seen: set[str] = set()
    out = []
    for name in cuda_kernels.kernel_modules():
        module = importlib.import_module(name)
        if not hasattr(module, "compile_variants"):
            continue
        own = [u for u in unique_units(module.compile_variants()) if u.key() not in seen]
        seen.update(u.key() for u in own)
        out.append((name.removeprefix(f"{cuda_kernels.__name__}."), own))
    return out


def module_chunks(arches: Iterable[str] = ARCHES) -> list[Chunk]:
    """Every unit of every module, for every arch, a module's units in near-equal interleaved parts of
    about CHUNK_SECONDS (estimated: UNIT_SECONDS). A unit pinned to an arch (u.arch, sm_90a) compiles the same
    for either arch: it is in the first arch's chunks only."""
    arches = tuple(arches)
    chunks = []
    for arch in arches:
        for module, units in module_units():
            units = [u for u in units if not u.arch or arch == arches[0]]
            if not units:
                continue
            seconds = len(units) * unit_seconds(module, arch)
            parts = min(len(units), max(1, math.ceil(seconds / CHUNK_SECONDS)))
            for part in range(parts):  # interleaved: a module's slow variants sit together, the parts share them
                chunks.append(Chunk(arch, module, part + 1, parts, tuple(units[part::parts])))
    return chunks


@contextlib.contextmanager
def _unit_lock(path, blocking: bool):
    """An exclusive lock on `path` (a file beside the unit's cache entry); yields False when `blocking`
    is off and another process holds it. Without fcntl (not POSIX) it always yields True, unlocked."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compile_once(units: Iterable, arch: str) -> dict[str, bytes]:
    """{KernelSource.key(): cubin} for every distinct unit of `units`, compiled with NVRTC in this process
    through the kernel cache (POLYKIT_CACHE_DIR: use the `shared_kernel_cache` fixture). A unit another
    process is compiling right now is left for last and then read from the cache once that process is
    done, instead of being compiled a second time; a unit that fails raises DeviceError with NVRTC's log."""
    from polykit.runtime.cuda.nvrtc import cache_dir, cache_key, compile_cached, unique_units

    def lock_path(u):
        return cache_dir() / arch / f"{cache_key(u, arch)}.lock"  # beside compile_cached's entry

    out: dict[str, bytes] = {}
    busy = []
    for u in unique_units(units):
        with _unit_lock(lock_path(u), blocking=False) as held:
            if held:
                out[u.key()] = compile_cached(u, arch)
            else:
                busy.append(u)
    for u in busy:
        with _unit_lock(lock_path(u), blocking=True):
            out[u.key()] = compile_cached(u, arch)
    return out


def check_all(units: Iterable, arch: str) -> int:
    """Every distinct unit of `units` compiled for `arch` at NVRTC's fastest level (nvrtc.check_compiles, the NVRTC
    test's check: ptxas over every instruction; DeviceError with NVRTC's log on failure), nothing cached: a family's
    "every variant compiles" test, which needs no cubin's bytes (compile_once gives the optimized ones). Returns the
    count of distinct units checked."""
    from polykit.runtime.cuda.nvrtc import check_compiles, unique_units

    distinct = unique_units(units)
    for u in distinct:
        check_compiles(u, arch)
    return len(distinct)
