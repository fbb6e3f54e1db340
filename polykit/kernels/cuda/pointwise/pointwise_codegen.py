"""Pointwise code generator: a fused `Pointwise` body (or one plain elementwise op) -> ONE module.

The body (attrs["body"], ops in topological order, see docs/FUSION.md) becomes C statements
over the device functions of pointwise.cuh (pointwise_expr). The generated module holds, for
each dtype signature (pointwise_signatures: the one the builder stamped on a plan layer, else
every candidate signature), two entry points:

- `<base>__<sig>_s`: strided / broadcast path. One thread per output element (grid-stride),
  dims collapsed on the host, per-tensor element strides (0 on broadcast dims) as i64 args.
- `<base>__<sig>_v`: contiguous path, 4 elements per thread with aligned vector loads/stores;
  every input is either the full-size contiguous tensor or a scalar (loaded once).
- `<base>__<sig>_r`: row-broadcast path (tactic cuda.pointwise.rows): the iteration space
  collapsed to [A, B, I] with contiguous outputs, each input contiguous or broadcast along I;
  8 elements a thread (16-byte loads of fp16) when every pointer and row stride allows it,
  else 1; offsets by multiply-add per row, no division per element. Emitted only for layers
  in a module of its own (entry names `<base>r__...`), compiled only for layers the rows tactic
  takes: it costs compile time, and a module that depended on the stamped shapes would differ
  between the corners of a dynamic profile.
- `<base>__<sig>_w`: view-vector path, only in the module of a layer with view operands (pass
  absorb_views; such a module has no `_v` or `_r`): the strided entry's arguments plus a flag per
  input, V consecutive elements of the innermost dim a thread (16 bytes of the widest storage
  type), offsets computed once per vector, vector loads and stores (pointwise_views).

Compute types: fp16/bf16 storage is computed in fp32, each op's result rounded to its ONNX type
(as the reference evaluates a body op by op); arithmetic keeps the type of its first operand
like ONNX. The low-precision storage types of lowp.cuh (float8, float4, int4/int2) load as
float / i32 and round only at the store; they only get signatures from stamped layers.
"""

from __future__ import annotations

import hashlib
import json
from typing import Mapping

from polykit.kernels.cuda.base import KernelSource
from polykit.kernels.cuda.launch_geometry import BLOCK
from polykit.kernels.cuda.pointwise.pointwise_concat import (cat_load, concat_helpers, input_params, operand_counts,
                                                              table_locals, table_params)
from polykit.kernels.cuda.pointwise.pointwise_expr import emit_expression
from polykit.kernels.cuda.pointwise.pointwise_signatures import candidate_signatures, layer_body, sig_name
from polykit.kernels.cuda.pointwise.pointwise_views import (narrow_div, view_inputs, view_locals, view_params, view_step,
                                                             view_width)
from polykit.kernels.cuda.pointwise.row_geometry import ROW_VEC
from polykit.kernels.cuda.storage_types import CTYPE

#: most dims of the strided path (after collapsing)
MAXR = 8
#: elements per thread of the vector path
VEC = 4


def _module_code(body, ins, outs, sigs, base, rows: bool, cats: Mapping[int, int] | None = None,
                 views: frozenset[int] = frozenset()) -> str:
    """The generated .cu text: a templated strided and vector kernel + extern "C" entries.
    `cats`: logical input -> its number of sources, for concatenated operands (pointwise_concat);
    `views`: the logical inputs read through views (pointwise_views: the strided and view-vector
    kernels only)."""
    cats = dict(cats or {})
    nin, nout = len(ins), len(outs)
    tin = [f"T{i}" for i in range(nin)]
    tout = [f"O{j}" for j in range(nout)]
    tparams = ", ".join(f"class {t}" for t in tin + tout)
    ptrs = [p for i in range(nin) for p in input_params(tin[i], i, cats.get(i), "__restrict__ ")] + \
           [f"{tout[j]}* __restrict__ y{j}" for j in range(nout)]
    tables = table_params(cats)
    # strided path: loads at per-tensor offsets
    types = {n: tin[i] for i, n in enumerate(ins)}
    code_s, env_s = emit_expression(body, {n: f"cat_at(cp{i}, ce{i}, E{i}, o_x{i})" if i in cats else f"ld(x{i}, o_x{i})"
                                           for i, n in enumerate(ins)}, types)
    geo = ["i64 n", "i64 rank"] + [f"i64 d{d}" for d in range(MAXR)] + \
          [f"i64 s{t}_{d}" for t in range(nin + nout) for d in range(MAXR)] + [f"i64 zm{j}" for j in range(nout)] + \
          view_params(views, MAXR)
    lines = ['#include "pointwise.cuh"', ""] + (concat_helpers() if cats else [])
    lines.append(f"template <{tparams}>")
    lines.append(f"__device__ __forceinline__ void {base}_s({', '.join(ptrs + geo + tables)}) {{")
    lines += table_locals(tin, cats, "  ")
    lines.append(f"  const i64 dims[{MAXR}] = {{{', '.join(f'd{d}' for d in range(MAXR))}}};")
    for t in range(nin + nout):
        lines.append(f"  const i64 st{t}[{MAXR}] = {{{', '.join(f's{t}_{d}' for d in range(MAXR))}}};")
    lines += view_locals(views, MAXR, "  ")
    lines.append("  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {")
    lines.append("    " + " ".join(f"i64 o{t} = 0;" for t in range(nin + nout)) + " bool skip[" + str(max(nout, 1)) + "] = {};")
    lines.append("    i64 r = i;")
    lines += _offsets(nin, nout, views, [f"        if (((zm{j} >> d) & 1) && c != 0) skip[{j}] = true;"
                                         for j in range(nout)])
    lines.append(code_s)
    for j, name in enumerate(outs):
        lines.append(f"    if (!skip[{j}]) st(y{j}, o{nin + j}, {env_s[name]});")
    lines.append("  }\n}\n")
    if views:  # a view operand is read by the strided path and the view-vector one (no `_v`, no `_r`)
        lines += _view_vector_kernel(body, ins, outs, types, tin, tout, tparams, ptrs, geo, base, views)
        wgeo = geo + [f"i64 vi{i}" for i in range(nin)]

        def view_entry(sig, targs, cptrs, names):
            width = view_width(sig[0] + sig[1])
            if not width:
                return None
            return (f'extern "C" __global__ void __launch_bounds__({BLOCK}) {sig_name(base, sig)}_w('
                    f'{", ".join(cptrs + wgeo)}) {{ {base}_w<{width}, {targs}>('
                    f'{", ".join(names + [p.split()[1] for p in wgeo])}); }}')
        return "\n".join(lines + _entries(sigs, base, nin, nout, cats, [("s", geo)], view_entry)) + "\n"
    # vector path: each input full-size contiguous (sc=0) or a scalar (sc=1); n % VEC == 0
    code_v, env_v = emit_expression(body, {n: f"a{i}" for i, n in enumerate(ins)}, types)
    vgeo = ["i64 n"] + [f"i64 sc{i}" for i in range(nin)]
    lines.append(f"template <{tparams}>")
    lines.append(f"__device__ __forceinline__ void {base}_v({', '.join(ptrs + vgeo + tables)}) {{")
    lines += table_locals(tin, cats, "  ")
    for i in range(nin):
        if i not in cats:  # a concatenated operand is never one value (the host takes this path only when it is full)
            lines.append(f"  const auto s{i} = ld(x{i}, 0);")
    lines.append(f"  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n / {VEC}; i += (i64)gridDim.x * blockDim.x) {{")
    for i in range(nin):
        if i in cats:
            lines.append(f"    const Vec<{tin[i]}, {VEC}> w{i} = {cat_load(i, str(VEC), f'i * {VEC}')};")
        else:
            lines.append(f"    Vec<{tin[i]}, {VEC}> w{i}; if (!sc{i}) w{i} = reinterpret_cast<const Vec<{tin[i]}, {VEC}>*>(x{i})[i];")
    lines += _lanes(code_v, env_v, outs, tout, str(VEC), "    ",
                    [f"ld(w{i}.v, k)" if i in cats else f"sc{i} ? s{i} : ld(w{i}.v, k)" for i in range(nin)])
    for j in range(nout):
        lines.append(f"    reinterpret_cast<Vec<{tout[j]}, {VEC}>*>(y{j})[i] = u{j};")
    lines.append("  }\n}\n")
    row_entry = None
    if rows:
        lines += _rows_kernel(body, ins, outs, types, tin, tout, tparams, ptrs, base, cats)
        rgeo = _rows_geometry_params(nin) + tables

        def row_entry(sig, targs, cptrs, names):
            rcall = ", ".join(names + [p.split()[1] for p in rgeo])
            return (f'extern "C" __global__ void __launch_bounds__({BLOCK}) {sig_name(base, sig)}_r('
                    f'{", ".join(cptrs + rgeo[:len(rgeo) - len(tables)] + ["i64 vec"] + tables)}) {{ '
                    f'if (vec) {base}_r<{ROW_VEC}, {targs}>({rcall}); '
                    f'else {base}_r<1, {targs}>({rcall}); }}')
    lines += _entries(sigs, base, nin, nout, cats, [("s", geo + tables), ("v", vgeo + tables)], row_entry)
    return "\n".join(lines) + "\n"


def _entries(sigs, base, nin, nout, cats, paths, more=None) -> list[str]:
    """The extern "C" entries of each signature: one per (path, geometry params), then what
    `more` gives for it (the row entry, the view-vector one; None: none)."""
    lines = []
    for sig in sigs:
        targs = ", ".join(CTYPE[d] for d in sig[0] + sig[1])
        cptrs = [p for i in range(nin) for p in input_params(CTYPE[sig[0][i]], i, cats.get(i))] + \
                [f"{CTYPE[sig[1][j]]}* y{j}" for j in range(nout)]
        names = [p.split()[-1] for p in cptrs]
        for path, g in paths:
            gnames = [p.split()[1] for p in g]
            lines.append(f'extern "C" __global__ void __launch_bounds__({BLOCK}) {sig_name(base, sig)}_{path}('
                         f'{", ".join(cptrs + g)}) {{ {base}_{path}<{targs}>({", ".join(names + gnames)}); }}')
        extra = more(sig, targs, cptrs, names) if more is not None else None
        if extra is not None:
            lines.append(extra)
    return lines


def _offsets(nin: int, nout: int, views: frozenset[int], per_dim: list[str], narrow: bool = False) -> list[str]:
    """The strided entries' offset loop: index r split over the collapsed dims (innermost last),
    each tensor's offset o<t> summed from the coordinates (a view operand's by its view step),
    then the logical inputs' offsets o_x<i>; `per_dim`: more statements per dim (over c);
    `narrow`: the divisions in 32 bits (the host keeps such launches under 2^31 elements)."""
    div = narrow_div("r", "dims[d]") if narrow else "r / dims[d]"
    lines = [f"#pragma unroll\n    for (int d = {MAXR} - 1; d >= 0; --d) {{",
             "      if (d < rank) {",
             f"        i64 q = rank == 1 ? 0 : {div}; i64 c = r - q * dims[d]; r = q;"]
    for t in range(nin + nout):
        lines.append(view_step(t, "        ", narrow) if t in views else f"        o{t} += c * st{t}[d];")
    lines += per_dim
    lines.append("      }\n    }")
    for i in range(nin):
        lines.append(f"    const i64 o_x{i} = o{i}{f' + vb{i}' if i in views else ''};")
    return lines


def _view_vector_kernel(body, ins, outs, types, tin, tout, tparams, ptrs, geo, base, views) -> list[str]:
    """The view-vector path `<base>_w<V>` of a module with view operands (pointwise_views): the
    strided entry's geometry, each thread V consecutive elements of the innermost dim (the host
    passes only launches where that dim is a multiple of V and every vector is contiguous and
    aligned, vector_view_flags); offsets once per vector at its first element (32-bit divisions:
    the host keeps it under 2^31 elements), then input i loads
    V elements (vi<i> = 1) or one value broadcast along the dim (vi<i> = 0), outputs store V."""
    nin, nout = len(ins), len(outs)
    code, env = emit_expression(body, {n: f"a{i}" for i, n in enumerate(ins)}, types)
    lines = [f"template <int V, {tparams}>",
             f"__device__ __forceinline__ void {base}_w({', '.join(ptrs + geo + [f'i64 vi{i}' for i in range(nin)])}) {{",
             f"  const i64 dims[{MAXR}] = {{{', '.join(f'd{d}' for d in range(MAXR))}}};"]
    for t in range(nin + nout):
        lines.append(f"  const i64 st{t}[{MAXR}] = {{{', '.join(f's{t}_{d}' for d in range(MAXR))}}};")
    lines += view_locals(views, MAXR, "  ")
    lines.append("  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n / V; i += (i64)gridDim.x * blockDim.x) {")
    lines.append("    " + " ".join(f"i64 o{t} = 0;" for t in range(nin + nout)))
    lines.append("    i64 r = i * V;")
    lines += _offsets(nin, nout, views, [], narrow=True)
    for i in range(nin):
        lines.append(f"    Vec<{tin[i]}, V> w{i};")
        lines += _load_or_broadcast(i, tin[i], f"vi{i}", f"x{i} + o_x{i}", f"x{i}[o_x{i}]", "    ")
    lines += _vector_lanes(code, env, nin, outs, tout, "    ", [f"y{j} + o{nin + j}" for j in range(nout)])
    lines.append("  }\n}\n")
    return lines


def _load_or_broadcast(i: int, ctype: str, flag: str, vec_at: str, one_at: str, pad: str) -> list[str]:
    """C statements: fill Vec w<i> (declared) with the V elements at pointer `vec_at` when `flag`,
    else with the one value `one_at` in every lane."""
    return [f"{pad}if ({flag}) w{i} = *reinterpret_cast<const Vec<{ctype}, V>*>({vec_at});",
            f"{pad}else {{ const {ctype} e{i} = {one_at};\n#pragma unroll\n"
            f"{pad}  for (int k = 0; k < V; ++k) w{i}.v[k] = e{i}; }}"]


def _vector_lanes(code, env, nin: int, outs, tout, pad: str, at: list[str]) -> list[str]:
    """The body on the V lanes of the loaded vectors w<i>, each output's V stored at pointer at[j]."""
    lines = _lanes(code, env, outs, tout, "V", pad, [f"ld(w{i}.v, k)" for i in range(nin)])
    return lines + [f"{pad}*reinterpret_cast<Vec<{t}, V>*>({p}) = u{j};" for j, (t, p) in enumerate(zip(tout, at))]


def _lanes(code, env, outs, tout, width: str, pad: str, loads) -> list[str]:
    """Declare the output vectors u<j> and evaluate the body on each of their `width` lanes k:
    input i is the C expression loads[i], each output stored into its lane."""
    lines = [f"{pad}Vec<{t}, {width}> u{j};" for j, t in enumerate(tout)]
    lines.append(f"#pragma unroll\n{pad}for (int k = 0; k < {width}; ++k) {{")
    lines += [f"{pad}  const auto a{i} = {e};" for i, e in enumerate(loads)]
    lines.append(code.replace("\n    ", f"\n{pad}  ").replace("    auto", f"{pad}  auto", 1))
    lines += [f"{pad}  st(u{j}.v, k, {env[name]});" for j, name in enumerate(outs)]
    lines.append(f"{pad}}}")
    return lines


def _rows_geometry_params(nin: int) -> list[str]:
    """The row kernel's geometry: [A, B, I] and, per input, its A and B strides and its inner
    stride (1: contiguous along I, 0: one value broadcast along I)."""
    return ["i64 A", "i64 B", "i64 I"] + [f"i64 {k}{i}" for i in range(nin) for k in ("sa", "sb", "si")]


def _rows_kernel(body, ins, outs, types, tin, tout, tparams, ptrs, base, cats) -> list[str]:
    """The row-broadcast path `<base>_r<V>`: the iteration space collapsed to [A, B, I] (outputs
    contiguous), thread (x, y) of block (bx, by, bz) owns V consecutive elements of I and rows
    b = by * blockDim.y + y (grid-stride), a = bz (grid-stride); every offset is a multiply-add per
    row, no division. An input contiguous along I loads V elements at once (the host passes V > 1
    only for aligned pointers and row strides), one broadcast along I loads one value a row."""
    nin, nout = len(ins), len(outs)
    code, env = emit_expression(body, {n: f"a{i}" for i, n in enumerate(ins)}, types)
    lines = [f"template <int V, {tparams}>",
             f"__device__ __forceinline__ void {base}_r({', '.join(ptrs + _rows_geometry_params(nin) + table_params(cats))}) {{",
             *table_locals(tin, cats, "  "),
             "  const i64 ci = (blockIdx.x * (i64)blockDim.x + threadIdx.x) * V;",
             "  if (ci >= I) return;",
             "  for (i64 ra = blockIdx.z; ra < A; ra += gridDim.z) {",
             "    for (i64 rb = blockIdx.y * (i64)blockDim.y + threadIdx.y; rb < B; rb += (i64)gridDim.y * blockDim.y) {",
             "      const i64 row = (ra * B + rb) * I + ci;"]
    for i in range(nin):
        if i in cats:  # offsets into the concatenation, loaded from its sources
            lines.append(f"      Vec<{tin[i]}, V> w{i}; const i64 p{i} = ra * sa{i} + rb * sb{i};")
            lines.append(f"      if (si{i}) w{i} = {cat_load(i, 'V', f'p{i} + ci')};")
            lines.append(f"      else {{ const {tin[i]} e{i} = {cat_load(i, '1', f'p{i}')}.v[0];\n#pragma unroll\n"
                         f"        for (int k = 0; k < V; ++k) w{i}.v[k] = e{i}; }}")
            continue
        lines.append(f"      Vec<{tin[i]}, V> w{i}; const {tin[i]}* p{i} = x{i} + ra * sa{i} + rb * sb{i};")
        lines += _load_or_broadcast(i, tin[i], f"si{i}", f"p{i} + ci", f"*p{i}", "      ")
    lines += _vector_lanes(code, env, nin, outs, tout, "      ", [f"y{j} + row" for j in range(nout)])
    lines.append("    }\n  }\n}\n")
    return lines


def _base_name(body, ins, outs, cats=None, views=frozenset()) -> str:
    parts = [body, list(ins), list(outs)] + ([sorted(cats.items())] if cats else []) + \
        ([{"views": sorted(views)}] if views else [])
    blob = json.dumps(parts, sort_keys=True, default=str)
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


def pointwise_base(body, ins, outs, rows: bool = False, cats=None, views=frozenset()) -> str:
    """The module's entry-name stem (the row module's ends in "r")."""
    return _base_name(body, ins, outs, cats, views) + ("r" if rows else "")


def pointwise_kernels(layer, sigs=None, *, rows: bool = False) -> list[KernelSource]:
    """Kernels (two per candidate signature, one module) for a Pointwise or plain elementwise
    layer; with `rows`, a module of its own (entries named `<base>r...`) that adds the row
    kernel (tactic cuda.pointwise.rows). A module never depends on the layer's shapes, so a
    layer with dynamic dims declares the same kernels at every profile corner."""
    body, ins, outs = _canonical(*layer_body(layer))
    sigs = candidate_signatures(layer) if sigs is None else sigs
    cats, views = operand_counts(layer), view_inputs(layer)
    rows = rows and not views  # a view operand is read by the strided and view-vector entries only
    base = pointwise_base(body, ins, outs, rows, cats, views)
    code = _module_code(body, ins, outs, sigs, base, rows, cats, views)
    if views:  # `_w` for the signatures that have a vector width
        return [KernelSource(f"{sig_name(base, s)}_{p}", code=code) for s in sigs
                for p in (("s", "w") if view_width(s[0] + s[1]) else ("s",))]
    paths = ("s", "v", "r") if rows else ("s", "v")
    return [KernelSource(f"{sig_name(base, s)}_{p}", code=code) for s in sigs for p in paths]
