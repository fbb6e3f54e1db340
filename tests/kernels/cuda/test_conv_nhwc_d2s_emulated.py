"""conv_nhwc.cu's depth-to-space stores (ConvNHWC depth_to_space, D2S_H / D2S_W) emulated on the
host (no GPU): the igemm_simt tactic's own enqueue launches the kernel's source compiled by g++,
every thread of a block a real thread (block_emulation.py); Y poisoned (NaN), compared with the
reference kernel (the NHWC conv, then DepthToSpace DCR). Dense, placed in a Concat's slice, and
split along K (the reduce kernel stores through the same address)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor, KernelSource
from polykit.kernels.tactics import find_tactic
from tests.kernels.cuda.block_emulation import EmulatedLauncher, host_launcher

SIMT = "cuda.conv_nhwc.igemm_simt"
rng = np.random.default_rng(29)


#: the mma.sync entry point (PTX the host cannot compile) cut from the module: nothing instantiates mma_gemm
MMA_ENTRY = re.compile(r'extern "C" __global__ void __launch_bounds__\(256\) conv_nhwc_igemm_mma\(.*?\n\}\n', re.S)


class ScratchLauncher(EmulatedLauncher):
    """An emulated launcher of conv_nhwc.cu's SIMT kernels that lends host scratch memory (the
    split-K partial sums)."""

    def _lib(self, kernel: KernelSource):
        text, cuts = MMA_ENTRY.subn("", kernel.render())
        assert cuts == 1
        # simt_gemm's static __shared__ tiles: one instance the whole block shares (the prelude's
        # empty __shared__ would give each thread its own)
        text = re.sub(r"__shared__ (float \w+\[)", r"static \1", text)
        return super()._lib(KernelSource(kernel.name, code=text))

    def workspace(self, nbytes: int) -> int:
        buf = np.zeros(nbytes, np.uint8)
        self.__dict__.setdefault("held", []).append(buf)
        return buf.ctypes.data


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    return host_launcher(tmp_path_factory, "CONV_NHWC_PARAMS", "CONV_NHWC_ARGS", cls=ScratchLauncher)


def d2s_case(x, w, attrs, blocks):
    """(layer, inputs, Y's shape, the reference Y) of a ConvNHWC storing depth-to-space."""
    attrs = {"kernel_shape": list(w[1:3]), "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
             **attrs, "depth_to_space": list(blocks)}
    inputs = {"X": rng.standard_normal(x).astype(np.float32), "W": rng.standard_normal(w).astype(np.float32),
              "B": rng.standard_normal(w[0]).astype(np.float32)}
    (want,) = run_reference(Node("ConvNHWC", ["X", "W", "B"], ["Y"], attrs, name="up", domain=POLYKIT_DOMAIN),
                            [inputs["X"], inputs["W"], inputs["B"]])
    layer = LayerDesc("up", "ConvNHWC", ("X", "W", "B"), ("Y",), attrs, domain=POLYKIT_DOMAIN, precision="fp32",
                      in_shapes=(x, w, (w[0],)), out_shapes=(want.shape,), in_dtypes=("float32",) * 3,
                      out_dtypes=("float32",))
    return layer, inputs, want


def run_emulated(launcher, layer, inputs, shape, before=0, after=0):
    """Y's pixel rows of before + C + after elements (poisoned), the layer's C channels `before` in;
    (Y as the layer sees it, whether the rest of every row kept its poison)."""
    pixels, c = int(np.prod(shape[:-1])), shape[-1]
    ldy = before + c + after
    rows = np.full((pixels, ldy), np.nan, np.float32)
    tensors = {name: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for name, a in inputs.items()}
    tensors["Y"] = DeviceTensor(rows.ctypes.data + before * 4, shape, np.dtype(np.float32), ldy if ldy != c else 0)
    tactic = find_tactic("cuda", "ConvNHWC", SIMT)
    assert tactic.supports(layer)
    if ldy != c:
        assert tactic.places(layer, c, ldy, before)
    tactic.enqueue(layer, launcher, tensors)
    kept = np.isnan(rows[:, :before]).all() and np.isnan(rows[:, before + c:]).all()
    return rows[:, before:before + c].reshape(shape), kept


# (x NHWC, w KRSC, attrs, blocks): UNet's 2x2 up-convolution, a 3x3 one, unequal blocks, an odd C of 5
# channels a block, a 3x3 conv before a pixel shuffle (pads, stride 2), a deep reduction on few tiles (split K)
CASES = [
    ((2, 3, 5, 8), (16, 1, 1, 8), {}, (2, 2)),
    ((1, 4, 3, 16), (27, 1, 1, 16), {}, (3, 3)),
    ((2, 3, 2, 8), (30, 1, 1, 8), {}, (2, 3)),
    ((1, 7, 6, 8), (20, 1, 1, 8), {}, (2, 2)),
    ((1, 9, 7, 8), (12, 3, 3, 8), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, (2, 2)),
    ((1, 3, 3, 256), (8, 1, 1, 256), {}, (2, 2)),
]


@pytest.mark.parametrize("x,w,attrs,blocks", CASES)
def test_emulated_depth_to_space_store_matches_the_reference(launcher, x, w, attrs, blocks):
    layer, inputs, want = d2s_case(x, w, attrs, blocks)
    got, _ = run_emulated(launcher, layer, inputs, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [0, 3])
def test_emulated_depth_to_space_store_into_a_concat_slice(launcher, case):
    """UNet's up-convolution output placed after the skip's channels: the rows' other channels stay poisoned."""
    layer, inputs, want = d2s_case(*CASES[case])
    got, kept = run_emulated(launcher, layer, inputs, want.shape, before=8, after=3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert kept


def test_the_split_case_really_splits(launcher):
    layer, inputs, want = d2s_case(*CASES[-1])
    launcher.launches.clear()
    run_emulated(launcher, layer, inputs, want.shape)
    assert [k.name for k, *_ in launcher.launches] == ["conv_nhwc_igemm_simt", "conv_nhwc_splitk_reduce"]
    assert all(("D2S_H", "2") in k.defines for k, *_ in launcher.launches)


def _fp16_layer(y, blocks):
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
    if blocks:
        attrs["depth_to_space"] = list(blocks)
    m = y[-1] * (blocks[0] * blocks[1] if blocks else 1)
    return LayerDesc("up", "ConvNHWC", ("X", "W", "B"), ("Y",), attrs, domain=POLYKIT_DOMAIN, precision="fp16",
                     in_shapes=((2, 3, 5, 16), (m, 1, 1, 16), (m,)), out_shapes=(tuple(y),),
                     in_dtypes=("float16",) * 3, out_dtypes=("float16",))


def test_only_the_families_that_store_depth_to_space_take_it():
    """Every ConvNHWC tactic refuses the attribute unless its family declares it (cuda_tactic's
    depth_to_space): the implicit GEMMs of conv_nhwc.cu and the sm90 tiles; sm90 only with blocks
    of C % 8 == 0 channels (its pair and 16-byte stores stay inside a block)."""
    from polykit.kernels.cuda.base import all_cuda_tactics

    convs = [t for t in all_cuda_tactics() if t.kind == "ConvNHWC"]
    plain = {t.name for t in convs if t.supports(_fp16_layer((2, 3, 5, 32), None))}
    taking = {t.name for t in convs if t.supports(_fp16_layer((2, 6, 10, 8), (2, 2)))}
    odd = {t.name for t in convs if t.supports(_fp16_layer((2, 6, 10, 6), (2, 2)))}
    assert any(".skinny_" in n for n in plain) and any(".sm90_" in n for n in plain)
    assert taking == {n for n in plain if n.startswith(("cuda.conv_nhwc.igemm_", "cuda.conv_nhwc.sm90_"))}
    assert odd == {n for n in plain if n.startswith("cuda.conv_nhwc.igemm_")}
