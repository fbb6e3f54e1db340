"""An example polykit plugin: tactics that are wrong on purpose, to test `polykit debug tactics`.

For Conv, MatMul and Gemm layers (and their fused ai.polykit forms, epilogue included) on
the cpu and cuda targets it registers a tactic `fault.<kind>` whose priority is above every
built-in tactic's, so a build at `--builder-optimization-level 0` takes it wherever it runs
the layer. It computes the right result, except on layers whose name matches (re.search)
the regular expression in the environment variable POLYKIT_FAULT_LAYERS, read when the
layer runs: there it adds SCALE * max|y| to every element of the layer's output y, a small
deterministic error.

  cpu   the op's reference kernel (cpu.reference's), then the error in float64
  cuda  a built-in SIMT tactic (CUDA_WRAPPED: its supports, workspace, kernels and launches),
        then one block of `polykit_fault_add` on the output: max|y| reduced in shared memory,
        then added to every element in place

    pip install -e examples/polykit-fault-plugin   # or: POLYKIT_PLUGINS=polykit_fault PYTHONPATH=examples/polykit-fault-plugin
    POLYKIT_FAULT_LAYERS='blocks.0/c1/Conv$' polykit debug tactics model.onnx --builder-optimization-level 0
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.errors import UsageError
from polykit.plugins import hookimpl

ENV_VAR = "POLYKIT_FAULT_LAYERS"
KINDS = ("Conv", "MatMul", "Gemm")
#: above every built-in tactic (cpu.reference: 10, the sm90 GEMMs: 30): level 0 takes the fault tactic
PRIORITY = 1000
#: the error added to every output element of a faulty layer: SCALE * max|y|
SCALE = 1e-2
#: the built-in cuda tactic whose kernels each fault tactic runs before adding its error
CUDA_WRAPPED = {"Conv": "cuda.conv.igemm_simt", "MatMul": "cuda.gemm.simt", "Gemm": "cuda.gemm.simt"}
#: threads of the one block that adds the error on cuda
BLOCK = 256
#: storage dtypes of the wrapped cuda tactics -> the error kernel's ELEM
ELEMS = {"float32": "float", "float16": "half_t"}

FAULT_CODE = """#include "blockreduce.cuh"
// y[i] += scale * max|y| for the n elements of y (ELEM: float or half_t); one block, any size
extern "C" __global__ void polykit_fault_add(ELEM* y, i64 n, float scale) {
  __shared__ float smem[32];
  float peak = 0.0f;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) peak = fmaxf(peak, fabsf(ld(y, i)));
  const float error = scale * block_reduce(peak, OpMax(), 0.0f, smem);
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) st(y, i, ld(y, i) + error);
}
"""


def faulty(layer_name: str) -> bool:
    """Whether the layer called `layer_name` gets the error (POLYKIT_FAULT_LAYERS matches it)."""
    pattern = os.environ.get(ENV_VAR, "")
    return bool(pattern) and _compiled(pattern).search(layer_name) is not None


@functools.lru_cache(maxsize=16)
def _compiled(pattern: str) -> "re.Pattern[str]":
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"${ENV_VAR} {pattern!r} is not a regular expression: {exc}",
                         hint=f"e.g. {ENV_VAR}='blocks.0/c1/Conv$|/fc/Gemm'") from None


def with_error(y: np.ndarray) -> np.ndarray:
    """y + SCALE * max|y| in y's dtype (computed in float64)."""
    wide = y.astype(np.float64)
    return (wide + SCALE * float(np.abs(wide).max(initial=0.0))).astype(y.dtype)


# ---- cpu ---------------------------------------------------------------------------------
def _run_cpu(node: Any, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    from polykit.kernels.cpu.base import REFERENCE

    outputs = REFERENCE.run(node, inputs)
    if faulty(node.name):
        outputs[0] = with_error(outputs[0])
    return outputs


def _cpu_supports(layer: Any) -> bool:
    from polykit.kernels.cpu.base import REFERENCE, plain_or_fused

    return plain_or_fused(layer) and REFERENCE.supports(layer)


def _cpu_tactics() -> list[Any]:
    from polykit.kernels.cpu.base import REFERENCE, CpuTactic

    return [CpuTactic("cpu", kind, f"fault.{kind}", supports=_cpu_supports, priority=PRIORITY, run_fn=_run_cpu,
                      code_of=REFERENCE.code_of) for kind in KINDS]


# ---- cuda --------------------------------------------------------------------------------
def fault_kernel(dtype: Any) -> Any:
    """The error kernel for outputs of numpy `dtype`."""
    from polykit.kernels.cuda.base import KernelSource, defines

    return KernelSource("polykit_fault_add", code=FAULT_CODE, defines=defines(ELEM=ELEMS[np.dtype(dtype).name]))


def fault_kernels() -> list[Any]:
    """The error kernel for each storage dtype the wrapped tactics take."""
    return [fault_kernel(dtype) for dtype in ELEMS]


def _cuda_tactic(kind: str) -> Any:
    from polykit.kernels.cuda.base import CudaTactic

    def wrapped() -> Any:  # looked up when used: the table is complete by then
        from polykit.kernels.tactics import find_tactic

        return find_tactic("cuda", kind, CUDA_WRAPPED[kind])

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, Any]) -> None:
        wrapped().enqueue(layer, launcher, tensors)
        if faulty(layer.name):
            y = tensors[layer.outputs[0]]
            launcher.launch(fault_kernel(y.dtype), (1,), (BLOCK,), [y, y.size, np.float32(SCALE)])

    return CudaTactic("cuda", kind, f"fault.{kind}", supports=lambda layer: wrapped().supports(layer),
                      priority=PRIORITY, workspace_fn=lambda layer, tensors, sms: wrapped().workspace(layer, tensors, sms),
                      kernels_fn=lambda layer: wrapped().kernels(layer) + fault_kernels(), enqueue_fn=enqueue)


_TACTICS = {"cpu": _cpu_tactics, "cuda": lambda: [_cuda_tactic(kind) for kind in KINDS]}


@hookimpl
def polykit_tactics(registry: Any) -> None:
    make = _TACTICS.get(registry.target)
    if make is not None:
        registry.register_all(make())
