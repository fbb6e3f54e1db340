"""CUDA kernels: their C sources (src/, one family per .cu file) and their tactic descriptions,
one sub-package per family (importable without cuda-python).

Importing this package imports every family module, which declares its tactics
(base.DECLARED); the built-in plugin (polykit.kernels.builtin) registers them.
"""

import importlib
import pkgutil

#: modules here that are not kernel families (no tactics, no compile variants)
NOT_FAMILIES = frozenset({"base", "wgmma_header", "storage_types", "launch_geometry", "pointwise_expr",
                          "pointwise_signatures", "pointwise_codegen", "row_geometry", "pointwise_views", "pdl"})



def kernel_modules() -> list[str]:
    """Every module of the family sub-packages and this package, sorted by its own name (the family
    folder does not count, so tactics declare in the same order wherever a module lives)."""
    found = [m.name for m in pkgutil.walk_packages(__path__, prefix=f"{__name__}.") if not m.ispkg]
    return sorted(found, key=lambda name: (name.rsplit(".", 1)[1], name))


def family_modules() -> list[str]:
    """The kernel family modules (each declares tactics or compile variants)."""
    return [name for name in kernel_modules() if name.rsplit(".", 1)[1] not in NOT_FAMILIES]


def all_compile_variants() -> list:
    """Every KernelSource the modules declare for CI's NVRTC compile (each module's `compile_variants()`)."""
    out = []
    for name in kernel_modules():
        module = importlib.import_module(name)
        if hasattr(module, "compile_variants"):
            out.extend(module.compile_variants())
    return out


for _mod in family_modules():
    importlib.import_module(_mod)
