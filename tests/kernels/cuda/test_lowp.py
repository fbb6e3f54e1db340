"""Low-precision storage types on cuda (lowp.cuh): float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz,
e8m0fnu), float4_e2m1fn, int4/uint4, int2/uint2 in Cast, CastLike, QuantizeLinear and
DequantizeLinear.

Host side: a numpy model of lowp.cuh's float encode / decode (the same algorithm, line for
line) is checked bit-exactly against ml_dtypes and the reference Cast on every code and a dense
set of floats; float -> 4/2-bit integers against an oracle of polykit's float -> integer rule
(reference cast.py), and against ml_dtypes where ONNX defines the cast; signature stamping and
codegen. GPU: the same checks through real layers.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.pointwise import pointwise as pw
from polykit.kernels.cuda.pointwise.pointwise_expr import emit_expression
from polykit.kernels.cuda.int8 import quantize as qk
from polykit.kernels.cuda.movement import tensor_misc as tm
from polykit.compiler.ops.tensor.cast_reference import convert

rng = np.random.default_rng(83)

# ---- numpy model of lowp.cuh ----------------------------------------------------------------------

# name: (E, M, B, maxcode, kind, signbit)   kind: 0 fn, 1 fnuz, 2 ieee, 3 f4 (no inf/nan)
FMT = {"float8_e4m3fn": (4, 3, 7, 0x7E, 0, 7), "float8_e4m3fnuz": (4, 3, 8, 0x7F, 1, 7),
       "float8_e5m2": (5, 2, 15, 0x7B, 2, 7), "float8_e5m2fnuz": (5, 2, 16, 0x7F, 1, 7),
       "float4_e2m1fn": (2, 1, 1, 0x7, 3, 3)}


def encode(u, fmt, sat):
    E, M, B, maxc, kind, sb = fmt
    u = np.asarray(u, np.uint32).astype(np.int64)
    s = u >> 31
    a = u & 0x7FFFFFFF
    e = a >> 23
    shift = 23 - M
    # normal target
    r = (a + (1 << (shift - 1)) - 1 + ((a >> shift) & 1)) >> shift
    normal_code = r - ((127 - B) << M)
    # subnormal target
    m = (a & 0x7FFFFF) | np.where(e > 0, 0x800000, 0)
    ee = np.maximum(e, 1)
    rs = shift + (1 - (ee - 127 + B))
    rs_c = np.clip(rs, 1, 62)
    q = m >> rs_c
    rem = m & ((1 << rs_c) - 1)
    half = 1 << (rs_c - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    sub_code = np.where(rs > 25, 0, q)
    code = np.where(e - 127 + B >= 1, normal_code, sub_code)
    over = code > maxc
    ovf = {0: 0x7F, 1: -1, 2: 0x7C, 3: maxc}[kind]
    code = np.where(over, maxc if sat else ovf, code)
    isnan = a > 0x7F800000
    isinf = a == 0x7F800000
    code = np.where(isinf, maxc if sat else ovf, code)
    nan = {0: 0x7F, 1: -1, 2: 0x7E, 3: -2}[kind]
    code = np.where(isnan, nan, code)
    out = code | (s << sb)
    if kind == 1:
        out = np.where((code == 0) | (code == -1), np.where(code == 0, 0, 0x80), out)
    if kind == 3:
        out = np.where(code == -2, (1 - s) << 3, out)
    return out.astype(np.uint8)


def decode(c, fmt):
    E, M, B, maxc, kind, sb = fmt
    c = np.asarray(c, np.uint8).astype(np.int64)
    if kind == 3:
        c = c & 0xF
    s = (c >> sb) & 1
    mag = c & ((1 << sb) - 1)
    ex = mag >> M
    man = mag & ((1 << M) - 1)
    sub = (man.astype(np.float32) * np.float32(2.0 ** (1 - B - M))).view(np.uint32).astype(np.int64)
    bits = np.where(ex == 0, sub, ((ex - B + 127) << 23) | (man << (23 - M)))
    bits = bits | (s << 31)
    if kind == 0:
        bits = np.where(mag == 0x7F, (s << 31) | 0x7FC00000, bits)
    elif kind == 1:
        bits = np.where(c == 0x80, 0xFFC00000, bits)
    elif kind == 2:
        bits = np.where(mag == 0x7C, (s << 31) | 0x7F800000, bits)
        bits = np.where(mag > 0x7C, (s << 31) | 0x7FC00000, bits)
    return bits.astype(np.uint32).view(np.float32)


def e8m0_encode(u, sat, mode):
    u = np.asarray(u, np.uint32).astype(np.int64)
    e = (u >> 23) & 0xFF
    normal = e != 0xFF
    if mode == "up":
        up = (u & 0x7FFFFF) > 0
    elif mode == "nearest":
        up = ((u & 0x400000) > 0) & (((u & 0x3FFFFF) > 0) | (e > 0))
    else:
        up = np.zeros(u.shape, bool)
    up = up & normal
    if sat:
        up = up & (e != 0xFE)
    return np.where(normal, e + up, 0xFF).astype(np.uint8)


def e8m0_decode(c):
    c = np.asarray(c, np.uint8).astype(np.int64)
    bits = np.where(c == 0xFF, 0x7FC00000, np.where(c == 0, 0x00400000, c << 23))
    return bits.astype(np.uint32).view(np.float32)


def int_range(nbits, signed):
    return (-(1 << nbits - 1), (1 << nbits - 1) - 1) if signed else (0, (1 << nbits) - 1)


def rule_codes(f, nbits, signed):
    """polykit's float -> integer rule (reference cast.py's docstring), written here on its own
    from numpy operations defined for every input: NaN -> 0, truncate toward zero, saturate to
    the type's range (Inf included); stored as the low nbits (two's complement)."""
    lo, hi = int_range(nbits, signed)
    with np.errstate(invalid="ignore"):  # a signalling NaN becomes a quiet one
        f = np.asarray(f, np.float64)
    t = np.clip(np.trunc(np.where(np.isnan(f), 0.0, f)), lo, hi)
    return (t.astype(np.int64) & ((1 << nbits) - 1)).astype(np.uint8)


def onnx_defined(f, nbits, signed):
    """Where ONNX defines float -> intN (not NaN, truncation inside the type's range); elsewhere
    only polykit's rule does, and ml_dtypes' C++ casts are undefined behaviour."""
    lo, hi = int_range(nbits, signed)
    with np.errstate(invalid="ignore"):
        f = np.asarray(f, np.float64)
        return (f > lo - 1) & (f < hi + 1)


def int_decode(c, nbits, signed):
    c = np.asarray(c, np.uint8).astype(np.int64) & ((1 << nbits) - 1)
    return np.where(signed & (c >= (1 << (nbits - 1))), c - (1 << nbits), c)


FLOAT_TYPES = list(FMT)
INT_TYPES = [("int4", 4, True), ("uint4", 4, False), ("int2", 2, True), ("uint2", 2, False)]
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
ONNX_CODE = {name: code for code, name in pw.ONNX_DTYPE.items()}


def dense_floats() -> np.ndarray:
    """Every float16 value, specials, rounding ties / overflow edges, random magnitudes and bit patterns."""
    every_half = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-38, 3.4e38, -3.4e38,
                      448, 464, 464.0001, 480, 240, 248, 57344, 61440, 61441, 5, 6, 7, 0.25, 0.75, 1.25], np.float32)
    r = np.random.default_rng(5)
    scaled = (r.standard_normal(50000) * 10.0 ** r.integers(-12, 8, 50000)).astype(np.float32)
    bits = r.integers(0, 2 ** 32, 50000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([every_half, edges, scaled, bits]).astype(np.float32)


DENSE = dense_floats()


def same_bits(got: np.ndarray, want: np.ndarray, nan_sign: bool = True) -> bool:
    """float32 bit equality, any NaN matching a NaN (of the same sign unless ``nan_sign`` is off)."""
    g, w = got.view(np.uint32), want.view(np.uint32)
    nan = np.isnan(want)
    same_nan = np.isnan(got) & (((g >> 31) == (w >> 31)) | (not nan_sign))
    return bool(np.all(np.where(nan, same_nan, g == w)))


# ---- host: the model against ml_dtypes / the reference Cast ---------------------------------------

@pytest.mark.parametrize("name", FLOAT_TYPES)
def test_model_decode_matches_ml_dtypes_on_every_code(name):
    codes = np.arange(16 if FMT[name][4] == 3 else 256, dtype=np.uint8)
    assert same_bits(decode(codes, FMT[name]), codes.view(getattr(ml_dtypes, name)).astype(np.float32))


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("name", FLOAT_TYPES)
def test_model_encode_matches_reference_cast_on_dense_floats(name, saturate):
    with np.errstate(all="ignore"):
        want = convert(DENSE, np.dtype(getattr(ml_dtypes, name)), saturate=saturate).view(np.uint8)
    np.testing.assert_array_equal(encode(DENSE.view(np.uint32), FMT[name], saturate), want)


def test_model_e8m0_decode_matches_ml_dtypes_on_every_code():
    codes = np.arange(256, dtype=np.uint8)
    assert same_bits(e8m0_decode(codes), codes.view(E8M0).astype(np.float32))


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_model_e8m0_encode_matches_reference_cast_for_every_round_mode(mode, saturate):
    want = convert(DENSE, E8M0, saturate, mode).view(np.uint8)
    np.testing.assert_array_equal(e8m0_encode(DENSE.view(np.uint32), saturate, mode), want)


@pytest.mark.parametrize("name,nbits,signed", INT_TYPES)
def test_model_int_decode_matches_ml_dtypes_on_every_code(name, nbits, signed):
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(int_decode(codes, nbits, signed), codes.view(getattr(ml_dtypes, name)).astype(np.int64))


#: DENSE as doubles (signalling NaNs become quiet), with values only a double holds (past int32
#: and float32's integers)
with np.errstate(invalid="ignore"):
    DOUBLES = np.concatenate([DENSE.astype(np.float64), [100000003.0, -100000003.0, 2.0 ** 31 - 1, 3e9 + 3, -2.0 ** 31,
                                                         2.0 ** 63, -2.0 ** 63 - 4096, 2.0 ** 64, 1e300, -1e300]])

#: NaN, the infinities, and values truncating just inside / outside every integer type's range
EDGES = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -0.5, -1.0, 1.5, -1.5, 2.5, 3.5, 7.5, 8.0, -8.5, -9.0,
                  15.5, 16.0, 127.5, 128.0, -128.5, -129.0, 255.5, 256.0, 32767.5, 32768.0, -32768.5, -32769.0,
                  65535.5, 65536.0, 2.0 ** 31 - 0.5, 2.0 ** 31, -2.0 ** 31 - 0.5, -2.0 ** 31 - 1, 2.0 ** 32 - 0.5,
                  2.0 ** 32, 2.0 ** 63, -2.0 ** 63, -2.0 ** 63 - 4096, 2.0 ** 64, 3e38, -3e38, 1e300, -1e300])


@pytest.mark.parametrize("name,nbits,signed", INT_TYPES)
def test_reference_float_to_intn_follows_polykits_rule_on_dense_floats(name, nbits, signed):
    for x in (DENSE, DOUBLES):
        got = convert(x, np.dtype(getattr(ml_dtypes, name))).view(np.uint8)
        np.testing.assert_array_equal(got, rule_codes(x, nbits, signed))


@pytest.mark.parametrize("name,nbits,signed", INT_TYPES)
def test_rule_gives_ml_dtypes_bytes_on_every_code_where_onnx_defines_the_cast(name, nbits, signed):
    """The rule agrees with ml_dtypes wherever the cast is defined (NaN and values truncating
    outside the range are not: there ml_dtypes' result depends on the processor), and the
    defined floats reach every code of the type."""
    defined = DOUBLES[onnx_defined(DOUBLES, nbits, signed)]
    want = defined.astype(np.dtype(getattr(ml_dtypes, name))).view(np.uint8)
    np.testing.assert_array_equal(rule_codes(defined, nbits, signed), want)
    assert set(want.tolist()) == set(range(1 << nbits))


def test_rule_saturates_infinities_and_out_of_range_values_and_maps_nan_to_zero():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 8.0, 7.99, -8.99, -9.0, 1e10, -0.5, 15.5, 16.0, -1.0])
    assert rule_codes(x, 4, True).tolist() == [0, 0, 7, 8, 7, 7, 8, 8, 7, 0, 7, 7, 15]
    assert rule_codes(x, 4, False).tolist() == [0, 0, 15, 0, 8, 7, 0, 0, 15, 0, 15, 15, 0]


@pytest.mark.parametrize("name,nbits,signed", INT_TYPES)
def test_integers_wrap_to_the_low_bits_in_the_reference(name, nbits, signed):
    x = np.array([-9, -8, 7, 8, 15, 16, 17, -1, 300, 2 ** 40 + 3], np.int64)
    np.testing.assert_array_equal(convert(x, np.dtype(getattr(ml_dtypes, name))).view(np.uint8), x & ((1 << nbits) - 1))


# ---- host: signatures, codegen, type codes --------------------------------------------------------

def cast_layer(src: str, dst: str, **attrs) -> LayerDesc:
    return LayerDesc(f"cast_{src}_{dst}", "Cast", ("X",), ("Y",), {"to": ONNX_CODE[dst], **attrs},
                     in_dtypes=(src,), out_dtypes=(dst,))


def test_stamped_layer_compiles_exactly_its_signature():
    assert pw.candidate_signatures(cast_layer("float32", "float8_e4m3fn")) == [(("float32",), ("float8_e4m3fn",))]
    assert len(pw.pointwise_kernels(cast_layer("float32", "float8_e4m3fn"))) == 2


def test_stamped_signature_drops_omitted_inputs():
    lay = LayerDesc("c", "Clip", ("X", "", "H"), ("Y",), in_dtypes=("float16", "", "float16"), out_dtypes=("float16",))
    assert pw.candidate_signatures(lay) == [(("float16", "float16"), ("float16",))]


def test_unstamped_layer_keeps_the_candidate_list_without_lowp_types():
    sigs = pw.candidate_signatures(LayerDesc("a", "Add", ("A", "B"), ("Y",)))
    assert len(sigs) > 1 and not any(d in pw.LOWP for sig in sigs for d in sig[0] + sig[1])


def test_stamped_dtype_without_cuda_storage_falls_back_to_the_candidates():
    lay = LayerDesc("a", "Add", ("A", "B"), ("Y",), in_dtypes=("object", "object"), out_dtypes=("object",))
    assert len(pw.candidate_signatures(lay)) > 1


def test_pointwise_tactic_declines_a_stamped_string_cast_at_build_time():
    from polykit.kernels.tactics import candidates

    lay = LayerDesc("c", "Cast", ("X",), ("Y",), {"to": 8}, in_dtypes=("float32",), out_dtypes=("object",))
    assert not [t for t in candidates("cuda", "Cast", lay) if t.name == "cuda.pointwise"]
    assert [t for t in candidates("cuda", "Cast", cast_layer("float32", "int4")) if t.name == "cuda.pointwise"]


@pytest.mark.parametrize("to,call", [("float8_e5m2", "pk_to_lowp<f8e5m2_t>(x0, false)"),
                                     ("int4", "pk_to_intn<i4_t>(x0)"),
                                     ("float8_e8m0fnu", "pk_to_e8m0(x0, false, 2)")])
def test_cast_to_lowp_types_emits_their_conversion_with_the_attributes(to, call):
    code, env = emit_expression([{"op": "Cast", "inputs": ["x"], "outputs": ["y"],
                                     "attrs": {"to": ONNX_CODE[to], "saturate": 0, "round_mode": "nearest"}}],
                                   {"x": "x0"})
    assert call in code


def test_compile_variants_instantiate_every_lowp_type_both_ways():
    text = "".join(k.code for k in pw.compile_variants() if k.code)
    for name, (ctype, code) in pw.LOWP.items():
        assert f"__{code}" in text or f"_{code}_" in text, name
        assert ctype in text


def test_castlike_and_quantize_have_codes_for_the_lowp_types():
    assert {np.dtype(getattr(ml_dtypes, n)) for n in pw.LOWP} <= set(tm.CAST_CODES)
    assert len(set(tm.CAST_CODES.values())) == len(tm.CAST_CODES)
    assert {n for n in pw.LOWP if n != "float8_e8m0fnu"} <= set(qk.TYPE_CODE)


# ---- GPU: real layers against the reference (outputs poisoned) ------------------------------------

def run_and_reference(layer, inputs):
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    return run_layer(layer, inputs)["Y"], reference_layer(layer, inputs)["Y"]


def assert_same_bytes(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.view(np.uint8).reshape(-1), want.view(np.uint8).reshape(-1)
    bad = np.nonzero(g != w)[0]
    assert bad.size == 0, f"{bad.size} elements differ, first at {bad[:5]}: got {g[bad[:5]]}, want {w[bad[:5]]}"


#: element counts that take the vector path (multiple of 4), the strided path, and a single element
SIZES = [len(DENSE) - len(DENSE) % 4, len(DENSE) - len(DENSE) % 4 - 3, 1]


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dst", FLOAT_TYPES + [t[0] for t in INT_TYPES])
def test_cast_float32_to_lowp_matches_reference_bit_exactly(dst, saturate, n):
    got, want = run_and_reference(cast_layer("float32", dst, saturate=saturate), {"X": DENSE[:n]})
    assert_same_bytes(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("src", ["float32", "float64", "float16"])
@pytest.mark.parametrize("dst", ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"])
def test_cast_floats_to_every_integer_type_follows_polykits_rule(dst, src):
    """NaN -> 0, truncated, saturated (reference cast.py): Cast (cvt) and CastLike (cast_any)."""
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.concatenate([EDGES, DOUBLES[::5]]).astype(src)
    got, want = run_and_reference(cast_layer(src, dst), {"X": x})
    assert_same_bytes(got, want)
    got, want = run_and_reference(cast_like_layer(), {"X": x, "L": np.zeros(1, dst)})
    assert_same_bytes(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_cast_float32_to_e8m0_follows_round_mode_and_saturate(mode, saturate):
    lay = cast_layer("float32", "float8_e8m0fnu", saturate=saturate, round_mode=mode)
    got, want = run_and_reference(lay, {"X": DENSE[:4001]})
    assert_same_bytes(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dst", ["float32", "float16"])
@pytest.mark.parametrize("src", FLOAT_TYPES + ["float8_e8m0fnu"] + [t[0] for t in INT_TYPES])
def test_cast_every_lowp_code_to_float_matches_reference(src, dst):
    n = 16 if src == "float4_e2m1fn" or src in ("int4", "uint4") else (4 if src in ("int2", "uint2") else 256)
    codes = np.tile(np.arange(n, dtype=np.uint8), 3)[:-1].view(np.dtype(getattr(ml_dtypes, src)))
    got, want = run_and_reference(cast_layer(src, dst), {"X": codes.reshape(-1)})
    # the GPU's float->half conversion (cvt.rn.f16.f32) writes the canonical NaN 0x7fff whatever the
    # sign; numpy keeps it. ONNX leaves NaN sign and payload unspecified, so only NaN-ness is compared.
    assert same_bits(got.astype(np.float32), want.astype(np.float32), nan_sign=dst != "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("src", ["float64", "int64", "int32", "uint8", "float16", "bool"])
@pytest.mark.parametrize("dst", ["float8_e4m3fn", "float8_e5m2fnuz", "float4_e2m1fn", "int4", "uint2"])
def test_cast_other_sources_to_lowp_matches_reference(src, dst):
    if src == "bool":
        x = rng.random(1003) < 0.5
    elif src.startswith("float"):
        with np.errstate(over="ignore"):
            x = (rng.standard_normal(1003) * 10.0 ** rng.integers(-3, 12, 1003)).astype(src)
        x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    else:
        info = np.iinfo(src)
        x = rng.integers(max(info.min, -(2 ** 40)), min(info.max, 2 ** 40), 1003).astype(src)
    for saturate in (1, 0):
        got, want = run_and_reference(cast_layer(src, dst, saturate=saturate), {"X": x})
        assert_same_bytes(got, want)


@pytest.mark.gpu
def test_cast_between_float8_types_saturates_through_float():
    x = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2)
    got, want = run_and_reference(cast_layer("float8_e5m2", "float8_e4m3fn", saturate=1), {"X": x})
    assert_same_bytes(got, want)


def cast_like_layer(**attrs):
    return LayerDesc("cl", "CastLike", ("X", "L"), ("Y",), dict(attrs))


@pytest.mark.gpu
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dst", FLOAT_TYPES + ["float8_e8m0fnu"] + [t[0] for t in INT_TYPES])
@pytest.mark.parametrize("src", ["float32", "float16", "float64", "int64"])
def test_castlike_to_lowp_matches_reference(src, dst, saturate):
    x = DENSE[:3001].astype(src) if src.startswith("float") else rng.integers(-300, 300, 3001).astype(src)
    like = np.zeros(2, np.dtype(getattr(ml_dtypes, dst)))
    with np.errstate(all="ignore"):
        got, want = run_and_reference(cast_like_layer(saturate=saturate, round_mode="nearest"), {"X": x, "L": like})
    assert_same_bytes(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dst", ["float32", "float16", "int32", "float8_e4m3fn"])
@pytest.mark.parametrize("src", FLOAT_TYPES + ["float8_e8m0fnu"] + [t[0] for t in INT_TYPES])
def test_castlike_from_every_lowp_code_matches_reference(src, dst):
    n = 16 if src in ("float4_e2m1fn", "int4", "uint4") else (4 if src in ("int2", "uint2") else 256)
    x = np.arange(n, dtype=np.uint8).view(np.dtype(getattr(ml_dtypes, src)))  # NaN, Inf, 2^127 -> int32 too
    like = np.zeros(1, np.dtype(getattr(ml_dtypes, dst, None) or dst))
    got, want = run_and_reference(cast_like_layer(), {"X": x, "L": like})
    if dst.startswith("float"):
        assert same_bits(got.astype(np.float32), want.astype(np.float32))
    else:
        assert_same_bytes(got, want)


def q_layer(kind, n_inputs=3, **attrs):
    return LayerDesc("q", kind, ("X", "S", "Z")[:n_inputs], ("Y",), dict(attrs))


def lowp_zero(dtype_name, shape=()):
    return np.zeros(shape, np.dtype(getattr(ml_dtypes, dtype_name)))


@pytest.mark.gpu
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("out", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn"])
def test_quantize_to_float8_and_float4_per_tensor_and_per_axis(out, saturate):
    x = (rng.standard_normal((3, 7, 5)) * 10.0 ** rng.integers(-2, 6, (3, 7, 5))).astype(np.float32)
    x[0, 0, :3] = [np.inf, -np.inf, np.nan]
    got, want = run_and_reference(q_layer("QuantizeLinear", saturate=saturate),
                                  {"X": x, "S": np.array(0.37, np.float32), "Z": lowp_zero(out)})
    assert_same_bytes(got, want)
    scales = rng.uniform(0.1, 3.0, 7).astype(np.float32)
    got, want = run_and_reference(q_layer("QuantizeLinear", axis=1, saturate=saturate),
                                  {"X": x, "S": scales, "Z": lowp_zero(out, (7,))})
    assert_same_bytes(got, want)


@pytest.mark.gpu
def test_quantize_to_float4_adds_its_zero_point():
    x = rng.standard_normal((4, 9)).astype(np.float32) * 4
    z = np.array([0.5, -1.0, 2.0, 0.0], ml_dtypes.float4_e2m1fn)
    got, want = run_and_reference(q_layer("QuantizeLinear", axis=0),
                                  {"X": x, "S": np.array([1.0, 0.5, 2.0, 0.25], np.float32), "Z": z})
    assert_same_bytes(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("out", ["int4", "uint4", "int2", "uint2"])
def test_quantize_to_4_and_2_bit_integers_rounds_and_saturates(out):
    x = rng.standard_normal((2, 6, 8)).astype(np.float32) * 6
    x[0, 0, :4] = [0.5, 1.5, -2.5, 1e9]
    dt = np.dtype(getattr(ml_dtypes, out))
    z = np.array(1, dt)
    got, want = run_and_reference(q_layer("QuantizeLinear"), {"X": x, "S": np.array(0.9, np.float32), "Z": z})
    assert_same_bytes(got, want)
    blocked_scale = rng.uniform(0.2, 2.0, (2, 2, 8)).astype(np.float32)
    zb = np.ones((2, 2, 8), dt)
    got, want = run_and_reference(q_layer("QuantizeLinear", axis=1, block_size=4),
                                  {"X": x, "S": blocked_scale, "Z": zb})
    assert_same_bytes(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("src", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn",
                                 "int4", "uint4", "int2", "uint2"])
def test_dequantize_from_lowp_types_matches_reference(src):
    n = 16 if src in ("float4_e2m1fn", "int4", "uint4") else (4 if src in ("int2", "uint2") else 256)
    codes = np.tile(np.arange(n, dtype=np.uint8), -(-48 // n))[:48]
    x = codes.view(np.dtype(getattr(ml_dtypes, src))).reshape(4, 12)
    scales = rng.uniform(0.1, 3.0, 4).astype(np.float32)
    z = lowp_zero(src, (4,)) if src.startswith("float") else np.array([1, 0, 1, 0], np.dtype(getattr(ml_dtypes, src)))
    got, want = run_and_reference(q_layer("DequantizeLinear", axis=0), {"X": x, "S": scales, "Z": z})
    assert same_bits(got, want)
    got, want = run_and_reference(q_layer("DequantizeLinear", 2), {"X": x, "S": np.array(0.5, np.float16)})
    assert same_bits(got.astype(np.float32), want.astype(np.float32))
