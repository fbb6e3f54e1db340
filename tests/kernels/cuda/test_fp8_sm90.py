"""The sm_90a FP8 convolution (`cuda.fp8.sm90_*`, fp8_sm90.py: conv_sm90 F8 on e4m3 wgmma).

CPU tests: which records the tactics take. GPU tests (H100 / H200; outputs poisoned first) compare with
the cpu reference, which sums the e4m3 products exactly and rounds once. The GPU sums each stage's 128
products on the tensor cores (whose FP8 accumulation keeps fewer bits than fp32: about 14 on the H800,
DeepSeek-V3 report 3.3.2) and adds the stages in fp32, so a float output may differ from the reference
by a bound proportional to sum |x * w| (dequantized): TOL_SUM = 2**-10 of it, plus 4 ulps of the value
for the dequantize and bias roundings. (2**-12 held for the conv tiles' cases, but the GEMM tiles' 4092 x 520
outputs at K 64 on an H100, 2026-12-06, reached 1.11-1.17 times it on three tiles whose other cases pass: each of
a stage's four k32 wgmma realigns its running sum to ~13-14 bits, truncating, so the errors add with one sign;
an indexing or scale fault is off by the whole magnitude, 10^2-10^3 times the bound.) An e4m3 output is the rounding of some value within that bound
of the float one: near zero (where e4m3 steps are small and the sums cancel) several steps apart,
which the first run on an H100 (2026-12-05) showed, up to 9; equal almost everywhere (the requantized
cases saturate part of their outputs at +-448).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.kernels.cuda.int8 import fp8_conv_sm90, fp8_gemm_sm90, fp8_sm90, int8_sm90

from ...compiler.fp8_models import E4M3
from .test_int8 import RESIDUAL, int8_residual, layer_of, rng, stamped
# (NHWC X, KRSC W, attrs): the INT8 sm90 kernel's cases (C and N not multiples of the tiles, 1x1 / 3x3 /
# 7x7 stride 2, dilation, asymmetric pads, K over many stages, more tiles than SMs)
from .test_int8_sm90 import CASES

gpu = pytest.mark.gpu
TACTICS = [f"cuda.fp8.sm90_{t.label}" for t in fp8_sm90.TILES]
#: the tests whose layers are 1x1 convs over rows run the FP8 GEMM tiles too (fp8_gemm_sm90.py), and the conv tiles
#: with the promotion in pieces (fp8_conv_sm90.py: their 8-column and per-element epilogues)
#: the fast-accumulation tiles (gemm_sm90_core.cuh F8_FAST), GEMM and conv: their own bound (tolerance)
FAST = [f"cuda.fp8.gemm_fast_sm90_{t.label}" for t in fp8_gemm_sm90.FAST_TILES] + [
    fp8_conv_sm90.tactic_name(t, True) for t in fp8_conv_sm90.FAST_TILES]
OVER_ROWS = TACTICS + [f"cuda.fp8.gemm_sm90_{t.label}" for t, _, _ in fp8_gemm_sm90.TILES] + [
    fp8_conv_sm90.tactic_name(t) for t, _, _ in fp8_conv_sm90.TILES] + FAST
SUPPORTS = {f"cuda.fp8.sm90_{t.label}": fp8_sm90._supports(t) for t in fp8_sm90.TILES}
#: a float output's bound, relative to sum |x * w| (module docstring)
TOL_SUM = 2.0 ** -10


def tolerance(tactic: str, inputs) -> float:
    """The bound relative to sum |x * w|: TOL_SUM for the promoted tactics (the tensor cores realign a sum
    within one stage of 128 K only); a fast tactic (F8_FAST) keeps realigning the running sum over every stage,
    errors of one sign adding up, so TOL_SUM a stage: ceil(K / 128) times it (K = R * S * C)."""
    if "_fast_" not in tactic:
        return TOL_SUM
    k = int(np.prod(inputs["W"].shape[1:]))
    return TOL_SUM * max(1, -(-k // 128))



def e4m3(shape, spread: float) -> np.ndarray:
    """Random e4m3 values, normal with standard deviation `spread` (saturated to +-448)."""
    return np.clip(rng.standard_normal(shape) * spread, -448, 448).astype(E4M3)


def fp8_inputs(x, w, per_channel=True, requant=False, bias=True):
    n = w[0]
    out = {"X": e4m3(x, 40.0), "XZ": np.zeros((), E4M3), "W": e4m3(w, 60.0),
           "WZ": np.zeros((n,) if per_channel else (), E4M3),
           "S": rng.uniform(1e-5, 4e-5, (n,) if per_channel else ()).astype(np.float32)}
    if bias:
        out["B"] = rng.standard_normal(n).astype(np.float32)
    if requant:
        out.update(YS=np.float32(rng.uniform(0.006, 0.012)), YZ=np.zeros((), E4M3))  # some saturate
    return out


def fp8_layer(inputs, attrs, epilogue=None, extra=()):
    return replace(stamped(layer_of("QConvNHWC", inputs, attrs, epilogue, extra), inputs), precision="fp8")


def magnitude(layer, inputs) -> np.ndarray:
    """sum |x * w| * scale per output element: the reference layer on |X|, |W|, without bias or epilogue."""
    from polykit.runtime.cuda.harness import reference_layer

    plain = replace(layer, inputs=tuple(n if n in ("X", "XZ", "W", "WZ", "S") else "" for n in layer.inputs[:8]),
                    attrs={k: v for k, v in layer.attrs.items() if k != "epilogue"})
    absolute = {**inputs, "X": np.abs(inputs["X"].astype(np.float32)).astype(E4M3),
                "W": np.abs(inputs["W"].astype(np.float32)).astype(E4M3)}
    return reference_layer(plain, absolute)["Y"]


def e4m3_ordinal(a: np.ndarray) -> np.ndarray:
    bits = np.asarray(a, E4M3).view(np.uint8).astype(np.int32)
    return np.where(bits & 0x80, -(bits & 0x7F), bits & 0x7F)


def check(layer, inputs, tactic, got=None):
    """Run `layer` on `tactic` (any FP8 QConvNHWC tactic: fp8_sm90's, fp8_gemm_sm90's) against the reference;
    `got`: its output computed elsewhere (test_sm90_epilogue_emulated.py's host emulation) instead of on the GPU."""
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    assert find_tactic("cuda", "QConvNHWC", tactic).supports(layer), \
        f"{tactic} refuses {layer.in_dtypes} {layer.in_shapes} {layer.attrs}"
    got = run_layer(layer, inputs, tactic=tactic)["Y"] if got is None else got
    want = reference_layer(layer, inputs)["Y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = tolerance(tactic, inputs) * magnitude(layer, inputs)
    if want.dtype == E4M3:
        # the float value before requantization may be off by tol (the tensor cores' FP8 sums): the e4m3
        # output is the rounding of some value in that interval, which near zero spans several e4m3 steps
        dense = {k: v for k, v in inputs.items() if k not in ("YS", "YZ")}
        y = reference_layer(replace(layer, inputs=tuple(n if n not in ("YS", "YZ") else "" for n in layer.inputs)),
                            dense)["Y"].astype(np.float64)
        scale, tol = float(inputs["YS"]), tol + np.abs(y) * 2.0 ** -21
        lo, hi = (e4m3_ordinal(np.clip((y + d) / scale, -448, 448).astype(E4M3)) for d in (-tol, tol))
        mine = e4m3_ordinal(got)
        assert np.all((lo <= mine) & (mine <= hi)), int(np.max(np.maximum(lo - mine, mine - hi)))
        steps = np.abs(mine - e4m3_ordinal(want))
        if "_fast_" in tactic:
            # a fast sum's wider bound moves more outputs to a neighbouring e4m3 value, and an output near zero
            # across the sign many ordinals (H100, 2026-12-07: K 3072 on 128x192 / 128x256, 4 % of outputs off,
            # one by 105 ordinals within the bound): most stay equal
            assert np.mean(steps > 0) <= 0.1, np.mean(steps > 0)
            return
        assert steps.mean() <= 0.05, steps.mean()  # equal almost everywhere
        return
    # a float16 output: the float value within tol, then rounded to float16 (half a step of 2^-10 relative)
    tol = tol + np.abs(want.astype(np.float64)) * (2.0 ** -10 if want.dtype == np.float16 else 2.0 ** -21)
    got, want = got.astype(np.float64), want.astype(np.float64)
    assert np.all(np.abs(got - want) <= tol), float(np.max(np.abs(got - want) / np.maximum(tol, 1e-30)))


def reference_tests(tactics: list[str]):
    """(float-output test, e4m3-output test): the two GPU tests each FP8 conv tactic family runs against the cpu
    reference (here, and test_fp8_conv_sm90.py's piece tiles), each of `tactics` on test_int8_sm90's CASES (the
    e4m3 output per channel and per tensor on CASES 0, 1, 3 and 4); a module takes them under its own test names."""
    @gpu
    @pytest.mark.parametrize("tactic", tactics)
    @pytest.mark.parametrize("x,w,attrs", CASES)
    def float_output(x, w, attrs, tactic):
        inputs = fp8_inputs(x, w)
        check(fp8_layer(inputs, attrs), inputs, tactic)

    @gpu
    @pytest.mark.parametrize("tactic", tactics)
    @pytest.mark.parametrize("per_channel", [True, False])
    @pytest.mark.parametrize("x,w,attrs", [CASES[0], CASES[1], CASES[3], CASES[4]])
    def requantized(x, w, attrs, per_channel, tactic):
        inputs = fp8_inputs(x, w, per_channel=per_channel, requant=True)
        check(fp8_layer(inputs, attrs), inputs, tactic)

    return float_output, requantized


(test_sm90_fp8_conv_float_output_matches_the_reference,
 test_sm90_fp8_conv_requantized_to_e4m3_matches_the_reference) = reference_tests(TACTICS)


@gpu
@pytest.mark.parametrize("tactic", OVER_ROWS)
@pytest.mark.parametrize("requant", [True, False])
@pytest.mark.parametrize("n", [24, 27], ids=["8_channels_a_lane", "per_element"])
def test_sm90_fp8_conv_with_a_float_residual_and_relu(tactic, requant, n):
    inputs = fp8_inputs((2, 10, 9, 32), (n, 1, 1, 32), requant=requant)
    inputs["skip"] = rng.standard_normal((2, 10, 9, n)).astype(np.float32)
    check(fp8_layer(inputs, {}, RESIDUAL, ("skip",)), inputs, tactic)


#: an --fp16 build's FP8 layer without an epilogue of its own, its Cast to float16 taken in (absorb_quantized_casts)
HALF_OUT = {"input": "raw", "body": [{"op": "Cast", "inputs": ["raw"], "outputs": ["y"], "attrs": {"to": 10}}]}


@gpu
@pytest.mark.parametrize("tactic", OVER_ROWS)
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("n", [136, 131], ids=["8_channels_a_lane", "per_element"])
def test_sm90_fp8_conv_reads_a_half_residual_and_writes_float16(tactic, residual, n):
    """BERT's dense layers in an --fp16 build: the float16 residual cast to float32 in the epilogue, the float32
    result cast to float16 and stored as float16 (int8_out.cuh Y_OUT 3)."""
    inputs = fp8_inputs((2, 10, 9, 64), (n, 1, 1, 64))
    if residual:
        inputs["skip"] = rng.standard_normal((2, 10, 9, n)).astype(np.float16)
        layer = fp8_layer(inputs, {}, {"input": "raw", "body": fp8_sm90.HALF_RESIDUAL}, ("skip",))
    else:
        layer = fp8_layer(inputs, {}, HALF_OUT, ())
    assert layer.out_dtypes == ("float16",)
    check(layer, inputs, tactic)


@gpu
@pytest.mark.parametrize("tactic", OVER_ROWS)
@pytest.mark.parametrize("requant", [True, False])
@pytest.mark.parametrize("n", [136, 131], ids=["8_channels_a_lane", "per_element"])
def test_sm90_fp8_conv_dequantizes_an_e4m3_residual_in_the_epilogue(tactic, requant, n):
    """An identity block's last conv of an --fp8 ResNet: the block's e4m3 input read as the residual,
    dequantized in the epilogue (fold_qdq.dequantizing_steps: Cast, Mul by its scale), Add, Relu."""
    inputs = fp8_inputs((2, 10, 9, 64), (n, 1, 1, 64), requant=requant)
    inputs.update(skip=e4m3((2, 10, 9, n), 40.0), skip_scale=np.float32(0.0037))
    layer = fp8_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale"))
    assert layer.in_dtypes[-2:] == ("float8_e4m3fn", "float32")
    check(layer, inputs, tactic)


@gpu
@pytest.mark.parametrize("tactic", OVER_ROWS)
@pytest.mark.parametrize("requant", [True, False])
def test_sm90_fp8_conv_reads_every_finite_e4m3_code_of_a_residual(tactic, requant):
    """lowp.cuh's e4m3_decode8 (the conversion unit on sm_89+, cvt.rn.f16x2.e4m3x2) on each of the 254 finite
    codes, zeros, subnormals and +-448 among them, in every byte position of a lane's 8 (the NaN codes are left
    out: the GPU's arithmetic gives a NaN sum the canonical sign, numpy keeps the operand's)."""
    inputs = fp8_inputs((2, 16, 8, 64), (136, 1, 1, 64), requant=requant)
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    inputs.update(skip=np.resize(codes, 2 * 16 * 8 * 136).view(E4M3).reshape(2, 16, 8, 136),
                  skip_scale=np.float32(0.75))
    check(fp8_layer(inputs, {}, int8_residual(False), ("skip", "skip_scale")), inputs, tactic)


def test_the_fp8_tactics_take_fp8_records_only():
    inputs = fp8_inputs((1, 8, 8, 32), (24, 3, 3, 32), requant=True)
    layer = fp8_layer(inputs, {"pads": [1, 1, 1, 1]})
    assert layer.precision == "fp8" and all(ok(layer) for ok in SUPPORTS.values())
    assert not any(ok(replace(layer, precision="int8")) for ok in SUPPORTS.values())
    # the INT8 sm90 tactics refuse FP8 records (their s8 wgmma would read e4m3 bytes as integers)
    assert not any(int8_sm90._supports(t)(replace(layer, attrs={**layer.attrs, "symmetric": 1}))
                   for t in int8_sm90.TILES)
    # C % 16, group 1, float32, e4m3 or float16 epilogue inputs only
    odd = fp8_inputs((1, 8, 8, 24), (16, 1, 1, 24))
    assert not any(ok(fp8_layer(odd, {})) for ok in SUPPORTS.values())
    residual = {**inputs, "skip": np.zeros((1, 8, 8, 24), E4M3), "skip_scale": np.float32(0.5)}
    assert all(ok(fp8_layer(residual, {"pads": [1, 1, 1, 1]}, int8_residual(False), ("skip", "skip_scale")))
               for ok in SUPPORTS.values())
    half = {**inputs, "skip": np.zeros((1, 8, 8, 24), np.float16)}
    assert all(ok(fp8_layer(half, {"pads": [1, 1, 1, 1]}, RESIDUAL, ("skip",))) for ok in SUPPORTS.values())
    double = {**inputs, "skip": np.zeros((1, 8, 8, 24), np.float64)}
    assert not any(ok(fp8_layer(double, {"pads": [1, 1, 1, 1]}, RESIDUAL, ("skip",))) for ok in SUPPORTS.values())
    # a float16 output: only an epilogue that casts to float16 last (absorb_quantized_casts) writes one
    plain = fp8_inputs((1, 8, 8, 32), (24, 3, 3, 32))
    assert all(ok(fp8_layer(plain, {"pads": [1, 1, 1, 1]}, HALF_OUT, ())) for ok in SUPPORTS.values())
    assert fp8_layer(plain, {"pads": [1, 1, 1, 1]}, HALF_OUT, ()).out_dtypes == ("float16",)


def test_the_fp8_variants_compile_with_f8_and_each_output():
    variants = fp8_sm90.compile_variants()
    assert any(("Y_OUT", "3") in v.defines for v in variants)  # the float16 output
    assert all(dict(v.defines).get("F8") == "1" and v.arch == "sm_90a" and v.name == "conv_sm90" for v in variants)
    assert {dict(v.defines)["BN"] for v in variants} == {str(t.bn) for t in fp8_sm90.TILES}
    assert any("apply_epilogue8" in (v.code or "") for v in variants)
    # the e4m3 residual: read as lowp.cuh's f8e4m3fn_t (its exact float value), 8 at a time and element by element
    e4m3_residual = [v for v in variants if "const f8e4m3fn_t* e0" in (v.code or "")]
    assert len(e4m3_residual) == 2 and sum("apply_epilogue8" in v.code for v in e4m3_residual) == 1
