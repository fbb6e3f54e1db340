"""Test-suite wiring: `gpu`-marked tests run only where a CUDA device is usable."""

from __future__ import annotations

import functools
import os
import sys

import pytest

from .gpu_guard import sticky_fault


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return False
        err, count = driver.cuDeviceGetCount()
        return int(err) == 0 and count > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none usable here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: the gpu test after which this process's CUDA context faulted (tests/gpu_guard.py)
_FAULTED: list[str] = []


@pytest.fixture(autouse=True)
def _cuda_fault_guard(request):
    """After a gpu test, a faulted CUDA context ends this xdist worker (xdist reports the test as
    crashed and starts a fresh one) or, in a single process, skips the remaining gpu tests."""
    if "gpu" not in request.keywords:
        yield
        return
    if _FAULTED:
        pytest.skip(f"the CUDA context of this process faulted in {_FAULTED[0]}")
    yield
    try:
        from cuda.bindings import driver

        code = sticky_fault(driver)
    except Exception:  # the guard never turns a test's teardown into an error of its own
        code = 0
    if code:
        _FAULTED.append(request.node.nodeid)
        if os.environ.get("PYTEST_XDIST_WORKER"):
            sys.stderr.write(f"\n{request.node.nodeid} left the CUDA context faulted (error {code}); "
                             "ending this worker so the next tests get a fresh one\n")
            sys.stderr.flush()
            os._exit(3)
