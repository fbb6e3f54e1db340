"""`python -m tests.tools.polygraphy_examples.perturbed_engine SCRIPT [ARGS]`: run a script written
for Polygraphy (as `python -m polykit.compat` does) with polykit's engine made wrong on purpose:
every floating output of PolykitRunner (TrtRunner) gets PERTURBATION added, so a comparison of
it with onnxruntime fails. The API example tests use it to show the examples' own asserts fail
when the comparison fails."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from polykit.backends.polykit_runner import PolykitRunner
from polykit.compat import run_script

PERTURBATION = 1e-3
_infer = PolykitRunner.infer_impl


def _perturbed(self: PolykitRunner, feed_dict: dict[str, Any]) -> dict[str, Any]:
    return {name: value + np.asarray(PERTURBATION, value.dtype) if np.issubdtype(value.dtype, np.floating) else value
            for name, value in _infer(self, feed_dict).items()}


if __name__ == "__main__":
    PolykitRunner.infer_impl = _perturbed
    run_script(sys.argv[1:])
