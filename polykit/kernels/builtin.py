"""polykit's own ops and tactics, registered through the same hooks a plugin uses.

Importing this module is cheap (it runs at `polykit --help`): the op modules and the
kernel families are imported inside the hooks, the cuda families only for the cuda target.
"""

from __future__ import annotations

import importlib
from typing import Any

from polykit.plugins import hookimpl

#: target -> (module, attribute) of the list its tactic families declare into
_TACTIC_FAMILIES = {
    "cpu": ("polykit.kernels.cpu", "polykit.kernels.cpu.base"),
    "cuda": ("polykit.kernels.cuda", "polykit.kernels.cuda.base"),
}


@hookimpl
def polykit_ops(registry: Any) -> None:
    # the op modules' decorators are the registry's functions (compiler.registry, kernels.registry)
    importlib.import_module("polykit.compiler.ops").load_op_modules()


@hookimpl
def polykit_tactics(registry: Any) -> None:
    families = _TACTIC_FAMILIES.get(registry.target)
    if families is None:
        return
    package, base = families
    importlib.import_module(package)
    registry.register_all(importlib.import_module(base).DECLARED)
