"""The Hopper GEMM tactics (gemm_sm90): geometry rules (CPU) and every tile against a float64
reference on random data with odd shapes (GPU, compute capability 9.0; outputs poisoned)."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.gemm.gemm_sm90 import TILES, X3_TILES, Sm90Gemm, plan_gemm, tile_count

rng = np.random.default_rng(11)
BF16 = np.dtype(ml_dtypes.bfloat16)


# ---- geometry (no GPU) --------------------------------------------------------------------

@pytest.mark.parametrize("kind,attrs,a,b,c,want", [
    ("MatMul", {}, (77, 72), (72, 264), None, Sm90Gemm(77, 264, 72, 1, 1, 1, True)),
    ("MatMul", {}, (3, 100, 136), (136, 200), None, Sm90Gemm(300, 200, 136, 1, 1, 1, True)),
    ("MatMul", {}, (4, 65, 40), (4, 40, 24), None, Sm90Gemm(65, 24, 40, 4, 4, 4, True)),
    ("MatMul", {}, (33, 48), (5, 48, 16), None, Sm90Gemm(33, 16, 48, 5, 1, 5, True)),
    ("Gemm", {"transB": 1}, (77, 96), (136, 96), (136,), Sm90Gemm(77, 136, 96, 1, 1, 1, False, (0, 1))),
    ("Gemm", {}, (20, 32), (32, 48), (20, 1), Sm90Gemm(20, 48, 32, 1, 1, 1, True, (1, 0))),
    ("Gemm", {}, (20, 32), (32, 48), (20, 48), Sm90Gemm(20, 48, 32, 1, 1, 1, True, (48, 1))),
])
def test_plan_gemm_maps_layers_onto_the_kernel(kind, attrs, a, b, c, want):
    assert plan_gemm(kind, attrs, a, b, c) == want


@pytest.mark.parametrize("kind,attrs,a,b", [
    ("MatMul", {}, (16, 36), (36, 64)),          # K rows not 16-byte aligned
    ("MatMul", {}, (16, 64), (64, 20)),          # N rows of B not 16-byte aligned
    ("MatMul", {}, (64,), (64, 64)),             # 1-D A
    ("MatMul", {}, (2, 3, 8, 16), (3, 16, 8)),   # partial batch broadcast
    ("Gemm", {"transA": 1}, (32, 16), (32, 64)),
    ("MatMul", {}, (16, 0), (0, 16)),            # empty K
])
def test_plan_gemm_declines_what_the_kernel_cannot_take(kind, attrs, a, b):
    assert plan_gemm(kind, attrs, a, b) is None


def test_tile_parameters_fit_the_chip():
    for t in TILES:
        assert t.fits("float16", True, False) and t.fits("float16", False, False) and t.bm <= 256 and t.bn <= 256
        assert t.blocks == 1 or t.consumers == 1  # two blocks an SM: 128 registers a thread at most
        assert t.threads == 128 * (t.consumers + 1)
    assert tile_count(Sm90Gemm(300, 200, 64, 2, 2, 2, True), TILES[0]) == 3 * 2 * 2


# ---- GPU ----------------------------------------------------------------------------------

def _sm90() -> bool:
    try:
        from tests.kernels.cuda import on_sm90

        return on_sm90()
    except Exception:
        return False


def require_sm90():
    if not _sm90():
        pytest.skip("needs a compute capability 9.0 GPU")


def rand(shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def stamped(layer: LayerDesc, inputs: dict, out_shape, out_dtype) -> LayerDesc:
    return replace(layer, in_dtypes=tuple(np.dtype(inputs[n].dtype).name if n else "" for n in layer.inputs),
                   out_dtypes=(np.dtype(out_dtype).name,),
                   in_shapes=tuple(tuple(inputs[n].shape) if n else () for n in layer.inputs),
                   out_shapes=(tuple(out_shape),))


def run(layer, inputs, tactic, out_shape, out_dtype):
    from polykit.runtime.cuda.harness import run_layer

    layer = stamped(layer, inputs, out_shape, out_dtype)
    return run_layer(layer, inputs, tactic=tactic, output_specs={"Y": (tuple(out_shape), out_dtype)})["Y"]


def rel_err(out, ref):
    out = np.asarray(out, np.float64)
    assert not np.isnan(out).any(), "unwritten (NaN) elements"
    return float(np.linalg.norm(out - ref) / (np.linalg.norm(ref) or 1.0))


TOL = {np.dtype(np.float16): 2e-3, BF16: 1e-2}
MATMUL_SHAPES = [((128, 64), (64, 128)), ((77, 72), (72, 264)), ((1, 8), (8, 8)), ((3, 100, 136), (136, 200)),
                 ((4, 65, 40), (4, 40, 24)), ((33, 48), (5, 48, 16)), ((300, 1000), (1000, 520)),
                 ((2048, 128), (128, 2048))]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES)
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["fp16", "bf16"])
def test_sm90_matmul_matches_float64_reference(tile, a_shape, b_shape, dtype):
    if dtype == BF16 and tile is not TILES[0] and a_shape != (77, 72):
        pytest.skip("bf16 runs on the default tile and one odd shape per tile")
    check_matmul(f"cuda.gemm.sm90_{tile.label}", a_shape, b_shape, dtype)


def check_matmul(tactic: str, a_shape, b_shape, dtype) -> None:
    """MatMul of random a_shape x b_shape operands by `tactic` against float64 (GPU)."""
    require_sm90()
    a, b = rand(a_shape, dtype), rand(b_shape, dtype)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = run(LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}), {"A": a, "B": b}, tactic, ref.shape, dtype)
    err = rel_err(out, ref)
    assert err <= TOL[dtype], f"{tactic} {a_shape} x {b_shape} {np.dtype(dtype).name}: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("trans_b,c_shape", [(1, (136,)), (0, (77, 1)), (1, (77, 136)), (0, None)])
def test_sm90_gemm_with_transposed_b_alpha_beta_and_broadcast_c(tile, trans_b, c_shape):
    require_sm90()
    M, K, N = 77, 96, 136
    a = rand((M, K), np.float16)
    b = rand((N, K) if trans_b else (K, N), np.float16)
    attrs = {"transB": trans_b, "alpha": 0.75, "beta": -1.5}
    inputs = {"A": a, "B": b}
    ref = 0.75 * (a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64))
    if c_shape is not None:
        inputs["C"] = rand(c_shape, np.float16)
        ref = ref - 1.5 * inputs["C"].astype(np.float64)
    layer = LayerDesc("gemm", "Gemm", tuple(inputs), ("Y",), attrs)
    out = run(layer, inputs, f"cuda.gemm.sm90_{tile.label}", (M, N), np.float16)
    assert rel_err(out, ref) <= 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [t for t in TILES if t.label in ("128x128", "256x128", "128x192")], ids=lambda t: t.label)
def test_sm90_matmul_with_bias_gelu_and_residual_epilogue(tile):
    require_sm90()
    body = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
            {"op": "Gelu", "inputs": ["s"], "outputs": ["g"], "attrs": {}},
            {"op": "Add", "inputs": ["g", "res"], "outputs": ["Y"], "attrs": {}}]
    layer = LayerDesc("mm", "MatMul", ("A", "B", "bias", "res"), ("Y",), {"epilogue": {"input": "raw", "body": body}},
                      domain="ai.polykit")
    a, b = rand((2, 100, 64), np.float16), rand((64, 136), np.float16)
    bias, res = rand((136,), np.float16), rand((2, 100, 136), np.float16)
    s = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)
    from math import erf

    gelu = 0.5 * s * (1.0 + np.vectorize(erf)(s / np.sqrt(2.0)))
    ref = gelu + res.astype(np.float64)
    out = run(layer, {"A": a, "B": b, "bias": bias, "res": res}, f"cuda.gemm.sm90_{tile.label}", ref.shape, np.float16)
    assert rel_err(out, ref) <= 3e-3


def _gemm_layer(kind, attrs, a, b, precision):
    return LayerDesc("g", kind, ("A", "B"), ("Y",), attrs, precision=precision, in_dtypes=("float32", "float32"),
                     out_dtypes=("float32",), in_shapes=(a, b), out_shapes=((a[0], b[0] if attrs.get("transB") else b[1]),))


def test_3xtf32_tiles_fit_with_their_scratch_ring():
    """Every 3xTF32 tile fits with a K-major B (convolutions, transposed Gemm B); the scratch ring
    of a [K, N] B (its big part too) is 3 x 2 x BN rows: the largest tiles take only K-major B."""
    for t in X3_TILES:
        assert t.fits("float32", False, True)
        assert t.scratch("float32", True, True) == 2 * t.scratch("float32", False, True) == 6 * t.bn * 128
    assert X3_TILES[0].fits("float32", True, True)
    assert not X3_TILES[3].fits("float32", True, True)  # two blocks an SM: 2 x (64 KiB + 48 KiB) + reserve
    assert TILES[0].scratch("float16", True, False) == 0 and TILES[0].scratch("float32", False, False) == 0


def test_sm90_takes_float32_as_tf32_or_3xtf32_by_tactic():
    from polykit.kernels.cuda.gemm.gemm_sm90 import tile_supports

    tf32, small_tf32, x3 = tile_supports(TILES[0], False), tile_supports(TILES[5], False), tile_supports(X3_TILES[0], True)
    gemm_t = ("Gemm", {"transB": 1}, (64, 96), (128, 96))
    assert tf32(_gemm_layer(*gemm_t, "tf32")) and not tf32(_gemm_layer(*gemm_t, "fp32"))
    assert x3(_gemm_layer(*gemm_t, "fp32")) and not x3(_gemm_layer(*gemm_t, "tf32"))
    mm = ("MatMul", {}, (64, 96), (96, 128))  # B [K, N]: transposed in shared memory, if the scratch fits
    assert small_tf32(_gemm_layer(*mm, "tf32")) and not tf32(_gemm_layer(*mm, "tf32"))
    assert x3(_gemm_layer(*mm, "fp32")) and not tile_supports(X3_TILES[3], True)(_gemm_layer(*mm, "fp32"))


@pytest.mark.gpu
@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("M,K,N", [(77, 96, 136), (300, 1000, 520), (1, 8, 8), (2048, 256, 1024)])
def test_sm90_tf32_gemm_matches_float64_reference(tile, M, K, N):
    """float32 storage, tf32 math: B transposed ([N, K], K-major), bias C, alpha."""
    require_sm90()
    a, b, c = rand((M, K), np.float32), rand((N, K), np.float32), rand((N,), np.float32)
    ref = 0.5 * (a.astype(np.float64) @ b.T.astype(np.float64)) + c.astype(np.float64)
    layer = replace(LayerDesc("gemm", "Gemm", ("A", "B", "C"), ("Y",), {"transB": 1, "alpha": 0.5}), precision="tf32")
    out = run(layer, {"A": a, "B": b, "C": c}, f"cuda.gemm.sm90_{tile.label}", (M, N), np.float32)
    assert rel_err(out, ref) <= 3e-3


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [TILES[5], TILES[4]], ids=lambda t: t.label)
@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES)
def test_sm90_tf32_matmul_with_b_k_by_n(tile, a_shape, b_shape):
    """tf32 math on a [K, N] B: the consumers transpose each stage of B into K-major rows."""
    require_sm90()
    a, b = rand(a_shape, np.float32), rand(b_shape, np.float32)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    layer = LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}, precision="tf32")
    out = run(layer, {"A": a, "B": b}, f"cuda.gemm.sm90_{tile.label}", ref.shape, np.float32)
    assert rel_err(out, ref) <= 3e-3


@pytest.mark.gpu
@pytest.mark.parametrize("tile", X3_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES)
def test_sm90x3_matmul_has_fp32_accuracy(tile, a_shape, b_shape):
    """3xTF32 (precision fp32 on tf32 tensor cores): the error is float32's (the SIMT kernel's
    on the same data, within a small factor), not tf32's ~1e-3."""
    require_sm90()
    if not tile.fits("float32", True, True):
        pytest.skip("this tile takes only a K-major B")
    a, b = rand(a_shape, np.float32), rand(b_shape, np.float32)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    layer = LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}, precision="fp32")
    out = run(layer, {"A": a, "B": b}, f"cuda.gemm.sm90x3_{tile.label}", ref.shape, np.float32)
    simt = run(layer, {"A": a, "B": b}, "cuda.gemm.simt", ref.shape, np.float32)
    assert rel_err(out, ref) <= max(2e-6, 4 * rel_err(simt, ref))


@pytest.mark.gpu
@pytest.mark.parametrize("tile", X3_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("M,K,N", [(77, 96, 136), (300, 1000, 520), (1, 8, 8), (2048, 768, 1024)])
def test_sm90x3_gemm_with_transposed_b_and_bias(tile, M, K, N):
    require_sm90()
    a, b, c = rand((M, K), np.float32), rand((N, K), np.float32), rand((N,), np.float32)
    ref = 0.5 * (a.astype(np.float64) @ b.T.astype(np.float64)) + c.astype(np.float64)
    layer = LayerDesc("gemm", "Gemm", ("A", "B", "C"), ("Y",), {"transB": 1, "alpha": 0.5}, precision="fp32")
    out = run(layer, {"A": a, "B": b, "C": c}, f"cuda.gemm.sm90x3_{tile.label}", (M, N), np.float32)
    assert rel_err(out, ref) <= 2e-6


GEMM_PATH_CASES = [(TILES[0], np.dtype(np.float16)), (TILES[6], np.dtype(np.float16)),
                   (TILES[-1], np.dtype(np.float16)), (TILES[0], BF16)]


@pytest.mark.gpu
@pytest.mark.parametrize("tile,dtype", GEMM_PATH_CASES, ids=[f"{t.label}-{d.name}" for t, d in GEMM_PATH_CASES])
def test_sm90_gemm_bias_c_on_the_16_byte_path_equals_the_pair_path_bit_for_bit(tile, dtype):
    """A Gemm's C of shape (N,) (scm 0, scn 1) with alpha and beta: at N 136 it is read 8 at a time
    on the 16-byte path, at N 137 (one more row of the transposed B) every element takes the pair
    path; the shared 136 columns must be the same bits."""
    require_sm90()
    M, K = 77, 96
    a, b, c = rand((M, K), dtype), rand((137, K), dtype), rand((137,), dtype)
    attrs = {"transB": 1, "alpha": 0.75, "beta": -1.5}
    out = {}
    for n in (136, 137):
        inputs = {"A": a, "B": np.ascontiguousarray(b[:n]), "C": np.ascontiguousarray(c[:n])}
        out[n] = run(LayerDesc("gemm", "Gemm", ("A", "B", "C"), ("Y",), attrs), inputs,
                     f"cuda.gemm.sm90_{tile.label}", (M, n), dtype)
    ref = 0.75 * (a.astype(np.float64) @ b.T.astype(np.float64)) - 1.5 * c.astype(np.float64)
    assert rel_err(out[137], ref) <= TOL[dtype]
    vector, pairs = out[136].view(np.uint16), np.ascontiguousarray(out[137][:, :136]).view(np.uint16)
    differ = np.argwhere(vector != pairs)
    assert differ.size == 0, f"{len(differ)} elements differ between the paths, first at {differ[:3].tolist()}"


EPILOGUE_PATH_TILES = [t for t in TILES if t.label in ("128x192", "128x256", "128x128", "64x128", "64x128x2")]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", EPILOGUE_PATH_TILES, ids=lambda t: t.label)
def test_sm90_bias_gelu_residual_epilogue_on_the_16_byte_path_equals_the_pair_path_and_reruns_bit_for_bit(tile):
    """finish_rows (a group's bias and C read once for both of a lane's rows, loads issued groups
    ahead) against the pair path: a Gemm with C (N,), alpha, beta and a bias + GELU + residual
    epilogue at N 200 (16-byte path; M 77: the last rows of a tile past M) and N 201 (every element
    on the pairs); the shared 200 columns must be the same bits, and a rerun must repeat them."""
    require_sm90()
    M, K = 77, 96
    a, b, c = rand((M, K), np.float16), rand((201, K), np.float16), rand((201,), np.float16)
    bias, res = rand((201,), np.float16), rand((M, 201), np.float16)
    body = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
            {"op": "Gelu", "inputs": ["s"], "outputs": ["g"], "attrs": {}},
            {"op": "Add", "inputs": ["g", "res"], "outputs": ["Y"], "attrs": {}}]
    attrs = {"transB": 1, "alpha": 0.75, "beta": -1.5, "epilogue": {"input": "raw", "body": body}}
    layer = LayerDesc("gemm", "Gemm", ("A", "B", "C", "bias", "res"), ("Y",), attrs, domain="ai.polykit")
    out = {}
    for n in (200, 201, -200):
        cols = abs(n)
        inputs = {"A": a, "B": np.ascontiguousarray(b[:cols]), "C": np.ascontiguousarray(c[:cols]),
                  "bias": np.ascontiguousarray(bias[:cols]), "res": np.ascontiguousarray(res[:, :cols])}
        out[n] = run(layer, inputs, f"cuda.gemm.sm90_{tile.label}", (M, cols), np.float16)
    from math import erf

    s = 0.75 * (a.astype(np.float64) @ b.T.astype(np.float64)) - 1.5 * c.astype(np.float64) + bias.astype(np.float64)
    ref = 0.5 * s * (1.0 + np.vectorize(erf)(s / np.sqrt(2.0))) + res.astype(np.float64)
    assert rel_err(out[201], ref) <= 3e-3
    assert rel_err(out[200], ref[:, :200]) <= 3e-3
    vector, pairs = out[200].view(np.uint16), np.ascontiguousarray(out[201][:, :200]).view(np.uint16)
    differ = np.argwhere(vector != pairs)
    assert differ.size == 0, f"{len(differ)} elements differ between the paths, first at {differ[:3].tolist()}"
    assert np.array_equal(out[200].view(np.uint16), out[-200].view(np.uint16)), "a rerun gave other bits"


def fp16_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in fp16 ulps (the sign-magnitude bit patterns made monotonic)."""
    ai, bi = (x.view(np.int16).astype(np.int32) for x in (a, b))
    ai, bi = (np.where(x < 0, -(x & 0x7FFF), x) for x in (ai, bi))
    return np.abs(ai - bi)


@pytest.mark.gpu
def test_sm90_fp16_gelu_epilogue_is_within_one_ulp_on_every_fp16_value():
    """pointwise.cuh's pk_gelu16 (the fp16 / bf16 epilogues' Gelu) on all 63488 finite fp16 values,
    each the exact product of an identity A with B, against float64 GELU rounded to fp16: within 1
    ulp everywhere, and off by that ulp on under 1 % of them (a numpy model of it: 0.47 %; of the
    float form 0.5 x (1 + erf(x / sqrt 2)) it replaced: 2 ulp, 0.52 %)."""
    require_sm90()
    from math import erf

    values = np.arange(65536, dtype=np.uint16).view(np.float16)
    values = values[np.isfinite(values)].reshape(256, 248)
    body = [{"op": "Gelu", "inputs": ["raw"], "outputs": ["Y"], "attrs": {}}]
    layer = LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {"epilogue": {"input": "raw", "body": body}},
                      domain="ai.polykit")
    out = run(layer, {"A": np.eye(256, dtype=np.float16), "B": values}, "cuda.gemm.sm90_128x128", (256, 248),
              np.float16)
    x = values.astype(np.float64)
    ref = (0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))).astype(np.float16)
    assert not np.isnan(out).any(), "NaN outputs (unwritten, or NaN for a finite input)"
    ulps = fp16_ulps(out, ref)
    worst = np.unravel_index(np.argmax(ulps), ulps.shape)
    assert ulps.max() <= 1, f"{ulps.max()} ulps at x = {values[worst]}: {out[worst]} (sigmoid {sig[worst]:.4g})"
    assert (ulps > 0).mean() < 0.01, f"{(ulps > 0).sum()} of {ulps.size} values off by an ulp"


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["Sigmoid", "SiLU"])
def test_sm90_fp16_sigmoid_and_silu_epilogues_are_within_one_ulp_on_every_fp16_value(op):
    """pointwise.cuh's pk_sigmoid16 (the 16-bit epilogues' Sigmoid, and SiLU = x * sigmoid(x) as the
    fused Sigmoid + Mul body) on all 63488 finite fp16 values, against float64 rounded to fp16 (SiLU: the
    fp16 sigmoid, as the graph stores it, times x)."""
    require_sm90()
    values = np.arange(65536, dtype=np.uint16).view(np.float16)
    values = values[np.isfinite(values)].reshape(256, 248)
    body = [{"op": "Sigmoid", "inputs": ["raw"], "outputs": ["Y" if op == "Sigmoid" else "s"], "attrs": {}}]
    if op != "Sigmoid":
        body.append({"op": "Mul", "inputs": ["raw", "s"], "outputs": ["Y"], "attrs": {}})
    layer = LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {"epilogue": {"input": "raw", "body": body}},
                      domain="ai.polykit")
    out = run(layer, {"A": np.eye(256, dtype=np.float16), "B": values}, "cuda.gemm.sm90_128x128", (256, 248),
              np.float16)
    x = values.astype(np.float64)
    with np.errstate(over="ignore"):
        sig = 1.0 / (1.0 + np.exp(-x))
    assert not np.isnan(out).any(), "NaN outputs (unwritten, or NaN for a finite input)"
    if op == "Sigmoid":
        ulps = fp16_ulps(out, sig.astype(np.float16))
    else:
        # the graph's s is an fp16 tensor, and the fused body keeps that rounding (x = -17.3: sigmoid
        # 2.97e-8 rounds to 0, so x * s is -0.0, not x * 2.97e-8 = -5.4e-7): x times s within 1 ulp of the
        # rounded sigmoid, each product rounded to fp16
        s16 = sig.astype(np.float16)
        candidates = (s16, np.nextafter(s16, np.float16(0)), np.nextafter(s16, np.float16(1)))
        ulps = np.min([fp16_ulps(out, (x * c.astype(np.float64)).astype(np.float16)) for c in candidates], axis=0)
    worst = np.unravel_index(np.argmax(ulps), ulps.shape)
    assert ulps.max() <= 1, f"{ulps.max()} ulps at x = {values[worst]}: {out[worst]} (sigmoid {sig[worst]:.4g})"
