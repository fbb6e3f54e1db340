"""NVRTC compilation of KernelSource records to cubin, with an on-disk kernel cache.

A compile unit is the rendered source text (a .cu file plus its #defines, or generated
code); several KernelSource records that differ only in `name` share one cubin. Cubins are
cached under the user cache directory keyed by (source text, the .cuh headers beside the
kernels, options, NVRTC version, arch); writes go to a temporary file renamed into place,
so several processes building at once never see a partial entry. Beside each `<key>.cubin` a
`<key>.json` names the kernel that first compiled it (name, file, defines; for reading the cache by hand
and for the zoo's prepared-kernels check, never read back here).

Needs only NVRTC (no GPU, no driver): CI compiles every variant through `compile_source`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import CUDA_DIR, KernelSource

#: NVRTC options every kernel is compiled with (part of the cache key).
BASE_OPTIONS: tuple[tuple[str, str], ...] = (("std", "c++17"),)


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise DeviceError(f"NVRTC is not available ({exc})",
                          hint="pip install 'polykit[cuda]' (cuda-bindings and nvidia-cuda-nvrtc)") from exc
    err, major, minor = nvrtc.nvrtcVersion()
    if int(err) != 0:
        raise DeviceError("NVRTC could not be loaded", hint="pip install nvidia-cuda-nvrtc")
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=1)
def headers_digest() -> str:
    """Hash of every .cuh header kernels may include (they are not part of render())."""
    h = hashlib.sha256()
    for p in sorted(CUDA_DIR.glob("*.cuh")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path:
    """$POLYKIT_CACHE_DIR/kernels, else $XDG_CACHE_HOME/polykit/kernels, else ~/.cache/polykit/kernels."""
    root = os.environ.get("POLYKIT_CACHE_DIR")
    if root:
        return Path(root) / "kernels"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "polykit" / "kernels"


def unit_arch(source: KernelSource, arch: str) -> str:
    """The arch `source` compiles for on a device of `arch` (its own, when it names one)."""
    return source.arch or arch


def cache_key(source: KernelSource, arch: str) -> str:
    h = hashlib.sha256()
    for part in (source.render(), headers_digest(), repr(BASE_OPTIONS), nvrtc_version(), unit_arch(source, arch)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:32]


def _program_options(arch: str, name: str):
    from cuda.core import ProgramOptions

    include = [str(CUDA_DIR)]
    return ProgramOptions(arch=arch, name=name, include_path=include, **dict(BASE_OPTIONS))


def compile_source(source: KernelSource, arch: str) -> bytes:
    """Compile `source` to a cubin for `arch` ("sm_90"); DeviceError with the NVRTC log on failure."""
    from cuda.core import Program

    label = source.file or f"{source.name}.cu"
    arch = unit_arch(source, arch)
    try:
        program = Program(source.render(), "c++", _program_options(arch, label))
        obj = program.compile("cubin")
    except Exception as exc:  # cuda.core raises its own NVRTCError carrying the log
        raise DeviceError(
            f"NVRTC failed to compile kernel {source.name!r} ({label}) for {arch}:\n{exc}",
            where=label,
            hint="fix the kernel source; the compiler log is above",
        ) from exc
    return bytes(obj.code)


def check_front_end(source: KernelSource, arch: str) -> None:
    """`source` through NVRTC's C++ / CUDA front end alone for `arch`'s virtual architecture (compute_XY,
    `--fdevice-syntax-only`: parsing, overloads and every template instantiation, no optimizer, no ptxas, no
    driver): CI's check of a second arch, ~2 % of a cubin's time (0.09 s against 3.7 s for PTX on a pointwise
    unit). Inline PTX is never read here (sm_90's cubins assemble it). An NVRTC without the option (before
    CUDA 12.2) compiles to PTX instead. DeviceError with NVRTC's log on failure."""
    arch = unit_arch(source, arch)
    base = [f"-arch=compute_{arch.removeprefix('sm_')}", *_shared_options()]
    _check(source, arch, (base + ["--fdevice-syntax-only"], base))


#: NVRTC's fastest code generation (CUDA 12.8+): few optimizations in NVVM and ptxas
FAST_COMPILE = "--Ofast-compile=max"


def check_compiles(source: KernelSource, arch: str) -> None:
    """`source` compiled to a cubin for `arch` at NVRTC's fastest level (FAST_COMPILE: the front end, NVVM's code
    generation and ptxas assembling every instruction, inline PTX included, with few optimizations), nothing
    cached: CI's check that every variant compiles, 3-20x faster than compile_source (measured 2026-12-07,
    NVRTC 13.5, one unit a module: reduce.norm 0.28 / 5.5 s, conv_nhwc 0.27 / 5.7, weight_only 0.43 / 2.7).
    Where NVRTC fails at that level the full compile_source decides (13.5 stops int8.cu's units there with
    "unsupported operation", a unit that compiles whole), and an NVRTC without the option compiles whole.
    DeviceError with NVRTC's log when the unit does not compile."""
    arch = unit_arch(source, arch)
    try:
        _check(source, arch, ([f"-arch={arch}", *_shared_options(), FAST_COMPILE],), cubin=True)
    except DeviceError:
        compile_source(source, arch)


def _shared_options() -> list[str]:
    return [f"--include-path={CUDA_DIR}", *(f"--{k}={v}" for k, v in BASE_OPTIONS)]


def _check(source: KernelSource, arch: str, attempts: Sequence[list[str]], cubin: bool = False) -> None:
    """Compile `source` with the first of `attempts` (option lists) that NVRTC accepts (a later one is tried only
    where an earlier one is an invalid option there); DeviceError with NVRTC's log where that compile fails.
    `cubin`: an empty cubin is a failure too."""
    from cuda.bindings import nvrtc

    label = source.file or f"{source.name}.cu"
    for i, options in enumerate(attempts):
        raw = [o.encode() for o in options]
        err, program = nvrtc.nvrtcCreateProgram(source.render().encode(), label.encode(), 0, [], [])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise DeviceError(f"NVRTC could not create a program for kernel {source.name!r} ({err})", where=label)
        try:
            (err,) = nvrtc.nvrtcCompileProgram(program, len(raw), raw)
            if err == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION and i + 1 < len(attempts):
                continue  # an NVRTC that lacks this attempt's option: the next one
            if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                _, size = nvrtc.nvrtcGetProgramLogSize(program)
                log = b" " * size
                nvrtc.nvrtcGetProgramLog(program, log)
                raise DeviceError(f"NVRTC failed to compile kernel {source.name!r} ({label}) for {arch}:\n"
                                  f"{log.decode(errors='replace')}", where=label, hint="fix the kernel source; the "
                                  "compiler log is above")
            if cubin:
                err, size = nvrtc.nvrtcGetCUBINSize(program)
                if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size == 0:
                    raise DeviceError(f"NVRTC gave no cubin for kernel {source.name!r} ({label}) for {arch}",
                                      where=label)
            return
        finally:
            nvrtc.nvrtcDestroyProgram(program)


def compile_cached(source: KernelSource, arch: str, cache: bool = True) -> bytes:
    """`compile_source` through the on-disk cache (a corrupt or unreadable entry is rebuilt)."""
    if not cache:
        return compile_source(source, arch)
    path = _cached_path(source, arch)
    try:
        data = path.read_bytes()
        if data[:4] == b"\x7fELF":
            return data
    except OSError:
        pass
    data = compile_source(source, arch)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".cubin")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        # which kernel the hash-named entry holds, for whoever reads the cache (never read back here)
        path.with_suffix(".json").write_text(json.dumps({**source.to_json(), "code": None}))
    except OSError:
        pass  # an unwritable cache only costs a recompile next time
    return data


def unique_units(sources: Iterable[KernelSource]) -> list[KernelSource]:
    """One KernelSource per distinct compile unit (same rendered text)."""
    seen: dict[str, KernelSource] = {}
    for s in sources:
        seen.setdefault(s.key(), s)
    return list(seen.values())


def _cached_path(source: KernelSource, arch: str) -> Path:
    return cache_dir() / arch / f"{cache_key(source, arch)}.cubin"


def compile_many(sources: Sequence[KernelSource], arch: str, *, cache: bool = True,
                 workers: int | None = None) -> dict[str, bytes]:
    """Compile every distinct unit of `sources`; returns {KernelSource.key(): cubin}.

    NVRTC holds the GIL, so several cold units compile in worker processes. They are
    started as `python -m polykit.runtime.cuda.nvrtc` (not multiprocessing): that never
    re-imports the caller's __main__, so a user script needs no `if __name__ == "__main__"`
    guard, and the children never inherit a CUDA context. Workers fill the on-disk cache;
    a unit a worker could not build is compiled here, so its NVRTC log reaches the caller.
    """
    units = unique_units(sources)
    if not units:
        return {}
    cold = [u for u in units if cache and not _cached_path(u, arch).is_file()]
    workers = min(len(cold), workers or os.cpu_count() or 1)
    if workers > 1:
        _compile_in_workers(cold, arch, workers)
    return {u.key(): compile_cached(u, arch, cache) for u in units}


def _compile_in_workers(units: Sequence[KernelSource], arch: str, workers: int) -> None:
    import subprocess
    import sys

    chunks = [units[i::workers] for i in range(workers)]
    procs = []
    for chunk in chunks:
        payload = json.dumps({"arch": arch, "sources": [u.to_json() for u in chunk]})
        proc = subprocess.Popen([sys.executable, "-m", "polykit.runtime.cuda.nvrtc"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc.stdin.write(payload.encode())
        proc.stdin.close()
        procs.append(proc)
    for proc in procs:
        proc.wait()  # failures are recompiled (and reported) by the caller


def _worker_main() -> None:
    """Compile the units given as JSON on stdin into the cache (used by compile_many)."""
    import sys

    job = json.loads(sys.stdin.read())
    for src in job["sources"]:
        try:
            compile_cached(KernelSource.from_json(src), job["arch"], True)
        except DeviceError:
            pass


if __name__ == "__main__":
    _worker_main()
