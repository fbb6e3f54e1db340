"""The suite's guard against one CUDA fault failing every later gpu test (tests/gpu_guard.py)."""

from __future__ import annotations

from .gpu_guard import STICKY, sticky_fault


class FakeDriver:
    def __init__(self, current: int, sync: int):
        self.current, self.sync, self.synced = current, sync, 0

    def cuCtxGetCurrent(self):
        return 0, self.current

    def cuCtxSynchronize(self):
        self.synced += 1
        return (self.sync,)


def test_a_faulted_context_is_reported_by_its_sticky_code():
    assert 716 in STICKY and 700 in STICKY
    assert sticky_fault(FakeDriver(current=0x1234, sync=716)) == 716


def test_no_context_or_a_usable_one_or_a_non_sticky_error_is_no_fault():
    idle = FakeDriver(current=0, sync=716)
    assert sticky_fault(idle) == 0 and idle.synced == 0  # no context: nothing to synchronize
    assert sticky_fault(FakeDriver(current=0x1234, sync=0)) == 0
    assert sticky_fault(FakeDriver(current=0x1234, sync=2)) == 0  # out of memory: the context is still usable
