"""Scripts written for Polygraphy, run without it.

`polykit.compat.polygraphy` holds the part of Polygraphy's API that scripts and its API examples
use, on polykit's code: `polygraphy.json` (save_json, load_json: Polygraphy's JSON format),
`polygraphy.comparator` (RunResults, Comparator, CompareFunc, DataLoader), `polygraphy.backend.trt`
(TrtRunner over polykit's engine, EngineFromNetwork(NetworkFromOnnxPath(...)), EngineFromBytes,
SaveEngine, CreateConfig, Profile, Calibrator: polykit plans), `polygraphy.backend.onnxrt`,
`polygraphy.backend.common`, `polygraphy.logger` and `polygraphy.func` (docs/POLYGRAPHY.md, API).
`install_polygraphy_alias()` makes `import polygraphy...` resolve to them, only when Polygraphy
itself cannot be imported, so a real install always wins:

    python -m polykit.compat data_loader.py [ARGS]     # runs the script with the alias

Anything else of Polygraphy's (TensorRT's network API, its CLI internals) is not there: importing
it raises ModuleNotFoundError naming the module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Any, Sequence

ALIAS, TARGET = "polygraphy", "polykit.compat.polygraphy"


class _PolygraphyAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `polygraphy[.x]` as `polykit.compat.polygraphy[.x]` (the same module objects)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS):]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname == ALIAS)

    def create_module(self, spec: Any) -> Any:
        return importlib.import_module(TARGET + spec.name[len(ALIAS):])

    def exec_module(self, module: Any) -> None:
        pass  # the polykit module ran when it was imported


def polygraphy_installed() -> bool:
    """Whether a real Polygraphy is importable (the alias not counted)."""
    return any(not isinstance(finder, _PolygraphyAlias) and finder.find_spec(ALIAS, None) is not None
               for finder in sys.meta_path if hasattr(finder, "find_spec"))


def install_polygraphy_alias() -> bool:
    """Let `import polygraphy...` resolve to polykit.compat.polygraphy unless Polygraphy is
    installed (or already imported); True when the alias is in place."""
    if any(isinstance(finder, _PolygraphyAlias) for finder in sys.meta_path):
        return True
    if ALIAS in sys.modules or polygraphy_installed():
        return False
    sys.meta_path.append(_PolygraphyAlias())  # last: never in front of a real install
    return True


def run_script(argv: Sequence[str]) -> None:
    """`python -m polykit.compat SCRIPT [ARGS]`: run SCRIPT as __main__ with the alias."""
    import runpy

    if not argv:
        raise SystemExit("usage: python -m polykit.compat SCRIPT [ARGS...]  (runs a script written for Polygraphy)")
    install_polygraphy_alias()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")
