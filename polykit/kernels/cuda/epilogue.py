"""Epilogues of the GEMM and conv kernels: the elementwise chain fused after Conv/Gemm/MatMul
(docs/FUSION.md, "Epilogue form") compiled INTO the producing kernel.

The body becomes C through the pointwise generator (`pointwise.emit_expression`); the
generated module is the family's .cu text preceded by HAS_EPILOGUE 1, the extra kernel
parameters (each extra input's pointer and its element strides over the output's dims, 0
on broadcast dims; up to MAXR output dims) and `apply_epilogue(E, v, out_index)`, which
the kernels call on each fp32 result before the store. Extra inputs must have the output's
storage dtype (float32 or float16).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ops.fused import EPILOGUE_ARITY
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import CUDA_DIR, DeviceTensor, KernelSource, defines

MAXR = 6


def has_epilogue(layer: Any) -> bool:
    return bool(layer.attrs.get("epilogue"))


def extra_inputs(layer: Any) -> list[str]:
    return [n for n in layer.inputs[EPILOGUE_ARITY[layer.kind]:]]


def _body_code(layer: Any) -> tuple[str, str]:
    from polykit.kernels.cuda.pointwise import emit_expression

    epi = layer.attrs["epilogue"]
    values = {epi["input"]: "v"}
    for j, name in enumerate(extra_inputs(layer)):
        values[name] = f"ld(E.e{j}, off{j})"
    code, env = emit_expression(epi["body"], values, prefix="t")
    return code, env[layer.outputs[0]]


def supports_epilogue(layer: Any) -> bool:
    """Whether the layer has no epilogue, or one this generator can compile."""
    if not has_epilogue(layer):
        return True
    try:
        _body_code(layer)
    except Exception:
        return False
    return all(extra_inputs(layer))


def epilogue_prelude(layer: Any, elem: str) -> str:
    n = len(extra_inputs(layer))
    params = [p for j in range(n) for p in [f"const ELEM* e{j}"] + [f"i64 e{j}s{d}" for d in range(MAXR)]]
    if n:
        params += [f"i64 od{d}" for d in range(MAXR)] + ["i64 orank"]
    names = [p.split()[-1] for p in params]
    fields = "".join(f"  const ELEM* e{j}; i64 s{j}[{MAXR}]; bool full{j};\n" for j in range(n))
    init = "".join(f"  E.e{j} = e{j};" + "".join(f" E.s{j}[{d}] = e{j}s{d};" for d in range(MAXR)) + "\n"
                   for j in range(n))
    if n:
        init += "".join(f"  E.od[{d}] = od{d};" for d in range(MAXR)) + "\n  E.rank = (int)orank;\n"
        # an input with the output's own shape (a residual) is read at the output index itself
        init += f"  {{ i64 acc = 1; bool f[{n}];" + "".join(f" f[{j}] = true;" for j in range(n)) + "\n"
        init += (f"    for (int d = {MAXR} - 1; d >= 0; --d) if (d < E.rank) {{"
                 + "".join(f" f[{j}] = f[{j}] && (E.s{j}[d] == acc || E.od[d] == 1);" for j in range(n))
                 + " acc *= E.od[d]; }\n")
        init += "   " + "".join(f" E.full{j} = f[{j}];" for j in range(n)) + " }\n"
    offsets = "".join(f"  const i64 off{j} = E.full{j} ? oi : strided_offset<{MAXR}>(oi, E.rank, E.od, E.s{j});\n"
                      for j in range(n))
    code, result = _body_code(layer)
    return (
        f"#define ELEM {elem}\n#define HAS_EPILOGUE 1\n"
        f"#define EPI_PARAMS {''.join(', ' + p for p in params)}\n"
        f"#define EPI_ARGS {', '.join(names)}\n"
        f"#define EPI_COMMA_ARGS {''.join(', ' + n for n in names)}\n"
        '#include "pointwise.cuh"\n'
        f"struct EpiState {{\n{fields}  i64 od[{MAXR}]; int rank;\n}};\n"
        f"__device__ __forceinline__ EpiState make_epi({', '.join(params)}) {{\n  EpiState E;\n{init}  return E;\n}}\n"
        "__device__ __noinline__ float apply_epilogue(const EpiState& E, float v, i64 oi) {\n"
        f"{offsets}{code}\n  return (float)({result});\n}}\n"
    )


def kernel_source(layer: Any, kernel: str, file: str, elem: str) -> KernelSource:
    """The KernelSource of `kernel` (in `file`) for `layer`: plain, or with its epilogue built in."""
    if not has_epilogue(layer):
        return KernelSource(kernel, file=file, defines=defines(ELEM=elem))
    return KernelSource(kernel, code=epilogue_prelude(layer, elem) + (CUDA_DIR / file).read_text())


def epilogue_args(layer: Any, tensors: Mapping[str, DeviceTensor], elem_dtype: np.dtype) -> list[Any]:
    """Kernel arguments for the epilogue's extra inputs (empty without an epilogue)."""
    if not has_epilogue(layer):
        return []
    where = f"layer {layer.name!r}"
    out = tensors[layer.outputs[0]].shape
    if len(out) > MAXR:
        raise DeviceError(f"epilogue output of rank {len(out)} (the cuda epilogue takes at most {MAXR})", where=where)
    args: list[Any] = []
    for name in extra_inputs(layer):
        t = tensors[name]
        if np.dtype(t.dtype) != np.dtype(elem_dtype):
            raise DeviceError(f"epilogue input {name!r} is {t.dtype}, the layer computes in {elem_dtype}",
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


def compile_variants() -> list[KernelSource]:
    """A representative epilogue (residual add + Relu) on every epilogue kernel: conv.cu with
    float storage, gemm.cu and conv_nhwc.cu with half storage (the dtype only changes ELEM,
    kept cheap for CI)."""
    from polykit.compiler.plan_records import LayerDesc

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
