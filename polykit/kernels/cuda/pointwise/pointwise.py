"""The pointwise family: tactic `cuda.pointwise` runs a fused `Pointwise` layer, or one plain
elementwise op (every op of the elementwise op table, polykit.compiler.ops.elementwise_table), as the one
kernel module pointwise_codegen generates, picking the contiguous vector entry point when
every tensor allows it (for a layer with view operands, the view-vector one when the views allow
it: pointwise_views), else the strided broadcast one (launch_geometry).
"""

from __future__ import annotations

import functools
from typing import Mapping

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.launch_geometry import BLOCK, broadcast_geometry, grid_for, view_geometry
from polykit.kernels.cuda.pointwise.pointwise_concat import (ConcatTensor, logical_tensors, operand_counts, pointer_args,
                                                              table_args, vector_aligned)
from polykit.kernels.cuda.pointwise.pointwise_expr import cuda_emitter
from polykit.kernels.cuda.pointwise.pointwise_codegen import MAXR, VEC, _canonical, pointwise_base, pointwise_kernels
from polykit.kernels.cuda.pointwise.pointwise_signatures import candidate_signatures, layer_body, sig_name
from polykit.kernels.cuda.pointwise.pointwise_views import (ViewTensor, vector_view_flags, view_args, view_inputs, view_width,
                                                             with_views)
from polykit.kernels.cuda.storage_types import CTYPE, LOWP, ONNX_DTYPE
from polykit.compiler.ops.elementwise_table import elementwise_op, elementwise_ops

@functools.lru_cache(maxsize=4096)
def _entry(layer, sig, rows: bool = False) -> tuple[KernelSource, KernelSource | None, KernelSource | None]:
    """The (strided, vector, row) kernels of `layer` for dtype signature `sig`, from its row
    module with `rows` (row: None without, pointwise_codegen). A layer with view operands has no
    row kernel, and its vector kernel is the view-vector entry `_w` (pointwise_views; None for a
    signature without a vector width)."""
    sigs = candidate_signatures(layer)
    if sig not in sigs:
        raise DeviceError(f"no pointwise kernel was compiled for dtypes {sig[0]} -> {sig[1]}",
                          where=f"layer {layer.name!r}",
                          hint=f"compiled signatures: {sigs[:4]}...; run this layer with --target cpu")
    body, ins, outs = _canonical(*layer_body(layer))
    views = view_inputs(layer)
    name = sig_name(pointwise_base(body, ins, outs, rows and not views, operand_counts(layer), views), sig)
    kernels = {k.name: k for k in pointwise_kernels(layer, sigs, rows=rows)}
    return kernels[name + "_s"], kernels.get(name + ("_w" if views else "_v")), kernels.get(name + "_r")


def layer_tensors(layer, tensors: Mapping[str, DeviceTensor], rows: bool = False):
    """(inputs, outputs, (strided, vector, row) kernels) of a pointwise layer's launch."""
    body, ins, outs = layer_body(layer)
    x = with_views(layer, logical_tensors(layer, tensors), tensors)  # a concatenated operand: its sources
    # (pointwise_concat); a view operand: its source and view (pointwise_views)
    y = [tensors[n] for n in outs]
    sig = (tuple(t.dtype.name for t in x), tuple(t.dtype.name for t in y))
    for d in sig[0] + sig[1]:
        if d not in CTYPE:
            raise DeviceError(f"dtype {d} has no CUDA pointwise kernel", where=f"layer {layer.name!r}",
                              hint="use --target cpu")
    return x, y, _entry(layer, sig, rows)


def enqueue_pointwise(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, (k_s, k_v, _) = layer_tensors(layer, tensors)
    launch_strided_or_vector(layer, launcher, x, y, k_s, k_v)


def launch_strided_or_vector(layer, launcher: Launcher, x, y, k_s: KernelSource, k_v: KernelSource | None) -> None:
    """Launch the vector kernel where every tensor is full (or one value) and aligned, else the
    strided one. With a view operand `k_v` is the view-vector entry: it runs where
    vector_view_flags takes the launch, the strided entry elsewhere."""
    n = max(t.size for t in y) if y else 0
    if n == 0:
        return
    if any(isinstance(t, ViewTensor) for t in x):
        args, geometry = strided_view_args(layer, x, y)
        width = view_width([t.dtype.name for t in x + y])
        flags = vector_view_flags(x, y, *geometry, width) if k_v is not None else None
        if flags is None:
            launcher.launch(k_s, grid_for(n), (BLOCK, 1, 1), args)
        else:
            launcher.launch(k_v, grid_for(n, width), (BLOCK, 1, 1), args + flags)
        return
    full = all(t.size == n for t in y) and all(t.size in (1, n) and (t.shape == y[0].shape or t.size == 1) for t in x)
    full = full and all(t.size == n for t in x if isinstance(t, ConcatTensor))  # never one value
    aligned = all(vector_aligned(t, VEC) for t in x + y)
    tables = table_args(x)
    if full and n % VEC == 0 and aligned and all(t.shape == y[0].shape for t in y):
        args = [*pointer_args(x), *y, n, *[int(t.size == 1 and n != 1) for t in x], *tables]
        launcher.launch(k_v, grid_for(n, VEC), (BLOCK, 1, 1), args)
        return
    n, dims, strides, zm = broadcast_geometry([t.shape for t in x + y], len(y))
    if len(dims) > MAXR:
        raise DeviceError(f"broadcast over {len(dims)} non-mergeable dims exceeds {MAXR}",
                          where=f"layer {layer.name!r}", hint="use --target cpu")
    pad = [1] * (MAXR - len(dims))
    args = [*pointer_args(x), *y, n, len(dims), *dims, *pad]
    for st in strides:
        args += [*st, *([0] * (MAXR - len(st)))]
    args += zm + tables
    launcher.launch(k_s, grid_for(n), (BLOCK, 1, 1), args)


def strided_view_args(layer, x, y) -> tuple[list, tuple]:
    """The strided entry's arguments for a layer with view operands and the geometry they come
    from, (dims, strides, zero masks, per-view lists) (launch_geometry.view_geometry)."""
    views = {i: t.dims for i, t in enumerate(x) if isinstance(t, ViewTensor)}
    try:
        n, dims, strides, zm, extra = view_geometry([t.shape for t in x + y], len(y), views)
    except ValueError as exc:
        raise DeviceError(f"view operands: {exc}", where=f"layer {layer.name!r}", hint="use --target cpu") from None
    if len(dims) > MAXR:
        raise DeviceError(f"a view over {len(dims)} non-mergeable dims exceeds {MAXR}",
                          where=f"layer {layer.name!r}", hint="use --target cpu")
    pad = [1] * (MAXR - len(dims))
    args = [*[t.source if isinstance(t, ViewTensor) else t for t in x], *y, n, len(dims), *dims, *pad]
    for st in strides:
        args += [*st, *([0] * (MAXR - len(st)))]
    return args + zm + view_args(x, extra, MAXR), (dims, strides, zm, extra)


def _storable(layer) -> bool:
    """False when the builder stamped a dtype that has no CUDA storage type (strings): the
    build then reports the layer instead of the run failing at enqueue."""
    stamped = tuple(getattr(layer, "in_dtypes", ())) + tuple(getattr(layer, "out_dtypes", ()))
    return all(d in CTYPE for d in stamped if d)


def register_pointwise(name: str, enqueue, fits=lambda layer: True, priority: int = 0,
                       kernels=pointwise_kernels, falls_back: bool = False) -> None:
    """Declare tactic `name` (enqueue, kernels) for Pointwise layers and every plain elementwise op
    with a C expression, on layers with CUDA storage types that `fits` takes. `falls_back`: its
    enqueue runs the plain strided / vector entries where `fits` would refuse the shapes, so it
    serves (Tactic.serves: a dynamic plan's profile corners) every layer cuda.pointwise does."""
    def body_ok(layer) -> bool:
        return all(cuda_emitter(elementwise_op(op["op"])) is not None for op in layer.attrs.get("body", ())) \
            and _storable(layer)

    def plain_ok(layer) -> bool:
        return layer.domain in ("", "ai.onnx") and _storable(layer)

    cuda_tactic("Pointwise", name, kernels=kernels, priority=priority,
                supports=lambda layer: body_ok(layer) and fits(layer),
                serves=body_ok if falls_back else None)(enqueue)
    for op in elementwise_ops():
        if cuda_emitter(op) is None:
            continue
        cuda_tactic(op.name, name, kernels=kernels, priority=priority,
                    supports=lambda layer: plain_ok(layer) and fits(layer),
                    serves=plain_ok if falls_back else None)(enqueue)


register_pointwise("cuda.pointwise", enqueue_pointwise)


def _chain(name: str, steps, precision: str = "fp32"):
    """A Pointwise layer over inputs x0, x1, x2: each step (op, attrs) reads the previous
    step's output first, then x1, x2 up to its arity (extra steps: (op, attrs, inputs))."""
    from polykit.compiler.plan.records import LayerDesc

    body, last = [], "x0"
    for k, step in enumerate(steps):
        op, attrs = step[0], step[1]
        extra = step[2] if len(step) > 2 else ["x1", "x2"][:elementwise_op(op).arity - 1]
        body.append({"op": op, "inputs": [last, *extra], "outputs": [f"t{k}"], "attrs": dict(attrs)})
        last = f"t{k}"
    return LayerDesc(name, "Pointwise", ("x0", "x1", "x2"), (last,), {"body": body}, domain="ai.polykit",
                     precision=precision)


def variant_layers() -> list:
    """Representative layers, from the elementwise op table: every float op (each attribute
    variant, Cast's float targets) in one body, every integer op in one, every float predicate
    (each followed by a Where back to float, fp16 first) in one, every bool op in one."""
    rows = elementwise_ops()
    float_ops = [(r.name, v) for r in rows if "float" in r.kinds and r.result in ("first", "cast") for v in r.variants]
    float_ops.append(("Clip", {}, ["x1", ""]))  # an omitted optional input
    int_ops = [(r.name, v) for r in rows if "int" in r.kinds and r.result == "first" for v in r.variants]
    predicates = [s for r in rows if "float" in r.kinds and r.result == "bool" and "cond" not in r.roles
                  for v in r.variants for s in ((r.name, v), ("Where", {}))]
    logic = [(r.name, v) for r in rows if "bool" in r.kinds and r.result == "bool" for v in r.variants]
    return [_chain("float", float_ops), _chain("int", int_ops), _chain("predicates", predicates, "fp16"),
            _chain("logic", logic + [("Where", {}), ("Cast", {"to": 7})])]


def compile_variants() -> list[KernelSource]:
    """The modules of `variant_layers` and of the low-precision encodes and decodes."""
    return ([pointwise_kernels(lay)[0] for lay in (*variant_layers(), *lowp_variant_layers(), *concat_variant_layers(),
                                                   *view_variant_layers())]
            + [pointwise_kernels(lay, rows=True)[0] for lay in (*variant_layers(), *concat_variant_layers())])


def view_variant_layers() -> list:
    """Layers with view operands (pass absorb_views): Swin's residual Add over a window merge with
    a roll, and LLaMA's RoPE (x * cos + rotate_half(x) * sin) over a transposed query and its roll;
    every float signature. Their modules depend on which inputs are views, not on the views."""
    from polykit.compiler.plan.records import LayerDesc

    def merge(name: str, first: int, shift: int) -> dict:  # [1, 4, 4, 3] from windows [1, 2, 2, 2, 2, 3]
        return {"name": name, "input": first, "offset": 0,
                "dims": [{"shift": 0, "pieces": [[1, 0]]}, {"shift": shift, "pieces": [[2, 24], [2, 6]]},
                         {"shift": shift, "pieces": [[2, 12], [2, 3]]}, {"shift": 0, "pieces": [[3, 1]]}]}

    def heads(name: str, first: int, shift: int) -> dict:  # [1, 2, 4, 8] from [1, 4, 2, 8]
        return {"name": name, "input": first, "offset": 0,
                "dims": [{"shift": 0, "pieces": [[1, 0]]}, {"shift": 0, "pieces": [[2, 8]]},
                         {"shift": 0, "pieces": [[4, 16]]}, {"shift": shift, "pieces": [[8, 1]]}]}

    add = [{"op": "Add", "inputs": ["res", "m"], "outputs": ["y"], "attrs": {}}]
    rope = [{"op": "Mul", "inputs": ["q", "cos"], "outputs": ["t0"], "attrs": {}},
            {"op": "Mul", "inputs": ["rot", "sin"], "outputs": ["t1"], "attrs": {}},
            {"op": "Add", "inputs": ["t0", "t1"], "outputs": ["y"], "attrs": {}}]
    return [LayerDesc("view_merge", "Pointwise", ("res", "win"), ("y",), {"body": add, "view": [merge("m", 1, 1)]},
                      domain="ai.polykit", precision="fp16"),
            LayerDesc("view_rope", "Pointwise", ("x", "cos", "x", "sin"), ("y",),
                      {"body": rope, "view": [heads("q", 0, 0), heads("rot", 2, 4)]}, domain="ai.polykit")]


def concat_variant_layers() -> list:
    """Layers with concatenated operands (pass absorb_concat): DenseNet's BatchNorm + ReLU over
    the concatenation of three sources, and a body reading two operands (one source-heavy, one
    of two) besides a plain input; every float signature."""
    from polykit.compiler.plan.records import LayerDesc

    bn = [{"op": "Mul", "inputs": ["cat", "s"], "outputs": ["t0"], "attrs": {}},
          {"op": "Add", "inputs": ["t0", "b"], "outputs": ["t1"], "attrs": {}},
          {"op": "Relu", "inputs": ["t1"], "outputs": ["y"], "attrs": {}}]
    cat = [{"name": "cat", "axis": 3, "first": 2, "count": 3, "extents": [None, None, None]}]
    two = [{"op": "Add", "inputs": ["p", "x"], "outputs": ["t0"], "attrs": {}},
           {"op": "Mul", "inputs": ["t0", "q"], "outputs": ["y"], "attrs": {}}]
    cats = [{"name": "p", "axis": 1, "first": 0, "count": 5, "extents": [None] * 5},
            {"name": "q", "axis": 1, "first": 6, "count": 2, "extents": [None] * 2}]
    return [LayerDesc("concat_bn", "Pointwise", ("s", "b", "c0", "c1", "c2"), ("y",), {"body": bn, "concat": cat},
                      domain="ai.polykit", precision="fp16"),
            LayerDesc("concat_two", "Pointwise", ("p0", "p1", "p2", "p3", "p4", "x", "q0", "q1"), ("y",),
                      {"body": two, "concat": cats}, domain="ai.polykit")]


def lowp_variant_layers() -> list:
    """Stamped layers that instantiate every low-precision encode (from float32, float64 and
    int64 sources, saturate on and off, every e8m0 round mode) and every decode."""
    from polykit.compiler.plan.records import LayerDesc

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
