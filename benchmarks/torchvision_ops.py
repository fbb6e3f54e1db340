"""torchvision's `nms` and `roi_align` as Python ops, for a torchvision whose C++ library does not
load (a wheel built for another torch): the detectors then run eagerly and export through
torchvision's own ONNX symbolics (NonMaxSuppression, RoiAlign) as with the library.

    from benchmarks.torchvision_ops import install; install()   # before building a detector
"""

from __future__ import annotations

import importlib

_LIBRARY = []  # the torch.library.Library that holds the ops (kept alive)


def _has_ops():  # torchvision.extension._has_ops, which TorchScript compiles when tracing batched_nms
    return True


def install() -> None:
    """Define torchvision::nms and torchvision::roi_align when the library did not (a no-op when it did)."""
    import torch
    import torchvision.extension as extension

    if extension._has_ops():
        return
    roi_module = importlib.import_module("torchvision.ops.roi_align")
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
               "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor")

    def nms(dets, scores, iou_threshold):
        """Greedy NMS: boxes by score (stable), each drops the later ones it overlaps above the threshold."""
        x1, y1, x2, y2 = dets.unbind(1)
        area = (x2 - x1) * (y2 - y1)
        keep, dropped = [], torch.zeros(len(dets), dtype=torch.bool)
        for i in torch.argsort(scores, descending=True, stable=True).tolist():
            if dropped[i]:
                continue
            keep.append(i)
            inter = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0) * \
                (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
            dropped |= inter / (area[i] + area - inter) > iou_threshold
        return torch.tensor(keep, dtype=torch.int64)

    def roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
        # torchvision's own Python transcription of its kernel, without the torch.compile wrapper
        return roi_module._roi_align.__wrapped__(input, rois, spatial_scale, pooled_height, pooled_width,
                                                 sampling_ratio, aligned)

    lib.impl("nms", nms, "CPU")
    lib.impl("roi_align", roi_align, "CPU")
    extension._has_ops = roi_module._has_ops = _has_ops
    _LIBRARY.append(lib)
