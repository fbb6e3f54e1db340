"""cpu tactics: numpy implementations the builder times against the reference kernels.

`cpu.reference` (the op's reference kernel, base.py) runs every layer and stays each layer's
conservative tactic; the family modules here add real alternatives for the layers where the
algorithm matters (convolution, matrix products, pooling). Each computes in the reference's
accumulator dtype (float64 for floats), so it agrees with the reference to float rounding.
Importing this package imports every family module, which declares its tactics.
"""

import importlib
import pkgutil

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod != "base":
        importlib.import_module(f"{__name__}.{_mod}")
