"""Streams, events and CUDA graphs (capture a stream's work once, replay it)."""

from __future__ import annotations

from typing import Any, Callable

from polykit.runtime.cuda import driver


class Stream:
    """An owned non-blocking stream, or a borrowed handle (an int or CUstream) when `handle` is given."""

    def __init__(self, handle: Any = None):
        d = driver.drv()
        if handle is None:
            self.handle = driver.call("cuStreamCreate", d.CUstream_flags.CU_STREAM_NON_BLOCKING, what="create stream")
            self.owned = True
        else:
            self.handle = handle if isinstance(handle, d.CUstream) else d.CUstream(int(handle))
            self.owned = False

    def synchronize(self) -> None:
        driver.call("cuStreamSynchronize", self.handle, what="stream synchronize")

    def close(self) -> None:
        if self.owned and self.handle is not None:
            driver.call("cuStreamDestroy", self.handle, what="destroy stream")
        self.handle = None


class Event:
    """A CUDA event with timing enabled."""

    def __init__(self):
        self.handle = driver.call("cuEventCreate", driver.drv().CUevent_flags.CU_EVENT_DEFAULT, what="create event")

    def record(self, stream: Stream) -> None:
        driver.call("cuEventRecord", self.handle, stream.handle, what="record event")

    def synchronize(self) -> None:
        driver.call("cuEventSynchronize", self.handle, what="event synchronize")

    def query(self) -> bool:
        """Whether the work before the event is done (a wait that can give up: NCCL peers)."""
        (err,) = driver.drv().cuEventQuery(self.handle)
        if int(err) == int(driver.drv().CUresult.CUDA_ERROR_NOT_READY):
            return False
        if int(err) != 0:
            driver.call("cuEventQuery", self.handle, what="event query")
        return True

    def elapsed_ms(self, start: "Event") -> float:
        return float(driver.call("cuEventElapsedTime", start.handle, self.handle, what="event elapsed time"))

    def close(self) -> None:
        if self.handle is not None:
            driver.call("cuEventDestroy", self.handle, what="destroy event")
            self.handle = None


class CudaGraph:
    """The work `record(stream)` enqueues, captured once and replayed with `launch`."""

    def __init__(self, stream: Stream, record: Callable[[Stream], None]):
        d = driver.drv()
        driver.call("cuStreamBeginCapture", stream.handle,
                    d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, what="begin graph capture")
        try:
            record(stream)
        except BaseException:
            d.cuStreamEndCapture(stream.handle)  # leave the stream usable; the original error wins
            raise
        self.graph = driver.call("cuStreamEndCapture", stream.handle, what="end graph capture")
        self.exec = driver.call("cuGraphInstantiate", self.graph, 0, what="instantiate CUDA graph")

    def launch(self, stream: Stream) -> None:
        driver.call("cuGraphLaunch", self.exec, stream.handle, what="launch CUDA graph")

    def close(self) -> None:
        if self.exec is not None:
            driver.call("cuGraphExecDestroy", self.exec, what="destroy CUDA graph")
            driver.call("cuGraphDestroy", self.graph, what="destroy CUDA graph")
            self.exec = self.graph = None
