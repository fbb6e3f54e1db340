"""The low-precision Cast / CastLike / (De)QuantizeLinear kernels, emulated on the host.

Each layer's real enqueue runs with a launcher that calls the kernel's own source, compiled by
g++ as a shared library (one CUDA thread: every kernel here is a grid-stride loop). A prelude
stands in for the CUDA builtins and _Float16 for dtypes.cuh's PTX half conversions; the rest
of the code is what NVRTC compiles. Outputs must equal the reference kernel's bytes. The GPU
tests in test_lowp.py run the same layers on the device.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.kernels.cuda.pointwise import pointwise as pw
from polykit.kernels.cuda.base import DeviceTensor
from polykit.compiler.ops.references import run_reference
from polykit.runtime.cuda.harness import infer_output_specs, resolve_tactic
from tests.kernels.cuda.test_lowp import DENSE, EDGES, FLOAT_TYPES, INT_TYPES, ONNX_CODE, cast_layer, same_bits
from tests.kernels.cuda.warp_emulation import PTX_PRELUDE, translate_asm

PRELUDE = r"""
#include <math.h>
#include <string.h>
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__
#define __shared__ static
struct Dim3 { unsigned x, y, z; };
static const Dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline void __syncthreads() {}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int) { return v; }
"""

#: dtypes.cuh's PTX conversions -> the same IEEE conversions through _Float16
HALF = {
    "h2f": "__device__ __forceinline__ float h2f(half_t h) { _Float16 v; memcpy(&v, &h.x, 2); return (float)v; }",
    "f2h": "__device__ __forceinline__ half_t f2h(float f) { _Float16 v = (_Float16)f; half_t h; memcpy(&h.x, &v, 2); return h; }",
    "d2h": "__device__ __forceinline__ half_t d2h(double d) { _Float16 v = (_Float16)d; half_t h; memcpy(&h.x, &v, 2); return h; }",
}


#: pk_gelu16's MUFU exp2 (pointwise.cuh, in every pointwise module) -> the host's exp2f: not its
#: bits, but no kernel here evaluates GELU; without it every pointwise module would be skipped
EX2 = ('asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(q2) : "f"(p));', "q2 = exp2f(p);")


#: compiled as the device compiles it (arch "sm_90": __CUDA_ARCH__ 900, so the sm_89+ branches run: lowp.cuh's
#: e4m3 decode by cvt.rn.f16x2.e4m3x2, quantize.cu's pair conversion), one thread being the whole warp
ARCH_PRELUDE = r"""
#define __CUDA_ARCH__ 900
struct uint2 { unsigned x, y; };
inline unsigned __activemask() { return 1u; }
inline bool __any_sync(unsigned, bool p) { return p; }
inline unsigned __vcmpeq4(unsigned a, unsigned b) {
  unsigned d = 0;
  for (int i = 0; i < 32; i += 8) d |= ((a >> i & 255u) == (b >> i & 255u) ? 255u : 0u) << i;
  return d;
}
"""


def host_source(cuda: str, arch: str = "host") -> str:
    """The kernel source for g++: dtypes.cuh's half conversions by _Float16, each inline PTX statement by
    warp_emulation's host model of it (PTX_PRELUDE: quotient.cuh's max / min .NaN and e4m3 conversion, lowp.cuh's
    sm_89+ decode, in branches the host does not compile too); a statement it has no model of skips the test.
    `arch` "sm_90": the device's branches (ARCH_PRELUDE)."""
    for name, repl in HALF.items():
        cuda = re.sub(r"__device__ __forceinline__ \w+ " + name + r"\(.*?\n\}", repl, cuda, count=1, flags=re.S)
    cuda = cuda.replace(*EX2)
    try:
        cuda = translate_asm(cuda)
    except ValueError as exc:
        pytest.skip(f"the kernel source holds PTX the host emulation does not model ({exc})")
    return PRELUDE + PTX_PRELUDE + (ARCH_PRELUDE if arch == "sm_90" else "") + cuda


class HostLauncher:
    """A Launcher that runs each kernel on the host (compiled once per source)."""

    def __init__(self, build_dir: Path, cxx: str, arch: str = "host"):
        self.dir, self.cxx, self.libs, self.keep, self.arch = build_dir, cxx, {}, [], arch

    def _lib(self, kernel):
        text = host_source(kernel.render(), self.arch)
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        if key not in self.libs:
            src, lib = self.dir / f"{key}.cpp", self.dir / f"{key}.so"
            src.write_text(text)
            subprocess.run([self.cxx, "-std=c++17", "-O1", "-w", "-fPIC", "-shared", "-o", str(lib), str(src)], check=True)
            self.libs[key] = ctypes.CDLL(str(lib))
        return self.libs[key]

    def launch(self, kernel, grid, block, args, shared_mem=0):
        c_args = []
        for a in args:
            if isinstance(a, DeviceTensor):
                c_args.append(ctypes.c_void_p(a.ptr))
            elif isinstance(a, np.int32):
                c_args.append(ctypes.c_int(int(a)))
            else:
                c_args.append(ctypes.c_longlong(int(a)))
        getattr(self._lib(kernel), kernel.name)(*c_args)

    def workspace(self, nbytes: int) -> int:
        buf = np.zeros(max(nbytes, 8), np.uint8)
        self.keep.append(buf)
        return buf.ctypes.data


@pytest.fixture(scope="module", params=["host", "sm_90"])
def launcher(tmp_path_factory, request):
    """The host's compile of each kernel, and the device's branches of it (sm_90)."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    return HostLauncher(tmp_path_factory.mktemp(f"lowp_emulated_{request.param}"), cxx, request.param)


def run_emulated(launcher, layer, inputs):
    """The layer's outputs from its cuda tactic's enqueue, kernels run on the host; outputs poisoned."""
    arrays = {n: np.ascontiguousarray(v) for n, v in inputs.items()}
    tensors = {n: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for n, a in arrays.items()}
    outs = {}
    for name, (shape, dtype) in infer_output_specs(layer, arrays).items():
        outs[name] = np.full(shape, 0xFF, np.uint8).view(dtype) if np.dtype(dtype).itemsize == 1 else \
            np.full(shape, 0xFF, np.uint8).repeat(np.dtype(dtype).itemsize).view(dtype).reshape(shape)
        tensors[name] = DeviceTensor(outs[name].ctypes.data, tuple(shape), np.dtype(dtype))
    resolve_tactic(layer).enqueue(layer, launcher, tensors)
    return outs


def reference(layer, inputs):
    node = Node(layer.kind, list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name, layer.domain)
    with np.errstate(all="ignore"):
        outs = run_reference(node, [inputs[n] if n else None for n in layer.inputs])
    return dict(zip(layer.outputs, outs))


def assert_same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.name in ("float16", "float32", "float64"):
        assert same_bits(got.astype(np.float32), want.astype(np.float32))
    else:
        bad = np.nonzero(got.reshape(-1).view(np.uint8) != want.reshape(-1).view(np.uint8))[0]
        assert bad.size == 0, f"{bad.size} differ, first {bad[:5]}"


def check(launcher, layer, inputs):
    got, want = run_emulated(launcher, layer, inputs), reference(layer, inputs)
    for name in want:
        assert_same(got[name], want[name])


#: the bits ml_dtypes' sub-byte types use (the other bits of their byte are always zero)
CODE_MASK = {"float4_e2m1fn": 0xF, "int4": 0xF, "uint4": 0xF, "int2": 0x3, "uint2": 0x3}


def lowp_codes(codes: np.ndarray, name: str) -> np.ndarray:
    """uint8 codes as `name` elements, limited to the bytes a `name` array can hold."""
    return (codes & CODE_MASK.get(name, 0xFF)).astype(np.uint8).view(np.dtype(getattr(ml_dtypes, name)))


LOWP = FLOAT_TYPES + ["float8_e8m0fnu"] + [t[0] for t in INT_TYPES]
#: the strided path (odd count) and the vector path (a multiple of 4)
COUNTS = [4001, 4000]


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("src", ["float32", "float64", "int64"])
def test_generated_cast_to_every_lowp_type_gives_reference_bytes(launcher, src, n):
    """One stamped module per source type: every target, saturate on/off, every e8m0 round mode."""
    layer = next(lay for lay in pw.lowp_variant_layers() if lay.name == f"lowp_{src}")
    x = DENSE[np.random.default_rng(1).permutation(len(DENSE))[:n]]
    x[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 57344]
    with np.errstate(invalid="ignore"):  # DENSE's signalling NaNs become quiet ones as float64
        x = x.astype(src) if src != "int64" else np.clip(np.nan_to_num(x), -2e9, 2e9).astype(np.int64)
    check(launcher, layer, {"x": x})


@pytest.mark.parametrize("n", [256 * 3 - 1, 256 * 4])
def test_generated_cast_from_every_lowp_code_gives_reference_values(launcher, n):
    layer = next(lay for lay in pw.lowp_variant_layers() if lay.name == "lowp_decode")
    codes = np.resize(np.arange(256, dtype=np.uint8), n)
    inputs = {name: lowp_codes(codes, dt) for name, dt in zip(layer.inputs, layer.in_dtypes)}
    got, want = run_emulated(launcher, layer, inputs), reference(layer, inputs)
    for name, op in zip(layer.outputs, layer.attrs["body"]):
        if op["op"] == "Identity" and dict(zip(layer.inputs, layer.in_dtypes))[op["inputs"][0]] == "float8_e5m2":
            # Identity re-encodes: an e5m2 NaN with another payload comes back as the quiet NaN
            assert same_bits(got[name].astype(np.float32), want[name].astype(np.float32))
            continue
        assert_same(got[name], want[name])  # NaN / Inf -> int32 too: polykit's rule (reference cast.py)


@pytest.mark.parametrize("dst", ["float32", "float16", "float8_e5m2"])
@pytest.mark.parametrize("src", LOWP)
def test_plain_cast_between_lowp_and_other_types(launcher, src, dst):
    layer, inputs = cast_layer(src, dst, saturate=0), {"X": lowp_codes(np.arange(256, dtype=np.uint8), src)}
    if src == dst:  # numpy copies the bytes; the kernel re-encodes (e5m2 NaN payloads become the quiet NaN)
        assert same_bits(run_emulated(launcher, layer, inputs)["Y"].astype(np.float32), inputs["X"].astype(np.float32))
        return
    if src == "float8_e8m0fnu" and dst.startswith("float8"):
        pytest.skip("ml_dtypes (the reference) has no e8m0 -> float8 cast")
    check(launcher, layer, inputs)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("src", ["float32", "float16", "float64", "int64"])
def test_castlike_to_and_from_every_lowp_type(launcher, src, saturate):
    x = DENSE[:3001].astype(src) if src != "int64" else np.arange(-1500, 1501, dtype=np.int64) * 7
    for dst in LOWP:
        like = np.zeros(1, np.dtype(getattr(ml_dtypes, dst)))
        lay = pw_free_castlike(saturate)
        check(launcher, lay, {"X": x, "L": like})
        back = lowp_codes(np.arange(256, dtype=np.uint8), dst)  # NaN, Inf, 2^127 -> int64: polykit's rule
        check(launcher, lay, {"X": back, "L": np.zeros(1, src)})


INTEGERS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"] + [t[0] for t in INT_TYPES]


@pytest.mark.parametrize("src", ["float32", "float64", "float16"])
@pytest.mark.parametrize("dst", INTEGERS)
def test_cast_and_castlike_from_floats_to_every_integer_type_follow_polykits_rule(launcher, src, dst):
    """Cast (the pointwise kernel: cvt / intn_bits) and CastLike (cast_any) give the reference's
    bytes, which follow polykit's float -> integer rule (tests/kernels/reference/test_cast.py),
    on NaN, Inf and out-of-range values too."""
    with np.errstate(over="ignore", invalid="ignore"):  # 1e300 -> inf; DENSE's signalling NaNs
        x = np.concatenate([EDGES, DENSE[::7].astype(np.float64)]).astype(src)
    check(launcher, cast_layer(src, dst), {"X": x})
    check(launcher, pw_free_castlike(1), {"X": x, "L": np.zeros(1, np.dtype(getattr(ml_dtypes, dst, None) or dst))})


def pw_free_castlike(saturate):
    from polykit.compiler.plan.records import LayerDesc

    return LayerDesc("cl", "CastLike", ("X", "L"), ("Y",), {"saturate": saturate, "round_mode": "nearest"})


def q_layer(kind, n_inputs=3, **attrs):
    from polykit.compiler.plan.records import LayerDesc

    return LayerDesc("q", kind, ("X", "S", "Z")[:n_inputs], ("Y",), dict(attrs))


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("out", [n for n in LOWP if n != "float8_e8m0fnu"])
def test_quantize_then_dequantize_every_lowp_type(launcher, out, saturate):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 8, 5)) * 10.0 ** rng.integers(-2, 6, (3, 8, 5))).astype(np.float32)
    x[0, 0, :4] = [np.inf, -np.inf, np.nan, 0.5]
    dt = np.dtype(getattr(ml_dtypes, out))
    zero = np.zeros(8, dt) if out.startswith("float") else np.resize(np.array([1, 0], dt), 8)
    scales = rng.uniform(0.1, 3.0, 8).astype(np.float32)
    check(launcher, q_layer("QuantizeLinear", axis=1, saturate=saturate), {"X": x, "S": scales, "Z": zero})
    check(launcher, q_layer("QuantizeLinear", saturate=saturate),
          {"X": x, "S": np.array(0.37, np.float16), "Z": zero[:1].reshape(())})
    q = lowp_codes(np.resize(np.arange(256, dtype=np.uint8), x.size), out).reshape(x.shape)
    check(launcher, q_layer("DequantizeLinear", axis=1), {"X": q, "S": scales, "Z": zero})
    check(launcher, q_layer("DequantizeLinear", 2, axis=-1, block_size=2),
          {"X": q, "S": rng.uniform(0.1, 3.0, (3, 8, 3)).astype(np.float32)})


@pytest.mark.parametrize("n", [4000, 4001])  # the 4-wide float32 path and the general one
@pytest.mark.parametrize("zp", [np.array(3, np.int8), np.array(200, np.uint8), np.array(-7, np.int16)])
def test_quantize_to_8_and_16_bit_integers_maps_nan_to_zero_and_saturates(launcher, zp, n):
    x = (np.random.default_rng(4).standard_normal(n) * 300).astype(np.float32)
    x[:6] = [np.nan, -np.nan, np.inf, -np.inf, 1e30, -1e30]
    check(launcher, q_layer("QuantizeLinear"), {"X": x, "S": np.array(0.7, np.float32), "Z": zp})


def test_dynamic_quantize_of_both_infinities_gives_the_reference_zero_point(launcher):
    x = np.array([-np.inf, 1.0, np.inf, 2.0], np.float32)
    from polykit.compiler.plan.records import LayerDesc

    check(launcher, LayerDesc("dq", "DynamicQuantizeLinear", ("X",), ("Y", "S", "Z")), {"X": x})
