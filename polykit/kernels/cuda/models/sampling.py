"""GridSample, AffineGrid and DeformConv tactics (sampling.cu; DeformConv's product on gemm.cu).

GridSample and AffineGrid are one thread per output element. DeformConv runs as TensorRT's and
torchvision's do: a deformable im2col (bilinear samples at the offset taps, times the mask) into a
workspace of (N, C*kH*kW, oH*oW) columns, one batched gemm_simt launch over (batch, group) that
multiplies each group's weights by its rows (the output layout falls out of the batch order), and
a bias pass. float32 only (what the ONNX tests and detection models use).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ops.nn.sampling import deform_geometry, grid_sample_attrs
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, stored_as
from polykit.kernels.cuda.gemm.gemm import TILES, gemm_args, launch_tiled, split_k
from polykit.kernels.cuda.models.recurrent import GEMM, GEMM_REDUCE

FILE = "sampling.cu"
MODES = {"nearest": 0, "linear": 1, "cubic": 2}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
BLOCK, MAX_BLOCKS = 256, 65535


def grid(n: int) -> tuple[int]:
    """Blocks of a grid-stride launch over n elements."""
    return (max(1, min(-(-n // BLOCK), MAX_BLOCKS)),)


def check_f32(layer, tensors: Mapping[str, DeviceTensor], names) -> None:
    for name in names:
        if name and np.dtype(tensors[name].dtype) != np.float32:
            raise DeviceError(f"{layer.kind} input {name!r} is {tensors[name].dtype}; the cuda kernel takes float32",
                              where=f"layer {layer.name!r}", hint="run this layer on --target cpu")


def enqueue_grid_sample(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, g, y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    check_f32(layer, tensors, layer.inputs[:2])
    mode, padding, align = grid_sample_attrs(layer.attrs, len(x.shape), f"layer {layer.name!r}")
    r = len(x.shape) - 2
    d, h, w = (1, *x.shape[2:]) if r == 2 else x.shape[2:]
    od, oh, ow = (1, *y.shape[2:]) if r == 2 else y.shape[2:]
    if y.size:
        launcher.launch(KernelSource("grid_sample", FILE), grid(y.size), (BLOCK,),
                        [x, g, y, x.shape[0], x.shape[1], d, h, w, od, oh, ow, r, MODES[mode], PADDINGS[padding],
                         int(align)])


def enqueue_affine_grid(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    theta, out = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    check_f32(layer, tensors, layer.inputs[:1])
    r = out.shape[-1]
    d, h, w = (1, *out.shape[1:3]) if r == 2 else out.shape[1:4]
    if out.size:
        launcher.launch(KernelSource("affine_grid", FILE), grid(out.size // r), (BLOCK,),
                        [theta, out, out.shape[0], d, h, w, r, int(bool(layer.attrs.get("align_corners", 0)))])


def _deform_problem(layer, shapes: Mapping[str, tuple[int, ...]]):
    geo = deform_geometry(layer.attrs, shapes[layer.inputs[1]], f"layer {layer.name!r}")
    n, c, h, w = shapes[layer.inputs[0]]
    m = shapes[layer.inputs[1]][0]
    oh, ow = shapes[layer.outputs[0]][2:]
    return geo, n, c, h, w, m, oh, ow


def _deform_workspace(layer, tensors: Mapping[str, Any], sm_count: int) -> int:
    try:
        geo, n, c, h, w, m, oh, ow = _deform_problem(layer, {k: tuple(v.shape) for k, v in tensors.items()})
    except Exception:
        return 0  # the layer fails at enqueue with its own error
    kh, kw = geo.kernel
    K, L = c // geo.group * kh * kw, oh * ow
    bm, bn, bk = TILES[GEMM.name]
    items = n * geo.group
    splits = split_k(-(-L // bn) * -(-(m // geo.group) // bm) * items, K, bk, sm_count, items)
    partial = 4 * splits * items * (m // geo.group) * L if splits > 1 else 0
    return (4 * n * c * kh * kw * L + 255) // 256 * 256 + partial


def enqueue_deform_conv(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    names = list(layer.inputs) + [""] * (5 - len(layer.inputs))
    check_f32(layer, tensors, names)
    x, wt, off, y = tensors[names[0]], tensors[names[1]], tensors[names[2]], tensors[layer.outputs[0]]
    bias, mask = (tensors[names[i]] if names[i] else None for i in (3, 4))
    geo, n, c, h, w, m, oh, ow = _deform_problem(layer, {k: tuple(v.shape) for k, v in tensors.items()})
    kh, kw = geo.kernel
    g, L = geo.group, oh * ow
    if off.shape != (n, geo.offset_group * kh * kw * 2, oh, ow):
        raise DeviceError(f"offset of shape {off.shape} does not fit the output {y.shape}", where=f"layer {layer.name!r}")
    if y.size == 0:
        return
    cols = launcher.workspace(4 * n * c * kh * kw * L)
    launcher.launch(KernelSource("deform_im2col", FILE), grid(n * c * kh * kw * L), (BLOCK,),
                    [x, off, mask or 0, cols, n, c, h, w, kh, kw, oh, ow, *geo.strides, *geo.pads[:2], *geo.dilations,
                     geo.offset_group])
    K, mg = c // g * kh * kw, m // g
    count, args = gemm_args(wt, DeviceTensor(cols, (n, c * kh * kw, L), np.dtype(np.float32)), None, y, M=mg, N=L, K=K,
                            sam=K, sak=1, sbk=L, sbn=1, batch=[n, g], a_bs=[0, mg * K], b_bs=[c * kh * kw * L, K * L],
                            where=f"layer {layer.name!r}")
    launch_tiled(launcher, GEMM, GEMM_REDUCE.name, mg, L, K, count, args, [])
    if bias is not None:
        launcher.launch(KernelSource("deform_bias", FILE), grid(y.size), (BLOCK,), [y, bias, y.size, m, L])


F32 = stored_as("float32")
cuda_tactic("GridSample", "cuda.sampling.grid_sample", kernels=lambda layer: [KernelSource("grid_sample", FILE)],
            supports=F32)(enqueue_grid_sample)
cuda_tactic("AffineGrid", "cuda.sampling.affine_grid", kernels=lambda layer: [KernelSource("affine_grid", FILE)],
            supports=F32)(enqueue_affine_grid)
cuda_tactic("DeformConv", "cuda.sampling.deform_conv",
            kernels=lambda layer: [KernelSource("deform_im2col", FILE), KernelSource("deform_bias", FILE), GEMM,
                                   GEMM_REDUCE], supports=F32, workspace=_deform_workspace)(enqueue_deform_conv)


def compile_variants() -> list[KernelSource]:
    return [KernelSource(k, FILE) for k in ("grid_sample", "affine_grid", "deform_im2col", "deform_bias")]
