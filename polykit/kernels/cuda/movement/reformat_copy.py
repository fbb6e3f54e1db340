"""ai.polykit Reformat on the cuda target (reformat_copy.cu): NCHW <-> NHWC of a few-channel tensor
with its dtype conversion and, on the way in, the zero channels, in one pass
(polykit.compiler.ops.tensor.reformat).

  cuda.movement.reformat   every Reformat with N * H * W < 2^31 pixels, fp16 / fp32 / bf16 in and out;
                           one thread per pixel loops over its channels (compose_reformats makes the
                           node only for at most MAX_CHANNELS of them)
The sizes are runtime arguments (N, C, P = H * W, the output's channels), never stamped.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.tensor.reformat import REFORMAT, TO_NHWC
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for

FILE = "reformat_copy.cu"
#: dtype name -> the kernels' type code
CODES = {"float16": "f16", "float32": "f32", "bfloat16": "bf16"}


def kernel_name(direction: str, in_dtype: Any, out_dtype: Any) -> str:
    """The entry point: reformat_in_<in>_<out> (to NHWC) or reformat_out_<in>_<out> (to NCHW)."""
    return f"reformat_{direction}_{CODES[np.dtype(in_dtype).name]}_{CODES[np.dtype(out_dtype).name]}"


def _direction(layer: Any) -> str:
    return "in" if tuple(int(p) for p in layer.attrs.get("perm", ())) == TO_NHWC else "out"


def _kernels(layer: Any) -> list[KernelSource]:
    return [KernelSource(kernel_name(_direction(layer), layer.in_dtypes[0], layer.out_dtypes[0]), FILE)]


def _supports(layer: Any) -> bool:
    shapes, dts = getattr(layer, "in_shapes", ()), getattr(layer, "in_dtypes", ())
    outs = getattr(layer, "out_dtypes", ())
    if not shapes or len(shapes[0]) != 4 or not dts or not outs:
        return False
    if np.dtype(dts[0]).name not in CODES or np.dtype(outs[0]).name not in CODES:
        return False
    pixels = int(np.prod(shapes[0], dtype=np.int64)) // max(int(shapes[0][1 if _direction(layer) == "in" else 3]), 1)
    return 0 < pixels < 2**31


def launch_args(layer: Any, tensors: Mapping[str, DeviceTensor]) -> tuple[str, int, list]:
    """(kernel name, pixels, arguments) of one Reformat launch."""
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    direction = _direction(layer)
    if direction == "in":
        n, c, p = x.shape[0], x.shape[1], x.shape[2] * x.shape[3]
        args = [x, y, np.int32(n), np.int32(c), np.int32(p), np.int32(y.shape[3])]
    else:
        n, c, p = x.shape[0], x.shape[3], x.shape[1] * x.shape[2]
        args = [x, y, np.int32(n), np.int32(c), np.int32(p)]
    return kernel_name(direction, x.dtype, y.dtype), n * p, args


def enqueue_reformat(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    name, pixels, args = launch_args(layer, tensors)
    if pixels:
        launcher.launch(KernelSource(name, FILE), grid_for(pixels), (BLOCK,), args)


def compile_variants() -> list[KernelSource]:
    return [KernelSource(kernel_name(d, a, b), FILE) for d in ("in", "out") for a in CODES for b in CODES]


cuda_tactic(REFORMAT, "cuda.movement.reformat", domain=POLYKIT_DOMAIN, kernels=_kernels,
            supports=_supports)(enqueue_reformat)
