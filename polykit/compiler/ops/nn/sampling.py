"""GridSample, AffineGrid, DeformConv -- importers and shape rules.

Canonical form: GridSample with opset-20 modes ("linear" / "nearest" / "cubic"); GridSample-16's
"bilinear" / "bicubic" (and its default "bilinear") are renamed on import. GridSample takes
N-D inputs as opset 20+ defines (polykit runs 2-D and 3-D; cubic is 2-D only, as the spec says).
DeformConv runs 2-D inputs (the only form ONNX's reference and onnxruntime implement).
"""

from __future__ import annotations

from dataclasses import dataclass

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule
from polykit.errors import NodeAttributeError

GRID_MODES = ("linear", "nearest", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")


@importer("GridSample", since=16)
def _grid_sample_v16(node: Node, ctx: ImportContext) -> None:
    if ctx.opset < 20:
        mode = node.attrs.get("mode", "bilinear")
        node.attrs["mode"] = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)


def grid_sample_attrs(attrs, rank: int | None, where: str) -> tuple[str, str, bool]:
    """(mode, padding_mode, align_corners), checked against the input's rank."""
    mode, padding = attrs.get("mode", "linear"), attrs.get("padding_mode", "zeros")
    if mode not in GRID_MODES:
        raise NodeAttributeError(f"mode {mode!r} is not one of {', '.join(GRID_MODES)}", where=where)
    if padding not in PADDING_MODES:
        raise NodeAttributeError(f"padding_mode {padding!r} is not one of {', '.join(PADDING_MODES)}", where=where)
    if rank is not None and rank not in (4, 5):
        raise NodeAttributeError(f"input of rank {rank}: polykit samples 2-D (rank 4) and 3-D (rank 5) inputs",
                                 where=where, hint="reshape the input to (N, C, H, W) or (N, C, D, H, W)")
    if mode == "cubic" and rank == 5:
        raise NodeAttributeError("cubic mode is defined for 2-D inputs only", where=where,
                                 hint="use mode 'linear' or 'nearest' for a 3-D input")
    return mode, padding, bool(attrs.get("align_corners", 0))


@shape_rule("GridSample")
def _grid_sample(ctx: InferContext):
    x, grid = ctx.shape(0), ctx.shape(1)
    grid_sample_attrs(ctx.node.attrs, None if x is None else len(x), ctx.node.describe())
    if x is None or grid is None:
        return [(ctx.dtype(0), None)]
    if len(grid) != len(x) or (isinstance(grid[-1], int) and grid[-1] != len(x) - 2):
        raise ctx.fail(f"grid of shape {grid} does not fit an input of rank {len(x)}",
                       hint="the grid is (N, D_out..., r) with r the input's spatial rank")
    return [(ctx.dtype(0), (x[0], x[1], *grid[1:-1]))]


@shape_rule("AffineGrid")
def _affine_grid(ctx: InferContext):
    theta, size = ctx.shape(0), ctx.const(1)
    if theta is not None and (len(theta) != 3 or theta[1:] not in ((2, 3), (3, 4))):
        raise ctx.fail(f"theta of shape {theta}: expected (N, 2, 3) or (N, 3, 4)")
    if size is None:
        r = None if theta is None else theta[1]
        return [(ctx.dtype(0), None if r is None else (None,) * (r + 1) + (r,))]
    size = [int(v) for v in size.reshape(-1)]
    if len(size) not in (4, 5) or (theta is not None and theta[1] != len(size) - 2):
        raise ctx.fail(f"size {size} does not fit theta {theta}", hint="size is (N, C, H, W) or (N, C, D, H, W)")
    return [(ctx.dtype(0), (size[0], *size[2:], len(size) - 2))]


@dataclass(frozen=True)
class DeformGeometry:
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]
    group: int
    offset_group: int

    def out_dim(self, i: int, axis: int) -> int:
        span = (self.kernel[axis] - 1) * self.dilations[axis] + 1
        return (i + self.pads[axis] + self.pads[axis + 2] - span) // self.strides[axis] + 1


def deform_geometry(attrs, w_shape, where: str) -> DeformGeometry:
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", w_shape[2:] if w_shape is not None else ()))
    if len(kernel) != 2:
        raise NodeAttributeError(f"kernel of {len(kernel)} spatial dims: polykit runs 2-D DeformConv", where=where,
                                 hint="the input is (N, C, H, W) and W is (M, C/group, kH, kW)")
    get = lambda key, default: tuple(int(v) for v in attrs.get(key, default))  # noqa: E731
    geo = DeformGeometry(kernel, get("strides", (1, 1)), get("dilations", (1, 1)), get("pads", (0, 0, 0, 0)),
                         int(attrs.get("group", 1)), int(attrs.get("offset_group", 1)))
    if len(geo.strides) != 2 or len(geo.dilations) != 2 or len(geo.pads) != 4 or geo.group < 1 or geo.offset_group < 1:
        raise NodeAttributeError("strides/dilations (2 values), pads (4 values), group and offset_group (>= 1) "
                                 "do not describe a 2-D DeformConv", where=where)
    return geo


@shape_rule("DeformConv")
def _deform_conv(ctx: InferContext):
    x, w = ctx.shape(0), ctx.shape(1)
    if x is not None and len(x) != 4:
        raise ctx.fail(f"input of rank {len(x)}: polykit runs 2-D DeformConv (N, C, H, W)")
    geo = deform_geometry(ctx.node.attrs, w, ctx.node.describe())
    if x is None or w is None:
        return [(ctx.dtype(0), None)]
    if isinstance(x[1], int) and isinstance(w[1], int) and (x[1] != w[1] * geo.group or x[1] % geo.offset_group):
        raise ctx.fail(f"{x[1]} input channels do not fit W {w} with group {geo.group} and offset_group "
                       f"{geo.offset_group}")
    out = tuple(geo.out_dim(d, a) if isinstance(d, int) else None for a, d in enumerate(x[2:]))
    return [(ctx.dtype(0), (x[0], w[0], *out))]
