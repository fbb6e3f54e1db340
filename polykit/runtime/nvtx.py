"""NVTX ranges around each layer launch, so Nsight Systems / Compute show polykit's layers.

The ranges come from the NVTX C API through ctypes: `libnvtx3interop.so.1` (CUDA 13's exported
NVTX3 entry points) or `libnvToolsExt.so.1` (CUDA 12 and older, and the `nvidia-nvtx` wheel), found
by the loader's search path, under $CUDA_HOME / $CUDA_PATH / /usr/local/cuda*, or in the `lib`
folders of the `nvidia` pip wheels (nvidia-nvtx, cuda-toolkit: what a pip-installed CUDA stack
such as PyTorch's has, with no toolkit on the loader's path; the lent H200's case, where ncu showed
no range before this lookup). Neither is a dependency: without one
there are no ranges and nothing else changes. NVTX itself does nothing unless a tool (nsys,
ncu) is attached, so a loaded library costs two foreign calls per eagerly launched layer; a
replayed CUDA graph launches no layer from the host, so only its capture records ranges (run
with cuda_graph=False, `--no-cuda-graph`, to see a range per layer of every run).

How much a range says is the profiling verbosity (TensorRT's): "none" (no ranges),
"layer_names_only" (the layer's name, the default) or "detailed" (name and tactic). A plan
records the verbosity it was built with (BuilderConfig.profiling_verbosity); a context may
lower it (ExecutionContext.nvtx_verbosity), not raise it.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from typing import Any, Sequence

#: profiling verbosities, least first
VERBOSITIES = ("none", "layer_names_only", "detailed")
LIBRARIES = ("libnvtx3interop.so.1", "libnvToolsExt.so.1")


class Nvtx:
    """The NVTX range calls of a loaded library."""

    def __init__(self, lib: Any, path: str = ""):
        self.path = path  # where the library was loaded from (as the loader was asked)
        self._push = lib.nvtxRangePushA
        self._push.argtypes, self._push.restype = [ctypes.c_char_p], ctypes.c_int
        self._pop = lib.nvtxRangePop
        self._pop.argtypes, self._pop.restype = [], ctypes.c_int

    def push(self, label: bytes) -> int:
        """Open a range; its nesting depth (negative when no tool listens)."""
        return int(self._push(label))

    def pop(self) -> int:
        return int(self._pop())


def _wheel_roots() -> list[str]:
    """The folders of the `nvidia` namespace package (pip's CUDA wheels), without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    return list(spec.submodule_search_locations or ()) if spec else []


def _candidates() -> list[str]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
             *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    paths = list(LIBRARIES)  # the loader's own search path first
    for root in filter(None, roots):
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            paths += [os.path.join(root, sub, name) for name in LIBRARIES]
    for root in _wheel_roots():  # nvidia/nvtx/lib, nvidia/cu13/lib, ...: the libraries these wheels hold
        for name in LIBRARIES:
            paths += sorted(glob.glob(os.path.join(root, "*", "lib", name)))
    return paths


@functools.lru_cache(maxsize=1)
def load_nvtx() -> Nvtx | None:
    """The process's NVTX library (looked up once), or None where none is installed."""
    for path in _candidates():
        try:
            return Nvtx(ctypes.CDLL(path), path)
        except (OSError, AttributeError):
            continue
    return None


def describe(verbosity: str) -> str:
    """What the ranges of a context at `verbosity` will be, for a report: the verbosity and the
    library, or why there are none."""
    if verbosity == "none":
        return "none (profiling verbosity none)"
    nvtx = load_nvtx()
    if nvtx is None:
        return (f"none: no NVTX library found ({' or '.join(LIBRARIES)}; pip install nvidia-nvtx, or set "
                "CUDA_HOME to a CUDA toolkit)")
    return f"{verbosity} ({nvtx.path})"


def check_verbosity(value: str, what: str = "profiling verbosity") -> str:
    """`value` if it is one of VERBOSITIES; else a UsageError listing them."""
    from polykit.errors import UsageError

    if value not in VERBOSITIES:
        raise UsageError(f"{what} {value!r} is not one of {', '.join(VERBOSITIES)}",
                         hint="e.g. --profiling-verbosity detailed (layer names and tactics in Nsight)")
    return value


def layer_labels(layers: Sequence[Any], verbosity: str) -> list[bytes] | None:
    """The range label of each layer at `verbosity` (None at "none")."""
    if verbosity == "none":
        return None
    if verbosity == "detailed":
        return [f"{layer.name} [{layer.kind}: {layer.tactic}]".encode() for layer in layers]
    return [layer.name.encode() for layer in layers]
