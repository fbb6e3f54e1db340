"""ONNX's own node test cases, by the case modules that define them, whatever was imported before.

onnx registers a node case when its case module is imported (each `export*` function calls
`expect`, which appends to the shared list `onnx.backend.test.case.node._NodeTestCases`), and
`collect_testcases(op)` leaves a filter behind that makes later imports register only that op.
Reading the shared list therefore depends on what other test modules of the same process
imported first: a resize case showed up among the math family's cases only when the nn module
was collected first. `node_cases(modules)` gives exactly the cases the named modules define:
each module is imported (or re-imported, if something else imported it before this helper saw
it) on its own, with the filter cleared, and the cases it appended are remembered per module.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, Iterable

_BY_MODULE: dict[str, list[Any]] = {}


def _module_cases(mod: str) -> list[Any]:
    if mod in _BY_MODULE:
        return _BY_MODULE[mod]
    import onnx.backend.test.case.node as node

    name = f"onnx.backend.test.case.node.{mod}"
    saved, node._TargetOpType = node._TargetOpType, None
    start = len(node._NodeTestCases)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if name in sys.modules:
                importlib.reload(sys.modules[name])
            else:
                importlib.import_module(name)
    finally:
        node._TargetOpType = saved
    _BY_MODULE[mod] = list(node._NodeTestCases[start:])
    return _BY_MODULE[mod]


def node_cases(modules: Iterable[str]) -> dict[str, Any]:
    """name -> onnx TestCase of every case (with a model) that the named case modules define."""
    out: dict[str, Any] = {}
    for mod in modules:
        for case in _module_cases(mod):
            if case.model is not None:
                out.setdefault(case.name, case)
    return out
