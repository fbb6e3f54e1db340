"""ai.polykit Reformat on the cuda target (reformat_copy.cu): NCHW <-> NHWC of a few-channel tensor
with its dtype conversion and, on the way in, the zero channels, in one pass
(polykit.compiler.ops.tensor.reformat).

  cuda.movement.reformat   every Reformat with fewer than 2^31 output elements, fp16 / fp32 / bf16 in
                           and out; one thread per pixel loops over its channels (compose_reformats
                           makes the node only for at most MAX_CHANNELS of them); to NHWC, one thread
                           per 4-16 byte chunk of a pixel when a chunk divides the pixel and y is
                           aligned to it (chunk_bytes, as pad_chunks: a padded fp16 stem pixel is one
                           16-byte store)
The sizes are runtime arguments (N, C, P = H * W, the output's channels), never stamped.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.tensor.reformat import REFORMAT, TO_NHWC
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic
from polykit.kernels.cuda.conv.reformat import chunk_bytes
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for

FILE = "reformat_copy.cu"
#: dtype name -> the kernels' type code
CODES = {"float16": "f16", "float32": "f32", "bfloat16": "bf16"}


def kernel_name(direction: str, in_dtype: Any, out_dtype: Any) -> str:
    """The entry point: reformat_in_<in>_<out> (to NHWC), reformat_in_chunks_<in>_<out> (to NHWC, a
    chunk a thread) or reformat_out_<in>_<out> (to NCHW)."""
    return f"reformat_{direction}_{CODES[np.dtype(in_dtype).name]}_{CODES[np.dtype(out_dtype).name]}"


def _direction(layer: Any) -> str:
    return "in" if tuple(int(p) for p in layer.attrs.get("perm", ())) == TO_NHWC else "out"


def _kernels(layer: Any) -> list[KernelSource]:
    directions = ("in", "in_chunks") if _direction(layer) == "in" else ("out",)
    return [KernelSource(kernel_name(d, layer.in_dtypes[0], layer.out_dtypes[0]), FILE) for d in directions]


def _supports(layer: Any) -> bool:
    shapes, dts = getattr(layer, "in_shapes", ()), getattr(layer, "in_dtypes", ())
    outs = getattr(layer, "out_dtypes", ())
    if not shapes or len(shapes[0]) != 4 or not dts or not outs:
        return False
    if np.dtype(dts[0]).name not in CODES or np.dtype(outs[0]).name not in CODES:
        return False
    outs = getattr(layer, "out_shapes", ())
    return bool(outs) and 0 < int(np.prod(outs[0], dtype=np.int64)) < 2**31


def launch_args(layer: Any, tensors: Mapping[str, DeviceTensor]) -> tuple[str, int, list]:
    """(kernel name, threads of work, arguments) of one Reformat launch."""
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    if _direction(layer) == "out":
        n, c, p = x.shape[0], x.shape[3], x.shape[1] * x.shape[2]
        return kernel_name("out", x.dtype, y.dtype), n * p, [x, y, np.int32(n), np.int32(c), np.int32(p)]
    n, c, p, cout = x.shape[0], x.shape[1], x.shape[2] * x.shape[3], y.shape[3]
    args = [x, y, np.int32(n), np.int32(c), np.int32(p), np.int32(cout)]
    w = chunk_bytes(y.dtype.itemsize, cout, y.ptr)
    if w:
        return kernel_name("in_chunks", x.dtype, y.dtype), y.size * y.dtype.itemsize // w, [*args, np.int32(w)]
    return kernel_name("in", x.dtype, y.dtype), n * p, args


def enqueue_reformat(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    name, work, args = launch_args(layer, tensors)
    if work:
        launcher.launch(KernelSource(name, FILE), grid_for(work), (BLOCK,), args)


def compile_variants() -> list[KernelSource]:
    return [KernelSource(kernel_name(d, a, b), FILE) for d in ("in", "in_chunks", "out") for a in CODES for b in CODES]


cuda_tactic(REFORMAT, "cuda.movement.reformat", domain=POLYKIT_DOMAIN, kernels=_kernels,
            supports=_supports)(enqueue_reformat)
