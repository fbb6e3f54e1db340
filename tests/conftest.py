"""Test-suite wiring: `gpu`-marked tests run only where a CUDA device is usable, `slow`-marked tests
run first, and the tests that compile kernels share one kernel cache a run."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

from .gpu_guard import sticky_fault
from .run_dirs import run_shared_dir


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
    # `slow`-marked tests first (a stable sort, the same on every xdist worker): a long test that
    # starts late keeps one worker busy while the others have run out of tests
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none usable here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def run_kernel_cache(tmp_path_factory) -> Path:
    """A kernel cache that starts empty in each test run and that every test of the run, on every
    xdist worker, shares: a test that checks units compile points POLYKIT_CACHE_DIR here
    (`shared_kernel_cache`), so a unit two tests need compiles with NVRTC once a run, not once a test.
    A hit is a cubin NVRTC built in this run from the same source, headers, options and arch (the
    cache key); a unit that fails to compile is never stored."""
    return run_shared_dir(tmp_path_factory, "run-kernel-cache")


@pytest.fixture
def shared_kernel_cache(run_kernel_cache, monkeypatch) -> Path:
    """POLYKIT_CACHE_DIR set to this run's shared kernel cache (`run_kernel_cache`) for one test."""
    monkeypatch.setenv("POLYKIT_CACHE_DIR", str(run_kernel_cache))
    return run_kernel_cache


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
