"""Reformat tactics (reformat.cu): NCHW <-> NHWC transposes of few-channel tensors and the
constant padding of the last axis, the layers at the entry of a channels-last chain (the
model's image input: Transpose 0231, then Pad of the channels to a multiple of 8).

  cuda.movement.to_nhwc    Transpose perm (0, 2, 3, 1) of a rank-4 tensor with C <= MAX_C
  cuda.movement.from_nhwc  Transpose perm (0, 3, 1, 2) of a rank-4 tensor with C <= MAX_C
  cuda.movement.pad_last   constant Pad (no `axes` input) that grows only the last axis; a thread
                           writes 4-16 bytes of an output row when the row and pointer allow
The generic movement kernels (movement.py) run every other case; these outrank them.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for

FILE = "reformat.cu"
SIZES = (1, 2, 4, 8)
#: most channels the per-pixel loops take (more: the tiled transpose moves them better)
MAX_C = 64
PERMS = {"to_nhwc": [0, 2, 3, 1], "from_nhwc": [0, 3, 1, 2]}


def _kernels(prefix: str):
    return lambda layer: [KernelSource(f"{prefix}_{es}", FILE) for es in SIZES]


def _fits(shape) -> bool:
    return 0 < int(np.prod(shape, dtype=np.int64)) < 2**31


def _transposes(prefix: str):
    def supports(layer: Any) -> bool:
        shapes = getattr(layer, "in_shapes", ())
        if not shapes or len(shapes[0]) != 4 or [int(p) for p in layer.attrs.get("perm", [])] != PERMS[prefix]:
            return False
        c = shapes[0][1] if prefix == "to_nhwc" else shapes[0][3]
        return c <= MAX_C and _fits(shapes[0]) and np.dtype(layer.in_dtypes[0]).itemsize in SIZES

    return supports


def _enqueue_transpose(prefix: str):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
        n, c, p = (x.shape[0], x.shape[1], x.shape[2] * x.shape[3]) if prefix == "to_nhwc" else \
            (x.shape[0], x.shape[3], x.shape[1] * x.shape[2])
        launcher.launch(KernelSource(f"{prefix}_{x.dtype.itemsize}", FILE), grid_for(n * p), (BLOCK,),
                        [x, y, np.int32(n), np.int32(c), np.int32(p)])

    return enqueue


def _pads_last_only(layer: Any) -> bool:
    shapes, outs = getattr(layer, "in_shapes", ()), getattr(layer, "out_shapes", ())
    if not shapes or not outs or layer.attrs.get("mode", "constant") != "constant":
        return False
    if len(layer.inputs) > 3 and layer.inputs[3]:  # an `axes` input: leave it to the generic kernel
        return False
    x, y = tuple(shapes[0]), tuple(outs[0])
    return (len(x) == len(y) >= 1 and x[:-1] == y[:-1] and y[-1] >= x[-1] > 0 and _fits(y)
            and np.dtype(layer.in_dtypes[0]).itemsize in SIZES)


def chunk_bytes(itemsize: int, cout: int, y_ptr: int) -> int:
    """pad_chunks' bytes a thread (16, 8 or 4): more than one element, a divisor of the output row,
    y aligned to it; 0 when none fits (pad_last's element loop then)."""
    for w in (16, 8, 4):
        if w > itemsize and cout % (w // itemsize) == 0 and y_ptr % w == 0:
            return w
    return 0


def enqueue_pad_last(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    if tuple(x.shape[:-1]) != tuple(y.shape[:-1]):  # the builder checked its profile's shapes, not every run's
        raise DeviceError(f"cuda.movement.pad_last pads only the last axis, but this run pads {tuple(x.shape)} to "
                          f"{tuple(y.shape)}", where=f"layer {layer.name!r}",
                          hint="rebuild the plan (its builder's witness points choose cuda.movement.pad), "
                               "or use --target cpu")
    pads = tensors[layer.inputs[1]]
    cval = tensors.get(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] else None
    es, cout = x.dtype.itemsize, y.shape[-1]
    rows = y.size // cout
    args = [x, y, cval if cval is not None and cval.size else 0, np.int32(rows), np.int32(x.shape[-1]),
            np.int32(cout), pads, np.int32(len(x.shape)), np.int32(int(pads.dtype.itemsize == 8))]
    w = chunk_bytes(es, cout, y.ptr)
    if w:
        launcher.launch(KernelSource(f"pad_chunks_{es}", FILE), grid_for(y.size * es // w), (BLOCK,), [*args, np.int32(w)])
    else:
        launcher.launch(KernelSource(f"pad_last_{es}", FILE), grid_for(rows), (BLOCK,), args)


def compile_variants() -> list[KernelSource]:
    return [KernelSource("to_nhwc_2", FILE)]  # one module: every entry point and element size


for _prefix in PERMS:
    cuda_tactic("Transpose", f"cuda.movement.{_prefix}", kernels=_kernels(_prefix), supports=_transposes(_prefix),
                priority=5, params={"max_channels": MAX_C})(_enqueue_transpose(_prefix))
cuda_tactic("Pad", "cuda.movement.pad_last", kernels=_kernels("pad_last"), supports=_pads_last_only,
            priority=5)(enqueue_pad_last)
