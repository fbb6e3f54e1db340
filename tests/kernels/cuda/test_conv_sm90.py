"""The Hopper channels-last convolution tactics (cuda.conv_nhwc.sm90_*): geometry rules (CPU)
and every tile against the float64 reference, outputs poisoned (GPU, compute capability 9.0)."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.conv.conv_sm90 import CONV_TILES, NARROW_TILES, X3_CONV_TILES, plan_conv

rng = np.random.default_rng(23)
BF16 = np.dtype(ml_dtypes.bfloat16)
TOL = {np.dtype(np.float16): 2e-3, BF16: 1e-2}


def test_plan_conv_maps_nhwc_convolutions_onto_the_gemm():
    geo = plan_conv({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, (2, 9, 9, 16), (24, 3, 3, 16),
                    (2, 5, 5, 24))
    assert (geo.M, geo.N, geo.K) == (2 * 5 * 5, 24, 9 * 16)
    assert geo.strides == (2, 2) and geo.pads == (1, 1) and geo.dilations == (1, 1)


@pytest.mark.parametrize("x,w,attrs", [((1, 8, 8, 12), (8, 3, 3, 12), {}),          # C not a multiple of 8
                                       ((1, 8, 8, 16), (8, 3, 3, 8), {"group": 2}),  # grouped
                                       ((1, 8, 16), (8, 3, 16), {})])                # 1-D
def test_plan_conv_declines_what_the_kernel_cannot_take(x, w, attrs):
    assert plan_conv(attrs, x, w, (1, 6, 6, 8)) is None


def producer_model(geo, bm: int, vec: int, ldx: int):
    """conv_sm90.cu's producer warpgroup in numpy, thread by thread, as the kernel computes it: each of
    the 128 threads owns chunk tid % 8 of rows tid / 8 + 16 i; a row keeps its input pixel index and
    tap-0 coordinates; the chunk's (channel block, kw, kh) advance by counting 8 chunks a k-tile.
    Returns {(m, k0): element offset in X or -1 for a zero fill} for every row m < M and chunk start k0."""
    M, K, H, W, C, OH, OW, KW = geo.M, geo.K, geo.H, geo.W, geo.C, geo.OH, geo.OW, geo.KW
    (SH, SW), (PH, PW), (DH, DW) = geo.strides, geo.pads, geo.dilations
    c8s, KH = C // vec, K // (KW * C)
    ktiles, tiles_m = -(-K // (8 * vec)), -(-M // bm)
    got = {}
    for tid in range(128):
        chunk = tid % 8
        for tm in range(tiles_m):
            rows = []
            for i in range(bm // 16):
                m = tm * bm + tid // 8 + 16 * i
                img, px = divmod(m, OH * OW)
                oh, ow = divmod(px, OW)
                ih0, iw0 = oh * SH - PH, ow * SW - PW
                rows.append((m, (img * H + ih0) * W + iw0, ih0 if m < M else -0x40000000, iw0))
            c8, (kh, kw) = chunk % c8s, divmod(chunk // c8s, KW)
            for kt in range(ktiles):
                dh, dw = kh * DH, kw * DW
                for m, pix, ih0, iw0 in rows:
                    ok = kh < KH and 0 <= ih0 + dh < H and 0 <= iw0 + dw < W
                    if m < M:
                        got[(m, (kt * 8 + chunk) * vec)] = (pix + dh * W + dw) * ldx + c8 * vec if ok else -1
                c8 += 8
                while c8 >= c8s:
                    c8 -= c8s
                    kw += 1
                    if kw == KW:
                        kw, kh = 0, kh + 1
    return got


@pytest.mark.parametrize("x,w,attrs", [
    ((2, 9, 11, 24), (24, 3, 3, 24), {"pads": [1, 1, 1, 1]}),                          # EfficientNet-V2's 24 channels
    ((1, 7, 6, 8), (16, 5, 5, 8), {"pads": [2, 1, 2, 1], "strides": [2, 1]}),          # one chunk a tap
    ((1, 9, 9, 72), (8, 3, 2, 72), {"dilations": [2, 3], "pads": [2, 3, 0, 1]}),       # 9 chunks a tap
    ((3, 5, 4, 64), (32, 1, 1, 64), {}),                                               # 1x1, M not a tile multiple
    ((1, 1, 23, 48), (16, 1, 7, 48), {"pads": [0, 3, 0, 3]}),                          # 1-D, 6 chunks a tap
])
@pytest.mark.parametrize("bm,vec,ldx_extra", [(64, 8, 0), (128, 8, 16), (128, 4, 0), (64, 16, 0)])
def test_the_producers_counted_chunks_gather_what_the_division_formula_names(x, w, attrs, bm, vec, ldx_extra):
    """The producer's k-tile counters and 32-bit pixel indices (conv_sm90.cu) name, for every row and
    16-byte chunk, the X element the im2col definition names (or a zero fill), fp16 / fp32 / int8 chunks,
    a row stride wider than C (a placed input) included."""
    kh_, kw_ = w[1], w[2]
    y_hw = [(x[1 + d] + attrs.get("pads", [0] * 4)[d] + attrs.get("pads", [0] * 4)[d + 2]
             - (attrs.get("dilations", [1, 1])[d] * ((kh_, kw_)[d] - 1) + 1)) // attrs.get("strides", [1, 1])[d] + 1
            for d in range(2)]
    geo = plan_conv(dict(attrs, kernel_shape=[kh_, kw_]), x, w, (x[0], *y_hw, w[0]))
    if geo.C % vec:
        pytest.skip("C is not a multiple of this chunk")
    ldx = geo.C + ldx_extra
    got = producer_model(geo, bm, vec, ldx)
    (SH, SW), (PH, PW), (DH, DW) = geo.strides, geo.pads, geo.dilations
    for m in range(geo.M):
        img, px = divmod(m, geo.OH * geo.OW)
        oh, ow = divmod(px, geo.OW)
        for k0 in range(0, -(-geo.K // (8 * vec)) * 8 * vec, vec):
            tap, c = divmod(k0, geo.C)
            ih, iw = oh * SH - PH + (tap // geo.KW) * DH, ow * SW - PW + (tap % geo.KW) * DW
            inside = k0 < geo.K and 0 <= ih < geo.H and 0 <= iw < geo.W
            want = ((img * geo.H + ih) * geo.W + iw) * ldx + c if inside else -1
            assert got[(m, k0)] == want, (m, k0)


def require_sm90():
    from tests.kernels.cuda import on_sm90

    if not on_sm90():
        pytest.skip("needs a compute capability 9.0 GPU")


def rand(shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def run_conv(tile, inputs, attrs, dtype, epilogue=None, precision="fp16", prefix="sm90", misalign=None):
    """(GPU output, float64 reference) of a ConvNHWC over `inputs` (X, W, B, then the epilogue's
    extra inputs in order); `misalign`: bytes to shift tensors from their aligned allocations."""
    from polykit.compiler.ops.references import run_reference
    from polykit.runtime.cuda.harness import infer_output_specs, run_layer

    names = tuple(inputs)
    w = inputs["W"].shape
    attrs = dict(attrs, kernel_shape=list(w[1:3]))
    if epilogue:
        attrs["epilogue"] = epilogue
    layer = LayerDesc("conv", "ConvNHWC", names, ("Y",), attrs, domain=POLYKIT_DOMAIN, precision=precision)
    specs = infer_output_specs(layer, inputs)
    layer = replace(layer, in_dtypes=tuple(np.dtype(inputs[n].dtype).name for n in names),
                    out_dtypes=(np.dtype(dtype).name,), in_shapes=tuple(tuple(inputs[n].shape) for n in names),
                    out_shapes=(specs["Y"][0],))
    out = run_layer(layer, inputs, tactic=f"cuda.conv_nhwc.{prefix}_{tile.label}", output_specs=specs,
                    misalign=misalign)["Y"]
    node = Node("ConvNHWC", list(names), ["Y"], dict(layer.attrs), "conv", POLYKIT_DOMAIN)
    ref = run_reference(node, [inputs[n].astype(np.float64) for n in names])[0]
    assert not np.isnan(np.asarray(out, np.float64)).any(), "unwritten (NaN) elements"
    return out, ref


def rel_err(out, ref):
    out = np.asarray(out, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def run_case(tile, x, w, attrs, dtype, epilogue=None, extra=None, precision="fp16", prefix="sm90"):
    inputs = {"X": rand(x, dtype), "W": rand(w, dtype), "B": rand((w[0],), dtype), **(extra or {})}
    return rel_err(*run_conv(tile, inputs, attrs, dtype, epilogue, precision, prefix))


RESIDUAL_RELU = {"input": "raw", "body": [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
                                          {"op": "Relu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}]}
RELU = {"input": "raw", "body": [{"op": "Relu", "inputs": ["raw"], "outputs": ["Y"], "attrs": {}}]}

CASES = [  # (x NHWC, w KRSC, attrs)
    ((2, 9, 11, 8), (5, 3, 3, 8), {"pads": [1, 1, 1, 1]}),
    ((1, 13, 10, 16), (9, 3, 2, 16), {"strides": [2, 3], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((2, 8, 8, 24), (70, 1, 1, 24), {}),
    ((3, 7, 7, 64), (136, 3, 3, 64), {"pads": [1, 1, 1, 1]}),
    ((2, 28, 28, 64), (256, 1, 1, 64), {}),
    ((1, 17, 16, 8), (16, 7, 7, 8), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),  # the padded stem
    ((2, 15, 15, 128), (64, 3, 3, 128), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", CONV_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("x,w,attrs", CASES)
def test_sm90_conv_matches_float64_reference(tile, x, w, attrs):
    require_sm90()
    assert run_case(tile, x, w, attrs, np.float16) <= 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [t for t in CONV_TILES if t not in NARROW_TILES], ids=lambda t: t.label)
@pytest.mark.parametrize("x,w,attrs", CASES)
def test_sm90_conv_tf32_matches_float64_reference(tile, x, w, attrs):
    """float32 storage, tf32 math (the operands' low 13 mantissa bits ignored): 4 channels a chunk."""
    require_sm90()
    assert run_case(tile, x, w, attrs, np.float32, precision="tf32") <= 3e-3


@pytest.mark.gpu
@pytest.mark.parametrize("tile", X3_CONV_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("x,w,attrs", CASES)
def test_sm90x3_conv_has_fp32_accuracy(tile, x, w, attrs):
    """float32 layers of precision fp32 on tf32 tensor cores, each operand split in two (3xTF32):
    the error stays at float32's level (tf32 alone: ~1e-3)."""
    require_sm90()
    assert run_case(tile, x, w, attrs, np.float32, precision="fp32", prefix="sm90x3") <= 2e-6


def test_sm90_conv_takes_float32_as_tf32_or_fp32_by_tactic():
    from polykit.kernels.cuda.conv.conv_sm90 import _supports

    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    base = LayerDesc("conv", "ConvNHWC", ("X", "W", "B"), ("Y",), attrs, domain=POLYKIT_DOMAIN,
                     in_dtypes=("float32",) * 3, out_dtypes=("float32",),
                     in_shapes=((1, 8, 8, 16), (32, 3, 3, 16), (32,)), out_shapes=((1, 8, 8, 32),))
    tf32, x3 = _supports(CONV_TILES[0], False), _supports(X3_CONV_TILES[0], True)
    assert tf32(replace(base, precision="tf32")) and not tf32(replace(base, precision="fp32"))
    assert x3(replace(base, precision="fp32")) and not x3(replace(base, precision="tf32"))
    half = replace(base, precision="fp16", in_dtypes=("float16",) * 3, out_dtypes=("float16",))
    assert not x3(half) and tf32(half)


def test_the_narrow_tiles_take_16_bit_layers_and_the_estimate_prefers_them_at_32_channels():
    """32-column tiles (wgmma m64n32k16) for convs with few output channels: 16-bit storage only, and
    predicted faster than the 64-column tiles where N <= 32 (half of a 64-column tile's products unused),
    slower where N = 64 (twice the tiles), which they do not take."""
    from polykit.kernels.cuda.conv.conv_sm90 import _estimate, _supports

    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}

    def conv(cout, dtype="float16", precision="fp16"):
        return LayerDesc("conv", "ConvNHWC", ("X", "W", "B"), ("Y",), attrs, domain=POLYKIT_DOMAIN, precision=precision,
                         in_dtypes=(dtype,) * 3, out_dtypes=(dtype,),
                         in_shapes=((8, 512, 512, 32), (cout, 3, 3, 32), (cout,)), out_shapes=((8, 512, 512, cout),))

    wide = next(t for t in CONV_TILES if t.label == "64x64x2")
    for tile in NARROW_TILES:
        assert tile.bn == 32 and _supports(tile, False)(conv(32)) and _supports(tile, False)(conv(32, "bfloat16", "bf16"))
        assert not _supports(tile, False)(conv(32, "float32", "tf32")) and not _supports(tile, False)(conv(40))
        assert _estimate(tile, False)(conv(32), 132) < _estimate(wide, False)(conv(32), 132)
        assert _estimate(tile, False)(conv(64), 132) > _estimate(wide, False)(conv(64), 132)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", NARROW_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("cout", [32, 24, 8])
def test_sm90_narrow_tiles_at_full_resolution_shapes(tile, cout):
    """Many row tiles, N = 32 (one whole column tile), 24 and 8 (a partial one)."""
    require_sm90()
    assert run_case(tile, (2, 33, 31, 32), (cout, 3, 3, 32), {"pads": [1, 1, 1, 1]}, np.float16) <= 2e-3
    assert run_case(tile, (1, 17, 19, 64), (cout, 3, 3, 64), {"pads": [1, 1, 1, 1]}, BF16) <= 1e-2


@pytest.mark.gpu
def test_sm90_conv_bf16():
    require_sm90()
    assert run_case(CONV_TILES[0], (2, 9, 11, 16), (24, 3, 3, 16), {"pads": [1, 1, 1, 1]}, BF16) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("tile", CONV_TILES[:2], ids=lambda t: t.label)
def test_sm90_conv_with_residual_relu_epilogue(tile):
    require_sm90()
    extra = {"skip": rand((2, 14, 14, 96), np.float16)}
    err = run_case(tile, (2, 14, 14, 32), (96, 3, 3, 32), {"pads": [1, 1, 1, 1]}, np.float16,
                   epilogue=RESIDUAL_RELU, extra=extra)
    assert err <= 2e-3



def bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


FP16 = np.dtype(np.float16)
#: (tile, storage, epilogue): every tile with the bias alone, then bf16 and the epilogues on a few
PATH_CASES = ([(t, FP16, None) for t in CONV_TILES]
              + [(CONV_TILES[0], BF16, None), (CONV_TILES[0], FP16, RELU), (CONV_TILES[0], FP16, RESIDUAL_RELU),
                 (CONV_TILES[-1], FP16, RESIDUAL_RELU), (CONV_TILES[0], BF16, RESIDUAL_RELU)])


@pytest.mark.gpu
@pytest.mark.parametrize("tile,dtype,epilogue", PATH_CASES, ids=[
    f"{t.label}-{d.name}-{'bias' if e is None else 'bias_relu' if e is RELU else 'bias_residual_relu'}"
    for t, d, e in PATH_CASES])
def test_sm90_conv_bias_on_the_16_byte_path_equals_the_pair_path_bit_for_bit(tile, dtype, epilogue):
    """136 output channels: the bias (the GEMM's C, row-broadcast) read 8 at a time, 16-byte
    stores (gemm_sm90_epilogue.cuh finish8). One channel more (137, not a multiple of 8) sends every element
    down the pair path; the same 136 channels come out of the same accumulators, so both paths
    must give the same bits. Both also match the float64 reference."""
    require_sm90()
    x, w, bias = rand((2, 9, 11, 32), dtype), rand((137, 3, 3, 32), dtype), rand((137,), dtype)
    skip = rand((2, 9, 11, 137), dtype)
    attrs = {"pads": [1, 1, 1, 1]}

    def inputs(n):
        extra = {"skip": np.ascontiguousarray(skip[..., :n])} if epilogue is RESIDUAL_RELU else {}
        return {"X": x, "W": np.ascontiguousarray(w[:n]), "B": np.ascontiguousarray(bias[:n]), **extra}

    pairs, ref = run_conv(tile, inputs(137), attrs, dtype, epilogue)
    vector, _ = run_conv(tile, inputs(136), attrs, dtype, epilogue)
    assert rel_err(pairs, ref) <= TOL[dtype] and rel_err(vector, ref[..., :136]) <= TOL[dtype]
    differ = np.argwhere(bits(vector) != bits(pairs[..., :136]))
    assert differ.size == 0, f"{len(differ)} elements differ between the paths, first at {differ[:3].tolist()}"


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [{"Y": 4}, {"B": 2}, {"skip": 4}], ids=["Y", "bias", "residual"])
def test_sm90_conv_with_unaligned_tensors_takes_the_pair_path(misalign):
    """Y, the bias or the residual off 16-byte alignment (element-aligned): vector_ok refuses the
    16-byte path, and the pair path's result equals the aligned run's bit for bit."""
    require_sm90()
    inputs = {"X": rand((2, 9, 11, 32), np.float16), "W": rand((136, 3, 3, 32), np.float16),
              "B": rand((136,), np.float16), "skip": rand((2, 9, 11, 136), np.float16)}
    attrs = {"pads": [1, 1, 1, 1]}
    aligned, ref = run_conv(CONV_TILES[0], inputs, attrs, np.float16, RESIDUAL_RELU)
    shifted, _ = run_conv(CONV_TILES[0], inputs, attrs, np.float16, RESIDUAL_RELU, misalign=misalign)
    assert rel_err(aligned, ref) <= 2e-3
    np.testing.assert_array_equal(bits(shifted), bits(aligned))
