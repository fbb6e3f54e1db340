"""The ops layer: per op family, the importer and shape rule (`<op>.py`) beside the reference
kernel (`<op>_reference.py`, the numpy oracle), and the tables they fill (registry, references,
elementwise_table). Imports only compiler.ir and polykit's ground.

`load_op_modules()` imports every op module (importers, shape rules, reference kernels), in the
order op_modules() gives, which fills the tables; the built-in plugin calls it.
"""

import importlib
import pkgutil


def op_modules() -> list[str]:
    """Every module of the op families: the importer modules, then the reference kernels, each
    sorted by its own name (the family folder does not count, so registration order is stable)."""
    found = [m.name for m in pkgutil.walk_packages(__path__, prefix=f"{__name__}.") if not m.ispkg]
    leaf = lambda name: name.rsplit(".", 1)[1]
    return sorted(found, key=lambda name: (leaf(name).endswith("_reference"), leaf(name).removesuffix("_reference")))


def load_op_modules() -> None:
    for name in op_modules():
        importlib.import_module(name)
