"""Adagrad / Adam / Momentum tactics (optimizer.cu): one elementwise launch per state tensor,
R and T read on the device."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ops.models.optimizer import GROUPS, TRAINING_DOMAIN, grouped
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, storage_code
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for
from polykit.kernels.cuda.storage_types import CODE

FILE = "optimizer.cu"
DTYPES = ("f32", "f64")


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"optimizer_{c}", FILE) for c in DTYPES]


def _constants(layer) -> tuple[int, list[float]]:
    """(kind, c0..c4) of optimizer.cu for the layer's attributes (ONNX's defaults)."""
    a = layer.attrs
    get = lambda k, d: float(a.get(k, d))  # noqa: E731
    if layer.kind == "Adagrad":
        return 0, [get("norm_coefficient", 0.0), get("epsilon", 1e-6), get("decay_factor", 0.0), 0.0, 0.0]
    if layer.kind == "Adam":
        return 1, [get("norm_coefficient", 0.0), get("epsilon", 1e-6), get("alpha", 0.9), get("beta", 0.999),
                   get("norm_coefficient_post", 0.0)]
    mode = a["mode"].decode() if isinstance(a["mode"], bytes) else a["mode"]
    return 3 if mode == "nesterov" else 2, [float(a["norm_coefficient"]), 0.0, float(a["alpha"]), float(a["beta"]), 0.0]


def enqueue_optimizer(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    r, t = tensors[layer.inputs[0]], tensors[layer.inputs[1]]
    if r.dtype.name not in ("float32", "float64") or t.dtype.name != "int64":
        raise DeviceError(f"{layer.kind} R of {r.dtype} and T of {t.dtype} (float32/float64 and int64 expected)",
                          where=where)
    n, ins = grouped(layer.kind, [tensors[name] for name in layer.inputs])
    out_groups = GROUPS[layer.kind][1]
    out = {g: [tensors[name] for name in layer.outputs[k * n:(k + 1) * n]] for k, g in enumerate(out_groups)}
    kind, consts = _constants(layer)
    for i in range(n):
        x = ins["X"][i]
        code = storage_code(layer, x, CODE, DTYPES)
        if x.size == 0:
            continue
        state = [ins[g][i] if g in ins else 0 for g in "GVH"]
        news = [out[g][i] if g in out else 0 for g in "XVH"]
        launcher.launch(KernelSource(f"optimizer_{code}", FILE), grid_for(x.size), (BLOCK, 1, 1),
                        [np.int32(kind), r, np.int32(r.dtype.itemsize == 8), t, x, *state, *news, x.size,
                         *[np.float64(c) for c in consts]])


for _op in GROUPS:
    cuda_tactic(_op, "cuda.optimizer", kernels=_kernels,
                supports=lambda layer: layer.domain == TRAINING_DOMAIN)(enqueue_optimizer)


def compile_variants() -> list[KernelSource]:
    """The one optimizer.cu module (every kernel is an entry point in it)."""
    return _kernels(None)
