"""RoiAlign and NonMaxSuppression tactics (detection.cu).

RoiAlign: one thread per output element. NonMaxSuppression: one block per (batch, class) ranks and
greedily selects on the device, a second launch writes the rows and their count to the layer's count
word (read back after the layer, polykit.runtime.output_alloc; without one, y's shape gives the rows).
float32 boxes, scores and features.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ops.nn.detection import roi_align_attrs
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, count_slot, cuda_tactic, stored_as
from polykit.kernels.cuda.models.sampling import BLOCK, check_f32, grid

FILE = "detection.cu"


def enqueue_roi_align(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, rois, idx, y = (tensors[n] for n in (*layer.inputs[:3], layer.outputs[0]))
    check_f32(layer, tensors, layer.inputs[:2])
    if np.dtype(idx.dtype) != np.int64:
        raise DeviceError(f"batch_indices is {idx.dtype}, int64 expected", where=f"layer {layer.name!r}")
    mode, half_pixel, oh, ow, ratio, scale = roi_align_attrs(layer.attrs, f"layer {layer.name!r}")
    if y.size:
        launcher.launch(KernelSource("roi_align", FILE), grid(y.size), (BLOCK,),
                        [x, rois, idx, y, y.shape[0], x.shape[1], x.shape[2], x.shape[3], oh, ow, ratio,
                         np.float32(scale), int(half_pixel), int(mode == "max")])


def _nms_sizes(layer, tensors: Mapping[str, Any]) -> tuple[int, int, int]:
    """(batches, classes, boxes) from the scores' shape."""
    b, c, n = tensors[layer.inputs[1]].shape
    return int(b), int(c), int(n)


def _nms_workspace(layer, tensors: Mapping[str, Any], sm_count: int) -> int:
    try:
        b, c, n = _nms_sizes(layer, tensors)
    except Exception:
        return 0
    return 2 * ((4 * b * c * n + 255) // 256 * 256) + 4 * b * c


def enqueue_nms(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    names = list(layer.inputs) + [""] * (5 - len(layer.inputs))
    boxes, scores, y = tensors[names[0]], tensors[names[1]], tensors[layer.outputs[0]]
    max_out, iou, score = (tensors[names[i]] if names[i] and tensors[names[i]].size else None for i in (2, 3, 4))
    check_f32(layer, tensors, [n for n in (names[0], names[1], names[3], names[4]) if n])
    if max_out is not None and np.dtype(max_out.dtype) != np.int64:
        raise DeviceError(f"max_output_boxes_per_class is {max_out.dtype}, int64 expected", where=f"layer {layer.name!r}")
    b, c, n = _nms_sizes(layer, tensors)
    total = tensors.get(count_slot(layer.name))
    rows = y.shape[0] if total is None else b * c * n  # with a count word y's shape is not bound yet
    if b * c * n == 0 or (total is None and y.size == 0):  # nothing kept (a count word stays 0)
        return
    order, sel, count = (launcher.workspace(k) for k in (4 * b * c * n, 4 * b * c * n, 4 * b * c))
    launcher.launch(KernelSource("nms_select", FILE), (b * c,), (BLOCK,),
                    [boxes, scores, max_out or 0, iou or 0, score or 0, order, sel, count, c, n,
                     int(layer.attrs.get("center_point_box", 0))])
    launcher.launch(KernelSource("nms_emit", FILE), grid(b * c), (BLOCK,), [sel, count, y, b * c, c, n, rows, total if total is not None else 0])


cuda_tactic("RoiAlign", "cuda.detection.roi_align", kernels=lambda layer: [KernelSource("roi_align", FILE)],
            supports=stored_as("float32"))(enqueue_roi_align)
cuda_tactic("NonMaxSuppression", "cuda.detection.nms",
            kernels=lambda layer: [KernelSource("nms_select", FILE), KernelSource("nms_emit", FILE)],
            supports=stored_as("float32"), workspace=_nms_workspace)(enqueue_nms)


def compile_variants() -> list[KernelSource]:
    return [KernelSource(k, FILE) for k in ("roi_align", "nms_select", "nms_emit")]
