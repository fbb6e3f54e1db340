"""Shape-tensor values staged in pinned host memory, one block per shape set.

A plan built with profiles computes some small tensors on the host (shape-tensor values:
Range limits, Reshape targets, masks of the bound sizes) and writes them into the arena before
the launches of every run. Copied from pageable numpy memory, each cuMemcpyHtoDAsync first waits
for the stream (the driver stages pageable copies synchronously), so every enqueue waited for
the previous run to finish: the host and the GPU took turns. The values are fixed for a shape set,
so they are packed once into page-locked memory and copied from there: the copies are truly
asynchronous and enqueue returns at once. The blocks stay while their shape set is cached
(bounded like the CUDA-graph replays); one leaves only after the stream that reads it drains.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from typing import Any, Callable, Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.memory import align_up

#: pinned blocks a context keeps, one per shape set (polykit.runtime.engine.MAX_REPLAYS alike)
MAX_STAGED = 16


class PinnedBlock:
    """`nbytes` of page-locked host memory, freed by `free()`."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        err, ptr = driver.drv().cuMemHostAlloc(self.nbytes, 0)
        if int(err) != 0:
            raise DeviceError(f"cannot allocate {self.nbytes} bytes of pinned host memory for shape values: "
                              f"{driver.error_name(err)}", hint="free host memory, or use fewer contexts")
        self.ptr = int(ptr)

    def write(self, offset: int, array: np.ndarray) -> None:
        if offset + array.nbytes > self.nbytes:
            raise DeviceError(f"{array.nbytes} bytes at {offset} do not fit a pinned block of {self.nbytes}",
                              hint="please report this")
        ctypes.memmove(self.ptr + offset, array.ctypes.data, array.nbytes)

    def free(self) -> None:
        if self.ptr:
            driver.call("cuMemFreeHost", self.ptr, what="free pinned shape values")
            self.ptr = 0


class StagedValues:
    """Per shape-set key, the values packed in one pinned block; `copy` issues their
    host-to-device copies on a stream."""

    def __init__(self) -> None:
        self._blocks: OrderedDict[tuple, tuple[PinnedBlock, list[tuple[str, int, int]]]] = OrderedDict()

    def copy(self, key: tuple, values: Mapping[str, np.ndarray], pointer: Callable[[str], int], stream: Any) -> None:
        entry = self._blocks.get(key)
        if entry is None:
            entry = self._stage(values)
            self._blocks[key] = entry
            if len(self._blocks) > MAX_STAGED:
                _, (old, _) = self._blocks.popitem(last=False)
                driver.call("cuCtxSynchronize", what="drain copies of evicted shape values")  # any stream may read it
                old.free()
        else:
            self._blocks.move_to_end(key)
        block, parts = entry
        for name, offset, nbytes in parts:
            driver.call("cuMemcpyHtoDAsync", pointer(name), block.ptr + offset, nbytes, stream,
                        what=f"copy of shape values {name!r}")

    @staticmethod
    def _stage(values: Mapping[str, np.ndarray]) -> tuple[PinnedBlock, list[tuple[str, int, int]]]:
        arrays = {name: np.ascontiguousarray(v) for name, v in values.items()}
        parts, offset = [], 0
        for name, a in arrays.items():
            if a.nbytes:
                parts.append((name, offset, a.nbytes))
                offset += align_up(a.nbytes, 16)
        block = PinnedBlock(offset)
        for name, start, _ in parts:
            block.write(start, arrays[name])
        return block, parts

    def free(self) -> None:
        for block, _ in self._blocks.values():
            block.free()
        self._blocks.clear()
