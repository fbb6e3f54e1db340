"""CenterCropPad and Col2Im tactics (image.cu).

CenterCropPad's window comes from the layer's static input and output shapes (the `shape`
input is not read); Col2Im reads its block shape on the device and takes the image size from
its output's shape.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ops.nn.image import crop_pad_axes, crop_pad_offsets
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, storage_code, stored_as
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for
from polykit.kernels.cuda.storage_types import CODE, dtype_names

FILE = "image.cu"
SIZES = (1, 2, 4, 8)
MAXR = 8
MAX_SPATIAL = 4
DTYPES = ("f32", "f16", "f64")


def _where(layer) -> str:
    return f"layer {layer.name!r}"


def _crop_pad_kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"crop_pad_{es}", FILE) for es in SIZES]


def enqueue_crop_pad(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    where = _where(layer)
    if x.dtype.itemsize not in SIZES or x.dtype == object:
        raise DeviceError(f"CenterCropPad of {x.dtype} has no kernel", where=where, hint="use --target cpu")
    if len(x.shape) > MAXR:
        raise DeviceError(f"CenterCropPad of a rank-{len(x.shape)} tensor (at most {MAXR})", where=where,
                          hint="use --target cpu")
    if y.size == 0:
        return
    axes = crop_pad_axes(layer.attrs, len(x.shape))
    _, offsets = crop_pad_offsets(x.shape, [y.shape[a] for a in axes], axes)
    pad = lambda v: list(v) + [1] * (MAXR - len(v))  # noqa: E731
    args = [x, y, y.size, np.int32(len(x.shape)), *pad(y.shape), *pad(x.shape), *offsets, *[0] * (MAXR - len(offsets))]
    launcher.launch(KernelSource(f"crop_pad_{x.dtype.itemsize}", FILE), grid_for(y.size), (BLOCK, 1, 1), args)


def _col2im_kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"col2im_{c}", FILE) for c in DTYPES]


def enqueue_col2im(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, block, y = tensors[layer.inputs[0]], tensors[layer.inputs[2]], tensors[layer.outputs[0]]
    where = _where(layer)
    code = storage_code(layer, x, CODE, DTYPES)
    if block.dtype != np.int64:
        raise DeviceError(f"Col2Im block_shape of dtype {block.dtype} (int64 expected)", where=where)
    image = list(y.shape[2:])
    nd = len(image)
    if nd > MAX_SPATIAL:
        raise DeviceError(f"Col2Im over {nd} spatial dims (at most {MAX_SPATIAL})", where=where, hint="use --target cpu")
    if y.size == 0:
        return
    attrs = layer.attrs
    pads = [int(p) for p in attrs.get("pads", [0] * 2 * nd)]
    four = lambda v, fill: list(v) + [fill] * (MAX_SPATIAL - len(v))  # noqa: E731
    args = [x, y, block, y.shape[0], y.shape[1], np.int32(nd), *four(image, 1),
            *four([int(d) for d in attrs.get("dilations", [1] * nd)], 1), *four(pads[:nd], 0), *four(pads[nd:], 0),
            *four([int(s) for s in attrs.get("strides", [1] * nd)], 1)]
    launcher.launch(KernelSource(f"col2im_{code}", FILE), grid_for(y.size), (BLOCK, 1, 1), args)


cuda_tactic("CenterCropPad", "cuda.image.crop_pad", kernels=_crop_pad_kernels)(enqueue_crop_pad)
cuda_tactic("Col2Im", "cuda.image.col2im", kernels=_col2im_kernels, supports=stored_as(*dtype_names(DTYPES)))(
    enqueue_col2im)


def compile_variants() -> list[KernelSource]:
    """The one image.cu module (every kernel is an entry point in it)."""
    return _crop_pad_kernels(None)
