"""WorkspacePool (host logic, no GPU): distinct regions per layer, stable pointers, no
allocation while frozen for CUDA-graph capture."""

from __future__ import annotations

import pytest

from polykit.errors import DeviceError
from polykit.runtime.cuda.memory import ALIGN, WorkspacePool


class FakeBuffer:
    next_ptr = 1 << 32

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = FakeBuffer.next_ptr
        FakeBuffer.next_ptr += nbytes + (1 << 24)
        self.freed = False

    def free(self) -> None:
        self.freed = True


def pool() -> WorkspacePool:
    return WorkspacePool(alloc=FakeBuffer)


def test_regions_taken_by_one_layer_do_not_overlap():
    p = pool()
    spans = [(p.take(n), n) for n in (100, 4096, 1, 3 << 20, 77)]
    spans.sort()
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n <= b
    assert all(ptr % ALIGN == 0 for ptr, _ in spans)


def test_growing_keeps_earlier_pointers_alive():
    p = pool()
    first = p.take(64)
    p.take(8 << 20)  # needs a new chunk; the first one must not be freed or moved
    assert not p.chunks[0].freed and p.chunks[0].ptr == first


def test_the_next_layer_reuses_the_same_regions():
    p = pool()
    a = [p.take(n) for n in (512, 2 << 20)]
    p.reset()
    assert [p.take(n) for n in (512, 2 << 20)] == a
    assert len(p.chunks) == 2


def test_a_frozen_pool_serves_what_it_has_and_refuses_to_allocate():
    p = pool()
    p.take(1000)
    p.reset()
    p.frozen = True
    p.take(1000)
    with pytest.raises(DeviceError, match="graph capture"):
        p.take(64 << 20)


def test_free_releases_every_chunk():
    p = pool()
    p.take(10)
    p.take(5 << 20)
    chunks = list(p.chunks)
    p.free()
    assert all(c.freed for c in chunks) and p.nbytes == 0


def test_a_reserved_pool_serves_a_planned_layer_without_allocating():
    allocations = []
    p = WorkspacePool(alloc=lambda n: allocations.append(n) or FakeBuffer(n))
    p.reserve(3 << 20)
    assert allocations == [3 << 20]
    p.frozen = True  # e.g. during CUDA-graph capture: what the plan asked for is there already
    first, second = p.take(1 << 20), p.take(2 << 20)
    assert second == first + (1 << 20) and allocations == [3 << 20]


def test_a_layer_asking_more_than_reserved_grows_the_pool_when_not_frozen():
    p = pool()
    p.reserve(1024)
    p.take(512)
    p.take(4096)
    assert len(p.chunks) == 2 and p.nbytes >= 1024 + 4096
