"""Reading a placed Concat input (a skip connection the Concat and a pool both read) on the cuda
target, host side: the NHWC pools take X's pixel stride as a runtime argument (pool.cu's LDX) and
load 16 bytes only where X's rows and address allow; so do the implicit-GEMM and sm90 convolutions
(conv_nhwc.cu's and conv_sm90.cu's LDX; sm90 only where its 16-byte cp.async stays aligned); which
tactics read placed inputs; host emulation of the pool and igemm index math on their launch
arguments. On a GPU (`gpu`): the kernels against the reference with X strided inside a NaN-poisoned
buffer, and the mini UNet's and a lateral conv's cuda fp16 plans against the cpu plan."""

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
IGEMM = ("cuda.conv_nhwc.igemm_mma", "cuda.conv_nhwc.igemm_simt", "cuda.conv_nhwc.igemm_simt_wide")


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
    conv = LayerDesc("conv", "ConvNHWC", ("X", "W"), ("Y",), {}, domain=POLYKIT_DOMAIN,
                     in_shapes=((2, 6, 8, 16), (8, 1, 1, 16)), out_shapes=((2, 6, 8, 8),))
    for name in IGEMM:  # the implicit-GEMM convolutions read X (input 0) with LDX
        tactic = find_tactic("cuda", "ConvNHWC", name)
        assert tactic.reads_placed(conv, 0, 16, 48, 16) and not tactic.reads_placed(conv, 1, 16, 48, 0)
        assert not tactic.reads_placed(conv, 0, 16 * 8, 48 * 8, 0)
    # the NCHW pools, the other convolution tiles, pointwise and movement kernels read dense inputs only
    for kind, name, lay in (("MaxPool", "cuda.pool.window", layer), ("ConvNHWC", "cuda.conv_nhwc.skinny_128x32", conv),
                            ("ConvNHWC", "cuda.conv_nhwc.depthwise_p8", conv),
                            ("ConvNHWC", "cuda.conv_nhwc.grouped_p2", conv),
                            ("Transpose", "cuda.movement.strided", layer)):
        assert not find_tactic("cuda", kind, name).reads_placed(lay, 0, 16, 48, 0), name


def _conv_launches(tactic: str, x: tuple, w: tuple, y: tuple, ldx: int, x_ptr: int = 0x10000, **attrs):
    layer = LayerDesc("conv", "ConvNHWC", ("X", "W"), ("Y",), dict(attrs), domain=POLYKIT_DOMAIN, precision="fp16",
                      in_dtypes=("float16",) * 2, out_dtypes=("float16",), in_shapes=(x, w), out_shapes=(y,))
    tensors = {"X": DeviceTensor(x_ptr, x, F16, ldx), "W": DeviceTensor(0x800000, w, F16),
               "Y": DeviceTensor(0x900000, y, F16)}
    launcher = RecordingLauncher()
    find_tactic("cuda", "ConvNHWC", tactic).enqueue(layer, launcher, tensors)
    return launcher.launches


@pytest.mark.parametrize("tactic", IGEMM)
@pytest.mark.parametrize("ldx", [0, 29, 48])
def test_igemm_convs_pass_the_input_pixel_stride_after_ldy(tactic, ldx):
    launches = _conv_launches(tactic, (2, 6, 7, 24), (5, 3, 3, 24), (2, 6, 7, 5), ldx, pads=[1] * 4)
    assert launches[0][0].startswith("conv_nhwc_igemm")  # (and a split-K reduction where it splits)
    assert all(args[-2:] == [5, ldx or 24] for _, args in launches)


def test_a_split_k_conv_and_its_reduction_both_take_the_input_stride():
    launches = _conv_launches("cuda.conv_nhwc.igemm_simt", (1, 5, 5, 96), (40, 3, 3, 96), (1, 5, 5, 40), 104,
                              pads=[1] * 4)
    assert [name for name, _ in launches] == ["conv_nhwc_igemm_simt", "conv_nhwc_splitk_reduce"]
    assert all(args[-2:] == [40, 104] for _, args in launches)


SM90 = ("cuda.conv_nhwc.sm90_128x128", "cuda.conv_nhwc.sm90_64x128")


@pytest.mark.parametrize("tactic", SM90)
def test_sm90_convs_read_placed_rows_that_keep_their_16_byte_loads_aligned(tactic):
    conv = LayerDesc("conv", "ConvNHWC", ("X", "W"), ("Y",), {}, domain=POLYKIT_DOMAIN, precision="fp16",
                     in_dtypes=("float16",) * 2, out_dtypes=("float16",), in_shapes=((2, 6, 8, 16), (8, 1, 1, 16)),
                     out_shapes=((2, 6, 8, 8),))
    t = find_tactic("cuda", "ConvNHWC", tactic)
    assert t.reads_placed(conv, 0, 16, 48, 0) and t.reads_placed(conv, 0, 16, 48, 32)
    assert not t.reads_placed(conv, 0, 16, 44, 0)  # pixels 88 bytes apart
    assert not t.reads_placed(conv, 0, 16, 48, 4)  # the slice 8 bytes into the pixel
    assert not t.reads_placed(conv, 1, 16, 48, 0)


@pytest.mark.parametrize("tactic", SM90)
@pytest.mark.parametrize("ldx", [0, 40])
def test_sm90_convs_pass_the_input_pixel_stride_after_ldy(tactic, ldx):
    ((name, args),) = _conv_launches(tactic, (2, 6, 7, 16), (24, 3, 3, 16), (2, 6, 7, 24), ldx, pads=[1] * 4)
    assert name == "conv_sm90" and args[-2:] == [24, ldx or 16]


def test_an_sm90_conv_refuses_a_misaligned_placed_x():
    from polykit.errors import DeviceError

    with pytest.raises(DeviceError, match="16-byte A loads"):
        _conv_launches("cuda.conv_nhwc.sm90_128x128", (2, 6, 7, 16), (24, 3, 3, 16), (2, 6, 7, 24), 44, pads=[1] * 4)


def _emulate_igemm_conv(args: list, memory: np.ndarray, base: int, w: np.ndarray) -> np.ndarray:
    """conv_nhwc.cu's implicit GEMM as its loaders index X from the launch arguments (ConvNhwcP.col and
    .b: column n = (nb, oh, ow), row k = (kh, kw, c), X[nb*H*W*LDX + (ih*W + iw)*LDX + c]), in fp32."""
    x0 = (args[0].ptr - base) // 2
    NB, C, _, H, W, M, _, OH, OW, _, KH, KW, _, SH, SW, _, PH, PW, _, DH, DW, G = (int(a) for a in args[4:26])
    LDX = int(args[-1])
    out = np.zeros((NB, OH, OW, M), np.float32)
    for nb, oh, ow in np.ndindex(NB, OH, OW):
        for kh, kw in np.ndindex(KH, KW):
            ih, iw = oh * SH - PH + kh * DH, ow * SW - PW + kw * DW
            if 0 <= ih < H and 0 <= iw < W:
                at = x0 + nb * H * W * LDX + (ih * W + iw) * LDX
                out[nb, oh, ow] += w[:, kh, kw, :].astype(np.float32) @ memory[at:at + C].astype(np.float32)
    return out


@pytest.mark.parametrize("c, ldx, start", [(24, 40, 0), (5, 29, 24), (16, 16, 0)])
def test_the_igemm_launch_arguments_convolve_the_strided_skip_as_the_reference_does_dense(c, ldx, start):
    """Host emulation: the igemm's X addressing on its own launch arguments, over a buffer whose other
    channels are NaN, convolves exactly the skip's channels (the reference on the dense X)."""
    from polykit.runtime.cuda.harness import reference_layer

    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 6, 7, c)).astype(np.float16)
    w = (rng.standard_normal((5, 3, 3, c)) * 0.2).astype(np.float16)
    base = 0x10000
    memory = np.full(2 * 6 * 7 * ldx, np.nan, np.float16)
    memory.reshape(2, 6, 7, ldx)[..., start:start + c] = x
    ((_, args),) = _conv_launches("cuda.conv_nhwc.igemm_mma", x.shape, w.shape, (2, 6, 7, 5), ldx,
                                  x_ptr=base + start * 2, pads=[1] * 4)
    got = _emulate_igemm_conv(args, memory, base, w)
    layer = LayerDesc("conv", "ConvNHWC", ("X", "W"), ("Y",), {"pads": [1] * 4, "kernel_shape": [3, 3]},
                      domain=POLYKIT_DOMAIN)
    want = reference_layer(layer, {"X": x.astype(np.float32), "W": w.astype(np.float32)})["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


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
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 7, 9, c)).astype(np.float16)
    buf = np.full((2, 7, 9, ldx), np.nan, np.float16)
    buf[..., start:start + c] = x
    layer = _pool_layer(kind, x.shape, (2, 3, 4, c), kernel_shape=[3, 3], strides=[2, 2])
    _read_x_strided(monkeypatch, x.shape, start, ldx)
    got = run_layer(layer, {"X": buf}, tactic=POOL, output_specs={"Y": ((2, 3, 4, c), F16)})["Y"]
    want = reference_layer(layer, {"X": x})["Y"]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def _read_x_strided(monkeypatch, shape: tuple, start: int, ldx: int) -> None:
    """The harness's X (uploaded as the whole [.., ldx] buffer) handed to the tactic as the placed
    skip: its `shape[-1]` channels `start` in, pixels `ldx` apart."""
    from polykit.kernels.cuda.base import CudaTactic

    enqueue = CudaTactic.enqueue

    def strided(self, lay, launcher, tensors):
        whole = tensors["X"]
        return enqueue(self, lay, launcher, {**tensors, "X": DeviceTensor(whole.ptr + start * 2, shape, F16, ldx)})

    monkeypatch.setattr(CudaTactic, "enqueue", strided)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", IGEMM + SM90)
@pytest.mark.parametrize("c, ldx, start", [(24, 40, 0), (16, 48, 32), (5, 29, 24)])
def test_igemm_and_sm90_convs_read_strided_x_inside_a_poisoned_buffer(tactic, c, ldx, start, monkeypatch):
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    if tactic in SM90 and (c % 8 or ldx % 8 or start % 8 or driver.current_device().arch != "sm_90"):
        pytest.skip("the sm90 tiles need 16-byte aligned pixels and an sm_90 device")

    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 6, 7, c)).astype(np.float16)
    w = (rng.standard_normal((8, 3, 3, c)) * 0.2).astype(np.float16)
    buf = np.full((2, 6, 7, ldx), np.nan, np.float16)
    buf[..., start:start + c] = x
    layer = LayerDesc("conv", "ConvNHWC", ("X", "W"), ("Y",), {"pads": [1] * 4, "kernel_shape": [3, 3]},
                      domain=POLYKIT_DOMAIN, precision="fp16", in_dtypes=("float16",) * 2, out_dtypes=("float16",),
                      in_shapes=(x.shape, w.shape), out_shapes=((2, 6, 7, 8),))
    _read_x_strided(monkeypatch, x.shape, start, ldx)
    got = run_layer(layer, {"X": buf, "W": w}, tactic=tactic, output_specs={"Y": ((2, 6, 7, 8), F16)})["Y"]
    want = reference_layer(layer, {"X": x.astype(np.float32), "W": w.astype(np.float32)})["Y"]
    assert not np.isnan(got).any()
    assert np.linalg.norm(got.astype(np.float32) - want) / np.linalg.norm(want) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("level", [0, 3])
@pytest.mark.parametrize("k, channels", [(3, 24), (1, 24), (3, 5)])
def test_cuda_fp16_lateral_conv_skip_matches_the_cpu(k, channels, level):
    from tests.compiler.test_concat_skip_placement import lateral

    model, _ = lateral(k, channels)
    feeds = _feeds()
    want = _run(build_plan(model, BuilderConfig(target="cpu")), feeds)
    got = _run(build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level)), feeds)
    for key, w in want.items():
        assert np.linalg.norm(got[key] - w) / np.linalg.norm(w) < 1e-2, key


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
