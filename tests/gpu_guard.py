"""A CUDA fault in one gpu test must not fail every later test of its process.

After a kernel faults (an illegal or misaligned address, a trap) the process's CUDA context stays
unusable: every later driver call returns the same error. The first H100 run of 2026-12-05 lost
~40 tests of one xdist worker that way, all failing with another test's misaligned-address fault.
The suite's conftest checks the context after each gpu test (`sticky_fault`); on a fault, an xdist
worker exits (xdist reports the test as crashed and starts a fresh worker) and a single process
skips its remaining gpu tests, naming the test that faulted.
"""

from __future__ import annotations

from typing import Any

#: driver status codes after which a context stays unusable: ILLEGAL_ADDRESS, HARDWARE_STACK_ERROR,
#: ILLEGAL_INSTRUCTION, MISALIGNED_ADDRESS, INVALID_ADDRESS_SPACE, INVALID_PC, LAUNCH_FAILED
STICKY = frozenset({700, 714, 715, 716, 717, 718, 719})


def sticky_fault(driver: Any) -> int:
    """The sticky error code of the calling thread's current CUDA context, or 0 (no context, or a
    usable one). `driver`: cuda.bindings.driver (or a stand-in with cuCtxGetCurrent and
    cuCtxSynchronize)."""
    err, ctx = driver.cuCtxGetCurrent()
    try:
        current = int(ctx)
    except (TypeError, ValueError):
        current = 0
    if int(err) != 0 or not current:
        return 0
    (err,) = driver.cuCtxSynchronize()
    return int(err) if int(err) in STICKY else 0
