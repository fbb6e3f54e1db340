"""quantize.cu's quantize_nhwc_s2d (ai.polykit QuantizeNHWC with `block` / `pads`: a space-to-depth stem's image)
emulated on the host (block_emulation.py, no GPU): the tactic's own enqueue launches it, outputs poisoned, the bytes
equal the reference's (QuantizeLinear of the zero-padded, space-to-depth'd image, NHWC, channels past C * s * s the
zero point) for int8 / uint8 / e4m3, 16-byte group stores (channels % 16 == 0, aligned) and byte stores (a channel
count of 20, or an output one byte off 16-byte alignment)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic
from tests.kernels.cuda.block_emulation import host_launcher, kernel_signature

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
ZEROS = {"int8": np.array(-3, np.int8), "uint8": np.array(131, np.uint8), "e4m3": np.zeros((), E4M3)}
rng = np.random.default_rng(83)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    return host_launcher(tmp_path_factory, *kernel_signature("quantize.cu", "quantize_nhwc_s2d"))


def run_emulated(launcher, x, scale, zero, attrs, shift=0):
    """(the kernel's output, the reference's) of QuantizeNHWC(x) with `attrs`, the output `shift` bytes past a
    64-byte aligned start, poisoned with 0xAB."""
    node = Node("QuantizeNHWC", ["X", "S", "Z"], ["Y"], dict(attrs), "q", POLYKIT_DOMAIN)
    (want,) = run_reference(node, [x, scale, zero])
    buf = np.full(want.nbytes + 128, 0xAB, np.uint8)
    start = (-buf.ctypes.data) % 64 + shift
    y = buf[start:start + want.nbytes].view(want.dtype).reshape(want.shape)
    tensors = {"X": DeviceTensor(x.ctypes.data, x.shape, x.dtype), "S": DeviceTensor(scale.ctypes.data, (), scale.dtype),
               "Z": DeviceTensor(zero.ctypes.data, (), zero.dtype), "Y": DeviceTensor(y.ctypes.data, want.shape, want.dtype)}
    layer = LayerDesc("q", "QuantizeNHWC", ("X", "S", "Z"), ("Y",), dict(attrs), domain=POLYKIT_DOMAIN)
    launcher.launches.clear()
    launcher.recorded = []
    find_tactic("cuda", "QuantizeNHWC", "cuda.quantize").enqueue(layer, Recording(launcher), tensors)
    assert [k.name for k, *_ in launcher.launches] == ["quantize_nhwc_s2d"]
    return y, want


class Recording:
    """The emulated launcher, its launches' arguments kept in `launcher.recorded`."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.inner.recorded.append(list(args))
        self.inner.launch(kernel, grid, block, args, shared_mem)


def image(shape, scale):
    """Random values over the 8-bit range, with ties, saturating values, infinities and a NaN among them."""
    x = rng.uniform(-200, 200, shape).astype(np.float32) * scale
    edge = np.float32([0.5, 1.5, -2.5, 126.5, -128.5, 1e9, -1e9, np.inf, -np.inf, np.nan, 300.0, -460.0]) * scale
    x.reshape(-1)[: edge.size] = edge[: x.size]
    return x


# (x shape, block, pads [top, left, bottom, right], channels): ResNet's stem (3 channels, 2, pads 3 and 4 to whole
# blocks: 12 of 16 channels), s 4 over 1 channel (16: one group, none padded), 5 channels at s 2 (20 -> 32: a group
# and a half), odd H / W with uneven pads, s 2 without pads, 20 channels (byte stores), s 4 over 3 (48: three groups)
CASES = [((2, 3, 29, 27), 2, [3, 3, 4, 4], 16), ((1, 1, 13, 10), 4, [1, 2, 2, 0], 16), ((2, 5, 9, 7), 2, [0, 1, 1, 0], 32),
         ((1, 3, 7, 11), 2, [2, 0, 3, 1], 16), ((1, 3, 10, 6), 2, [0, 0, 0, 0], 16), ((1, 3, 9, 9), 2, [1, 1, 0, 0], 20),
         ((1, 3, 12, 9), 4, [2, 3, 2, 0], 48)]


@pytest.mark.parametrize("zero", ZEROS.values(), ids=ZEROS)
@pytest.mark.parametrize("shape,block,pads,channels", CASES)
def test_the_emulated_kernel_writes_the_reference_bytes(launcher, zero, shape, block, pads, channels):
    scale = np.array(0.031, np.float32)
    x = image(shape, scale)
    y, want = run_emulated(launcher, x, scale, zero, {"channels": channels, "block": block, "pads": pads})
    np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))
    assert int(launcher.recorded[-1][-2]) == int(channels % 16 == 0)  # vec: 16-byte group stores


@pytest.mark.parametrize("zero", [ZEROS["int8"], ZEROS["e4m3"]], ids=["int8", "e4m3"])
def test_a_misaligned_output_takes_byte_stores_and_writes_the_same_bytes(launcher, zero):
    scale = np.array(0.05, np.float32)
    x = image((2, 3, 11, 9), scale)
    y, want = run_emulated(launcher, x, scale, zero, {"channels": 16, "block": 2, "pads": [1, 3, 0, 0]}, shift=1)
    np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))
    assert int(launcher.recorded[-1][-2]) == 0  # vec off: byte stores


def test_more_pixels_than_a_block_cover_several_blocks_and_images(launcher):
    """43 x 41 output pixels (1763: seven 256-thread blocks, the last partly idle) of 3 images."""
    scale = np.array(0.02, np.float32)
    x = image((3, 3, 83, 79), scale)
    y, want = run_emulated(launcher, x, scale, ZEROS["uint8"], {"channels": 16, "block": 2, "pads": [3, 3, 0, 0]})
    np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))
    _, grid, block, _ = launcher.launches[-1]
    assert grid[:2] == (7, 3) and block[0] == 256
