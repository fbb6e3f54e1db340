"""The tensor-core conv kernels emulated on the host (no GPU): conv_halo_mma's dense tactics
(halo_mma_persist_p32 and halo_mma_pipe_p32: conv_grouped_mma_pipe.cu with GM_PERSIST 1 / 0) and
conv_grouped_mma's grouped ones through their real enqueue, the kernels' own source compiled by g++
(block_emulation.py: every thread of a block a real thread; mma.sync, ldmatrix and cp.async a
rendezvous of a warp's threads, warp_emulation.py), outputs poisoned (NaN), against the float64
reference. A sample of test_conv_grouped_mma.py's GPU cases: every dense case (8 to 96 channels,
1 x 1 to 5 x 5, strides, dilation) on both tactics in float16 and bfloat16, the SiLU + residual
epilogue in both (a full residual through 16-byte loads and pair stores, a broadcast one into a
misaligned output), on the grouped tactics too; blocks looping over double-buffered tiles with
copies deferred and eager; the element staging. A kernel with one index broken fails."""

from __future__ import annotations

import pytest

from polykit.kernels.cuda.base import KernelSource
from polykit.kernels.cuda.conv.conv_grouped_mma import VARIANTS
from tests.kernels.cuda.test_conv_depthwise import BF16, F16, TOL
from tests.kernels.cuda.test_conv_depthwise_emulated import run_emulated
from tests.kernels.cuda.test_conv_grouped import EPI_CASES
from tests.kernels.cuda.test_conv_grouped_mma import (DENSE_CASES, HALO, HALO_PERSIST, HALO_PIPE, SILU_RESIDUAL,
                                                      run_misaligned_input, run_persistent)
from tests.kernels.cuda.test_conv_grouped_mma import eager_launcher, launcher, two_sms  # noqa: F401 (fixtures)

HALO_TACTICS = sorted(HALO)


def dense(case):
    """DENSE_CASES[case] as (x, w, group 1, attrs)."""
    x, w, attrs = DENSE_CASES[case]
    return x, w, 1, attrs


@pytest.mark.parametrize("tactic,case,dtype", [(t, c, (F16, BF16)[(c + i) % 2]) for i, t in enumerate(HALO_TACTICS)
                                               for c in range(len(DENSE_CASES))])
def test_emulated_halo_matches_the_reference(launcher, tactic, case, dtype):  # noqa: F811
    """Every dense case on both tactics, float16 and bfloat16 alternating (each case gets both)."""
    x, w, attrs = DENSE_CASES[case]
    assert run_emulated(launcher, tactic, x, w, attrs, dtype, group=1) <= TOL[dtype]


@pytest.mark.parametrize("dtype,shift_y", [(F16, 1), (BF16, 0)], ids=["fp16-misaligned", "bf16"])
@pytest.mark.parametrize("tactic", HALO_TACTICS)
@pytest.mark.parametrize("case,skip", [(0, (1, 9, 11, 24)), (3, (1, 1, 10, 1))])
def test_emulated_halo_silu_residual_epilogue(launcher, tactic, case, skip, dtype, shift_y):  # noqa: F811
    """SiLU then a residual of the output's shape (16-byte epilogue loads) and one broadcast over
    rows and channels (strided); float16 into an output 2 bytes off (element stores), bfloat16
    aligned (pair stores)."""
    x, w, attrs = DENSE_CASES[case]
    assert run_emulated(launcher, tactic, x, w, attrs, dtype, shift_y=shift_y, group=1, epilogue=SILU_RESIDUAL,
                        extra={"skip": skip}) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("tactic", [v.name for v in VARIANTS])
def test_emulated_grouped_silu_residual_epilogue(launcher, tactic, dtype):  # noqa: F811
    """The grouped tactics (8 groups of 8 channels) with the SiLU + residual epilogue."""
    x, w, group, attrs, skip = EPI_CASES[0]
    assert run_emulated(launcher, tactic, x, w, attrs, dtype, group=group, epilogue=SILU_RESIDUAL,
                        extra={"skip": skip}) <= TOL[dtype]


@pytest.mark.parametrize("copies", ["deferred", "eager"])
@pytest.mark.parametrize("case,dtype", [(0, F16), (1, BF16), (4, F16), (6, F16)])
def test_emulated_persistent_blocks_loop_over_double_buffered_tiles(request, two_sms, case, dtype,  # noqa: F811
                                                                    copies):
    """halo_mma_persist's blocks each compute several tiles of several images (see
    test_conv_grouped_mma's grouped cases): deferred copies catch a window read before its wait,
    eager ones a refill racing the warps still reading the buffer."""
    launcher = request.getfixturevalue("launcher" if copies == "deferred" else "eager_launcher")
    assert run_persistent(launcher, HALO_PERSIST, dense(case), dtype) <= TOL[dtype]


@pytest.mark.parametrize("tactic,case", [(HALO_PIPE, 1), (HALO_PERSIST, 7)])
def test_emulated_misaligned_input_takes_the_element_staging(launcher, tactic, case):  # noqa: F811
    assert run_misaligned_input(launcher, tactic, dense(case)) <= TOL[F16]


# ---- the emulation catches a broken kernel -----------------------------------------------------------
#: (what breaks, the line of conv_grouped_mma_pipe.cu, the line broken): each changes the results
#: deterministically, so the error is far past the tolerance on every run
MUTATIONS = {
    "A rows' k half": ("const int ah = lane / 16;", "const int ah = lane / 8 % 2;"),
    "x2 B fragment's k half": ("const ELEM* wl2 = ws + (i64)(nl0 + lane % 8) * KP + ((lane / 8) % 2) * 8;",
                               "const ELEM* wl2 = ws + (i64)(nl0 + lane % 8) * KP + ((lane / 16) % 2) * 8;"),
    "a window read before its wait": ("gm_cp_wait(1);     // all but the newest group",
                                      "gm_cp_wait(2);     // all but the newest group"),
}


@pytest.fixture(scope="module")
def mutated(tmp_path_factory):
    """launcher(what): kernels whose source has MUTATIONS[what] applied (in the build folder's copy)."""
    from tests.kernels.cuda.block_emulation import EmulatedLauncher, host_launcher

    class Mutated(EmulatedLauncher):
        what = ""

        def _lib(self, kernel: KernelSource):
            line, broken = MUTATIONS[self.what]
            text = kernel.render()
            assert text.count(line) == 1, f"{self.what}: the kernel no longer has {line!r}"
            return super()._lib(KernelSource(kernel.name, code=text.replace(line, broken)))

    launcher = host_launcher(tmp_path_factory, "GM_PARAMS", "GM_ARGS", Mutated)

    def of(what):
        launcher.what = what
        return launcher

    return of


@pytest.mark.parametrize("what,tactic", [("A rows' k half", HALO_PIPE), ("x2 B fragment's k half", HALO_PIPE),
                                         ("a window read before its wait", HALO_PERSIST)])
def test_a_broken_index_fails_the_comparison(mutated, two_sms, what, tactic):  # noqa: F811
    """DENSE_CASES[0] (24 channels: n8 count 3, an .x4 and an .x2 B load a step) at batch 3 with
    two_sms's plans (PERSIST blocks loop over tiles): each mutation puts the error past 10x TOL."""
    x, w, attrs = DENSE_CASES[0]
    assert run_emulated(mutated(what), tactic, (3,) + x[1:], w, attrs, F16, group=1) > 10 * TOL[F16]
