"""Resize and Upsample -- importers to Resize's opset-19 form, and its shape rule.

Canonical form: Resize(X, roi, scales, sizes) with opset 19 attributes; omitted inputs are ""
(an empty constant roi/scales/sizes is turned into ""). Older forms are rewritten:
- Upsample-1 (height_scale/width_scale attrs), Upsample-7 (scales attr), Upsample-9 (scales
  input) and Resize-10 (X, scales) become Resize(X, "", scales) with asymmetric coordinates
  and the "floor" nearest rule (the ONNX Upsample/Resize-10 semantics); "bilinear" -> "linear".
- Resize-11 keeps its attributes; its mode "tf_half_pixel_for_nn" (removed in 13) stays and
  the reference kernel implements it.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Dim, Node
from polykit.compiler.ir.symbolic import Expr, SymInt, float32_fraction, float_type, term_of
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule
from polykit.errors import NodeAttributeError, ShapeError

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize", "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _legacy_resize(node: Node, ctx: ImportContext, scales: str) -> list[Node]:
    mode = str(node.attrs.get("mode", "nearest")).lower()
    mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
    if mode not in ("nearest", "linear"):
        raise NodeAttributeError(f"mode {mode!r} is not supported by {node.op_type}", where=node.describe(),
                                 hint="Upsample and Resize-10 take 'nearest' or 'linear'")
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    values = ctx.const(scales)
    if mode != "nearest" or values is None or not np.any(values < 1):
        return [Node("Resize", [node.inputs[0], "", scales], list(node.outputs), attrs, node.name, "")]
    # The legacy nearest rule rounds down when upsampling an axis and up when downsampling it
    # (onnxruntime's behaviour): resize the shrinking axes first with "ceil", then the others.
    values = np.asarray(values, dtype=np.float32).ravel()
    down = [i for i, s in enumerate(values) if s < 1]
    up = [i for i, s in enumerate(values) if s >= 1]
    mid = ctx.graph.fresh_name(f"{node.outputs[0]}_downsampled")
    first = Node("Resize", [node.inputs[0], "", ctx.add_constant(values[down], "resize_scales")], [mid],
                 {**attrs, "nearest_mode": "ceil", "axes": down}, node.name, "")
    second = Node("Resize", [mid, "", ctx.add_constant(values[up], "resize_scales")], list(node.outputs),
                  {**attrs, "axes": up}, ctx.graph.fresh_name(node.name or "resize"), "")
    return [first, second]


@importer("Upsample", since=1)
def _upsample_v1(node: Node, ctx: ImportContext) -> list[Node]:
    scales = [1.0, 1.0, float(node.attrs.get("height_scale", 1.0)), float(node.attrs.get("width_scale", 1.0))]
    return _legacy_resize(node, ctx, ctx.add_constant(np.array(scales, np.float32), "upsample_scales"))


@importer("Upsample", since=7)
def _upsample_v7(node: Node, ctx: ImportContext) -> list[Node]:
    if "scales" not in node.attrs:
        raise NodeAttributeError("required attribute 'scales' is missing", where=node.describe())
    scales = ctx.add_constant(np.array(node.attrs["scales"], np.float32), "upsample_scales")
    return _legacy_resize(node, ctx, scales)


@importer("Upsample", since=9)
@importer("Resize", since=10)
def _scales_input(node: Node, ctx: ImportContext) -> list[Node]:
    return _legacy_resize(node, ctx, node.input(1))


@importer("Resize", since=11)
def _resize_v11(node: Node, ctx: ImportContext) -> None:
    for i in (1, 2, 3):
        value = ctx.const(node.input(i))
        if value is not None and value.size == 0:
            node.inputs[i] = ""
    while node.inputs and node.inputs[-1] == "":
        node.inputs.pop()


def resize_axes(attrs, rank: int, where: str) -> list[int]:
    """The axes Resize scales (attribute `axes`, negatives normalized), all axes by default."""
    axes = attrs.get("axes")
    if not axes:
        return list(range(rank))
    out = []
    for a in axes:
        if not -rank <= int(a) < rank:
            raise NodeAttributeError(f"axis {a} is out of range for rank {rank}", where=where)
        out.append(int(a) % rank)
    if len(set(out)) != len(out):
        raise NodeAttributeError(f"axes {list(axes)} repeat an axis", where=where)
    return out


def check_resize_attrs(attrs, where: str) -> None:
    for key, allowed, default in (("mode", MODES, "nearest"),
                                  ("coordinate_transformation_mode", COORDINATE_MODES, "half_pixel"),
                                  ("nearest_mode", NEAREST_MODES, "round_prefer_floor"),
                                  ("keep_aspect_ratio_policy", ASPECT_POLICIES, "stretch")):
        value = attrs.get(key, default)
        if value not in allowed:
            raise NodeAttributeError(f"{key} {value!r} is not one of {', '.join(allowed)}", where=where)


def output_sizes(in_dims: list[Dim], scales: np.ndarray | None, sizes: np.ndarray | None, policy: str,
                 where: str = "") -> tuple[list[Dim], list[float | None]]:
    """Output dims and per-axis scale factors of the resized axes (in `axes` order). A dynamic dim
    (SymInt) gives an expression: floor(in * scale) for scales, the size's own expression for
    sizes (a Shape chain's); ShapeError (at `where`) for what no expression holds."""
    if sizes is not None:
        sizes = [s if isinstance(s, SymInt) else int(s) for s in sizes]
        ratios = [s / d if isinstance(d, int) and d else None for s, d in zip(sizes, in_dims)]
        if policy == "stretch":
            return list(sizes), ratios
        if any(r is None for r in ratios):
            return [None] * len(sizes), [None] * len(sizes)
        if any(isinstance(v, SymInt) for v in [*sizes, *in_dims]):
            raise ShapeError(f"keep_aspect_ratio_policy {policy!r} over dynamic dims picks its axis by comparing "
                             f"sizes/dims at each shape, which no dim expression holds", where=where,
                             hint="use the 'stretch' policy with sizes computed for the aspect ratio, or pin the dims")
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        return [int(scale * d + 0.5) for d in in_dims], [scale] * len(sizes)
    assert scales is not None
    factors32 = np.asarray(scales, dtype=np.float32).ravel()
    # a float the graph computes from the dims carries its float expression (a ruled value's RuledFloat a symbol)
    computed = [e if float_type(e) else None for e in (getattr(f, "expr", None) for f in np.asarray(scales, dtype=object).ravel())]
    dims = [_by_computed(d, f, e) if e is not None else _scaled(d, f, where) if isinstance(d, int) else
            (d if f == 1 else None) for d, f, e in zip(in_dims, factors32, computed)]
    return dims, [float(f) for f in factors32]


def _by_computed(d: Dim, f: np.float32, scale: Expr) -> "int | None":
    """A dim resized by a scale the graph computes from the dims (a float32 dim expression of
    polykit.compiler.graph.dim_floats): trunc(scale * float32(d)), as onnxruntime sizes its output;
    None (no expression) for a dim without an int value or a scale of another float type."""
    if not isinstance(d, int) or float_type(scale) != "f32":
        return None
    return SymInt(int(f * np.float32(int(d))), Expr("trunc", (Expr("f*", (scale, Expr("f32", (term_of(d),)))),)))


def _scaled(d: int, f: np.float32, where: str) -> int:
    """floor(d * f) in float32, as onnxruntime computes it (10 * 0.7f is 7, not 6.99...); for a
    SymInt d, (d * p) // q with p/q the simplest fraction that rounds to f (for 0.7f: 7/10, so
    the expression agrees with the float32 product wherever d * q stays far below 2**23)."""
    value = int(np.floor(np.float32(int(d)) * f))
    if not isinstance(d, SymInt) or f == 1:
        return d if f == 1 else value
    ratio = float32_fraction(f)
    dim = d * ratio.numerator // ratio.denominator
    if int(dim) != value:
        raise ShapeError(f"scale {float(f)!r} of dynamic dim {d.expr} gives {value} in float32 but "
                         f"{ratio.numerator}/{ratio.denominator} of it gives {int(dim)}", where=where,
                         hint="use a scale that is a small fraction (2, 0.5, 1.5, ...) or pin the dim")
    return dim


@shape_rule("Resize")
def _resize(ctx: InferContext):
    x = ctx.shape(0)
    check_resize_attrs(ctx.node.attrs, ctx.node.describe())
    if x is None:
        return [(ctx.dtype(0), None)]
    axes = resize_axes(ctx.node.attrs, len(x), ctx.node.describe())
    scales = ctx.const(2) if ctx.has(2) else None
    sizes = ctx.const(3) if ctx.has(3) else None
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    if scales is not None and sizes is not None:
        raise ctx.fail("Resize got both 'scales' and 'sizes'", hint="give one of them; leave the other \"\"")
    for name, value in (("scales", scales), ("sizes", sizes)):
        if value is not None and value.size != len(axes):
            raise ctx.fail(f"{name} has {value.size} values for {len(axes)} resized axes",
                           hint="give one value per input axis (or per entry of the axes attribute)")
    if scales is not None and np.any(np.asarray(scales) <= 0):
        raise ctx.fail(f"scales {np.asarray(scales).tolist()} must be positive")
    out = list(x)
    if scales is None and sizes is None:
        known_missing = not (ctx.has(2) or ctx.has(3))
        if known_missing:
            raise ctx.fail("Resize needs a 'scales' or a 'sizes' input")
        for a in axes:
            out[a] = None
        return [(ctx.dtype(0), tuple(out))]
    dims, _ = output_sizes([x[a] for a in axes], scales, sizes,
                           ctx.node.attrs.get("keep_aspect_ratio_policy", "stretch"), ctx.node.describe())
    for a, d in zip(axes, dims):
        out[a] = d
    return [(ctx.dtype(0), tuple(out))]
