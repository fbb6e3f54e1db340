"""Pointwise code generator: a fused `Pointwise` body (or one plain elementwise op) -> ONE module.

The body (attrs["body"], ops in topological order, see docs/FUSION.md) becomes C statements
over the device functions of pointwise.cuh (pointwise_expr). The generated module holds, for
each dtype signature (pointwise_signatures: the one the builder stamped on a plan layer, else
every candidate signature), two entry points:

- `<base>__<sig>_s`: strided / broadcast path. One thread per output element (grid-stride),
  dims collapsed on the host, per-tensor element strides (0 on broadcast dims) as i64 args.
- `<base>__<sig>_v`: contiguous path, 4 elements per thread with aligned vector loads/stores;
  every input is either the full-size contiguous tensor or a scalar (loaded once).

Compute types: fp16/bf16 storage is computed in fp32, each op's result rounded to its ONNX type
(as the reference evaluates a body op by op); arithmetic keeps the type of its first operand
like ONNX. The low-precision storage types of lowp.cuh (float8, float4, int4/int2) load as
float / i32 and round only at the store; they only get signatures from stamped layers.
"""

from __future__ import annotations

import hashlib
import json

from polykit.kernels.cuda.base import KernelSource
from polykit.kernels.cuda.launch_geometry import BLOCK
from polykit.kernels.cuda.pointwise.pointwise_expr import emit_expression
from polykit.kernels.cuda.pointwise.pointwise_signatures import candidate_signatures, layer_body, sig_name
from polykit.kernels.cuda.storage_types import CTYPE

#: most dims of the strided path (after collapsing)
MAXR = 8
#: elements per thread of the vector path
VEC = 4


def _module_code(body, ins, outs, sigs, base) -> str:
    """The generated .cu text: a templated strided and vector kernel + extern "C" entries."""
    nin, nout = len(ins), len(outs)
    tin = [f"T{i}" for i in range(nin)]
    tout = [f"O{j}" for j in range(nout)]
    tparams = ", ".join(f"class {t}" for t in tin + tout)
    ptrs = [f"const {tin[i]}* __restrict__ x{i}" for i in range(nin)] + \
           [f"{tout[j]}* __restrict__ y{j}" for j in range(nout)]
    # strided path: loads at per-tensor offsets
    types = {n: tin[i] for i, n in enumerate(ins)}
    code_s, env_s = emit_expression(body, {n: f"ld(x{i}, o_x{i})" for i, n in enumerate(ins)}, types)
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
    code_v, env_v = emit_expression(body, {n: f"a{i}" for i, n in enumerate(ins)}, types)
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
