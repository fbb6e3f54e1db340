"""Pointwise code generator: a fused `Pointwise` body (or one plain elementwise op) -> ONE kernel.

The body (attrs["body"], ops in topological order, see docs/FUSION.md) becomes C statements
over the device functions of pointwise.cuh (`emit_expression`, also used by GEMM/conv
epilogues). The generated module holds, for each dtype signature (the one the builder
stamped on a plan layer, else every candidate signature), two entry points:

- `<base>__<sig>_s`: strided / broadcast path. One thread per output element (grid-stride),
  dims collapsed on the host, per-tensor element strides (0 on broadcast dims) as i64 args.
- `<base>__<sig>_v`: contiguous path, 4 elements per thread with aligned vector loads/stores;
  every input is either the full-size contiguous tensor or a scalar (loaded once).

Compute types: fp16 storage is computed in fp32 (rounded once on store); arithmetic keeps
the type of its first operand like ONNX. The low-precision storage types of lowp.cuh (float8,
float4, int4/int2) load as float / i32; they only get signatures from stamped layers.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from polykit.errors import DeviceError, NodeAttributeError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic

MAXR = 8
BLOCK = 256
VEC = 4

#: low-precision storage types (lowp.cuh; one byte per element, as ml_dtypes stores them):
#: numpy dtype name -> (C storage type, signature code)
LOWP = {
    "float8_e4m3fn": ("f8e4m3fn_t", "f8e4m3"), "float8_e4m3fnuz": ("f8e4m3fnuz_t", "f8e4m3uz"),
    "float8_e5m2": ("f8e5m2_t", "f8e5m2"), "float8_e5m2fnuz": ("f8e5m2fnuz_t", "f8e5m2uz"),
    "float8_e8m0fnu": ("f8e8m0_t", "f8e8m0"), "float4_e2m1fn": ("f4e2m1_t", "f4e2m1"),
    "int4": ("i4_t", "i4"), "uint4": ("u4_t", "u4"), "int2": ("i2_t", "i2"), "uint2": ("u2_t", "u2"),
}
LOWP_INTS = ("int4", "uint4", "int2", "uint2")
CTYPE = {
    "float32": "float", "float16": "half_t", "float64": "double", "int8": "i8", "uint8": "u8",
    "int16": "i16", "uint16": "u16", "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
    "bool": "bool", "bfloat16": "bf16_t",
    **{name: ctype for name, (ctype, _) in LOWP.items()},
}
CODE = {
    "float32": "f32", "float16": "f16", "float64": "f64", "int8": "i8", "uint8": "u8", "int16": "i16",
    "uint16": "u16", "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64", "bool": "b8", "bfloat16": "bf16",
    **{name: code for name, (_, code) in LOWP.items()},
}


def dtype_names(codes: tuple[str, ...]) -> tuple[str, ...]:
    """numpy dtype names whose CODE is one of `codes` (a family's storage types)."""
    return tuple(name for name, code in CODE.items() if code in codes)


#: ONNX TensorProto element type -> numpy dtype name (Cast "to")
ONNX_DTYPE = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
              9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16",
              17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz",
              21: "uint4", 22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2"}
#: Cast round_mode (float8e8m0 targets) -> the code e8m0_encode takes
ROUND_MODES = {"up": 0, "down": 1, "nearest": 2}
INT_DTYPES = ("int32", "int64", "int8", "uint8", "int16", "uint16", "uint32", "uint64")


def _lit(x: Any) -> str:
    return repr(float(x)) if not isinstance(x, bool) else ("true" if x else "false")


def _call(fn: str, *extra: str) -> Callable:
    return lambda a, at: f"{fn}({', '.join([*a, *extra])})"


def _call_attrs(fn: str, *names_defaults: tuple[str, float]) -> Callable:
    return lambda a, at: f"{fn}({', '.join([*a, *(_lit(at.get(n, d)) for n, d in names_defaults)])})"


def _fold(fn: str) -> Callable:
    def emit(a, at):
        a = [x for x in a if x]
        out = a[0]
        for x in a[1:]:
            out = f"{fn}({out}, {x})"
        return out
    return emit


def _mean(a, at):
    a = [x for x in a if x]
    return f"pk_div({_fold('pk_add')(a, at)}, {len(a)})"


def _clip(a, at):
    x, lo, hi = (a + [None, None, None])[:3]
    if lo and hi:
        return f"pk_clip({x}, {lo}, {hi})"
    if lo:
        return f"pk_clip_lo({x}, {lo})"
    return f"pk_clip_hi({x}, {hi})" if hi else x


def _cast(a, at):
    to = ONNX_DTYPE.get(int(at.get("to", 1)))
    if to is None:
        raise NodeAttributeError(f"Cast to ONNX type {at.get('to')} has no CUDA kernel", hint="use --target cpu")
    if to in ("float16", "bfloat16"):  # rounded to the narrow type, kept in the float compute type
        return f"pk_to_{'half' if to == 'float16' else 'bf16'}({a[0]})"
    sat = _lit(bool(at.get("saturate", 1)))
    if to == "float8_e8m0fnu":
        mode = ROUND_MODES.get(str(at.get("round_mode", "up")))
        if mode is None:
            raise NodeAttributeError(f"Cast round_mode {at.get('round_mode')!r} is not one of {sorted(ROUND_MODES)}")
        return f"pk_to_e8m0({a[0]}, {sat}, {mode})"
    if to in LOWP_INTS:
        return f"pk_to_intn<{CTYPE[to]}>({a[0]})"
    if to in LOWP:  # float8 / float4: rounded (saturated as `saturate` says), kept in float
        return f"pk_to_lowp<{CTYPE[to]}>({a[0]}, {sat})"
    return f"cvt<{CTYPE[to]}>({a[0]})"


def _gelu(a, at):
    return f"pk_gelu_tanh({a[0]})" if at.get("approximate", "none") == "tanh" else f"pk_gelu({a[0]})"


def _isinf(a, at):
    return f"pk_isinf({a[0]}, {_lit(bool(at.get('detect_positive', 1)))}, {_lit(bool(at.get('detect_negative', 1)))})"


def _mod(a, at):
    return f"{'pk_fmod' if at.get('fmod', 0) else 'pk_mod'}({a[0]}, {a[1]})"


def _shift(a, at):
    return f"{'pk_shl' if at.get('direction', 'LEFT') == 'LEFT' else 'pk_shr'}({a[0]}, {a[1]})"


#: op -> emit(args: list of C expressions ("" for omitted), attrs) -> C expression
OPS: dict[str, Callable[[list[str], Mapping[str, Any]], str]] = {
    "Abs": _call("pk_abs"), "Neg": _call("pk_neg"), "Sqrt": _call("pk_sqrt"), "Exp": _call("pk_exp"),
    "Log": _call("pk_log"), "Erf": _call("pk_erf"), "Reciprocal": _call("pk_reciprocal"),
    "Floor": _call("pk_floor"), "Ceil": _call("pk_ceil"), "Round": _call("pk_round"), "Sign": _call("pk_sign"),
    "Sin": _call("pk_sin"), "Cos": _call("pk_cos"), "Tan": _call("pk_tan"), "Asin": _call("pk_asin"),
    "Acos": _call("pk_acos"), "Atan": _call("pk_atan"), "Sinh": _call("pk_sinh"), "Cosh": _call("pk_cosh"),
    "Asinh": _call("pk_asinh"), "Acosh": _call("pk_acosh"), "Atanh": _call("pk_atanh"), "Tanh": _call("pk_tanh"),
    "Not": _call("pk_not"), "BitwiseNot": _call("pk_bitnot"), "Identity": lambda a, at: a[0],
    "IsNaN": _call("pk_isnan"), "IsInf": _isinf,
    "Add": _call("pk_add"), "Sub": _call("pk_sub"), "Mul": _call("pk_mul"), "Div": _call("pk_div"),
    "Pow": _call("pk_pow"), "Mod": _mod, "BitwiseAnd": _call("pk_band"), "BitwiseOr": _call("pk_bor"),
    "BitwiseXor": _call("pk_bxor"), "BitShift": _shift,
    "Equal": lambda a, at: f"({a[0]} == {a[1]})", "Less": lambda a, at: f"({a[0]} < {a[1]})",
    "Greater": lambda a, at: f"({a[0]} > {a[1]})", "LessOrEqual": lambda a, at: f"({a[0]} <= {a[1]})",
    "GreaterOrEqual": lambda a, at: f"({a[0]} >= {a[1]})",
    "And": lambda a, at: f"((bool){a[0]} && (bool){a[1]})", "Or": lambda a, at: f"((bool){a[0]} || (bool){a[1]})",
    "Xor": lambda a, at: f"((bool){a[0]} != (bool){a[1]})",
    "Min": _fold("pk_min"), "Max": _fold("pk_max"), "Sum": _fold("pk_add"), "Mean": _mean,
    "Where": lambda a, at: f"({a[0]} ? {a[1]} : {a[2]})",
    "Cast": _cast, "Clip": _clip,
    "Relu": _call("pk_relu"), "LeakyRelu": _call_attrs("pk_leaky_relu", ("alpha", 0.01)),
    "PRelu": _call("pk_prelu"), "Sigmoid": _call("pk_sigmoid"),
    "HardSigmoid": _call_attrs("pk_hard_sigmoid", ("alpha", 0.2), ("beta", 0.5)), "HardSwish": _call("pk_hard_swish"),
    "Elu": _call_attrs("pk_elu", ("alpha", 1.0)),
    "Selu": _call_attrs("pk_selu", ("alpha", 1.67326319217681884765625), ("gamma", 1.05070102214813232421875)),
    "Celu": _call_attrs("pk_celu", ("alpha", 1.0)), "Gelu": _gelu, "Softplus": _call("pk_softplus"),
    "Softsign": _call("pk_softsign"), "Mish": _call("pk_mish"),
    "ThresholdedRelu": _call_attrs("pk_thresholded_relu", ("alpha", 1.0)),
    "Shrink": _call_attrs("pk_shrink", ("bias", 0.0), ("lambd", 0.5)), "Swish": _call_attrs("pk_swish", ("alpha", 1.0)),
}

BOOL_OUT = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf"}
#: ops that run on integer tensors (a body made only of these gets integer signatures too)
INT_OPS = {"Abs", "Neg", "Sign", "Identity", "Add", "Sub", "Mul", "Div", "Pow", "Mod", "BitwiseAnd", "BitwiseOr",
           "BitwiseXor", "BitShift", "BitwiseNot", "Min", "Max", "Sum", "Mean", "Where", "Cast", "Clip", "Relu",
           "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"} | {"Not", "And", "Or", "Xor"}
INT_ONLY_OPS = {"BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitShift", "BitwiseNot"}
BOOL_OPS = {"Not", "And", "Or", "Xor", "Equal", "Where", "Cast", "Identity"}


def emit_expression(body: Sequence[Mapping[str, Any]], values: Mapping[str, str], *,
                    prefix: str = "v") -> tuple[str, dict[str, str]]:
    """C statements that evaluate `body` (ONNX elementwise ops in topological order).

    `values` maps each external name the body reads to a C expression in its compute type
    (float for fp16/fp32 storage). Returns (code, env): `code` declares one `auto` local per
    body output (named `<prefix><k>`), `env` maps every name (external and body) to its C
    expression, so a caller stores env[output] with `st(ptr, index, env[output])`.
    """
    env = dict(values)
    lines = []
    for k, op in enumerate(body):
        emit = OPS.get(op["op"])
        if emit is None:
            raise NodeAttributeError(f"op {op['op']} cannot run inside a CUDA pointwise kernel",
                                     hint="use --target cpu, or keep the op out of the fused body")
        args = []
        for name in op["inputs"]:
            if name and name not in env:
                raise NodeAttributeError(f"pointwise body reads {name!r} before it is defined")
            args.append(env[name] if name else "")
        var = f"{prefix}{k}"
        lines.append(f"    auto {var} = {emit(args, op.get('attrs', {}))};")
        for out in op["outputs"]:
            env[out] = var
    return "\n".join(lines), env


def body_dtypes(body: Sequence[Mapping[str, Any]], dtypes: Mapping[str, str]) -> dict[str, str]:
    """numpy dtype names of every body value, given the external inputs' (ONNX typing rules)."""
    env = dict(dtypes)
    for op in body:
        ins = [env.get(n) for n in op["inputs"]]
        kind = op["op"]
        if kind in BOOL_OUT:
            dt = "bool"
        elif kind == "Cast":
            dt = ONNX_DTYPE.get(int(op.get("attrs", {}).get("to", 1)), "float32")
        elif kind == "Where":
            dt = ins[1]
        else:
            dt = ins[0]
        for out in op["outputs"]:
            env[out] = dt
    return env


def _input_roles(body, inputs) -> dict[str, set[str]]:
    """How each external input is used: 'cond' (bool operand), 'cast' (Cast source), 'exp', 'data'."""
    roles: dict[str, set[str]] = {n: set() for n in inputs}
    for op in body:
        for i, name in enumerate(op["inputs"]):
            if name not in roles:
                continue
            if (op["op"] == "Where" and i == 0) or op["op"] in ("Not", "And", "Or", "Xor"):
                roles[name].add("cond")
            elif op["op"] == "Cast":
                roles[name].add("cast")
            elif op["op"] == "Pow" and i == 1:
                roles[name].add("exp")

            else:
                roles[name].add("data")
    return roles


#: dtypes an input used only by Cast or as an exponent may have besides the layer's type
ALT_DTYPES = ("int64", "int32", "bool", "float32", "float16", "uint8", "int8", "float64")
#: further dtypes an exponent-only input may have (ONNX Pow's T1)
EXP_DTYPES = ("uint32", "uint64", "uint16", "int16")


def _compare_only_inputs(body, ins, outs, roles) -> list[str]:
    """Inputs whose values reach the outputs only through comparisons (their dtype never
    becomes an output's): e.g. the integer positions of Less(Add(range, offset), len)."""
    typed = set(outs)
    for op in reversed(body):
        if op["op"] in BOOL_OUT or op["op"] == "Cast" or not typed & set(op["outputs"]):
            continue
        for i, name in enumerate(op["inputs"]):
            if not ((op["op"] == "Where" and i == 0) or (op["op"] == "Pow" and i == 1)):
                typed.add(name)
    return [n for n in ins if n not in typed and roles[n] and roles[n] <= {"data"}]


def stamped_signature(layer) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The one signature a plan layer needs, from the dtypes the builder stamped on it
    (LayerDesc.in_dtypes/out_dtypes, "" = omitted input); None when they are not set, do not
    match the layer's tensors, or name a type without a CUDA storage type."""
    in_dtypes, out_dtypes = tuple(getattr(layer, "in_dtypes", ())), tuple(getattr(layer, "out_dtypes", ()))
    if not out_dtypes or len(in_dtypes) != len(layer.inputs) or len(out_dtypes) != len(layer.outputs):
        return None
    ins = tuple(d for n, d in zip(layer.inputs, in_dtypes) if n)
    outs = tuple(out_dtypes)
    if not all(d in CTYPE for d in ins + outs):
        return None
    return ins, outs


def candidate_signatures(layer) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(input dtypes, output dtypes) the layer's module is compiled for: the plan's float type
    first, then the other float types, integer/bool types where the ops allow them, for
    inputs used only by Cast (masks, ids) or as an exponent the usual integer/bool types, and
    int64/int32 for inputs that only feed comparisons (positions building a mask). A plan
    layer whose dtypes the builder stamped gets exactly that one signature."""
    stamped = stamped_signature(layer)
    if stamped is not None:
        return [stamped]
    body, ins, outs = layer_body(layer)
    ins = [n for n in ins if n]
    ops = {op["op"] for op in body}
    floats = ["float16", "float32"] if layer.precision == "fp16" else ["float32", "float16"]
    uniform = [] if ops & INT_ONLY_OPS else floats + ["float64", "bfloat16"]
    if ops <= INT_OPS:
        uniform += list(INT_DTYPES)
    if ops <= BOOL_OPS:
        uniform.append("bool")
    roles = _input_roles(body, ins)
    sigs: list[dict[str, str]] = []
    for t in uniform:
        sigs.append({n: ("bool" if roles[n] == {"cond"} else t) for n in ins})
    alt_names = [n for n in ins if roles[n] and roles[n] <= {"cast", "exp"}]
    if len(alt_names) == 1:
        exp_only = roles[alt_names[0]] == {"exp"}
        # ONNX Pow: base T in {int32, int64, floats}, exponent T1 any numeric type
        bases = floats + (["int32", "int64"] if exp_only and ops <= INT_OPS else [])
        alts = ALT_DTYPES + (EXP_DTYPES if exp_only else ())
        for t in bases:
            for alt in alts:
                sig = {n: ("bool" if roles[n] == {"cond"} else t) for n in ins}
                sig[alt_names[0]] = alt
                sigs.append(sig)
    # masks built in the body from integer positions (Less(range, len) -> Where(mask, 0, -inf))
    cmp_names = _compare_only_inputs(body, ins, outs, roles)
    if cmp_names and len(cmp_names) < len(ins):
        for t in floats:
            for ct in ("int64", "int32"):
                sigs.append({n: ("bool" if roles[n] == {"cond"} else ct if n in cmp_names else t) for n in ins})
    out: list = []
    for sig in sigs:
        env = body_dtypes(body, sig)
        key = (tuple(sig[n] for n in ins), tuple(env.get(n, "float32") for n in outs))
        if key not in out and None not in key[1]:
            out.append(key)
    return out


def layer_body(layer) -> tuple[list[dict], tuple[str, ...], tuple[str, ...]]:
    """(body, inputs, outputs) of a Pointwise layer, or of a plain op as a one-op body."""
    if layer.kind == "Pointwise":
        return list(layer.attrs["body"]), tuple(layer.inputs), tuple(layer.outputs)
    attrs = {k: v for k, v in layer.attrs.items() if k != "fused_from"}
    return [{"op": layer.kind, "inputs": list(layer.inputs), "outputs": list(layer.outputs), "attrs": attrs}], \
        tuple(layer.inputs), tuple(layer.outputs)


def sig_name(base: str, sig) -> str:
    ins, outs = sig
    return f"{base}__{'_'.join(CODE[d] for d in ins)}__{'_'.join(CODE[d] for d in outs)}"


def _module_code(body, ins, outs, sigs, base) -> str:
    """The generated .cu text: a templated strided and vector kernel + extern "C" entries."""
    nin, nout = len(ins), len(outs)
    tin = [f"T{i}" for i in range(nin)]
    tout = [f"O{j}" for j in range(nout)]
    tparams = ", ".join(f"class {t}" for t in tin + tout)
    ptrs = [f"const {tin[i]}* __restrict__ x{i}" for i in range(nin)] + \
           [f"{tout[j]}* __restrict__ y{j}" for j in range(nout)]
    # strided path: loads at per-tensor offsets
    code_s, env_s = emit_expression(body, {n: f"ld(x{i}, o_x{i})" for i, n in enumerate(ins)})
    geo = ["i64 n", "i64 rank"] + [f"i64 d{d}" for d in range(MAXR)] + \
          [f"i64 s{t}_{d}" for t in range(nin + nout) for d in range(MAXR)] + [f"i64 zm{j}" for j in range(nout)]
    lines = ['#include "pointwise.cuh"', ""]
    lines.append(f"template <{tparams}>")
    lines.append(f"__device__ __forceinline__ void {base}_s({', '.join(ptrs + geo)}) {{")
    lines.append(f"  const i64 dims[{MAXR}] = {{{', '.join(f'd{d}' for d in range(MAXR))}}};")
    for t in range(nin + nout):
        lines.append(f"  const i64 st{t}[{MAXR}] = {{{', '.join(f's{t}_{d}' for d in range(MAXR))}}};")
    lines.append("  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {")
    lines.append("    " + " ".join(f"i64 o{t} = 0;" for t in range(nin + nout)) + " bool skip[" + str(max(nout, 1)) + "] = {};")
    lines.append("    i64 r = i;")
    lines.append(f"#pragma unroll\n    for (int d = {MAXR} - 1; d >= 0; --d) {{")
    lines.append("      if (d < rank) {")
    lines.append("        i64 q = rank == 1 ? 0 : r / dims[d]; i64 c = r - q * dims[d]; r = q;")
    for t in range(nin + nout):
        lines.append(f"        o{t} += c * st{t}[d];")
    for j in range(nout):
        lines.append(f"        if (((zm{j} >> d) & 1) && c != 0) skip[{j}] = true;")
    lines.append("      }\n    }")
    for i in range(nin):
        lines.append(f"    const i64 o_x{i} = o{i};")
    lines.append(code_s)
    for j, name in enumerate(outs):
        lines.append(f"    if (!skip[{j}]) st(y{j}, o{nin + j}, {env_s[name]});")
    lines.append("  }\n}\n")
    # vector path: each input full-size contiguous (sc=0) or a scalar (sc=1); n % VEC == 0
    code_v, env_v = emit_expression(body, {n: f"a{i}" for i, n in enumerate(ins)})
    vgeo = ["i64 n"] + [f"i64 sc{i}" for i in range(nin)]
    lines.append(f"template <{tparams}>")
    lines.append(f"__device__ __forceinline__ void {base}_v({', '.join(ptrs + vgeo)}) {{")
    for i in range(nin):
        lines.append(f"  const auto s{i} = ld(x{i}, 0);")
    lines.append(f"  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n / {VEC}; i += (i64)gridDim.x * blockDim.x) {{")
    for i in range(nin):
        lines.append(f"    Vec<{tin[i]}, {VEC}> w{i}; if (!sc{i}) w{i} = reinterpret_cast<const Vec<{tin[i]}, {VEC}>*>(x{i})[i];")
    for j in range(nout):
        lines.append(f"    Vec<{tout[j]}, {VEC}> u{j};")
    lines.append(f"#pragma unroll\n    for (int k = 0; k < {VEC}; ++k) {{")
    for i in range(nin):
        lines.append(f"      const auto a{i} = sc{i} ? s{i} : ld(w{i}.v, k);")
    lines.append(code_v.replace("\n    ", "\n      ").replace("    auto", "      auto", 1))
    for j, name in enumerate(outs):
        lines.append(f"      st(u{j}.v, k, {env_v[name]});")
    lines.append("    }")
    for j in range(nout):
        lines.append(f"    reinterpret_cast<Vec<{tout[j]}, {VEC}>*>(y{j})[i] = u{j};")
    lines.append("  }\n}\n")
    for sig in sigs:
        targs = ", ".join(CTYPE[d] for d in sig[0] + sig[1])
        cptrs = [f"const {CTYPE[sig[0][i]]}* x{i}" for i in range(nin)] + \
                [f"{CTYPE[sig[1][j]]}* y{j}" for j in range(nout)]
        names = [f"x{i}" for i in range(nin)] + [f"y{j}" for j in range(nout)]
        for path, g in (("s", geo), ("v", vgeo)):
            gnames = [p.split()[1] for p in g]
            lines.append(f'extern "C" __global__ void __launch_bounds__({BLOCK}) {sig_name(base, sig)}_{path}('
                         f'{", ".join(cptrs + g)}) {{ {base}_{path}<{targs}>({", ".join(names + gnames)}); }}')
    return "\n".join(lines) + "\n"


def _base_name(body, ins, outs) -> str:
    blob = json.dumps([body, list(ins), list(outs)], sort_keys=True, default=str)
    return "pw_" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def _canonical(body, ins, outs):
    """Rename external names to x<i>/y<j> so identical bodies share one compiled module."""
    ren = {n: f"x{i}" for i, n in enumerate(ins) if n}
    for k, op in enumerate(body):
        for m, o in enumerate(op["outputs"]):
            ren.setdefault(o, f"t{k}_{m}")
    for j, n in enumerate(outs):
        if n not in ins:
            ren[n] = f"y{j}"
    body = [{"op": op["op"], "inputs": [ren.get(n, n) if n else "" for n in op["inputs"]],
             "outputs": [ren[o] for o in op["outputs"]], "attrs": op.get("attrs", {})} for op in body]
    return body, tuple(ren[n] for n in ins if n), tuple(ren[n] for n in outs)


def pointwise_kernels(layer, sigs=None) -> list[KernelSource]:
    """Kernels (two per candidate signature, one module) for a Pointwise or plain elementwise layer."""
    body, ins, outs = _canonical(*layer_body(layer))
    sigs = candidate_signatures(layer) if sigs is None else sigs
    base = _base_name(body, ins, outs)
    code = _module_code(body, ins, outs, sigs, base)
    return [KernelSource(f"{sig_name(base, s)}_{p}", code=code) for s in sigs for p in ("s", "v")]


def broadcast_geometry(shapes: Sequence[tuple[int, ...]], n_out: int):
    """Collapse the broadcast iteration space of `shapes` (inputs then outputs).

    Returns (n, dims, strides per tensor, zero-masks per output): dims innermost last;
    adjacent dims merge when every tensor is contiguous (or broadcast) across them."""
    rank = max((len(s) for s in shapes), default=0)
    full = [1] * rank
    for s in shapes:
        for k, d in enumerate(s):
            full[rank - len(s) + k] = max(full[rank - len(s) + k], d)
    n = int(np.prod(full, dtype=np.int64)) if full else 1
    per = []
    for s in shapes:
        padded = (1,) * (rank - len(s)) + tuple(s)
        st, acc = [0] * rank, 1
        for k in range(rank - 1, -1, -1):
            st[k] = 0 if padded[k] == 1 else acc
            acc *= padded[k]
        per.append(st)
    keep = [k for k in range(rank) if full[k] != 1]
    dims = [full[k] for k in keep]
    strides = [[st[k] for k in keep] for st in per]
    k = len(dims) - 1
    while k > 0:
        if all(st[k - 1] == st[k] * dims[k] for st in strides):
            dims[k - 1] *= dims[k]
            for st in strides:
                st[k - 1] = st[k]
                del st[k]
            del dims[k]
        k -= 1
    if not dims:
        dims, strides = [1], [[0] for _ in shapes]
    zm = [sum(1 << d for d in range(len(dims)) if strides[len(shapes) - n_out + j][d] == 0 and dims[d] > 1)
          for j in range(n_out)]
    return n, dims, strides, zm


def grid_for(n: int, per_thread: int = 1) -> tuple[int, int, int]:
    return (max(1, min(-(-n // (BLOCK * per_thread)), 65535 * 16)), 1, 1)


@functools.lru_cache(maxsize=4096)
def _entry(layer, sig) -> tuple[KernelSource, KernelSource]:
    """The (strided, vector) kernels of `layer` for dtype signature `sig`."""
    sigs = candidate_signatures(layer)
    if sig not in sigs:
        raise DeviceError(f"no pointwise kernel was compiled for dtypes {sig[0]} -> {sig[1]}",
                          where=f"layer {layer.name!r}",
                          hint=f"compiled signatures: {sigs[:4]}...; run this layer with --target cpu")
    body, ins, outs = _canonical(*layer_body(layer))
    name = sig_name(_base_name(body, ins, outs), sig)
    kernels = {k.name: k for k in pointwise_kernels(layer, sigs)}
    return kernels[name + "_s"], kernels[name + "_v"]


def enqueue_pointwise(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    body, ins, outs = layer_body(layer)
    x = [tensors[n] for n in ins if n]
    y = [tensors[n] for n in outs]
    sig = (tuple(t.dtype.name for t in x), tuple(t.dtype.name for t in y))
    for d in sig[0] + sig[1]:
        if d not in CTYPE:
            raise DeviceError(f"dtype {d} has no CUDA pointwise kernel", where=f"layer {layer.name!r}",
                              hint="use --target cpu")
    k_s, k_v = _entry(layer, sig)
    n = max(t.size for t in y) if y else 0
    if n == 0:
        return
    full = all(t.size == n for t in y) and all(t.size in (1, n) and (t.shape == y[0].shape or t.size == 1) for t in x)
    itemsizes = [t.dtype.itemsize for t in x + y]
    aligned = all(t.ptr % (VEC * s) == 0 for t, s in zip(x + y, itemsizes))
    if full and n % VEC == 0 and aligned and all(t.shape == y[0].shape for t in y):
        args = [*x, *y, n, *[int(t.size == 1 and n != 1) for t in x]]
        launcher.launch(k_v, grid_for(n, VEC), (BLOCK, 1, 1), args)
        return
    n, dims, strides, zm = broadcast_geometry([t.shape for t in x + y], len(y))
    if len(dims) > MAXR:
        raise DeviceError(f"broadcast over {len(dims)} non-mergeable dims exceeds {MAXR}",
                          where=f"layer {layer.name!r}", hint="use --target cpu")
    pad = [1] * (MAXR - len(dims))
    args = [*x, *y, n, len(dims), *dims, *pad]
    for st in strides:
        args += [*st, *([0] * (MAXR - len(st)))]
    args += zm
    launcher.launch(k_s, grid_for(n), (BLOCK, 1, 1), args)


#: plain layer kinds that run through the generator as a one-op body
PLAIN_KINDS = tuple(sorted(OPS))


def _storable(layer) -> bool:
    """False when the builder stamped a dtype that has no CUDA storage type (strings): the
    build then reports the layer instead of the run failing at enqueue."""
    stamped = tuple(getattr(layer, "in_dtypes", ())) + tuple(getattr(layer, "out_dtypes", ()))
    return all(d in CTYPE for d in stamped if d)


def _register() -> None:
    cuda_tactic("Pointwise", "cuda.pointwise", kernels=pointwise_kernels,
                supports=lambda layer: all(op["op"] in OPS for op in layer.attrs.get("body", ()))
                and _storable(layer))(enqueue_pointwise)
    for kind in PLAIN_KINDS:
        cuda_tactic(kind, "cuda.pointwise", kernels=pointwise_kernels,
                    supports=lambda layer: layer.domain in ("", "ai.onnx") and _storable(layer))(enqueue_pointwise)


_register()


def compile_variants() -> list[KernelSource]:
    """Representative modules: every float op in one body, every integer op, every bool op."""
    from polykit.compiler.plan_records import LayerDesc

    def layer(ops_inputs, precision="fp32"):
        body, last = [], "x0"
        for k, (op, extra, attrs) in enumerate(ops_inputs):
            body.append({"op": op, "inputs": [last, *extra], "outputs": [f"t{k}"], "attrs": attrs})
            last = f"t{k}"
        return LayerDesc("v", "Pointwise", ("x0", "x1", "x2"), (last,),
                         {"body": body}, domain="ai.polykit", precision=precision)

    unary_f = ["Abs", "Neg", "Sqrt", "Exp", "Log", "Erf", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin",
               "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Tanh", "Relu",
               "Sigmoid", "HardSwish", "Softplus", "Softsign", "Mish", "Identity"]
    attrs_f = [("LeakyRelu", [], {"alpha": 0.1}), ("HardSigmoid", [], {}), ("Elu", [], {}), ("Selu", [], {}),
               ("Celu", [], {}), ("Gelu", [], {}), ("Gelu", [], {"approximate": "tanh"}),
               ("ThresholdedRelu", [], {}), ("Shrink", [], {}), ("Swish", [], {}),
               ("Clip", ["x1", "x2"], {}), ("Clip", ["x1", ""], {}), ("PRelu", ["x1"], {}),
               ("Add", ["x1"], {}), ("Sub", ["x1"], {}), ("Mul", ["x1"], {}), ("Div", ["x1"], {}),
               ("Pow", ["x2"], {}), ("Mod", ["x1"], {"fmod": 1}), ("Min", ["x1", "x2"], {}), ("Max", ["x1"], {}),
               ("Sum", ["x1", "x2"], {}), ("Mean", ["x1"], {}), ("Cast", [], {"to": 10}), ("Cast", [], {"to": 1})]
    flt = layer([(op, [], {}) for op in unary_f] + attrs_f)
    ints = layer([(op, ["x1"], {}) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "BitwiseAnd", "BitwiseOr",
                                              "BitwiseXor", "Pow")] + [("Mod", ["x1"], {}), ("Abs", [], {}),
                                                                      ("Neg", [], {}), ("Sign", [], {}),
                                                                      ("BitwiseNot", [], {}), ("Clip", ["x1", "x2"], {}),
                                                                      ("BitShift", ["x2"], {"direction": "RIGHT"})])
    logic = layer([("Equal", ["x1"], {}), ("Not", [], {}), ("And", ["x1"], {}), ("Or", ["x2"], {}),
                   ("Xor", ["x1"], {}), ("Where", ["x1", "x2"], {}), ("Cast", [], {"to": 7})])
    cmp = layer([("Less", ["x1"], {}), ("Cast", [], {"to": 1}), ("IsNaN", [], {}), ("Where", ["x1", "x2"], {}),
                 ("IsInf", [], {}), ("Where", ["x1", "x2"], {}), ("Greater", ["x2"], {}),
                 ("Where", ["x1", "x2"], {}), ("GreaterOrEqual", ["x1"], {}), ("Where", ["x1", "x2"], {}),
                 ("LessOrEqual", ["x2"], {}), ("Cast", [], {"to": 1})], precision="fp16")
    return [pointwise_kernels(lay)[0] for lay in (flt, ints, logic, cmp, *lowp_variant_layers())]


def lowp_variant_layers() -> list:
    """Stamped layers that instantiate every low-precision encode (from float32, float64 and
    int64 sources, saturate on and off, every e8m0 round mode) and every decode."""
    from polykit.compiler.plan_records import LayerDesc

    codes = [k for k, d in ONNX_DTYPE.items() if d in LOWP]
    layers = []
    for src in ("float32", "float64", "int64"):
        body, outs = [], []
        for k, code in enumerate(codes):
            for sat, mode in ((1, "up"), (0, "nearest"), (1, "down")):
                if (mode != "up" or not sat) and ONNX_DTYPE[code] != "float8_e8m0fnu" and (src != "float32" or sat):
                    continue
                out = f"y{len(outs)}"
                body.append({"op": "Cast", "inputs": ["x"], "outputs": [out],
                             "attrs": {"to": code, "saturate": sat, "round_mode": mode}})
                outs.append(out)
        body.append({"op": "Cast", "inputs": ["x"], "outputs": [f"y{len(outs)}"], "attrs": {"to": codes[0], "saturate": 0}})
        outs.append(f"y{len(outs)}")
        out_dtypes = tuple(ONNX_DTYPE[op["attrs"]["to"]] for op in body)
        layers.append(LayerDesc(f"lowp_{src}", "Pointwise", ("x",), tuple(outs), {"body": body}, domain="ai.polykit",
                                in_dtypes=(src,), out_dtypes=out_dtypes))
    ins = tuple(f"x{k}" for k in range(len(codes)))
    body = [{"op": "Cast", "inputs": [n], "outputs": [f"f{k}"], "attrs": {"to": 1}} for k, n in enumerate(ins)]
    body += [{"op": "Cast", "inputs": [n], "outputs": [f"h{k}"], "attrs": {"to": 10}} for k, n in enumerate(ins)]
    body += [{"op": "Cast", "inputs": [n], "outputs": [f"i{k}"], "attrs": {"to": 6}} for k, n in enumerate(ins)]
    body += [{"op": "Identity", "inputs": [n], "outputs": [f"c{k}"], "attrs": {}} for k, n in enumerate(ins)]
    outs = tuple(f"{p}{k}" for p in "fhic" for k in range(len(codes)))
    out_dtypes = ("float32",) * len(codes) + ("float16",) * len(codes) + ("int32",) * len(codes) + \
        tuple(ONNX_DTYPE[c] for c in codes)
    layers.append(LayerDesc("lowp_decode", "Pointwise", ins, outs, {"body": body}, domain="ai.polykit",
                            in_dtypes=tuple(ONNX_DTYPE[c] for c in codes), out_dtypes=out_dtypes))
    return layers
