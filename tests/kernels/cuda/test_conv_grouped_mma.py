"""The tensor-core grouped channels-last tactic (cuda.conv_nhwc.grouped_mma_p32): which layers it
takes and the tiles it plans (CPU), NVRTC compiles of every variant, conv_grouped_mma.cu run on
the host with mma.sync emulated from the PTX ISA's m16n8k16 fragment layouts (each lane's
registers exchanged through a per-warp table between two block barriers: the kernel's mma calls
are block-uniform), and on the GPU against the float64 reference with poisoned outputs: 8, 16, 24
and 32 channels a group, 3 x 3 and 1 x 1 kernels, stride 2, dilation 2, odd sizes, float16 and
bfloat16, an epilogue; test_conv_grouped.py runs it on misaligned tensors."""

from __future__ import annotations

import os
import re

import pytest

from polykit.kernels.cuda.base import KernelSource
from polykit.kernels.cuda.conv.conv_grouped_mma import (MMA_SMEM_LIMIT, VARIANT, compile_variants, mma_window,
                                                        plan_mma, warp_n8)
from polykit.kernels.tactics import candidates, find_tactic
from tests.kernels.cuda.test_conv_depthwise import BF16, F16, F32, RESIDUAL_RELU, TOL
from tests.kernels.cuda.test_conv_grouped import CASES, EPI_CASES, grouped_layer, run_case

MMA = VARIANT.name
#: the CASES with multiples of 8 input and output channels a group
MMA_CASES = [3, 5, 7, 8, 11]


# ---- CPU --------------------------------------------------------------------------------------
def test_mma_window_takes_multiples_of_8_channels_a_group():
    assert mma_window({"group": 32}, (1, 7, 7, 256), (256, 3, 3, 8)) is not None
    assert mma_window({"group": 32}, (1, 7, 7, 128), (128, 3, 3, 4)) is None      # cpg 4
    assert mma_window({"group": 4}, (1, 7, 7, 32), (16, 3, 3, 8)) is None         # 4 outputs a group
    assert [warp_n8(m) for m in (8, 16, 24, 32, 64, 56)] == [1, 2, 3, 4, 4, 1]


@pytest.mark.parametrize("case", MMA_CASES + [2])
def test_plan_covers_the_output_in_whole_warps(case):
    x, w, group, attrs = CASES[case]
    layer, _, specs = grouped_layer(x, w, group, attrs)
    plan = plan_mma(layer.attrs, x, w, specs["Y"][0], "float16")
    if case == 2:  # cpg 4: not this tactic's
        assert plan is None and not find_tactic("cuda", "ConvNHWC", MMA).supports(layer)
        return
    y = specs["Y"][0]
    assert plan is not None and plan.smem <= MMA_SMEM_LIMIT and plan.block[0] <= 256
    assert plan.TH * plan.TWT <= plan.PWARPS * 32 and plan.CB == plan.CW * 8 * plan.nb
    assert -(-plan.TH * plan.TWT // 32) == plan.PWARPS and plan.TH <= y[1]   # no warp without pixels
    assert plan.CB % (w[0] // group) == 0 or (w[0] // group) % plan.CB == 0
    gx, gy, gz = plan.grid
    assert gx == -(-y[1] // plan.TH) * -(-y[2] // plan.TWT) and gy * plan.CB >= w[0] and gz == x[0]
    assert plan_mma(layer.attrs, x, w, y, "float32") is None
    assert find_tactic("cuda", "ConvNHWC", MMA).supports(layer)


@pytest.mark.parametrize("x,w,group", [((32, 28, 28, 256), (256, 3, 3, 8), 32), ((32, 7, 7, 1024), (1024, 3, 3, 32), 32),
                                       ((32, 14, 14, 408), (408, 3, 3, 24), 17)])
def test_plans_of_real_layers_fit_with_several_warps(x, w, group):
    plan = plan_mma({"group": group, "pads": [1, 1, 1, 1]}, x, w, x[:3] + (w[0],), "float16")
    assert plan is not None and plan.smem <= MMA_SMEM_LIMIT and plan.block[0] >= 64


def test_float32_layers_are_not_the_tensor_core_tactics():
    layer, _, _ = grouped_layer((1, 9, 9, 64), (64, 3, 3, 8), 8, {"pads": [1, 1, 1, 1]}, F32)
    assert MMA not in {t.name for t in candidates("cuda", "ConvNHWC", layer)}
    layer, _, _ = grouped_layer((1, 9, 9, 64), (64, 3, 3, 8), 8, {"pads": [1, 1, 1, 1]}, BF16)
    assert MMA in {t.name for t in candidates("cuda", "ConvNHWC", layer)}


def test_every_variant_compiles_with_nvrtc(tmp_path, monkeypatch):
    from polykit.runtime.cuda.nvrtc import compile_many, unique_units

    monkeypatch.setenv("POLYKIT_CACHE_DIR", str(tmp_path))
    variants = compile_variants()
    assert {(dict(k.defines)["GM_BF16"], dict(k.defines)["GM_NB"]) for k in variants if k.code is None} == \
        {(b, nb) for b in ("0", "1") for nb in ("1", "2", "3", "4")}
    units = unique_units(variants)
    for arch in ("sm_80", "sm_90"):
        cubins = compile_many(units, arch, workers=min(2, os.cpu_count() or 1))
        assert len(cubins) == len(units) and all(blob[:4] == b"\x7fELF" for blob in cubins.values())


# ---- host emulation of mma.sync ----------------------------------------------------------------
#: gm_mma on the host: a warp's lanes publish their fragments, meet, each computes its own
#: accumulators from the m16n8k16 layouts (A row-major: a register holds row gid (+8), columns
#: 2 tig + {0, 1} (+8); B column-major: rows 2 tig + {0, 1} (+8), column gid), then meet again
EMULATED_MMA = r"""
static u32 gm_emu_a[8][32][4], gm_emu_b[8][32][2];
static float gm_emu_elem(u32 word, int half) {
  const u32 bits = half ? word >> 16 : word & 0xffffu;
#if GM_BF16
  return __uint_as_float(bits << 16);
#else
  half_t h; h.x = (unsigned short)bits; return h2f(h);
#endif
}
__device__ __forceinline__ void gm_mma(float* c, const u32* a, const u32* b) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, gid = l / 4, tig = l % 4;
  for (int i = 0; i < 4; ++i) gm_emu_a[w][l][i] = a[i];
  for (int i = 0; i < 2; ++i) gm_emu_b[w][l][i] = b[i];
  __syncthreads();
  float d[4];
  for (int e = 0; e < 4; ++e) {
    const int row = gid + 8 * (e / 2), col = 2 * tig + e % 2;
    float s = 0.f;
    for (int k = 0; k < 16; ++k) {
      const float av = gm_emu_elem(gm_emu_a[w][(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k % 2);
      const float bv = gm_emu_elem(gm_emu_b[w][col * 4 + (k % 8) / 2][k >= 8], k % 2);
      s += av * bv;
    }
    d[e] = s;
  }
  __syncthreads();
  for (int e = 0; e < 4; ++e) c[e] += d[e];
}
"""


#: ldmatrix on the host, from the PTX ISA's m8n8 .b16 layout: lane 8 i + j gives the address of
#: row j of matrix i (x2: lanes 0-15 count), lane l receives in register i matrix i's row l / 4,
#: elements 2 (l % 4) and 2 (l % 4) + 1; the lanes publish their addresses and meet (block-uniform
#: calls, as gm_mma's)
EMULATED_LDSM = r"""
static const unsigned char* gm_emu_p[8][32];
static void gm_emu_ldsm(u32* r, const void* p, int count) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  gm_emu_p[w][l] = (const unsigned char*)p;
  __syncthreads();
  for (int i = 0; i < count; ++i) memcpy(&r[i], gm_emu_p[w][8 * i + l / 4] + 4 * (l % 4), 4);
  __syncthreads();
}
__device__ __forceinline__ void gm_ldsm_x4(u32* r, const ELEM* p) { gm_emu_ldsm(r, p, 4); }
"""
#: each helper's host stand-in (cp.async groups: block_emulation copies at once, so commits and
#: waits are no-ops; a missing barrier between a phase's copies and their readers still races)
EMULATED = {"gm_mma": EMULATED_MMA, "gm_ldsm_x4": EMULATED_LDSM,
            "gm_ldsm_x2": "__device__ __forceinline__ void gm_ldsm_x2(u32* r, const ELEM* p) { gm_emu_ldsm(r, p, 2); }\n",
            "gm_cp_commit": "__device__ __forceinline__ void gm_cp_commit() {}\n",
            "gm_cp_wait": "__device__ __forceinline__ void gm_cp_wait(int) {}\n"}


def emulated_source(text: str) -> str:
    """conv_grouped_mma.cu's rendered source with its warp-level PTX helpers in host C++."""
    for name, body in EMULATED.items():
        text, count = re.subn(r"__device__ __forceinline__ void " + name + r"\(.*?\n\}\n", lambda _: body, text,
                              count=1, flags=re.S)
        assert count == 1, name
    assert not re.search(r'asm volatile\(\s*"(mma|ldmatrix|cp\.async\.(commit|wait))', text)
    return text


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    import shutil

    from tests.kernels.cuda.block_emulation import EmulatedLauncher

    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")

    class MmaEmulated(EmulatedLauncher):
        def _lib(self, kernel: KernelSource):
            return super()._lib(KernelSource(kernel.name, code=emulated_source(kernel.render())))

    return MmaEmulated(tmp_path_factory.mktemp("grouped_mma_emulated"), cxx, "GM_PARAMS", "GM_ARGS")


@pytest.mark.parametrize("case,dtype", [(3, F16), (5, BF16), (8, F16), (11, F16)])
def test_emulated_mma_matches_the_reference(launcher, case, dtype):
    from tests.kernels.cuda.test_conv_depthwise_emulated import run_emulated

    x, w, group, attrs = CASES[case]
    assert run_emulated(launcher, MMA, x, w, attrs, dtype, group=group) <= TOL[dtype]


def test_emulated_mma_residual_relu_epilogue_and_misaligned_output(launcher):
    from tests.kernels.cuda.test_conv_depthwise_emulated import run_emulated

    x, w, group, attrs, skip = EPI_CASES[0]
    assert run_emulated(launcher, MMA, x, w, attrs, F16, shift_y=1, group=group, epilogue=RESIDUAL_RELU,
                        extra={"skip": skip}) <= TOL[F16]


# ---- GPU ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", MMA_CASES)
def test_mma_matches_the_reference(case, dtype):
    assert run_case(*CASES[case], dtype, MMA) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("x,w,group,attrs,skip", EPI_CASES[:3])
def test_mma_residual_relu_epilogue(x, w, group, attrs, skip):
    assert run_case(x, w, group, attrs, F16, MMA, epilogue=RESIDUAL_RELU, extra={"skip": skip}) <= TOL[F16]


@pytest.mark.gpu
def test_mma_on_a_resnext_stage_2_layer_at_batch_4():
    assert run_case((4, 28, 28, 256), (256, 3, 3, 8), 32, {"pads": [1, 1, 1, 1]}, F16, MMA) <= TOL[F16]
