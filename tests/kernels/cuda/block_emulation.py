"""Run a block-cooperative CUDA kernel on the host, every thread of a block a real thread.

test_lowp_emulated.py runs grid-stride kernels as one thread; a kernel that stages tiles in
shared memory needs its whole block: here each block of the launch runs as blockDim.x
std::threads that share the module's one shared-memory buffer (blocks run one after another)
and meet at a std::barrier in __syncthreads. The kernel's own source is compiled by g++ as a
shared library with a prelude that stands in for the CUDA builtins (threadIdx / blockIdx are
thread_local; blocks of one, two or three dimensions) and test_lowp_emulated's IEEE stand-ins for
dtypes.cuh's PTX conversions; a generated `emu_launch(grid, block, <the kernel's parameters>)`
runs the grid. A missing barrier shows up as a wrong or changing result, as on a GPU. Consecutive
32 threads (linear thread index) form a warp: warp_emulation.py gives the warp collectives
(shuffles, __syncwarp) and the kernels' warp-level PTX (mma.sync, ldmatrix, cp.async), each a
rendezvous of the warp's threads, which do not otherwise run in lockstep. A thread that returns
leaves its block's and its warp's barriers; a block still running after EMU_BLOCK_SECONDS (300)
aborts the process with the reason, where threads waiting at a barrier or collective that others
never reach would hang it.

`EmulatedLauncher` is a Launcher for a tactic's own enqueue: its kernels run here.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor, KernelSource
from tests.kernels.cuda.warp_emulation import WARP_PRELUDE, translate_asm

PRELUDE = r"""
#include <math.h>
#include <string.h>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#ifndef EMU_BLOCK_SECONDS
#define EMU_BLOCK_SECONDS 300   // the longest a block may run (a hang fails the launch)
#endif
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__
#define __constant__ static  // host memory the kernels only read (weight_only_mma.cuh's masks)
#define __shared__ static  // one array a kernel instance, shared by the block's threads (blocks run one after another)
struct Dim3 { unsigned x, y, z; };
static thread_local Dim3 threadIdx, blockIdx;
static Dim3 blockDim, gridDim;
static std::barrier<>* emu_barrier;
inline void __syncthreads() { emu_barrier->arrive_and_wait(); }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
inline float __fdiv_rn(float a, float b) { return a / b; }  // IEEE division on the host, as on the GPU
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
// CUDA's per-byte SIMD intrinsics (4 bytes of a word, each on its own)
template <class F> inline unsigned emu_bytes4(unsigned a, unsigned b, F f) {
  unsigned d = 0;
  for (int i = 0; i < 4; ++i) d |= (unsigned)(f((a >> 8 * i) & 255u, (b >> 8 * i) & 255u) & 255u) << 8 * i;
  return d;
}
inline unsigned __vcmpeq4(unsigned a, unsigned b) { return emu_bytes4(a, b, [](unsigned x, unsigned y) { return x == y ? 255u : 0u; }); }
inline unsigned __vcmpgeu4(unsigned a, unsigned b) { return emu_bytes4(a, b, [](unsigned x, unsigned y) { return x >= y ? 255u : 0u; }); }
inline unsigned __vmaxu4(unsigned a, unsigned b) { return emu_bytes4(a, b, [](unsigned x, unsigned y) { return x > y ? x : y; }); }
inline unsigned __vmaxs4(unsigned a, unsigned b) {
  return emu_bytes4(a, b, [](unsigned x, unsigned y) { return (signed char)x > (signed char)y ? x : y; });
}
"""

#: g++'s flags for an emulated kernel's library and for the prelude's precompiled headers (which must match)
CXX_FLAGS = ("-std=c++20", "-O1", "-w", "-fPIC", "-pthread")


def _write_once(path: Path, write) -> None:
    """`write(tmp)` makes `path`'s content under a name of this process's own, renamed into place:
    processes that build the same file at once never see a partial one."""
    tmp = path.with_name(f".{os.getpid()}-{path.name}")
    write(tmp)
    os.replace(tmp, path)


def precompiled_prelude(folder: Path, cxx: str) -> Path:
    """A header of PRELUDE's standard #includes in `folder`, precompiled there by `cxx` (with
    CXX_FLAGS) unless it already is: a library compiled with `-include` of it skips parsing those
    headers again (about 1 s of each g++ run). The source keeps its own #includes (guarded: no-ops
    after the header), and g++ reads the header's text where the .gch does not fit."""
    text = "".join(line + "\n" for line in PRELUDE.splitlines() if line.startswith("#include"))
    key = hashlib.sha256("\0".join((cxx, *CXX_FLAGS, text)).encode()).hexdigest()[:16]
    header = folder / f"prelude-{key}.h"
    gch = header.with_name(header.name + ".gch")
    if not gch.exists():
        _write_once(header, lambda tmp: tmp.write_text(text))
        _write_once(gch, lambda tmp: subprocess.run([cxx, *CXX_FLAGS, "-x", "c++-header", "-o", str(tmp), str(header)],
                                                    check=True))
    return header


def host_source(cuda: str, kernel: str, params: str, args: str, smem_bytes: int, eager_copies: bool = False,
                unmodelled: str = "error") -> str:
    """`cuda` (a rendered module) as host C++ with `emu_launch(gx, gy, gz, bx, <params>)`, which
    runs kernel `kernel(<args>)` over the grid; `smem_bytes` of dynamic shared memory; cp.async
    copies deferred to their wait, or landing at once (`eager_copies`: warp_emulation.py); PTX the
    emulation does not model an error, or a run-time trap (`unmodelled`: translate_asm)."""
    from tests.kernels.cuda.test_lowp_emulated import HALF

    for name, repl in HALF.items():
        cuda = re.sub(r"__device__ __forceinline__ \w+ " + name + r"\(.*?\n\}", repl, cuda, count=1, flags=re.S)
    cuda = translate_asm(cuda, unmodelled)
    # dynamic shared memory: one buffer at namespace scope in place of the kernel's `extern` declaration
    extern = r"extern __shared__ __align__\(\d+\) unsigned char (\w+)\[\];"
    shared = re.findall(extern, cuda)
    cuda = re.sub(extern, "", cuda)
    head = "".join(f"alignas(16) unsigned char {name}[{smem_bytes}];\n" for name in dict.fromkeys(shared))
    # one host thread per thread of a block, started once a launch and reused by every block of the
    # grid (blocks run one after another): each block starts the threads' kernel call afresh (its
    # block index, new barriers, no cp.async copies pending) and ends when all of them have returned
    runner = f"""
extern "C" void emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, {params}) {{
  gridDim = {{gx, gy, gz}};
  blockDim = {{bx, by, bz}};
  const unsigned emu_threads = bx * by * bz, emu_nwarps = (emu_threads + 31) / 32;
  std::mutex emu_mutex;
  std::condition_variable emu_start, emu_end;
  unsigned long long emu_started = 0;  // blocks started: a thread runs the kernel once for each
  unsigned emu_done = 0;               // threads of the running block that returned
  bool emu_quit = false;
  Dim3 emu_block;
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < emu_threads; ++t)
    threads.emplace_back([=, &emu_mutex, &emu_start, &emu_end, &emu_started, &emu_done, &emu_quit, &emu_block] {{
      threadIdx = {{t % bx, t / bx % by, t / (bx * by)}};
      emu_lane = t % 32;
      emu_warp_id = t / 32;
      for (unsigned long long ran = 0;; ++ran) {{
        {{
          std::unique_lock<std::mutex> lock(emu_mutex);
          emu_start.wait(lock, [&] {{ return emu_quit || emu_started > ran; }});
          if (emu_quit) return;
          blockIdx = emu_block;
        }}
        emu_groups.clear();
        emu_open.clear();
        {kernel}({args});
        emu_warps[t / 32].bar->arrive_and_drop();   // a returned thread no longer holds its warp
        emu_barrier->arrive_and_drop();             // or its block back
        {{ std::lock_guard<std::mutex> lock(emu_mutex); ++emu_done; }}
        emu_end.notify_one();
      }}
    }});
  for (unsigned emu_z = 0; emu_z < gz; ++emu_z)  // not x, y, z: a kernel's parameters may be named so
    for (unsigned emu_y = 0; emu_y < gy; ++emu_y)
      for (unsigned emu_x = 0; emu_x < gx; ++emu_x) {{
        std::barrier<> bar((std::ptrdiff_t)emu_threads);
        std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
        std::vector<EmuWarp> warps(emu_nwarps);
        for (unsigned w = 0; w < emu_nwarps; ++w) {{
          warps[w].lanes = emu_threads - 32 * w < 32 ? emu_threads - 32 * w : 32;
          warp_bars.emplace_back(new std::barrier<>((std::ptrdiff_t)warps[w].lanes));
          warps[w].bar = warp_bars.back().get();
        }}
        std::unique_lock<std::mutex> lock(emu_mutex);
        emu_barrier = &bar;
        emu_warps = warps.data();
        emu_block = {{emu_x, emu_y, emu_z}};
        emu_done = 0;
        ++emu_started;
        emu_start.notify_all();
        // a barrier or collective some threads never reach hangs the block: fail instead
        if (!emu_end.wait_for(lock, std::chrono::seconds(EMU_BLOCK_SECONDS), [&] {{ return emu_done == emu_threads; }}))
          emu_fail("a block ran past EMU_BLOCK_SECONDS: a barrier or collective some threads never reach");
      }}
  {{ std::lock_guard<std::mutex> lock(emu_mutex); emu_quit = true; }}
  emu_start.notify_all();
  for (auto& th : threads) th.join();
}}
"""
    return PRELUDE + ("#define EMU_CP_EAGER 1\n" if eager_copies else "") + WARP_PRELUDE + head + cuda + runner


class EmulatedLauncher:
    """A Launcher whose kernels run on the host (compiled once per source text into `build_dir`,
    which several launchers and processes may share); `params` and `args` name the kernel's
    parameter list and its argument names (macros of the .cu); `prelude`, a header of
    `precompiled_prelude`, spares each compile the standard headers."""

    stream = None
    communicator = None
    sm_count = 132

    #: PTX the emulation does not model: a compile error, or a run-time trap (translate_asm)
    unmodelled = "error"

    def __init__(self, build_dir: Path, cxx: str, params: str, args: str, smem_bytes: int = 1 << 18,
                 eager_copies: bool = False, prelude: Path | None = None):
        self.dir, self.cxx, self.params, self.args, self.smem = build_dir, cxx, params, args, smem_bytes
        self.eager_copies, self.prelude = eager_copies, prelude
        self.libs: dict[str, ctypes.CDLL] = {}
        self.launches: list[tuple[KernelSource, tuple[int, ...], tuple[int, ...], int]] = []

    def _lib(self, kernel: KernelSource) -> ctypes.CDLL:
        text = host_source(kernel.render(), kernel.name, self.params, self.args, self.smem, self.eager_copies,
                           self.unmodelled)
        key = hashlib.sha256((self.cxx + text).encode()).hexdigest()[:16]
        if key not in self.libs:
            src, lib = self.dir / f"{key}.cpp", self.dir / f"{key}.so"
            if not lib.exists():
                _write_once(src, lambda tmp: tmp.write_text(text))
                include = ["-include", str(self.prelude)] if self.prelude else []
                _write_once(lib, lambda tmp: subprocess.run([self.cxx, *CXX_FLAGS, "-shared", *include, "-o", str(tmp),
                                                             str(src)], check=True))
            self.libs[key] = ctypes.CDLL(str(lib))
        return self.libs[key]

    def launch(self, kernel: KernelSource, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
               shared_mem: int = 0) -> None:
        if shared_mem > self.smem:
            raise AssertionError(f"{shared_mem} B of shared memory, the emulation has {self.smem}")
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        self.launches.append((kernel, grid, block, shared_mem))
        c_args = []
        for a in args:
            if isinstance(a, DeviceTensor):
                c_args.append(ctypes.c_void_p(a.ptr))
            elif isinstance(a, np.int32):
                c_args.append(ctypes.c_int(int(a)))
            elif isinstance(a, np.float32):
                c_args.append(ctypes.c_float(float(a)))
            elif isinstance(a, (np.float64, float)):
                c_args.append(ctypes.c_double(float(a)))
            else:
                c_args.append(ctypes.c_longlong(int(a)))
        self._lib(kernel).emu_launch(*(ctypes.c_uint(g) for g in grid), *(ctypes.c_uint(b) for b in block), *c_args)

    def workspace(self, nbytes: int) -> int:
        raise AssertionError("the emulated kernels borrow no workspace")


def kernel_signature(file: str, kernel: str) -> tuple[str, str]:
    """(parameter list, argument names) of `kernel` in kernel source `file`: EmulatedLauncher's
    `params` and `args`; for a kernel declared `kernel(X_PARAMS)`, the macros X_PARAMS and X_ARGS
    (the .cu defines both: flash_attention.cu's FA_PARAMS, whose last parameter a define adds)."""
    from polykit.kernels.cuda.base import kernel_file

    found = re.search(kernel + r"\((.*?)\)\s*\{", kernel_file(file, kernel).read_text(), re.S)
    if found is None:
        raise ValueError(f"no kernel {kernel!r} in {file}")
    params = " ".join(found.group(1).replace("__restrict__", "").split())
    if re.fullmatch(r"\w+_PARAMS", params):
        return params, params[:-len("PARAMS")] + "ARGS"
    return params, ", ".join(p.split()[-1] for p in params.split(","))


def host_launcher(tmp_path_factory, params: str, args: str, cls: type = EmulatedLauncher, **kw):
    """An emulated launcher (`cls`, given `kw`) building with the host's g++ in this test run's one
    emulation folder (`run_builds`); the test is skipped where there is no g++."""
    import shutil

    import pytest

    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    folder = run_builds(tmp_path_factory)
    return cls(folder, cxx, params, args, prelude=precompiled_prelude(folder, cxx), **kw)


def run_builds(tmp_path_factory) -> Path:
    """The folder where this test run's emulated kernels build, shared by every test and xdist
    worker of the run: a library is named by the hash of its whole source and compiler, so a
    kernel that several tests (or both workers) launch compiles once a run."""
    from tests.run_dirs import run_shared_dir

    return run_shared_dir(tmp_path_factory, "emulated-kernels")
