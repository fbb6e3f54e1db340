"""ai.polykit CheckRange and SelectByIndex on the cuda target (polykit.compiler.ops.tensor.selection):
host-driven layers, no kernels of their own.

- CheckRange reads its (small) value back once the stream reached it, raises the RuntimeInputError
  of the reference kernel out of range, and writes the checked value (negatives wrapped) to its
  output: one synchronization. A kernel that flags the error on the device would spare it only if
  nothing else in the plan synchronized; the selections it guards read their index back anyway.
- SelectByIndex reads the index back (one synchronization), then copies each chosen candidate into
  its output: the planned tensor when the candidates share a shape, else room of the chosen one's
  shape (the output is sized by the run: polykit.runtime.cuda.layer_outputs).

Host-driven layers keep the context from CUDA-graph capture (polykit.runtime.cuda.target.capture).
"""

from __future__ import annotations

from typing import Any, Mapping

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.tensor.selection import CHECK_RANGE, SELECT_BY_INDEX
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DECLARED, CudaTactic, DeviceTensor
from polykit.compiler.ops.tensor.selection_reference import checked, chosen


def compile_variants() -> list:
    return []  # host-driven: copies only


def _where(layer: Any) -> str:
    return f"layer {layer.name!r} ({layer.kind})"


def _nbytes(t: DeviceTensor) -> int:
    return t.size * t.dtype.itemsize


def _enqueue_check_range(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    value = launcher.bodies.read(tensors[layer.inputs[0]])
    launcher.bodies.write(tensors[layer.outputs[0]].ptr, checked(layer.attrs, value, _where(layer)))


def _enqueue_select(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    picks = chosen(layer.attrs, launcher.bodies.read(tensors[layer.inputs[0]]), len(layer.outputs), _where(layer))
    for name, c in zip(layer.outputs, picks):
        src = tensors[layer.inputs[1 + c]]
        if launcher.outputs is not None and launcher.outputs.sizes(name):
            dst = launcher.outputs.allocate(name, src.shape, src.dtype)
            launcher.outputs.done(name, src.shape)
        else:
            dst = tensors[name]
            if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
                raise DeviceError(f"output {name!r} is planned {dst.dtype} {tuple(dst.shape)}, candidate {c} is "
                                  f"{src.dtype} {tuple(src.shape)}", where=_where(layer),
                                  hint="the plan is inconsistent; rebuild it with `polykit convert`")
        launcher.bodies.copy(dst.ptr, src.ptr, _nbytes(src))


for _kind, _enqueue in ((CHECK_RANGE, _enqueue_check_range), (SELECT_BY_INDEX, _enqueue_select)):
    DECLARED.append(CudaTactic("cuda", _kind, "cuda.selection", {}, lambda layer: True, priority=0,
                               kernels_fn=lambda layer: [], enqueue_fn=_enqueue, host_driven=True,
                               domain=POLYKIT_DOMAIN))
