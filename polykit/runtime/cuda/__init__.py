"""The cuda target: polykit's own NVRTC-compiled kernels on an NVIDIA GPU.

Modules: driver (device, errors), nvrtc (compile + on-disk kernel cache), memory (buffers,
arena), launcher (loaded kernels, Launcher), stream (streams, events, CUDA graphs),
harness (run one layer: the kernel tests' entry point), target (CudaTarget -> engine ->
execution context). Importing this package does not import cuda-python.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("CudaTarget", "CudaEngine", "CudaContext"):
        from polykit.runtime.cuda import target

        return getattr(target, name)
    raise AttributeError(name)
