"""CUDA C kernel sources (.cu) and their tactic descriptions (importable without cuda-python).

Importing this package imports every family module here, which declares its tactics
(base.DECLARED); the built-in plugin (polykit.kernels.builtin) registers them.
"""

import importlib
import pkgutil

#: modules here that are not kernel families (no tactics, no compile variants)
NOT_FAMILIES = frozenset({"base", "wgmma_header", "storage_types", "launch_geometry", "pointwise_expr",
                          "pointwise_signatures", "pointwise_codegen"})

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod not in NOT_FAMILIES:
        importlib.import_module(f"{__name__}.{_mod}")
