"""The grouped Hopper convolution tactics (cuda.conv_nhwc.sm90g_*): the launch each would make,
replayed on the host (what every grid-z group reads and writes, the TMA map's view of the weight)
against the float64 reference; which layers they take; the cuda plan of a wav2vec2-like positional
conv (CPU); and the kernel against the reference (GPU, compute capability 9.0)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, TensorMapSpec
from polykit.kernels.cuda.conv.conv_sm90 import CONV_TILES
from polykit.kernels.cuda.conv.conv_sm90_grouped import plan_grouped, tile_widths
from polykit.kernels.tactics import candidates, find_tactic

rng = np.random.default_rng(29)
GELU = {"input": "raw", "body": [{"op": "Gelu", "inputs": ["raw"], "outputs": ["Y"], "attrs": {}}]}
RESIDUAL = {"input": "raw", "body": [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["Y"], "attrs": {}}]}
POS_CONV = {"kernel_shape": [1, 128], "pads": [0, 64, 0, 64], "group": 16}


def conv_layer(x, w, attrs, dtype="float16", bias=True, epilogue=None, extra=()):
    """A ConvNHWC layer as the builder stamps it (Y's shape by the reference rules)."""
    attrs = dict(attrs, kernel_shape=list(w[1:3]))
    if epilogue:
        attrs["epilogue"] = epilogue
    names = ("X", "W", "B")[:3 if bias else 2] + tuple(n for n, _ in extra)
    shapes = (tuple(x), tuple(w), (w[0],))[:3 if bias else 2] + tuple(s for _, s in extra)
    node = Node("ConvNHWC", list(names[:2]), ["Y"], {k: v for k, v in attrs.items() if k != "epilogue"}, "c",
                POLYKIT_DOMAIN)
    y = run_reference(node, [np.zeros(x), np.zeros(w)])[0].shape
    return LayerDesc("conv", "ConvNHWC", names, ("Y",), attrs, domain=POLYKIT_DOMAIN, precision="fp16",
                     in_dtypes=(dtype,) * len(names), out_dtypes=(dtype,), in_shapes=shapes, out_shapes=(tuple(y),))


class Heap:
    """Device memory as one float64 array of `es`-byte elements from BASE: tensors at 256-byte
    aligned element offsets, NaN where nothing was put."""

    BASE = 1 << 20

    def __init__(self, es: int):
        self.es, self.data, self.filled = es, np.full(0, np.nan), 0

    def put(self, a: np.ndarray, dtype: str, shift: int = 0) -> DeviceTensor:
        start = -(-self.filled // (256 // self.es)) * (256 // self.es) + shift
        self.data = np.concatenate([self.data, np.full(start + a.size - self.data.size, np.nan)])
        self.data[start:start + a.size] = a.ravel()
        self.filled = start + a.size
        return DeviceTensor(self.BASE + start * self.es, tuple(a.shape), np.dtype(dtype))

    def at(self, ptr: int) -> int:
        assert (ptr - self.BASE) % self.es == 0
        return (ptr - self.BASE) // self.es


class Recorder:
    sm_count = 132
    stream = communicator = None

    def __init__(self):
        self.launches = []

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.launches.append((kernel, tuple(grid), tuple(block), list(args), shared_mem))


def replay(heap: Heap, grid, args) -> None:
    """Run the recorded launch the way conv_sm90.cu with CONV_GROUPED does, in numpy: group z of
    grid z gathers A at X + z * C (pixels LDX apart), reads B through the TMA map at z (zero past
    its dims), adds Bias + z * N and stores rows of N at Y + z * N, LDY apart (each element once)."""
    tm, X, B, Y = args[:4]
    M, N, K, H, W, C, OH, OW, KW, SH, SW, PH, PW, DH, DW, LDY, LDX = (int(a) for a in args[4:21])
    es, data = heap.es, heap.data
    assert isinstance(tm, TensorMapSpec) and tm.ptr % 16 == 0 and all(s % 16 == 0 for s in tm.strides)
    assert tm.box[0] * es == 128 and tm.box[2] == 1 and tm.dims[2] == grid[2] and grid[1] == 1
    m, k = np.arange(M)[:, None], np.arange(K)[None, :]
    img, pix = m // (OH * OW), m % (OH * OW)
    tap, c = k // C, k % C
    ih = (pix // OW) * SH - PH + (tap // KW) * DH
    iw = (pix % OW) * SW - PW + (tap % KW) * DW
    ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    n = np.arange(N)
    for z in range(grid[2]):
        x0, y0 = heap.at(X.ptr) + z * C, heap.at(Y.ptr) + z * N
        src = x0 + img * H * W * LDX + (np.where(ok, ih, 0) * W + np.where(ok, iw, 0)) * LDX + c
        a = np.where(ok, data[np.where(ok, src, x0)], 0.0)
        assert not np.isnan(a).any(), "A gathered outside X"
        w0 = heap.at(tm.ptr) + z * tm.strides[1] // es
        b = data[w0 + np.arange(tm.dims[1])[None, :] * (tm.strides[0] // es) + np.arange(tm.dims[0])[:, None]]
        assert b.shape == (K, N) and not np.isnan(b).any()
        out = a @ b + (data[heap.at(B.ptr) + z * N + n] if isinstance(B, DeviceTensor) else 0.0)
        dst = y0 + np.arange(M)[:, None] * LDY + n[None, :]
        assert np.isnan(data[dst]).all(), "a Y element written twice"
        data[dst] = out


EMULATED = [  # (x NHWC, w KRSC, attrs without kernel_shape)
    ((1, 1, 23, 768), (768, 1, 128, 48), POS_CONV),                                   # wav2vec2's pos conv, odd L
    ((1, 1, 37, 64), (32, 1, 128, 16), dict(POS_CONV, group=4)),                      # odd L, Mg 8
    ((2, 9, 11, 64), (64, 3, 3, 16), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # 3x3 Cg 16 stride 2
    ((1, 7, 6, 96), (48, 3, 3, 32), {"group": 3, "pads": [2, 0, 1, 1], "dilations": [2, 1]}),
]


def emulate(layer, tile, dtype="float16", y_stride=0, x_stride=0):
    """(Y as the replayed launch left it, the float64 reference) of `layer` on sm90g_<tile>;
    `y_stride` / `x_stride`: Y / X placed in a wider channels-last tensor (rows that far apart)."""
    x, w = layer.in_shapes[0], layer.in_shapes[1]
    y = layer.out_shapes[0]
    X, Wt, Bv = rng.standard_normal(x), rng.standard_normal(w), rng.standard_normal(w[0])
    heap = Heap(np.dtype(dtype).itemsize)
    wide_x = np.full(x[:3] + (x_stride or x[3],), np.nan)
    wide_x[..., :x[3]] = X
    tx = replace(heap.put(wide_x, dtype), shape=tuple(x), row_stride=x_stride)
    tensors = {"X": tx, "W": heap.put(Wt, dtype), "B": heap.put(Bv, dtype)}
    ty = heap.put(np.full(y[:3] + (y_stride or y[3],), np.nan), dtype)
    tensors["Y"] = replace(ty, shape=tuple(y), row_stride=y_stride)
    rec = Recorder()
    find_tactic("cuda", "ConvNHWC", f"cuda.conv_nhwc.sm90g_{tile.label}").enqueue_fn(layer, rec, tensors)
    (kernel, grid, block, args, smem), = rec.launches
    assert ("CONV_GROUPED", "1") in kernel.defines and block == (tile.threads,) and smem > 0
    replay(heap, grid, args)
    start = heap.at(ty.ptr)
    got = heap.data[start:start + int(np.prod(ty.shape))].reshape(ty.shape)
    node = Node("ConvNHWC", ["X", "W", "B"], ["Y"], {k: v for k, v in layer.attrs.items()}, "c", POLYKIT_DOMAIN)
    ref = run_reference(node, [X, Wt, Bv])[0]
    if y_stride:
        assert np.isnan(got[..., y[3]:]).all(), "written outside Y's slice"
        got = got[..., :y[3]]
    return got, ref


@pytest.mark.parametrize("x,w,attrs", EMULATED)
def test_each_group_reads_and_writes_its_slices(x, w, attrs):
    layer = conv_layer(x, w, attrs)
    got, ref = emulate(layer, CONV_TILES[0])
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9)


def test_placed_output_and_input_keep_their_row_strides():
    layer = conv_layer((2, 5, 7, 64), (64, 3, 3, 16), {"group": 4, "pads": [1, 1, 1, 1]})
    got, ref = emulate(layer, CONV_TILES[3], "bfloat16", y_stride=96, x_stride=80)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9)


def test_launch_puts_the_groups_on_grid_z_sharing_the_sms():
    layer = conv_layer((1, 1, 249, 768), (768, 1, 128, 48), POS_CONV)
    gg = plan_grouped(layer.attrs, *layer.in_shapes[:2], layer.out_shapes[0])
    assert (gg.G, gg.geo.M, gg.geo.N, gg.geo.K, gg.geo.C, gg.geo.ldx, gg.geo.ldy) == (16, 250, 48, 6144, 48, 768, 768)
    heap, rec = Heap(2), Recorder()
    tensors = {n: heap.put(np.zeros(s), "float16") for n, s in zip(("X", "W", "B"), layer.in_shapes)}
    tensors["Y"] = heap.put(np.zeros(layer.out_shapes[0]), "float16")
    tile = next(t for t in CONV_TILES if t.label == "128x64")
    find_tactic("cuda", "ConvNHWC", "cuda.conv_nhwc.sm90g_128x64").enqueue_fn(layer, rec, tensors)
    (_, grid, _, args, _), = rec.launches
    assert grid == (2, 1, 16)  # 2 row tiles a group, every group at once: 32 blocks, one launch
    assert args[0].dims == (6144, 48, 16) and args[0].strides == (6144 * 2, 48 * 6144 * 2)
    assert args[0].box == (64, tile.bn, 1)


def test_misaligned_input_or_weight_is_refused_at_enqueue():
    layer = conv_layer((1, 4, 4, 32), (32, 3, 3, 16), {"group": 2, "pads": [1, 1, 1, 1]})
    tactic = find_tactic("cuda", "ConvNHWC", f"cuda.conv_nhwc.sm90g_{CONV_TILES[0].label}")
    for bad in ("X", "W"):
        heap = Heap(2)
        tensors = {n: heap.put(np.zeros(s), "float16", shift=4 if n == bad else 0)
                   for n, s in zip(("X", "W", "B"), layer.in_shapes)}
        tensors["Y"] = heap.put(np.zeros(layer.out_shapes[0]), "float16")
        with pytest.raises(DeviceError, match="16-byte"):
            tactic.enqueue_fn(layer, Recorder(), tensors)
    # placed X: pixel strides and offsets that keep the 16-byte chunks aligned, not others
    assert tactic.reads_placed(layer, 0, 32, 40, 0) and not tactic.reads_placed(layer, 0, 32, 36, 0)
    assert not tactic.reads_placed(layer, 0, 32, 40, 4)


def sm90g(layer):
    return [t.name for t in candidates("cuda", "ConvNHWC", layer, arch="sm_90") if ".sm90g_" in t.name]


def test_wav2vec2_pos_conv_is_offered_on_the_64_column_tiles_first():
    layer = conv_layer((1, 1, 249, 768), (768, 1, 128, 48), POS_CONV, epilogue=GELU)
    found = [t.name for t in candidates("cuda", "ConvNHWC", layer, arch="sm_90")]
    assert sm90g(layer) == [f"cuda.conv_nhwc.sm90g_{t.label}" for t in CONV_TILES if t.bn == 64]
    assert found[0].startswith("cuda.conv_nhwc.sm90g_") and "cuda.conv_nhwc.igemm_simt" in found
    assert not any("grouped" in name for name in found)  # the per-group window does not fit grouped_mma
    assert sm90g(replace(layer, in_dtypes=("bfloat16",) * 3, out_dtypes=("bfloat16",))) == sm90g(layer)
    assert not any(".sm90g_" in t.name for t in candidates("cuda", "ConvNHWC", layer, arch="sm_80"))


@pytest.mark.parametrize("x,w,group,why", [
    ((1, 28, 28, 144), (144, 3, 3, 16), 9, "RegNet-Y-800MF: K 144, grouped_mma's"),
    ((1, 56, 56, 128), (128, 3, 3, 4), 32, "ResNeXt-50 stage 1: Cg 4"),
    ((1, 7, 7, 1024), (1024, 3, 3, 32), 32, "ResNeXt-50 stage 4: K 288 with Mg 32"),
    ((1, 8, 8, 48), (48, 3, 3, 12), 4, "Cg 12"),
    ((1, 8, 8, 64), (36, 3, 3, 16), 4, "Mg 9"),
])
def test_small_or_unaligned_groups_are_not_offered(x, w, group, why):
    assert sm90g(conv_layer(x, w, {"group": group, "pads": [1, 1, 1, 1]})) == [], why


def test_large_groups_are_offered_and_unfit_layers_refused():
    big = conv_layer((1, 14, 14, 896), (896, 3, 3, 112), {"group": 8, "pads": [1, 1, 1, 1]})  # K 1008, Mg 112
    assert sm90g(big) == [f"cuda.conv_nhwc.sm90g_{t.label}" for t in CONV_TILES if t.bn == 128]
    pos = ((1, 1, 249, 768), (768, 1, 128, 48), POS_CONV)
    assert sm90g(conv_layer(*pos, bias=False))
    assert not sm90g(conv_layer(*pos, dtype="float32"))
    assert not sm90g(conv_layer(*pos, epilogue=RESIDUAL, extra=(("skip", (1, 1, 250, 768)),)))
    assert not sm90g(conv_layer((1, 1, 49, 64), (64, 1, 128, 64), dict(POS_CONV, group=1)))
    assert plan_grouped(dict(POS_CONV, depth_to_space=[1, 2]), *pos[:2], (1, 1, 250, 768)) is None


def test_cuda_plan_of_a_wav2vec2_pos_conv_puts_sm90g_before_igemm_simt():
    """The positional conv of a wav2vec2 front-end (16 groups of 48 channels, k 128, pad 64, the
    Slice of its last frame, Gelu) in the cuda fp16 level-0 plan: on sm_90 the three 64-column
    sm90g tiles lead its candidates, and a level-0 build there (by_estimate, 132 SMs) takes one
    of them rather than igemm_simt."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.builder.tuner import by_estimate
    from tests.conv_models import wav2vec2_frontend

    model = wav2vec2_frontend(batch=1, length=1203, width=16, model_dim=768, groups=16, pos_kernel=128)
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    pos, = [layer for layer in plan.layers if layer.kind == "ConvNHWC" and layer.attrs["group"] == 16]
    assert tuple(pos.in_shapes[1]) == (768, 1, 128, 48) and pos.attrs["kernel_shape"] == [1, 128]
    found = candidates("cuda", "ConvNHWC", pos, arch="sm_90")
    names = [t.name for t in found]
    assert names == sm90g(pos) + ["cuda.conv_nhwc.igemm_simt", "cuda.conv_nhwc.igemm_simt_wide"]
    assert len(sm90g(pos)) == 3
    (_, first), = by_estimate([(pos, t) for t in found], 132)[:1]
    assert first in found[:3]  # the cheapest sm90g tile by gemm_sm90's predicted_us, not igemm_simt


def require_sm90():
    from tests.kernels.cuda import on_sm90

    if not on_sm90():
        pytest.skip("needs a compute capability 9.0 GPU")


GPU_CASES = [
    ((1, 1, 61, 768), (768, 1, 128, 48), POS_CONV, GELU),                      # wav2vec2's pos conv at L 61
    ((2, 13, 11, 64), (64, 3, 3, 16), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}, None),  # 3x3 Cg 16
    ((1, 9, 9, 256), (256, 3, 3, 64), {"group": 4, "pads": [1, 1, 1, 1]}, None),  # K 576, Mg 64
]


def run_gpu(x, w, attrs, epilogue, dtype, tile, misalign=None):
    """(the sm90g_<tile> output, the float64 reference) on random inputs."""
    from polykit.runtime.cuda.harness import infer_output_specs, run_layer

    inputs = {"X": rng.standard_normal(x).astype(np.float32).astype(dtype),
              "W": (rng.standard_normal(w) * 0.1).astype(np.float32).astype(dtype),
              "B": rng.standard_normal(w[0]).astype(np.float32).astype(dtype)}
    layer = conv_layer(x, w, attrs, dtype.name, epilogue=epilogue)
    specs = infer_output_specs(layer, inputs)
    out = run_layer(layer, inputs, tactic=f"cuda.conv_nhwc.sm90g_{tile.label}", output_specs=specs,
                    misalign=misalign)["Y"]
    node = Node("ConvNHWC", ["X", "W", "B"], ["Y"], dict(layer.attrs), "c", POLYKIT_DOMAIN)
    ref = run_reference(node, [inputs[n].astype(np.float64) for n in ("X", "W", "B")])[0]
    out = np.asarray(out, np.float64)
    assert not np.isnan(out).any(), "unwritten (NaN) elements"
    return out, ref


@pytest.mark.gpu
@pytest.mark.parametrize("x,w,attrs,epilogue", GPU_CASES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sm90g_matches_float64_reference(x, w, attrs, epilogue, dtype):
    import ml_dtypes

    require_sm90()
    dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    tiles = [t for t in CONV_TILES if t.fits(dtype.name, False, False) and t.bn in tile_widths(w[0] // attrs["group"])]
    for tile in tiles[:2]:
        out, ref = run_gpu(x, w, attrs, epilogue, dtype, tile)
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) <= (2e-3 if dtype == np.float16 else 1e-2), tile.label


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [{"Y": 4}, {"B": 2}], ids=["Y", "bias"])
def test_sm90g_unaligned_output_or_bias_takes_the_narrow_stores(misalign):
    """Y or the bias element-aligned only: every group's pointer off 16 bytes alike, the kernel's
    run-time checks take the pair / element stores; within fp16 rounding of the reference."""
    require_sm90()
    x, w, attrs, _ = GPU_CASES[2]
    out, ref = run_gpu(x, w, attrs, None, np.dtype(np.float16), CONV_TILES[0], misalign=misalign)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) <= 2e-3


def test_every_variant_and_an_epilogue_compile_with_nvrtc():
    from polykit.kernels.cuda.conv.conv_sm90_grouped import compile_variants, grouped_kernel
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    gelu = conv_layer((1, 1, 23, 768), (768, 1, 128, 48), POS_CONV, epilogue=GELU)
    units = unique_units(compile_variants() + [grouped_kernel(gelu, CONV_TILES[4], "half_t")])
    assert len([u for u in units if ("ELEM", "half_t") in u.defines]) == len(CONV_TILES)  # every tile in fp16
    assert all(("CONV_GROUPED", "1") in u.defines for u in units)
    assert check_all(units, "sm_90") == len(units)
