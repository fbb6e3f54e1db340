"""Convolution family: Conv (implicit GEMM on SIMT or tensor cores, direct for grouped and
depthwise), ConvTranspose (direct gather). NCHW with 1, 2 or 3 spatial dims (mapped onto
D x H x W with unit leading dims); pads come from the compiler's window geometry, so
auto_pad / dilations / strides follow exactly what the shape rules computed.

Layers with an epilogue (ai.polykit Conv, docs/FUSION.md) run it inside the kernel.

The implicit-GEMM kernels split K over several blocks when the output has too few tiles to fill
the GPU (gemm.split_k; `conv_splitk_reduce` sums the slices in a fixed order).

Tactics, kind "Conv" (first supporting one wins; the builder may time them):
  cuda.conv.igemm_mma   precision fp16, group 1: implicit GEMM on mma.sync (fp32 accumulate)
  cuda.conv.direct      group > 1 (depthwise and grouped): one thread per output element
  cuda.conv.igemm_simt_wide  any conv: implicit GEMM, fp32 FMA 128x128 tiles, 8x8 outputs a thread
  cuda.conv.igemm_simt  any conv: implicit GEMM with fp32 FMA 64x64 tiles (groups on grid z)
kind "ConvTranspose":
  cuda.conv_transpose.direct  gather form, one thread per output element
"""

from __future__ import annotations

from typing import Any, Mapping

from polykit.compiler.ops.nn.channels_last import conv_output_shape
from polykit.compiler.ops.nn.conv import transpose_geometry, window_geometry
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines, stored_as
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, kernel_source, supports_epilogue
from polykit.kernels.cuda.gemm.gemm import ELEMS, STORED, elem_of, launch_tiled, tile_params, tiled_workspace

KERNELS = ("conv_igemm_simt", "conv_igemm_simt_wide", "conv_igemm_mma", "conv_splitk_reduce", "conv_direct",
           "conv_transpose_direct")
BLOCK = 256


def variants(kernel: str, file: str = "conv.cu") -> list[KernelSource]:
    return [KernelSource(kernel, file=file, defines=defines(ELEM=e)) for e in ELEMS.values()]


def layer_variants(kernel: str, file: str = "conv.cu"):
    """kernels(layer) of a tactic: `kernel` for each storage dtype, with the layer's epilogue."""
    return lambda layer: [kernel_source(layer, kernel, file, e) for e in ELEMS.values()]


def _with_epilogue(layer: Any, tensors: Mapping[str, DeviceTensor], args: list[Any]) -> list[Any]:
    return args + epilogue_args(layer, tensors, tensors[layer.outputs[0]].dtype)


def compile_variants() -> list[KernelSource]:
    return [v for k in KERNELS for v in variants(k)]


def _to3(values, fill: int) -> list[int]:
    values = [int(v) for v in values]
    if len(values) > 3:
        raise DeviceError(f"{len(values)} spatial dims (the cuda conv kernels take 1 to 3)",
                          hint="run this layer on --target cpu")
    return [fill] * (3 - len(values)) + values


#: layer kinds whose X, W and Y hold their channels last (X [N, *spatial, C], W [M, *k, C/G])
CHANNELS_LAST_KINDS = frozenset({"ConvNHWC"})


def conv_args(layer: Any, tensors: Mapping[str, DeviceTensor], transpose: bool = False) -> tuple[str, list[Any], dict]:
    """(ELEM, kernel args (conv_common.cuh), geometry dict) of a Conv / ConvTranspose / ConvNHWC layer."""
    where = f"layer {layer.name!r}"
    X, Wt, Y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    B = tensors.get(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] else None
    elem = elem_of(X, where)
    if len({elem_of(t, where) for t in (X, Wt, Y) + ((B,) if B is not None else ())}) != 1:
        raise DeviceError("Conv input, weight, bias and output must share one dtype", where=where)
    if layer.kind in CHANNELS_LAST_KINDS:
        conv_out = conv_output_shape(layer.attrs, Y.shape)  # Y's shape before a depth_to_space store
        (NB, *spatial, C), kernel, (*_, M), out = X.shape, Wt.shape[1:-1], conv_out, conv_out[1:-1]
    else:
        (NB, C, *spatial), kernel, M, out = X.shape, Wt.shape[2:], Y.shape[1], Y.shape[2:]
    geo = (transpose_geometry if transpose else window_geometry)(layer.attrs, spatial, kernel, where=where)
    group = int(layer.attrs.get("group", 1))
    g = {"NB": NB, "C": C, "M": M, "G": group, "OSP": 1}
    for o in out:
        g["OSP"] *= o
    d, h, w = _to3(spatial, 1)
    od, oh, ow = _to3(out, 1)
    kd, kh, kw = _to3(kernel, 1)
    sd, sh, sw = _to3(geo.strides, 1)
    pd, ph, pw = _to3(geo.pads_begin, 0)
    dd, dh, dw = _to3(geo.dilations, 1)
    args = [X, Wt, B if B is not None else 0, Y, NB, C, d, h, w, M, od, oh, ow, kd, kh, kw, sd, sh, sw,
            pd, ph, pw, dd, dh, dw, group]
    return elem, args, g


def _grid_1d(total: int) -> tuple[int]:
    return (max(1, min((total + BLOCK - 1) // BLOCK, 2**31 - 1)),)


def enqueue_igemm(kernel_name: str, reduce_name: str = "conv_splitk_reduce", file: str = "conv.cu",
                  row_stride: bool = False):
    """The enqueue of an implicit-GEMM conv tactic: `kernel_name`, then `reduce_name` after a split-K
    launch; with `row_stride` its kernels take the elements between Y's pixel rows, then X's, after
    `partial` (conv_nhwc.cu's LDY, LDX)."""

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        where = f"layer {layer.name!r}"
        elem, args, g = conv_args(layer, tensors)
        if g["G"] > 65535:
            raise DeviceError(f"group {g['G']} exceeds the grid limit", where=where)
        wt = tensors[layer.inputs[1]].shape
        k = 1
        for d in wt[1:]:
            k *= d
        x = tensors[layer.inputs[0]].shape
        if k >= 2**31 or max(x[1:], default=1) >= 2**31:
            raise DeviceError(f"convolution reduction of {k} elements per output (the implicit-GEMM kernels "
                              "index it in 32 bits)", where=where, hint="run this layer on --target cpu")
        n, m = g["NB"] * g["OSP"], g["M"] // g["G"]
        kernel = kernel_source(layer, kernel_name, file, elem)
        y, xt = tensors[layer.outputs[0]], tensors[layer.inputs[0]]
        strides = [y.rows_apart(y.shape[-1]), xt.rows_apart(g["C"])] if row_stride else []  # Y's pixels (C each)
        launch_tiled(launcher, kernel, reduce_name, m, n, k, g["G"], args, strides + _with_epilogue(layer, tensors, []))

    return enqueue


def _enqueue_direct(kernel_name: str, transpose: bool = False):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        elem, args, g = conv_args(layer, tensors, transpose)
        kernel = kernel_source(layer, kernel_name, "conv.cu", elem)
        launcher.launch(kernel, _grid_1d(g["NB"] * g["M"] * g["OSP"]), (BLOCK,), _with_epilogue(layer, tensors, args))

    return enqueue


def _plain(layer: Any) -> bool:
    return supports_epilogue(layer)


def group_of(layer: Any) -> int:
    return int(layer.attrs.get("group", 1))


def igemm_problem(layer: Any, tensors: Mapping[str, DeviceTensor]) -> tuple[str, int, int, int, int, list[Any]]:
    """(elem, groups, M, N, K, args) of the implicit GEMM a Conv layer runs (per group)."""
    elem, args, g = conv_args(layer, tensors)
    k = 1
    for d in tensors[layer.inputs[1]].shape[1:]:
        k *= d
    return elem, g["G"], g["M"] // g["G"], g["NB"] * g["OSP"], k, args


cuda_tactic("Conv", "cuda.conv.igemm_mma", kernels=layer_variants("conv_igemm_mma"), priority=10,
            supports=stored_as(*STORED, then=lambda layer: _plain(layer) and layer.precision == "fp16"
                               and group_of(layer) == 1),
            params=tile_params("conv_igemm_mma"), workspace=tiled_workspace("conv_igemm_mma", igemm_problem))(
    enqueue_igemm("conv_igemm_mma"))
cuda_tactic("Conv", "cuda.conv.direct", kernels=layer_variants("conv_direct"), priority=8,
            supports=stored_as(*STORED, then=lambda layer: _plain(layer) and group_of(layer) > 1))(
    _enqueue_direct("conv_direct"))
cuda_tactic("Conv", "cuda.conv.igemm_simt_wide", kernels=layer_variants("conv_igemm_simt_wide"), priority=4,
            supports=stored_as(*STORED, then=_plain), params=tile_params("conv_igemm_simt_wide"),
            workspace=tiled_workspace("conv_igemm_simt_wide", igemm_problem))(enqueue_igemm("conv_igemm_simt_wide"))
cuda_tactic("Conv", "cuda.conv.igemm_simt", kernels=layer_variants("conv_igemm_simt"), priority=5, conservative=True,
            supports=stored_as(*STORED, then=_plain), params=tile_params("conv_igemm_simt"),
            workspace=tiled_workspace("conv_igemm_simt", igemm_problem))(enqueue_igemm("conv_igemm_simt"))
cuda_tactic("ConvTranspose", "cuda.conv_transpose.direct", kernels=lambda layer: variants("conv_transpose_direct"),
            supports=stored_as(*STORED, then=lambda layer: not layer.attrs.get("epilogue")))(
    _enqueue_direct("conv_transpose_direct", True))
