"""Training-mode tactics (training.cu): Dropout with a training_mode input, whose mask matches
the reference's numpy generator bit for bit, and BatchNormalization with training_mode=1.

Dropout's ratio and training_mode are runtime inputs: the kernels read them on the device
(no host sync), so one plan serves both modes. The mask comes from numpy's legacy MT19937
run by one block (sequential over 624-word twists: a few microseconds per 312 elements),
then an elementwise kernel applies it.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, storage_code
from polykit.kernels.cuda.launch_geometry import grid_for
from polykit.kernels.cuda.storage_types import CODE
from polykit.kernels.cuda.reduce.reduce import block_for

FILE = "training.cu"
DTYPES = ("f32", "f16", "bf16", "f64")
MT_THREADS = 640
MT_BLOCK_ELEMENTS = 312  # uniforms per 624-word twist
#: dtype codes of real tensors read or written through ld_real / st_real (REAL_* in training.cu)
REAL_CODES = {"float32": 1, "float16": 2, "float64": 3, "bfloat16": 4}
MAX_GRID = 1 << 20


def _plain(layer) -> bool:
    return layer.domain in ("", "ai.onnx")


def _known_dtypes_fit(layer) -> bool:
    """False when the builder stamped an X dtype (layer.in_dtypes) that has no kernel here."""
    stamped = getattr(layer, "in_dtypes", ()) or ()
    return not stamped or CODE.get(stamped[0]) in DTYPES


def _where(layer) -> str:
    return f"layer {layer.name!r}"


def _code(layer, t: DeviceTensor) -> str:
    return storage_code(layer, t, CODE, DTYPES)


def _real_code(layer, t: DeviceTensor | None, what: str) -> np.int32:
    if t is None:
        return np.int32(0)
    code = REAL_CODES.get(t.dtype.name)
    if code is None:
        raise DeviceError(f"{layer.kind} {what} of dtype {t.dtype} (float16/bfloat16/float32/float64 expected)",
                          where=_where(layer), hint="use --target cpu")
    return np.int32(code)


def _opt(tensors: Mapping[str, DeviceTensor], names, i: int) -> DeviceTensor | None:
    return tensors[names[i]] if len(names) > i and names[i] else None


# ---- Dropout --------------------------------------------------------------------------------
def dropout_has_training_input(layer) -> bool:
    return _plain(layer) and len(layer.inputs) > 2 and bool(layer.inputs[2]) and _known_dtypes_fit(layer)


def dropout_seed(layer) -> np.uint32:
    """RandomState's seed as init_genrand takes it (numpy accepts 0 .. 2**32 - 1)."""
    return np.uint32(int(layer.attrs.get("seed", 0)) & 0xFFFFFFFF)


def _dropout_kernels(layer) -> list[KernelSource]:
    return [KernelSource("dropout_mask", FILE)] + [KernelSource(f"dropout_apply_{c}", FILE) for c in DTYPES]


def enqueue_dropout_training(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    ratio, training = _opt(tensors, layer.inputs, 1), _opt(tensors, layer.inputs, 2)
    mask = _opt(tensors, layer.outputs, 1)
    code = _code(layer, x)
    if training is not None and training.dtype != np.bool_:
        raise DeviceError(f"Dropout training_mode of dtype {training.dtype} (bool expected)", where=_where(layer))
    if x.size == 0:
        return
    ratio_code = _real_code(layer, ratio, "ratio")
    mask_ptr = mask.ptr if mask is not None else launcher.workspace(x.size)
    scalars = [ratio if ratio is not None else 0, ratio_code, training if training is not None else 0]
    launcher.launch(KernelSource("dropout_mask", FILE), (1, 1, 1), (MT_THREADS, 1, 1),
                    [*scalars, dropout_seed(layer), mask_ptr, x.size])
    launcher.launch(KernelSource(f"dropout_apply_{code}", FILE), grid_for(x.size), (256, 1, 1),
                    [x, y, mask_ptr, *scalars, x.size])


cuda_tactic("Dropout", "cuda.training.dropout", kernels=_dropout_kernels, supports=dropout_has_training_input,
            priority=10)(enqueue_dropout_training)


# ---- BatchNormalization ---------------------------------------------------------------------
def batchnorm_geometry(shape) -> tuple[int, int, int]:
    """(N, C, inner) of an (N, C, ...) tensor."""
    return int(shape[0]), int(shape[1]), int(np.prod(shape[2:], dtype=np.int64))


def _batchnorm_kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"batchnorm_train_{c}", FILE) for c in DTYPES]


def enqueue_batchnorm_training(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, scale, bias, mean, var = (tensors[n] for n in layer.inputs[:5])
    y = tensors[layer.outputs[0]]
    run_mean, run_var = _opt(tensors, layer.outputs, 1), _opt(tensors, layer.outputs, 2)
    if len(x.shape) < 2:
        raise DeviceError(f"BatchNormalization needs X of rank >= 2, got shape {x.shape}", where=_where(layer))
    code = _code(layer, x)
    n, c, inner = batchnorm_geometry(x.shape)
    if x.size == 0:
        return
    params = []
    for t, what in ((scale, "scale"), (bias, "B"), (mean, "input_mean"), (var, "input_var")):
        params += [t, _real_code(layer, t, what)]
    outs = []
    for t, what in ((run_mean, "running_mean"), (run_var, "running_var")):
        outs += [t if t is not None else 0, _real_code(layer, t, what)]
    args = [x, *params, y, *outs, n, c, inner, np.float64(layer.attrs.get("epsilon", 1e-5)),
            np.float64(layer.attrs.get("momentum", 0.9))]
    launcher.launch(KernelSource(f"batchnorm_train_{code}", FILE), (min(c, MAX_GRID), 1, 1),
                    (block_for(n * inner), 1, 1), args)


def batchnorm_in_training_mode(layer) -> bool:
    return _plain(layer) and bool(layer.attrs.get("training_mode", 0)) and _known_dtypes_fit(layer)


cuda_tactic("BatchNormalization", "cuda.training.batchnorm", kernels=_batchnorm_kernels,
            supports=batchnorm_in_training_mode, priority=10)(enqueue_batchnorm_training)


def compile_variants() -> list[KernelSource]:
    """The one training.cu module (every kernel is an entry point in it)."""
    return _dropout_kernels(None)
