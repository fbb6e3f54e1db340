"""polykit's pytest plugin (entry point `pytest11: polykit`).

- fixture `polykit_accuracy`: polykit.testing.assert_accuracy with the session's target
  (`--polykit-target cpu|cuda`, default: cuda when usable, else cpu) filled in;
- marker `gpu`: the test needs a CUDA GPU; skipped where none is usable.

It imports nothing heavy at load time: pytest loads it in every session of every project
where polykit is installed.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import pytest


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("polykit")
    group.addoption("--polykit-target", default=None, choices=("cpu", "cuda"),
                    help="target for polykit_accuracy (default: cuda when a GPU is usable, else cpu)")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped where none is usable)")


@functools.lru_cache(maxsize=1)
def gpu_usable() -> bool:
    try:
        from polykit.runtime.target import default_target

        return default_target() == "cuda"
    except Exception:
        return False


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked or gpu_usable():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none usable here)")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def polykit_accuracy(request: Any) -> Callable[..., Any]:
    """`polykit_accuracy(model, backends=("trt", "onnxrt"), atol=..., rtol=..., inputs=None, seed=1)`."""
    from polykit.testing import assert_accuracy

    target = request.config.getoption("--polykit-target")
    return functools.partial(assert_accuracy, target=target)
