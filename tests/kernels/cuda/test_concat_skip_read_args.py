"""Reading a placed Concat input (a skip connection the Concat and a pool both read) on the cuda
target, host side: the NHWC pools take X's pixel stride as a runtime argument (pool.cu's LDX) and
load 16 bytes only where X's rows and address allow; which tactics read placed inputs. On a GPU
(`gpu`): the kernels against the reference with X strided inside a NaN-poisoned buffer, and the
mini UNet's cuda fp16 plans against the cpu plan."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic
from tests.compiler.test_concat_placement import _run
from tests.compiler.test_concat_skip_placement import IMAGE, _feeds, mini_unet
from tests.kernels.cuda.recording_launcher import RecordingLauncher

F16 = np.dtype(np.float16)
POOL = "cuda.pool_nhwc.window"


def _pool_layer(kind: str, x: tuple, y: tuple, dtype: str = "float16", **attrs) -> LayerDesc:
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2], **attrs}
    return LayerDesc("pool", kind, ("X",), ("Y",), attrs, domain=POLYKIT_DOMAIN, precision="fp16",
                     in_dtypes=(dtype,), out_dtypes=(dtype,), in_shapes=(x,), out_shapes=(y,))


def _launch(kind: str, c: int, ldx: int, x_offset: int = 0, ldy: int = 0, dtype=F16) -> tuple[str, list]:
    x, y = (2, 6, 8, c), (2, 3, 4, c)
    layer = _pool_layer(kind, x, y, np.dtype(dtype).name)
    tensors = {"X": DeviceTensor(0x10000 + x_offset, x, np.dtype(dtype), ldx),
               "Y": DeviceTensor(0x40000, y, np.dtype(dtype), ldy)}
    launcher = RecordingLauncher()
    find_tactic("cuda", kind, POOL).enqueue(layer, launcher, tensors)
    (launch,) = launcher.launches
    return launch


@pytest.mark.parametrize("kind", ["MaxPoolNHWC", "AveragePoolNHWC"])
@pytest.mark.parametrize("c, ldx, x_offset, kernel", [
    (16, 0, 0, "pool_window_nhwc_v8"),  # dense
    (16, 48, 0, "pool_window_nhwc_v8"),  # a skip of 16 channels first in a 48-channel Concat
    (16, 48, 64, "pool_window_nhwc_v8"),  # ... 32 channels in: 64 bytes, aligned
    (16, 44, 0, "pool_window_nhwc"),  # pixels 88 bytes apart: no 16-byte loads
    (16, 48, 10, "pool_window_nhwc"),  # the slice 5 channels into the pixel
    (5, 29, 0, "pool_window_nhwc"),  # odd channels
])
def test_nhwc_pools_pass_the_input_pixel_stride_and_load_16_bytes_only_where_aligned(kind, c, ldx, x_offset, kernel):
    name, args = _launch(kind, c, ldx, x_offset)
    assert name == kernel
    assert args[-2:] == [c, ldx or c]  # LDY (Y dense), LDX
    assert int(args[3]) == c  # C: the pool's own channels, whatever the stride


def test_a_pool_reading_and_writing_placed_rows_takes_both_strides():
    name, args = _launch("MaxPoolNHWC", 8, 24, 0, ldy=40)
    assert name == "pool_window_nhwc_v8" and args[-2:] == [40, 24]


@pytest.mark.parametrize("dtype, kernel", [(np.int8, "pool_window_nhwc_v16"), (np.float32, "pool_window_nhwc")])
def test_int8_and_fp32_pools_take_the_input_stride(dtype, kernel):
    name, args = _launch("MaxPoolNHWC", 16, 32, 0, dtype=dtype)
    assert name == kernel and args[-2:] == [16, 32]
    # int8 loads 16 channels (16 bytes) a thread: pixels 40 bytes apart take the scalar kernel
    assert _launch("MaxPoolNHWC", 16, 40, 0, dtype=dtype)[0] == "pool_window_nhwc"


def test_which_tactics_read_a_placed_input():
    pool = find_tactic("cuda", "MaxPoolNHWC", POOL)
    layer = _pool_layer("MaxPoolNHWC", (2, 6, 8, 16), (2, 3, 4, 16))
    assert pool.reads_placed(layer, 0, 16, 48, 0) and pool.reads_placed(layer, 0, 16, 16, 32)
    assert not pool.reads_placed(layer, 0, 16 * 8, 48 * 8, 0)  # rows of a Concat on another axis
    assert not pool.reads_placed(layer, 0, 16, 8, 0) and not pool.reads_placed(layer, 1, 16, 48, 0)
    # the NCHW pools, the convolutions, pointwise and movement kernels read dense inputs only
    conv = LayerDesc("conv", "ConvNHWC", ("X", "W"), ("Y",), {}, domain=POLYKIT_DOMAIN,
                     in_shapes=((2, 6, 8, 16), (8, 1, 1, 16)), out_shapes=((2, 6, 8, 8),))
    for kind, name, lay in (("MaxPool", "cuda.pool.window", layer), ("ConvNHWC", "cuda.conv_nhwc.igemm_mma", conv),
                            ("Transpose", "cuda.movement.strided", layer)):
        assert not find_tactic("cuda", kind, name).reads_placed(lay, 0, 16, 48, 0), name


def _emulate_nhwc_pool(name: str, args: list, memory: np.ndarray, base: int) -> None:
    """pool.cu's NHWC max-pool kernels as their index math reads the launch arguments (X, Y pointers
    into `memory`, an fp16 array starting at device address `base`): per output pixel and channel
    (the v8 kernel: a group of 8 channels, which this walks channel by channel with its addresses),
    the max over the window of X[nb*H*W*LDX + (ih*W + iw)*LDX + c], stored at Y[pix*LDY + c]."""
    x0, y0 = (args[0].ptr - base) // 2, (args[1].ptr - base) // 2
    C = int(args[3])
    _, H, W, _, OH, OW, _, KH, KW, _, SH, SW, _, PH, PW = (int(a) for a in args[4:19])
    LDY, LDX = int(args[-2]), int(args[-1])
    NB = int(args[2]) if name.endswith(("_v8", "_v16")) else int(args[2]) // C
    for pix in range(NB * OH * OW):
        nb, s = divmod(pix, OH * OW)
        oh, ow = divmod(s, OW)
        for c in range(C):
            taps = [memory[x0 + nb * H * W * LDX + (ih * W + iw) * LDX + c]
                    for ih in range(oh * SH - PH, oh * SH - PH + KH) for iw in range(ow * SW - PW, ow * SW - PW + KW)
                    if 0 <= ih < H and 0 <= iw < W]
            memory[y0 + pix * LDY + c] = max(taps)


@pytest.mark.parametrize("c, ldx, start, ldy", [(16, 48, 32, 0), (5, 29, 3, 0), (8, 24, 8, 40)])
def test_the_launch_arguments_pool_the_strided_skip_as_the_reference_pools_it_dense(c, ldx, start, ldy):
    """Host emulation: the kernel the enqueue picks, run on its own launch arguments over a buffer
    whose other channels are NaN, pools exactly the skip's channels."""
    from polykit.runtime.cuda.harness import reference_layer

    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 6, 8, c)).astype(np.float16)
    base, xsize, yrows = 0x10000, 2 * 6 * 8 * ldx, 2 * 3 * 4
    memory = np.full(xsize + yrows * (ldy or c), np.nan, np.float16)
    memory[:xsize].reshape(2, 6, 8, ldx)[..., start:start + c] = x
    layer = _pool_layer("MaxPoolNHWC", x.shape, (2, 3, 4, c), kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    tensors = {"X": DeviceTensor(base + start * 2, x.shape, F16, ldx),
               "Y": DeviceTensor(base + xsize * 2, (2, 3, 4, c), F16, ldy)}
    launcher = RecordingLauncher()
    find_tactic("cuda", "MaxPoolNHWC", POOL).enqueue(layer, launcher, tensors)
    ((name, args),) = launcher.launches
    _emulate_nhwc_pool(name, args, memory, base)
    got = memory[xsize:].reshape(yrows, ldy or c)[:, :c].reshape(2, 3, 4, c)
    np.testing.assert_array_equal(got, reference_layer(layer, {"X": x})["Y"])


# ---- on a GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["MaxPoolNHWC", "AveragePoolNHWC"])
@pytest.mark.parametrize("c, ldx, start", [(16, 48, 0), (16, 48, 32), (5, 29, 0), (24, 29, 5), (8, 8, 0)])
def test_nhwc_pool_reads_strided_x_inside_a_poisoned_buffer(kind, c, ldx, start, monkeypatch):
    """X's pixels `ldx` apart, `start` channels into a buffer whose other channels are NaN (the
    rows of a Concat's other inputs): a pool that read outside its channels would give NaN; the
    result is the reference's pool of the dense X."""
    from polykit.kernels.cuda.base import CudaTactic
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 7, 9, c)).astype(np.float16)
    buf = np.full((2, 7, 9, ldx), np.nan, np.float16)
    buf[..., start:start + c] = x
    layer = _pool_layer(kind, x.shape, (2, 3, 4, c), kernel_shape=[3, 3], strides=[2, 2])
    enqueue = CudaTactic.enqueue

    def strided(self, lay, launcher, tensors):  # X as the placed skip: its channels inside the buffer
        whole = tensors["X"]
        tensors = {**tensors, "X": DeviceTensor(whole.ptr + start * 2, x.shape, F16, ldx)}
        return enqueue(self, lay, launcher, tensors)

    monkeypatch.setattr(CudaTactic, "enqueue", strided)
    got = run_layer(layer, {"X": buf}, tactic=POOL, output_specs={"Y": ((2, 3, 4, c), F16)})["Y"]
    want = reference_layer(layer, {"X": x})["Y"]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("level", [0, 3])
@pytest.mark.parametrize("channels, up", [((5, 24), "ConvTranspose"), ((16, 24), "Resize"), ((3, 5), "Resize")])
def test_cuda_fp16_mini_unet_with_placed_skips_matches_the_cpu(channels, up, level):
    model, _ = mini_unet(channels, up=up)
    feeds = _feeds()
    want = _run(build_plan(model, BuilderConfig(target="cpu")), feeds)
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level))
    assert sum(1 for n in plan.memory.placements if any(n in lay.inputs for lay in plan.layers
                                                        if lay.kind == "MaxPoolNHWC")) == 2
    got = _run(plan, feeds)
    for key, w in want.items():
        assert got[key].shape == w.shape == (IMAGE[0], 3, *IMAGE[2:])
        assert np.linalg.norm(got[key] - w) / np.linalg.norm(w) < 1e-2, key
