"""Weight streaming on the GPU (the schedule: polykit.runtime.weight_streaming).

`StreamedWeights` (one per engine) holds the resident weights in one device buffer, packed, and
the streamed ones in one pinned host buffer (page-locked: the copies are asynchronous and may be
captured in a CUDA graph). `DeviceStreamer` (one per context) owns the scratch ring, a copy
stream and events: before layer i it issues the copies the schedule places there on the copy
stream, each behind an event recorded after the last layer that read the slots it overwrites,
records an event after the copies a layer waits for, and makes the compute stream wait for
layer i's; a run starts with the copy stream waiting for the compute stream (the last run's
layers read the same slots). Copies of layer i+1's weights so overlap layer i's kernels, and a
captured run records the copies, the second stream and the events into the graph.
"""

from __future__ import annotations

import ctypes
from typing import Any, Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.memory import DeviceBuffer, upload
from polykit.runtime.cuda.stream import Stream
from polykit.runtime.weight_streaming import StreamSchedule, align_up


class PinnedBuffer:
    """`nbytes` of page-locked host memory (cuMemAllocHost), freed by `free()`."""

    def __init__(self, nbytes: int, *, what: str = "pinned host buffer"):
        self.nbytes = int(nbytes)
        self.what = what
        self.ptr = 0
        if self.nbytes:
            err, ptr = driver.drv().cuMemAllocHost(self.nbytes)
            if int(err) != 0:
                raise DeviceError(f"cannot allocate {self.nbytes} bytes of pinned host memory for {what}: "
                                  f"{driver.error_name(err)}", hint="free host memory, or raise the streaming budget")
            self.ptr = int(ptr)

    def write(self, offset: int, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        ctypes.memmove(self.ptr + offset, a.ctypes.data, a.nbytes)

    def free(self) -> None:
        if self.ptr:
            driver.call("cuMemFreeHost", self.ptr, what=f"free {self.what}")
            self.ptr = 0


class StreamedWeights:
    """An engine's weights at one budget: the resident ones packed on the device (`tensors`), the
    streamed ones in pinned host memory (`host_offsets`). `schedule` None: every weight resident."""

    def __init__(self, plan: Any, schedule: StreamSchedule | None, allocator: Any = None):
        self.plan = plan
        self.schedule = schedule
        self.allocator = allocator  # the engine's device allocator (None: cuMemAlloc), for the scratch too
        descs = {n: t for n, t in plan.tensors.items() if t.kind == "weight"}
        streamed = set(schedule.streamed) if schedule is not None else set()
        self.resident_offsets: dict[str, int] = {}
        self.host_offsets: dict[str, int] = {}
        for table, names in ((self.resident_offsets, [n for n in descs if n not in streamed]),
                             (self.host_offsets, [n for n in descs if n in streamed])):
            end = 0
            for name in sorted(names):
                table[name] = end
                end += align_up(descs[name].nbytes)
        self.resident = DeviceBuffer(sum(align_up(descs[n].nbytes) for n in self.resident_offsets),
                                     what="resident engine weights", allocator=allocator)
        self.host = None
        try:
            self.host = PinnedBuffer(sum(align_up(descs[n].nbytes) for n in self.host_offsets),
                                     what="streamed engine weights")
            self.tensors = {n: DeviceTensor(self.resident.ptr + off, tuple(descs[n].shape), descs[n].np_dtype)
                            for n, off in self.resident_offsets.items()}
            self.update({n: plan.weights[n] for n in descs})
        except BaseException:
            self.free()
            raise

    def update(self, weights: Mapping[str, np.ndarray]) -> None:
        """New values (the device's work in flight is done): resident ones uploaded, streamed ones
        written to pinned memory, which the next copies read."""
        for name, arr in weights.items():
            desc = self.plan.tensors[name]
            value = np.ascontiguousarray(arr, dtype=desc.np_dtype).reshape(desc.shape)
            if name in self.resident_offsets:
                upload(self.resident.ptr + self.resident_offsets[name], value)
            else:
                self.host.write(self.host_offsets[name], value)

    def streamer(self) -> "DeviceStreamer | None":
        return DeviceStreamer(self) if self.schedule is not None else None

    def free(self) -> None:
        self.resident.free()
        if self.host is not None:
            self.host.free()


def _event() -> Any:
    return driver.call("cuEventCreate", driver.drv().CUevent_flags.CU_EVENT_DISABLE_TIMING, what="create event")


class DeviceStreamer:
    """One context's scratch ring, copy stream and events (the module docstring)."""

    def __init__(self, weights: StreamedWeights):
        schedule = weights.schedule
        self.schedule = schedule
        self._weights = weights
        self._by_issue = schedule.by_issue()
        self._waited = sorted({k for k in schedule.waits if k >= 0})
        afters = sorted({c.after for c in schedule.copies if c.after >= 0})
        self.scratch = DeviceBuffer(schedule.scratch_bytes, what="weight streaming scratch",
                                    allocator=weights.allocator)
        self.copy_stream = Stream()
        self._fork = _event()
        self._done = {layer: _event() for layer in afters}  # recorded after the layers copies wait for
        self._copied = {k: _event() for k in self._waited}  # recorded after the copies layers wait for
        self._last = len(schedule.waits)

    @property
    def nbytes(self) -> int:
        return self.scratch.nbytes

    def before(self, index: int, stream: Stream, tensors: dict[str, DeviceTensor]) -> None:
        if index <= self._last:  # a new run: the copy stream waits for the last run's layers
            driver.call("cuEventRecord", self._fork, stream.handle, what="record event")
            driver.call("cuStreamWaitEvent", self.copy_stream.handle, self._fork, 0, what="stream wait")
            start = 0
        else:
            start = self._last + 1
        host = self._weights.host
        for point in range(start, index + 1):
            for k in self._by_issue.get(point, ()):
                copy = self.schedule.copies[k]
                if copy.after >= 0:
                    driver.call("cuStreamWaitEvent", self.copy_stream.handle, self._done[copy.after], 0,
                                what="stream wait")
                dst = self.scratch.ptr + copy.offset
                driver.call("cuMemcpyHtoDAsync", dst, host.ptr + self._weights.host_offsets[copy.name], copy.nbytes,
                            self.copy_stream.handle, what="weight streaming copy")
                desc = self._weights.plan.tensors[copy.name]
                tensors[copy.name] = DeviceTensor(dst, tuple(desc.shape), desc.np_dtype)
                if k in self._copied:
                    driver.call("cuEventRecord", self._copied[k], self.copy_stream.handle, what="record event")
        self._last = index
        wait = self.schedule.waits[index] if index < len(self.schedule.waits) else -1
        if wait >= 0:
            driver.call("cuStreamWaitEvent", stream.handle, self._copied[wait], 0, what="stream wait")

    def after(self, index: int, stream: Stream) -> None:
        event = self._done.get(index)
        if event is not None:
            driver.call("cuEventRecord", event, stream.handle, what="record event")

    def free(self) -> None:
        self.copy_stream.synchronize()
        for event in [self._fork, *self._done.values(), *self._copied.values()]:
            driver.call("cuEventDestroy", event, what="destroy event")
        self._done, self._copied = {}, {}
        self.copy_stream.close()
        self.scratch.free()
