"""Epilogues of the GEMM and conv kernels: the elementwise chain fused after Conv/Gemm/MatMul
(docs/FUSION.md, "Epilogue form") compiled INTO the producing kernel.

The body becomes C through the pointwise generator (`pointwise.emit_expression`); the
generated module is the family's .cu text preceded by HAS_EPILOGUE 1, the extra kernel
parameters (each extra input's pointer and its element strides over the output's dims, 0
on broadcast dims; up to MAXR output dims) and `apply_epilogue(E, v, out_index, col)`, which
the kernels call on each fp32 result before the store. Extra inputs must have the output's
storage dtype (float32, float16 or bfloat16). As the reference (and ONNX) compute the fused
nodes one by one, each giving the output's type, a 16-bit result is rounded to that type
before the body and each body op's result after it (`round_as`, a no-op for float32). Where
the builder stamped shapes on the layer, each extra input is read by its class
(`input_classes`): at the output index, at the column, or once; only other broadcasts pay the
strided offset.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ops.nn.channels_last import DEPTH_TO_SPACE
from polykit.compiler.ops.nn.fused import EPILOGUE_ARITY
from polykit.compiler.ops.quant.int8 import QUANT_ARITY, epilogue_result, is_int8_layer
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import CUDA_DIR, DeviceTensor, KernelSource, defines

MAXR = 6


def has_epilogue(layer: Any) -> bool:
    return bool(layer.attrs.get("epilogue"))


def extra_inputs(layer: Any) -> list[str]:
    arity = QUANT_ARITY if is_int8_layer(layer) else EPILOGUE_ARITY[layer.kind]
    return list(layer.inputs[arity:])


#: 16-bit storage types: their epilogues compute Gelu with pointwise.cuh's pk_gelu16 (the result is
#: rounded to 16 bits, so erff's full float accuracy is not needed; within 1 fp16 ulp, one MUFU)
_SIXTEEN_BIT = ("half_t", "bf16_t")
#: extra inputs an INT8 or FP8 layer's epilogue reads in their own type (it computes in float32): numpy dtype name
#: -> C storage type. 8-bit ones it dequantizes itself (fold_qdq.dequantizing_steps; lowp.cuh's f8e4m3fn_t loads
#: as its float value), float16 ones it casts to float32 itself (passes/absorb_quantized_casts.py)
_OWN_TYPE = {"int8": "i8", "uint8": "u8", "float8_e4m3fn": "f8e4m3fn_t", "float16": "half_t"}


def extra_types(layer: Any, elem: str) -> list[str]:
    """The C storage type of each extra input: `elem`, or for an INT8 or FP8 layer the type of an input
    stamped int8 / uint8 / float8_e4m3fn (a residual read as 8 bits) or float16 (a half residual)."""
    stamped = dict(zip(layer.inputs, getattr(layer, "in_dtypes", ()) or ()))
    quantized = is_int8_layer(layer)
    return [_OWN_TYPE.get(stamped.get(name, ""), elem) if quantized else elem for name in extra_inputs(layer)]


def _body_code(layer: Any) -> tuple[str, str]:
    from polykit.kernels.cuda.pointwise.pointwise_expr import emit_expression

    epi = layer.attrs["epilogue"]
    values = {epi["input"]: "round_as<ELEM>(v)"}
    for j, name in enumerate(extra_inputs(layer)):
        values[name] = f"ld(E.e{j}, off{j})"
    code, env = emit_expression(epi["body"], values, _value_types(layer), prefix="t")
    # an INT8 layer's epilogue ends in a body-local name when its output is requantized
    return code, env[epilogue_result(epi) if is_int8_layer(layer) else layer.outputs[0]]


def _value_types(layer: Any) -> dict[str, str]:
    """The C storage type of each value the epilogue body reads: the GEMM/conv result is of the
    output's type (ELEM), as the node it fused stored it; the extra inputs as extra_types says."""
    types = dict(zip(extra_inputs(layer), extra_types(layer, "ELEM")))
    types[layer.attrs["epilogue"]["input"]] = "ELEM"
    return types


def supports_epilogue(layer: Any) -> bool:
    """Whether the layer has no epilogue, or one this generator can compile."""
    if not has_epilogue(layer):
        return True
    try:
        _body_code(layer)
    except Exception:
        return False
    return all(extra_inputs(layer))


def input_classes(layer: Any) -> list[str]:
    """How each extra input is read, from the shapes the builder stamped on the layer:
    "full" (the output's own shape: at the output index), "last" (a vector along the output's
    last axis, broadcast over the rest: at the column index), "scalar" (one element), or
    "general" (any other broadcast, or shapes unknown: strided offset at run time)."""
    names = extra_inputs(layer)
    shapes = dict(zip(layer.inputs, getattr(layer, "in_shapes", ()) or ()))
    outs = getattr(layer, "out_shapes", ()) or ()
    if not outs or any(n not in shapes for n in names):
        return ["general"] * len(names)
    out = tuple(outs[0])
    # kernels pass the GEMM column as `col`; a MatMul with a 1-D B has no column axis in its output
    column_is_last = not (layer.kind == "MatMul" and len(getattr(layer, "in_shapes", ())[1]) == 1)
    classes = []
    for name in names:
        shape = tuple(shapes[name])
        padded = (1,) * (len(out) - len(shape)) + shape if len(shape) <= len(out) else None
        if padded == out:
            classes.append("full")
        elif padded is not None and all(d == 1 for d in padded):
            classes.append("scalar")
        elif padded is not None and out and column_is_last and all(d == 1 for d in padded[:-1]) and padded[-1] == out[-1]:
            classes.append("last")
        else:
            classes.append("general")
    return classes


_OFFSET = {
    "full": "oi",
    "scalar": "0",
    # every kernel passes the index along the output's last axis (a modulo here, even one never
    # taken, was evaluated speculatively for every element: 64-bit division calls in the epilogue)
    "last": "col",
}


def _body8(layer: Any, refs: Mapping[str, str]) -> str:
    """The loop of apply_epilogue8 over 8 values v[i], each extra input read as `refs` names it
    (a scalar input at its one element)."""
    from polykit.kernels.cuda.pointwise.pointwise_expr import emit_expression

    epi = layer.attrs["epilogue"]
    values = {epi["input"]: "round_as<ELEM>(v[i])", **refs}
    code, env = emit_expression(epi["body"], values, _value_types(layer), prefix="t")
    result = env[epilogue_result(epi) if is_int8_layer(layer) else layer.outputs[0]]
    lines = code.split("\n")
    last = f"    auto {result} = round_as<ELEM>("
    if not is_int8_layer(layer) and lines[-1].startswith(last):
        # the store rounds the result to ELEM itself: rounding it here too is the same bits, two more cvt
        lines[-1] = f"    auto {result} = {lines[-1][len(last):-2]};"
    code = "\n".join(lines)
    return f"#pragma unroll\n  for (int i = 0; i < 8; ++i) {{\n{code}\n    v[i] = (float)({result});\n  }}\n"


def _vector_epilogue(layer: Any, classes: list[str], types: list[str]) -> str:
    """The epilogue of 8 consecutive outputs of one row (oi, col multiples of 8), each "full" /
    "last" input (of C type `types[j]`) read with vector8.cuh's `load8`, and `epi_vec_ok(E)`:
    whether those inputs are 16-byte aligned; loads apart from the math, so callers issue the
    loads of several rows or column groups before any math and store. An INT8 layer (int8_out.cuh's
    value8): `load_epilogue8(E, in, oi, col)` fills an `EpiIn8`, `apply_epilogue8(E, in, v)`
    computes. Other layers (the 16-bit sm90 epilogue, gemm_sm90_epilogue.cuh's finish_rows) split
    the loads by what they depend on, so a column input (a bias) is read once for several rows:
    `load_cols8(E, cols, col)` fills an `EpiCols8` with the "last" inputs, `load_rows8(E, rows,
    oi)` an `EpiRows8` with the "full" ones, `apply_epilogue8(E, cols, rows, v)` computes. EPI_VEC 1
    (0 when an input is read through a general broadcast). Each element's arithmetic is
    apply_epilogue's. With "full" inputs, EPI_PREFETCH 1 and `prefetch_rows(E, oi, n)`: their
    elements oi .. oi + n - 1 brought into L2 (vector8.cuh's prefetch_span)."""
    names = extra_inputs(layer)
    scalars = {name: f"ld(E.e{j}, 0)" for j, (name, c) in enumerate(zip(names, classes)) if c == "scalar"}
    vec = [(j, name, c) for j, (name, c) in enumerate(zip(names, classes)) if c != "scalar"]

    def record(struct: str, var: str, load: str, index: str, which: tuple[str, ...]) -> str:
        fields = "".join(f"  __align__(16) {types[j]} x{j}[8];\n" for j, _, c in vec if c in which)
        loads = "".join(f"  load8({var}.x{j}, E.e{j} + {_OFFSET[c]});\n" for j, _, c in vec if c in which)
        return (f"struct {struct} {{\n{fields}  int unused;\n}};\n"
                f"__device__ __forceinline__ void {load}(const EpiState& E, {struct}& {var}, {index}) {{\n{loads}}}\n")

    aligned = " && ".join(f"((u64)E.e{j} & 15) == 0" for j, _, _ in vec) or "true"
    head = '#define EPI_VEC 1\n#include "vector8.cuh"\n'
    tail = f"__device__ __forceinline__ bool epi_vec_ok(const EpiState& E) {{ return {aligned}; }}\n"
    full = [j for j, _, c in vec if c == "full"]
    if full:  # the inputs read at the output index (residuals): prefetch_rows(E, oi, n) brings n of them to L2
        spans = "".join(f"  prefetch_span(E.e{j} + oi, n * (i64)sizeof(*E.e{j}));\n" for j in full)
        tail += ("#define EPI_PREFETCH 1\n"
                 f"__device__ __forceinline__ void prefetch_rows(const EpiState& E, i64 oi, i64 n) {{\n{spans}}}\n")
    if is_int8_layer(layer):
        # e4m3 inputs decoded 8 at a time first (lowp.cuh's e4m3_decode8: the conversion unit on sm_89+), but
        # in the FP8 kernels that promote in pieces (F8_PIECES > 1: their registers, ptxas spilled more)
        e4m3 = {j for j, _, _ in vec if types[j] == "f8e4m3fn_t"}
        decode = "".join(f"  float d{j}[8];\n#if F8_PIECES > 1\n  for (int i = 0; i < 8; ++i) d{j}[i] = "
                         f"ld(in.x{j}, i);\n#else\n  e4m3_decode8(in.x{j}, d{j});\n#endif\n" for j in sorted(e4m3))
        body = decode + _body8(layer, {**scalars, **{name: f"d{j}[i]" if j in e4m3 else f"ld(in.x{j}, i)"
                                                     for j, name, _ in vec}})
        if all(types[j] in ("i8", "u8", "f8e4m3fn_t") for j, _, _ in vec):
            # every vector input is 8 bytes a group: the sm90 INT8 epilogue may transpose them as packed
            # bytes (gemm_sm90_epilogue.cuh, I8_NATIVE) and compute in the accumulators' layout
            fields = " ".join(f"F(x{j})" for j, _, _ in vec)
            head += f"#define EPI_BYTES8 1\n#define EPI_IN8_FIELDS(F) {fields}\n#define EPI_IN8_COUNT {len(vec)}\n"
        return (head + record("EpiIn8", "in", "load_epilogue8", "i64 oi, i64 col", ("full", "last"))
                + "__device__ __forceinline__ void apply_epilogue8(const EpiState& E, const EpiIn8& in, float (&v)[8]) {\n"
                + body + "}\n" + tail)
    body = _body8(layer, {**scalars, **{name: f"ld({'cols' if c == 'last' else 'rows'}.x{j}, i)" for j, name, c in vec}})
    return (head + record("EpiCols8", "cols", "load_cols8", "i64 col", ("last",))
            + record("EpiRows8", "rows", "load_rows8", "i64 oi", ("full",))
            + "__device__ __forceinline__ void apply_epilogue8(const EpiState& E, const EpiCols8& cols, "
            "const EpiRows8& rows, float (&v)[8]) {\n" + body + "}\n" + tail)


#: the outputs of an INT8 / FP8 layer stored in at most 16 bits
_NARROW_OUTPUTS = ("int8", "uint8", "float8_e4m3fn", "float16", "bfloat16")


def _narrow_quantized(layer: Any) -> bool:
    """Whether `layer` is an INT8 / FP8 layer (its epilogue computed in float) whose output is stored in at most 16
    bits: its GELU and sigmoid may take pointwise.cuh's 16-bit forms (PK_GELU16: within 1 fp16 ulp of the exact
    value, far inside an e4m3 / int8 step or a 16-bit rounding) instead of erff's and expf's. A float32 output keeps
    them. BERT's FFN1 in an FP8 plan is such a layer (Add of the bias, Gelu, then e4m3 for FFN2)."""
    outs = tuple(getattr(layer, "out_dtypes", ()) or ())
    return is_int8_layer(layer) and bool(outs) and outs[0] in _NARROW_OUTPUTS


def epilogue_prelude(layer: Any, elem: str) -> str:
    """C text that defines the epilogue a GEMM/conv kernel calls on each fp32 result:
    `apply_epilogue(E, v, oi, col)` (oi the output's flat index, col its index along the output's
    last axis), `EpiState`, `make_epi(EPI_ARGS)` and the EPI_* macros the kernels splice in.
    The kernel parameters are the same for every class; EpiState keeps only what the classes
    read (a pointer, the strides for "general"), so it stays small."""
    n = len(extra_inputs(layer))
    classes = input_classes(layer)
    types = [t if t in _OWN_TYPE.values() else "ELEM" for t in extra_types(layer, elem)]
    general = [j for j, c in enumerate(classes) if c == "general"]
    params = [p for j in range(n) for p in [f"const {types[j]}* e{j}"] + [f"i64 e{j}s{d}" for d in range(MAXR)]]
    if n:
        params += [f"i64 od{d}" for d in range(MAXR)] + ["i64 orank"]
    names = [p.split()[-1] for p in params]
    fields = "".join(f"  const {types[j]}* e{j};\n" for j in range(n))
    fields += "".join(f"  i64 s{j}[{MAXR}]; bool full{j};\n" for j in general)
    init = "".join(f"  E.e{j} = e{j};\n" for j in range(n))
    init += "".join(f"  E.s{j}[{d}] = e{j}s{d};" for j in general for d in range(MAXR))
    if general:
        fields += f"  i64 od[{MAXR}]; int rank;\n"
        init += "".join(f"  E.od[{d}] = od{d};" for d in range(MAXR)) + "\n  E.rank = (int)orank;\n"
        # an input with the output's own shape (a residual) is read at the output index itself
        init += f"  {{ i64 acc = 1; bool f[{n}];" + "".join(f" f[{j}] = true;" for j in general) + "\n"
        init += (f"    for (int d = {MAXR} - 1; d >= 0; --d) if (d < E.rank) {{"
                 + "".join(f" f[{j}] = f[{j}] && (E.s{j}[d] == acc || E.od[d] == 1);" for j in general)
                 + " acc *= E.od[d]; }\n")
        init += "   " + "".join(f" E.full{j} = f[{j}];" for j in general) + " }\n"
    offsets = "".join(
        f"  const i64 off{j} = {_OFFSET.get(c) or f'E.full{j} ? oi : strided_offset<{MAXR}>(oi, E.rank, E.od, E.s{j})'};\n"
        for j, c in enumerate(classes))
    # Known classes make a few integer ops: inline. A general broadcast keeps the strided
    # offset chain out of line (inlined into an unrolled store loop it made NVRTC very slow).
    inline = "__forceinline__" if not general else "__noinline__"
    code, result = _body_code(layer)
    vector = _vector_epilogue(layer, classes, types) if not general else "#define EPI_VEC 0\n"
    gelu16 = "#define PK_GELU16 1\n" if elem in _SIXTEEN_BIT or _narrow_quantized(layer) else ""
    return gelu16 + (
        f"#define ELEM {elem}\n#define HAS_EPILOGUE 1\n"
        f"#define EPI_PARAMS {''.join(', ' + p for p in params)}\n"
        f"#define EPI_ARGS {', '.join(names)}\n"
        f"#define EPI_COMMA_ARGS {''.join(', ' + n for n in names)}\n"
        '#include "pointwise.cuh"\n'
        f"struct EpiState {{\n{fields}  int unused;\n}};\n"
        f"__device__ __forceinline__ EpiState make_epi({', '.join(params)}) {{\n  EpiState E;\n{init}  return E;\n}}\n"
        f"__device__ {inline} float apply_epilogue(const EpiState& E, float v, i64 oi, i64 col) {{\n"
        f"{offsets}{code}\n  return (float)({result});\n}}\n"
    ) + vector


def store_defines(layer: Any) -> tuple[tuple[str, str], ...]:
    """The defines of how a layer stores its output: D2S_H, D2S_W for a ConvNHWC with
    depth_to_space [bH, bW] (conv_nhwc.cu, gemm_sm90_epilogue.cuh); none otherwise."""
    blocks = (getattr(layer, "attrs", None) or {}).get(DEPTH_TO_SPACE)
    return defines(D2S_H=int(blocks[0]), D2S_W=int(blocks[1])) if blocks is not None else ()


def kernel_source(layer: Any, kernel: str, file: str, elem: str) -> KernelSource:
    """The KernelSource of `kernel` (in `file`) for `layer`: plain, or with its epilogue built in
    (either with the layer's store_defines)."""
    if not has_epilogue(layer):
        return KernelSource(kernel, file=file, defines=defines(ELEM=elem) + store_defines(layer))
    return KernelSource(kernel, code=epilogue_prelude(layer, elem) + (CUDA_DIR / file).read_text(),
                        defines=store_defines(layer))


def epilogue_args(layer: Any, tensors: Mapping[str, DeviceTensor], elem_dtype: np.dtype) -> list[Any]:
    """Kernel arguments for the epilogue's extra inputs (empty without an epilogue)."""
    if not has_epilogue(layer):
        return []
    where = f"layer {layer.name!r}"
    out = tensors[layer.outputs[0]].shape
    if len(out) > MAXR:
        raise DeviceError(f"epilogue output of rank {len(out)} (the cuda epilogue takes at most {MAXR})", where=where)
    args: list[Any] = []
    own = {c: name for name, c in _OWN_TYPE.items()}
    declared = [_numpy_dtype(own[c]) if c in own else np.dtype(elem_dtype) for c in extra_types(layer, "")]
    for name, want in zip(extra_inputs(layer), declared):
        t = tensors[name]
        if np.dtype(t.dtype) != want:
            raise DeviceError(f"epilogue input {name!r} is {t.dtype}, the kernel was made for {want}",
                              where=where, hint="run this layer on --target cpu")
        shape = (1,) * (len(out) - len(t.shape)) + tuple(t.shape)
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(0 if d == 1 else acc)
            acc *= d
        strides = strides[::-1] + [0] * (MAXR - len(out))
        args += [t, *strides]
    if args:
        args += list(out) + [1] * (MAXR - len(out)) + [len(out)]
    return args


def _numpy_dtype(name: str) -> np.dtype:
    from polykit.compiler.ops.quant.int8 import FP8

    return FP8 if name == "float8_e4m3fn" else np.dtype(name)


def compile_variants() -> list[KernelSource]:
    """A representative epilogue (residual add + Relu) on every epilogue kernel: conv.cu with
    float storage, gemm.cu and conv_nhwc.cu with half storage (the dtype only changes ELEM,
    kept cheap for CI)."""
    from polykit.compiler.plan.records import LayerDesc

    body = [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
            {"op": "Relu", "inputs": ["s"], "outputs": ["y"], "attrs": {}}]
    out = []
    for kind, file, kernels, ins, elem in (
            ("Conv", "conv.cu", ("conv_igemm_simt", "conv_igemm_mma", "conv_direct"), ("x", "w", "", "skip"), "float"),
            ("ConvNHWC", "conv_nhwc.cu", ("conv_nhwc_igemm_simt", "conv_nhwc_igemm_mma"), ("x", "w", "", "skip"),
             "half_t"),
            ("Gemm", "gemm.cu", ("gemm_simt", "gemm_mma"), ("a", "b", "c", "skip"), "half_t")):
        layer = LayerDesc("epi", kind, ins, ("y",), {"epilogue": {"input": "raw", "body": body}}, domain="ai.polykit")
        out += [kernel_source(layer, k, file, elem) for k in kernels]
    return out
