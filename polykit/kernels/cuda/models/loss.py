"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss tactics (loss.cu).

SoftmaxCrossEntropyLoss is LogSoftmax over the class dim (softmax.cu) into its log_prob output,
or into the workspace when the node does not ask for it, then the NLL kernels. A reduced loss
(sum / mean) is one block's deterministic double-precision sum: the same bits every run.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ops.models.loss import loss_reduction
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, storage_code, stored_as
from polykit.kernels.cuda.launch_geometry import grid_for
from polykit.kernels.cuda.storage_types import CODE, dtype_names
from polykit.kernels.cuda.reduce.softmax import MODES, launch_softmax, softmax_kernels

FILE = "loss.cu"
DTYPES = ("f32", "f16", "f64")
STORED = dtype_names(DTYPES)
BLOCK = 256


def _nll_kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"nll_{mode}_{c}", FILE) for mode in ("none", "reduce") for c in DTYPES]


def _sce_kernels(layer) -> list[KernelSource]:
    return softmax_kernels(layer) + _nll_kernels(layer)


def _where(layer) -> str:
    return f"layer {layer.name!r}"


def launch_nll(layer, launcher: Launcher, log_prob: DeviceTensor, target: DeviceTensor,
               weight: DeviceTensor | None, out: DeviceTensor) -> None:
    """out = the NLL loss of `log_prob` [N, C, ...] against `target`, reduced per the layer's attributes."""
    where = _where(layer)
    code = storage_code(layer, log_prob, CODE, DTYPES)
    if target.dtype.name not in ("int32", "int64"):
        raise DeviceError(f"{layer.kind} target of dtype {target.dtype} (int32/int64 expected)", where=where)
    if weight is not None and weight.dtype != log_prob.dtype:
        raise DeviceError(f"{layer.kind} weight of dtype {weight.dtype} for scores of {log_prob.dtype}", where=where)
    n_classes = log_prob.shape[1]
    inner = int(np.prod(log_prob.shape[2:], dtype=np.int64))
    ignore = layer.attrs.get("ignore_index")
    args = [log_prob, target, np.int32(target.dtype.itemsize == 8), weight.ptr if weight is not None else 0, out,
            target.size, n_classes, inner, int(ignore or 0), np.int32(ignore is not None)]
    reduction = loss_reduction(layer.attrs)
    if reduction == "none":
        if target.size:
            launcher.launch(KernelSource(f"nll_none_{code}", FILE), grid_for(target.size), (BLOCK, 1, 1), args)
    else:
        launcher.launch(KernelSource(f"nll_reduce_{code}", FILE), (1, 1, 1), (BLOCK, 1, 1),
                        [*args, np.int32(reduction == "mean")])


def _weight(layer, tensors: Mapping[str, DeviceTensor]) -> DeviceTensor | None:
    return tensors[layer.inputs[2]] if len(layer.inputs) > 2 and layer.inputs[2] else None


def enqueue_nll(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    launch_nll(layer, launcher, tensors[layer.inputs[0]], tensors[layer.inputs[1]], _weight(layer, tensors),
               tensors[layer.outputs[0]])


def _wants_log_prob(layer) -> bool:
    return len(layer.outputs) > 1 and bool(layer.outputs[1])


def _sce_workspace(layer, tensors, sm_count: int) -> int:
    """Scratch log-probabilities when the layer has no log_prob output."""
    if _wants_log_prob(layer) or layer.inputs[0] not in tensors:
        return 0
    x = tensors[layer.inputs[0]]
    return max(int(np.prod(x.shape, dtype=np.int64)), 1) * np.dtype(x.dtype).itemsize


def enqueue_sce(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x = tensors[layer.inputs[0]]
    if _wants_log_prob(layer):
        log_prob = tensors[layer.outputs[1]]
    else:
        log_prob = DeviceTensor(launcher.workspace(max(x.size, 1) * x.dtype.itemsize), x.shape, x.dtype)
    launch_softmax(launcher, x, log_prob, 1, MODES["LogSoftmax"], _where(layer))
    launch_nll(layer, launcher, log_prob, tensors[layer.inputs[1]], _weight(layer, tensors), tensors[layer.outputs[0]])


cuda_tactic("NegativeLogLikelihoodLoss", "cuda.loss.nll", kernels=_nll_kernels, supports=stored_as(*STORED))(
    enqueue_nll)
cuda_tactic("SoftmaxCrossEntropyLoss", "cuda.loss.sce", kernels=_sce_kernels, supports=stored_as(*STORED),
            workspace=_sce_workspace)(enqueue_sce)


def compile_variants() -> list[KernelSource]:
    """The one loss.cu module (every kernel is an entry point in it)."""
    return _nll_kernels(None)
