"""warp_emulation.py's primitives, each through a tiny kernel against numpy: the shuffles (widths,
lanes past a segment, 64-bit values, two warps apart), mma.sync m16n8k16 f16 / bf16 and m16n8k32
s8 (fragments built from the PTX ISA's layouts by the kernel, so a wrong layout on either side is a
wrong product), ldmatrix .x1 / .x2 / .x4 with and without .trans, cp.async with src-size zero
fill, commit groups and wait_group (deferred: what was not waited for is not there yet; eager:
there at once). The same kernels run on the GPU (gpu-marked) against the same expectations, where
the emulation's choices are the hardware's (a copy not yet waited for is indeterminate there)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from polykit.kernels.cuda.base import DeviceTensor, KernelSource

rng = np.random.default_rng(41)

SOURCE = r"""
typedef unsigned int u32;
#define WE_PARAMS const u32* in0, const u32* in1, u32* out, int arg
#define WE_ARGS in0, in1, out, arg
#define FULL 0xffffffffu

// out[t][0..7]: xor 5, idx (7 lane + 3) % 32, down 3, up 2, xor 9 width 8, down 3 width 8, a 64-bit value
// from lane 31 - lane (lo, hi)
extern "C" __global__ void we_shuffles(WE_PARAMS) {
  const int t = threadIdx.x, lane = t % 32;
  const u32 v = in0[t];
  u32* o = out + t * 8;
  o[0] = __shfl_xor_sync(FULL, v, 5);
  o[1] = __shfl_sync(FULL, v, (lane * 7 + 3) % 32);
  o[2] = __shfl_down_sync(FULL, v, 3);
  o[3] = __shfl_up_sync(FULL, v, 2);
  o[4] = __shfl_xor_sync(FULL, v, 9, 8);
  o[5] = __shfl_down_sync(FULL, v, 3, 8);
  const unsigned long long w = __shfl_sync(FULL, ((unsigned long long)v << 32) | (u32)t, 31 - lane);
  __syncwarp();
  o[6] = (u32)w;
  o[7] = (u32)(w >> 32);
}

__device__ __forceinline__ u32 we_pair(const unsigned short* p) { return (u32)p[0] | ((u32)p[1] << 16); }

__device__ __forceinline__ void we_mma_f16_op(float* c, const u32* a, const u32* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void we_mma_bf16_op(float* c, const u32* a, const u32* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D (16 x 8 floats, row-major) = A (16 x 16, row-major u16) * B (given as its 8 x 16 transpose) + C,
// C[row][col] = (row - col) / 4; fragments from the PTX ISA's m16n8k16 layouts
#define WE_MMA(name, op)                                                                                 \
  extern "C" __global__ void name(WE_PARAMS) {                                                           \
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;                                            \
    const unsigned short *A = (const unsigned short*)in0, *Bt = (const unsigned short*)in1;              \
    u32 a[4] = {we_pair(A + g * 16 + 2 * t), we_pair(A + (g + 8) * 16 + 2 * t),                          \
                we_pair(A + g * 16 + 2 * t + 8), we_pair(A + (g + 8) * 16 + 2 * t + 8)};                 \
    u32 b[2] = {we_pair(Bt + g * 16 + 2 * t), we_pair(Bt + g * 16 + 2 * t + 8)};                         \
    float c[4];                                                                                          \
    for (int e = 0; e < 4; ++e) c[e] = (float)((g + 8 * (e / 2)) - (2 * t + e % 2)) / 4;                 \
    op(c, a, b);                                                                                         \
    float* D = (float*)out;                                                                              \
    for (int e = 0; e < 4; ++e) D[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = c[e];                         \
  }
WE_MMA(we_mma_f16, we_mma_f16_op)
WE_MMA(we_mma_bf16, we_mma_bf16_op)

// D (16 x 8 ints) = A (16 x 32 s8) * B (its 8 x 32 transpose) + C, C[row][col] = row - col
extern "C" __global__ void we_mma_s8(WE_PARAMS) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  u32 a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = in0[((g + 8 * (i % 2)) * 32 + 4 * t + 16 * (i / 2)) / 4];
  for (int i = 0; i < 2; ++i) b[i] = in1[(g * 32 + 4 * t + 16 * i) / 4];
  int c[4];
  for (int e = 0; e < 4; ++e) c[e] = (g + 8 * (e / 2)) - (2 * t + e % 2);
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  for (int e = 0; e < 4; ++e) ((int*)out)[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = c[e];
}

// four 8 x 8 u16 matrices (in0, row-major) staged with rows 32 bytes apart; lane l gives row l % 8 of
// matrix l / 8; `arg` 0-2: x1, x2, x4, 3-5: the same .trans; out[l][0..3] the registers (0 unset)
extern "C" __global__ void we_ldmatrix(WE_PARAMS) {
  __shared__ __align__(16) unsigned short s[4 * 8 * 16];
  const int l = threadIdx.x;
  for (int i = l; i < 256; i += 32) s[(i / 8) * 16 + i % 8] = ((const unsigned short*)in0)[i];
  __syncthreads();
  const u32 addr = (u32)__cvta_generic_to_shared(s + ((l / 8) * 8 + l % 8) * 16);
  u32 r[4] = {0u, 0u, 0u, 0u};
  if (arg == 0) asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
  if (arg == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
  if (arg == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
  if (arg == 3) asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
  if (arg == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
  if (arg == 5)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
  for (int i = 0; i < 4; ++i) out[l * 4 + i] = r[i];
}

// lane l: a 16-byte chunk of in0 (src-size 0, 8 or 16 by l % 3) in commit group 0, one of in1 in group 1,
// into shared memory holding 0xAAAAAAAA; out[l]: both chunks after wait_group 1, then after wait_group 0
extern "C" __global__ void we_cp_async(WE_PARAMS) {
  __shared__ __align__(16) u32 s[2][32 * 4];
  const int l = threadIdx.x;
  for (int i = 0; i < 4; ++i) s[0][l * 4 + i] = s[1][l * 4 + i] = 0xAAAAAAAAu;
  for (int j = 0; j < 2; ++j) {
    const u32 dst = (u32)__cvta_generic_to_shared(&s[j][l * 4]);
    const u32* src = (j ? in1 : in0) + l * 4;
    const int size = j ? 16 : (l % 3) * 8;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(size) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.wait_group 1;" ::: "memory");
  for (int i = 0; i < 8; ++i) out[l * 16 + i] = s[i / 4][l * 4 + i % 4];
  asm volatile("cp.async.wait_all;" ::: "memory");
  for (int i = 0; i < 8; ++i) out[l * 16 + 8 + i] = s[i / 4][l * 4 + i % 4];
}
"""


def run_host(launcher, name: str, threads: int, in0: np.ndarray, in1: np.ndarray, out_words: int, arg: int = 0):
    out = np.zeros(out_words, np.uint32)
    args = [DeviceTensor(a.ctypes.data, a.shape, a.dtype) for a in (in0, in1, out)] + [np.int32(arg)]
    launcher.launch(KernelSource(name, code=SOURCE), (1,), (threads,), args)
    return out


def run_gpu(name: str, threads: int, in0: np.ndarray, in1: np.ndarray, out_words: int, arg: int = 0):
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules
    from polykit.runtime.cuda.memory import DeviceBuffer, download, upload

    kernel = KernelSource(name, code=SOURCE)
    modules = KernelModules(driver.current_device().arch)
    bufs = [DeviceBuffer(max(a.nbytes, 4), what=name) for a in (in0, in1)] + [DeviceBuffer(4 * out_words, what=name)]
    try:
        modules.load([kernel])
        for buf, a in zip(bufs, (in0, in1, np.zeros(out_words, np.uint32))):
            upload(buf.ptr, np.ascontiguousarray(a))
        CudaLauncher(modules, 0, lambda n: 0, name).launch(
            kernel, (1,), (threads,), [DeviceTensor(b.ptr, (1,), np.uint32) for b in bufs] + [np.int32(arg)])
        driver.synchronize()
        return download(bufs[2].ptr, (out_words,), np.uint32)
    finally:
        for buf in bufs:
            buf.free()
        modules.close()


@pytest.fixture(scope="module", params=["host", "eager", pytest.param("gpu", marks=pytest.mark.gpu)])
def run(request, tmp_path_factory):
    """run(name, threads, in0, in1, out_words, arg) -> the kernel's out words: on the host with
    deferred or eager copies, or on the GPU."""
    if request.param == "gpu":
        return run_gpu
    from tests.kernels.cuda.block_emulation import host_launcher

    launcher = host_launcher(tmp_path_factory, "WE_PARAMS", "WE_ARGS",
                             eager_copies=request.param == "eager")
    return lambda *a, **kw: run_host(launcher, *a, **kw)


def test_shuffles_read_the_lanes_cuda_names(run):
    v = rng.integers(0, 2**32, 64, dtype=np.uint32)
    out = run("we_shuffles", 64, v, v, 64 * 8).reshape(64, 8)
    t = np.arange(64)
    lane, base = t % 32, t - t % 32
    seg8 = lane - lane % 8
    own = np.arange(64)

    def src(lanes):
        return v[base + lanes]

    np.testing.assert_array_equal(out[:, 0], src(lane ^ 5))
    np.testing.assert_array_equal(out[:, 1], src((lane * 7 + 3) % 32))
    np.testing.assert_array_equal(out[:, 2], np.where(lane + 3 < 32, v[np.minimum(own + 3, 63)], v))
    np.testing.assert_array_equal(out[:, 3], np.where(lane >= 2, v[own - 2], v))
    # width 8: xor may reach an earlier segment, never a later one (its own value then)
    np.testing.assert_array_equal(out[:, 4], np.where((lane ^ 9) < seg8 + 8, src(lane ^ 9), v))
    np.testing.assert_array_equal(out[:, 5], np.where(lane + 3 < seg8 + 8, v[np.minimum(own + 3, 63)], v))
    np.testing.assert_array_equal(out[:, 6], (base + 31 - lane).astype(np.uint32))
    np.testing.assert_array_equal(out[:, 7], src(31 - lane))


@pytest.mark.parametrize("storage,kernel", [(np.float16, "we_mma_f16"), (ml_dtypes.bfloat16, "we_mma_bf16")])
@pytest.mark.parametrize("values", ["integers", "normal"])
def test_mma_m16n8k16_is_a_times_b_plus_c(run, storage, kernel, values):
    """Small integers: every product and sum exact, so D equals A B + C to the bit and any layout
    slip shows; normal values: float32 accumulation within 1e-6 of float64."""
    if values == "integers":
        a, b = rng.integers(-4, 5, (16, 16)), rng.integers(-4, 5, (16, 8))
    else:
        a, b = rng.standard_normal((16, 16)), rng.standard_normal((16, 8))
    a, b = a.astype(storage), b.astype(storage)
    bt = np.ascontiguousarray(b.T)
    d = run(kernel, 32, a.view(np.uint16).ravel(), bt.view(np.uint16).ravel(), 128).view(np.float32).reshape(16, 8)
    c = (np.arange(16)[:, None] - np.arange(8)[None, :]) / 4
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    if values == "integers":
        np.testing.assert_array_equal(d, want)
    else:
        np.testing.assert_allclose(d, want, rtol=1e-6, atol=1e-6)


def test_mma_m16n8k32_s8_is_a_times_b_plus_c(run):
    a, b = rng.integers(-128, 128, (16, 32), dtype=np.int8), rng.integers(-128, 128, (32, 8), dtype=np.int8)
    bt = np.ascontiguousarray(b.T)
    d = run("we_mma_s8", 32, a.ravel().view(np.uint32), bt.ravel().view(np.uint32), 128).view(np.int32).reshape(16, 8)
    c = np.arange(16)[:, None] - np.arange(8)[None, :]
    np.testing.assert_array_equal(d, a.astype(np.int64) @ b.astype(np.int64) + c)


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True], ids=["rows", "trans"])
def test_ldmatrix_gives_each_lane_its_fragment(run, count, trans):
    m = rng.integers(0, 2**16, (4, 8, 8), dtype=np.uint16)
    arg = {1: 0, 2: 1, 4: 2}[count] + 3 * trans
    regs = run("we_ldmatrix", 32, m.ravel(), m.ravel(), 128, arg).reshape(32, 4)
    lane = np.arange(32)
    src = m.transpose(0, 2, 1) if trans else m
    for i in range(4):
        lo, hi = src[i, lane // 4, 2 * (lane % 4)], src[i, lane // 4, 2 * (lane % 4) + 1]
        want = (lo.astype(np.uint32) | hi.astype(np.uint32) << 16) if i < count else np.zeros(32, np.uint32)
        np.testing.assert_array_equal(regs[:, i], want, err_msg=f"register {i}")


def test_cp_async_lands_at_its_wait_with_src_size_zero_fill(run, request):
    a, b = rng.integers(0, 2**32, (32, 4), dtype=np.uint32), rng.integers(0, 2**32, (32, 4), dtype=np.uint32)
    out = run("we_cp_async", 32, a.ravel(), b.ravel(), 32 * 16).reshape(32, 2, 2, 4)
    words = (np.arange(32) % 3 * 8) // 4       # src-size 0, 8, 16 bytes: words read, zeros after
    landed_a = np.where(np.arange(4)[None, :] < words[:, None], a, 0)
    mode = request.node.callspec.params["run"]
    np.testing.assert_array_equal(out[:, 0, 0], landed_a)                 # group 0 waited for
    np.testing.assert_array_equal(out[:, 1, 0], landed_a)
    np.testing.assert_array_equal(out[:, 1, 1], b)                        # group 1 after wait_all
    if mode == "host":   # deferred: group 1 not yet there at wait_group 1
        assert (out[:, 0, 1] == 0xAAAAAAAA).all()
    elif mode == "eager":
        np.testing.assert_array_equal(out[:, 0, 1], b)


def test_the_kernels_compile_with_nvrtc(shared_kernel_cache):
    """What the GPU runs of these tests launch (one module of every kernel above)."""
    from polykit.runtime.cuda.nvrtc import compile_many, unique_units

    names = re.findall(r'extern "C" __global__ void (\w+)\(', SOURCE) + ["we_mma_f16", "we_mma_bf16"]
    units = unique_units([KernelSource(name, code=SOURCE) for name in names])
    cubins = compile_many(units, "sm_80", workers=1)
    assert len(cubins) == len(units) == 1 and all(blob[:4] == b"\x7fELF" for blob in cubins.values())


def test_ptx_without_a_host_model_is_named():
    from tests.kernels.cuda.warp_emulation import translate_asm

    with pytest.raises(ValueError, match="mov.u64"):
        translate_asm('u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));')


#: lane 0 waits at the block's barrier, the others at the warp's: neither ever completes
DIVERGED = r"""
#define D_PARAMS int arg
#define D_ARGS arg
extern "C" __global__ void we_diverged(D_PARAMS) {
  if (threadIdx.x % 32 == arg) __syncthreads(); else __syncwarp();
}
"""


def test_a_block_that_never_finishes_fails_instead_of_hanging(tmp_path):
    """Threads that wait at collectives the others never reach: the launch aborts the process
    (here a child) with the reason once the block has run EMU_BLOCK_SECONDS (1 here)."""
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("g++") is None:
        pytest.skip("no host C++ compiler")
    child = (f"import numpy as np\n"
             f"from pathlib import Path\n"
             f"from polykit.kernels.cuda.base import KernelSource\n"
             f"from tests.kernels.cuda import block_emulation as be\n"
             f"be.PRELUDE = '#define EMU_BLOCK_SECONDS 1\\n' + be.PRELUDE\n"
             f"launcher = be.EmulatedLauncher(Path({str(tmp_path)!r}), {shutil.which('g++')!r}, 'D_PARAMS', 'D_ARGS')\n"
             f"launcher.launch(KernelSource('we_diverged', code={DIVERGED!r}), (1,), (32,), [np.int32(0)])\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode != 0 and "ran past EMU_BLOCK_SECONDS" in done.stderr, done.stderr[-2000:]


def test_unmodelled_ptx_is_an_error_or_with_trap_a_run_time_failure_that_names_it():
    """translate_asm: PTX it does not model stops the translation (ValueError), or with unmodelled="trap" becomes a
    statement that fails the process when it runs, naming the PTX (the sm90 epilogue harness compiles wgmma so);
    an empty template (a register fence) is nothing either way, and modelled PTX is translated the same."""
    from tests.kernels.cuda.warp_emulation import translate_asm

    wgmma = 'asm volatile("wgmma.fence.sync.aligned;" ::: "memory");'
    with pytest.raises(ValueError, match="wgmma.fence.sync.aligned"):
        translate_asm(wgmma)
    trapped = translate_asm(wgmma, unmodelled="trap")
    assert "emu_fail(" in trapped and "wgmma.fence.sync.aligned" in trapped and "asm" not in trapped
    fence = 'asm volatile("" : "+f"(x)::"memory");'
    assert translate_asm(fence) == translate_asm(fence, unmodelled="trap") == "(void)0;"
    rcp = 'asm("rcp.approx.f32 %0, %1;" : "=f"(y) : "f"(x));'
    assert translate_asm(rcp, unmodelled="trap") == translate_asm(rcp) == "(y) = 1.0f / (x);"
    with pytest.raises(ValueError, match="'error' or 'trap'"):
        translate_asm(rcp, unmodelled="skip")
