"""RoiAlign and NonMaxSuppression -- importer and shape rules.

RoiAlign-10 had no coordinate_transformation_mode; it behaved as "output_half_pixel" (opset 16's
default is "half_pixel"), so the importer writes the old behaviour down for models below opset 16.

NonMaxSuppression's output count depends on the boxes' values: its shape rule gives a data-dependent
dim (polykit.compiler.ops.data_dims) bounded by batch x classes x min(boxes, max_output_boxes_per_class),
which the runtime binds after the layer runs; build-time evaluation fills it in when the inputs are
constants.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.data_dims import data_dim
from polykit.compiler.ops.tensor.shape_ops import const_ints
from polykit.compiler.ir.symbolic import MAX_VALUE, SymInt, extreme, term_of
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule
from polykit.errors import NodeAttributeError

ROI_MODES = ("avg", "max")
ROI_COORDINATES = ("half_pixel", "output_half_pixel")


@importer("RoiAlign", since=10)
def _roi_align_v10(node: Node, ctx: ImportContext) -> None:
    if ctx.opset < 16:
        node.attrs.setdefault("coordinate_transformation_mode", "output_half_pixel")


def roi_align_attrs(attrs, where: str) -> tuple[str, bool, int, int, int, float]:
    """(mode, half_pixel, output_height, output_width, sampling_ratio, spatial_scale)."""
    mode = attrs.get("mode", "avg")
    coords = attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode not in ROI_MODES:
        raise NodeAttributeError(f"mode {mode!r} is not avg or max", where=where)
    if coords not in ROI_COORDINATES:
        raise NodeAttributeError(f"coordinate_transformation_mode {coords!r} is not one of "
                                 f"{', '.join(ROI_COORDINATES)}", where=where)
    oh, ow = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    if oh < 1 or ow < 1:
        raise NodeAttributeError(f"output size {oh}x{ow} must be positive", where=where)
    return mode, coords == "half_pixel", oh, ow, int(attrs.get("sampling_ratio", 0)), \
        float(attrs.get("spatial_scale", 1.0))


@shape_rule("RoiAlign")
def _roi_align(ctx: InferContext):
    _, _, oh, ow, _, _ = roi_align_attrs(ctx.node.attrs, ctx.node.describe())
    x, rois, idx = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if x is not None and len(x) != 4:
        raise ctx.fail(f"input of rank {len(x)}, expected (N, C, H, W)")
    if rois is not None and (len(rois) != 2 or (isinstance(rois[1], int) and rois[1] != 4)):
        raise ctx.fail(f"rois of shape {rois}, expected (num_rois, 4)")
    count = rois[0] if rois is not None else (idx[0] if idx is not None else None)
    return [(ctx.dtype(0), (count, None if x is None else x[1], oh, ow))]


@shape_rule("NonMaxSuppression")
def _nms(ctx: InferContext):
    boxes, scores = ctx.shape(0), ctx.shape(1)
    if int(ctx.node.attrs.get("center_point_box", 0)) not in (0, 1):
        raise NodeAttributeError("center_point_box must be 0 or 1", where=ctx.node.describe())
    if boxes is not None and (len(boxes) != 3 or (isinstance(boxes[2], int) and boxes[2] != 4)):
        raise ctx.fail(f"boxes of shape {boxes}, expected (batch, boxes, 4)")
    if scores is not None and len(scores) != 3:
        raise ctx.fail(f"scores of shape {scores}, expected (batch, classes, boxes)")
    bound = None
    if boxes is not None and scores is not None and all(isinstance(d, int) for d in scores):
        per_class = scores[2]
        limit = const_ints(ctx, 2) if ctx.has(2) else [0]
        if limit is not None and len(limit) == 1 and not isinstance(limit[0], SymInt):
            most = max(int(limit[0]), 0)  # of a dynamic box count, min() stays an expression: a corner's bound agrees
            if isinstance(per_class, SymInt) and most < MAX_VALUE:  # a larger limit (torchvision's sys.maxsize)
                per_class = SymInt(min(int(per_class), most), extreme("min", term_of(per_class), most))  # limits none
            elif not isinstance(per_class, SymInt):
                per_class = min(per_class, most)
        bound = scores[0] * scores[1] * per_class
    return [(np.dtype(np.int64), (data_dim(ctx, "nms", bound, 0), 3))]
