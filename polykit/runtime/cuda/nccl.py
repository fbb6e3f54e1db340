"""NCCL through NVIDIA's nccl4py (the optional `multi-gpu` extra): one communicator per rank.

    uid = nccl_unique_id()                                # once, in the process that starts the ranks
    comm = NcclCommunicator(rank, ranks, uid, device=rank, timeout_s=60)
    ctx = engine.create_execution_context(communicator=comm)

The communicator is non-blocking (ncclConfig_t.blocking = 0), so nothing here waits without
a deadline: joining polls ncclCommGetAsyncError until the group is complete, and `wait(stream)`
polls an event behind the enqueued collectives; past `timeout_s` the communicator is aborted
(ncclCommAbort ends its in-flight kernels) and a RankError names this rank and the last
collective layer enqueued. Collectives are enqueued on the caller's stream, so a CUDA-graph
capture of the layer loop records them. NVLink SHARP (multicast objects) stays off:
NCCL_NVLS_ENABLE=0 is set before the first NCCL call. The NCCL library (libnccl.so.2) is
loaded on the first call, so importing this module needs neither nccl4py nor a GPU.

Buffers are device pointers; movement collectives (broadcast, all_gather, send/recv) move
bytes, reductions take the element type. Counts follow NCCL: all_gather's is per rank,
reduce_scatter's is the output's.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, Sequence

from polykit.errors import DeviceError, RankError, UsageError
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.stream import Event, Stream

#: the environment every NCCL process runs with: no NVLink SHARP, so no multicast objects
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}

_INSTALL_HINT = "pip install 'polykit[multi-gpu]' (nccl4py) and the NCCL library (nvidia-nccl-cu12 or -cu13)"

#: numpy dtype name -> NCCL data type name (types NCCL can reduce)
REDUCIBLE = {"int8": "Int8", "uint8": "Uint8", "int32": "Int32", "uint32": "Uint32", "int64": "Int64",
             "uint64": "Uint64", "float16": "Float16", "float32": "Float32", "float64": "Float64",
             "bfloat16": "Bfloat16"}

#: the `reduce` attribute of a DistCollective -> NCCL reduction op name
REDUCE_OPS = {"sum": "Sum", "prod": "Prod", "max": "Max", "min": "Min", "avg": "Avg"}

#: the layer kind of collectives (one input, one output; attrs op, reduce, ranks, group, root, axis)
COLLECTIVE_KIND = "DistCollective"

#: one side of a point-to-point transfer: (device pointer, bytes, peer rank)
Transfer = tuple[int, int, int]


@functools.lru_cache(maxsize=1)
def bindings() -> Any:
    """The nccl.bindings.nccl module; DeviceError when nccl4py is not installed."""
    try:
        from nccl.bindings import nccl
    except ImportError as exc:
        raise DeviceError(f"nccl4py is not installed ({exc})", hint=_INSTALL_HINT) from None
    return nccl


def unusable_reason() -> str | None:
    """Why NCCL cannot run here (no nccl4py, no libnccl.so.2), or None when it can."""
    try:
        nc = bindings()
        nc.get_version()
    except DeviceError as exc:
        return exc.what
    except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError when libnccl.so.2 is missing
        return f"the NCCL library cannot be loaded: {type(exc).__name__}: {exc}"
    return None


def _call(fn: Callable[..., Any], *args: Any, what: str) -> Any:
    """A nccl4py call; its failures (an NCCL error, a missing libnccl) as DeviceError."""
    try:
        return fn(*args)
    except Exception as exc:
        raise DeviceError(f"{what} failed: {type(exc).__name__}: {exc}", hint=_INSTALL_HINT
                          if "libnccl" in str(exc) else "see NCCL_DEBUG=WARN output for the cause") from None


def check_communicator(plan: Any, communicator: Any, device: int) -> Any:
    """The communicator a context of `plan` on CUDA device `device` runs with: required when
    the plan has collective layers over several ranks (over one, each copies its input), and
    of the plan's rank and group size (metadata)."""
    layers = [layer.name for layer in plan.layers
              if layer.kind == COLLECTIVE_KIND and int(layer.attrs.get("ranks", 1)) > 1]
    if communicator is None:
        if layers:
            raise UsageError(f"the plan has {len(layers)} collective layer(s) (first {layers[0]!r}) and the "
                             "context no communicator",
                             hint="create it with communicator=NcclCommunicator(rank, ranks, uid, device), or run "
                                  "the rank plans as processes with polykit.backends.rank_processes.run_ranks")
        return None
    for key in ("rank", "ranks"):
        want = plan.metadata.get(key)
        if want is not None and int(want) != getattr(communicator, key):
            raise RankError(f"rank {communicator.rank}: the plan was built for {key} {want}, the communicator "
                            f"has {key} {getattr(communicator, key)}",
                            hint="give each rank the plan written for it (model.rank<i>.plan) and one group size")
    if getattr(communicator, "device", device) != device:
        raise UsageError(f"the communicator of rank {communicator.rank} is on CUDA device {communicator.device}, "
                         f"the engine on device {device}", hint="load the engine and the communicator on one device")
    return communicator


def nccl_unique_id() -> bytes:
    """A new NCCL unique id (128 bytes): made once and given to every rank of a group."""
    os.environ.update(NCCL_ENV)
    nc = bindings()
    return bytes(_call(nc.get_unique_id, what="ncclGetUniqueId"))


class NcclCommunicator:
    """Rank `rank` of an NCCL group of `ranks`, on CUDA device `device` (an ordinal of this
    process, never remapped). Every wait gives up after `timeout_s` with a RankError."""

    def __init__(self, rank: int, ranks: int, unique_id: bytes, device: int, timeout_s: float = 60.0):
        if not 0 <= rank < ranks:
            raise UsageError(f"rank {rank} is outside a group of {ranks} ranks", hint="use ranks 0 .. ranks-1")
        if len(unique_id) != 128:
            raise UsageError(f"an NCCL unique id has 128 bytes, got {len(unique_id)}",
                             hint="pass the bytes nccl_unique_id() returned in the parent process")
        if timeout_s <= 0:
            raise UsageError(f"timeout_s must be positive, got {timeout_s}")
        os.environ.update(NCCL_ENV)
        self.rank, self.ranks, self.device, self.timeout_s = rank, ranks, device, float(timeout_s)
        self._last = "none yet"
        self._comm: Any = None
        driver.current_device(device)
        nc = self._nc = bindings()
        config = nc.Config()
        config.blocking = 0
        self._uid = bytes(unique_id)
        uid = nc.UniqueId.from_buffer(bytearray(self._uid))
        self._comm = _call(nc.comm_init_rank_config, ranks, uid, rank, config,
                           what=f"ncclCommInitRank (rank {rank} of {ranks}, device {device})")
        self._settle(f"join the {ranks}-rank NCCL group on device {device}")

    # ---- health ---------------------------------------------------------------------------
    def _state(self) -> int:
        return int(_call(self._nc.comm_get_async_error, self._comm, what="ncclCommGetAsyncError"))

    def _fail(self, what: str, hint: str) -> RankError:
        self.abort()
        return RankError(f"rank {self.rank} of {self.ranks}: {what}", where=f"collective layer {self._last!r}",
                         hint=hint)

    def _check(self, state: int) -> None:
        if state not in (int(self._nc.Result.Success), int(self._nc.Result.InProgress)):
            name = _call(self._nc.get_error_string, state, what="ncclGetErrorString")
            raise self._fail(f"NCCL reported {name} ({state})", "a peer rank failed or was aborted; check every "
                                                                "rank's error (NCCL_DEBUG=WARN says more)")

    def _settle(self, what: str) -> None:
        """Poll until the communicator leaves ncclInProgress; RankError on an error or timeout."""
        success = int(self._nc.Result.Success)
        self._poll(lambda state: state == success, f"timed out after {self.timeout_s:g} s waiting to {what}")

    def _poll(self, done: Callable[[int], bool], late: str) -> None:
        """Until done(NCCL's state), checking the state for errors; RankError saying `late` once
        timeout_s has passed (the communicator is aborted then)."""
        deadline = time.monotonic() + self.timeout_s
        pause = 1e-5
        while True:
            state = self._state()
            self._check(state)
            if done(state):
                return
            if time.monotonic() > deadline:
                raise self._fail(late, "a peer rank did not arrive (crashed, hung, or runs another plan); check "
                                       "every rank, or raise the timeout")
            time.sleep(pause)
            pause = min(pause * 2, 0.002)

    def _live(self) -> Any:
        if self._comm is None:
            raise RankError(f"rank {self.rank}: the NCCL communicator is closed or was aborted",
                            where=f"collective layer {self._last!r}", hint="create a new communicator")
        return self._comm

    def _enqueue(self, layer: str, what: str, stream: Any, fn: Callable[..., Any], *args: Any) -> None:
        """fn(*args, comm, stream): one NCCL collective, then wait out ncclInProgress."""
        comm = self._live()
        self._last = layer or what
        _call(fn, *args, comm, _handle(stream), what=f"{what} (rank {self.rank}, layer {layer!r})")
        self._settle(f"enqueue {what}")

    # ---- collectives (device pointers, on `stream`: a CUstream or handle int) --------------
    def all_reduce(self, send: int, recv: int, count: int, dtype: str, op: str, stream: Any, layer: str = "") -> None:
        self._enqueue(layer, "ncclAllReduce", stream, self._nc.all_reduce, send, recv, count,
                      self._type(dtype, layer), self._op(op))

    def reduce(self, send: int, recv: int, count: int, dtype: str, op: str, root: int, stream: Any,
               layer: str = "") -> None:
        self._enqueue(layer, "ncclReduce", stream, self._nc.reduce, send, recv, count, self._type(dtype, layer),
                      self._op(op), root)

    def reduce_scatter(self, send: int, recv: int, recv_count: int, dtype: str, op: str, stream: Any,
                       layer: str = "") -> None:
        self._enqueue(layer, "ncclReduceScatter", stream, self._nc.reduce_scatter, send, recv, recv_count,
                      self._type(dtype, layer), self._op(op))

    def broadcast(self, send: int, recv: int, nbytes: int, root: int, stream: Any, layer: str = "") -> None:
        self._enqueue(layer, "ncclBroadcast", stream, self._nc.broadcast, send, recv, nbytes,
                      int(self._nc.DataType.Uint8), root)

    def all_gather(self, send: int, recv: int, nbytes: int, stream: Any, layer: str = "") -> None:
        """Each rank's `nbytes` at `send` land at recv + rank * nbytes on every rank."""
        self._enqueue(layer, "ncclAllGather", stream, self._nc.all_gather, send, recv, nbytes,
                      int(self._nc.DataType.Uint8))

    def exchange(self, sends: Sequence[Transfer], recvs: Sequence[Transfer], stream: Any, layer: str = "") -> None:
        """Point-to-point transfers in one NCCL group (all_to_all, gather, scatter)."""
        comm, nc, handle = self._live(), self._nc, _handle(stream)
        self._last = layer or "send/recv"
        byte = int(nc.DataType.Uint8)
        _call(nc.group_start, what="ncclGroupStart")
        try:
            for ptr, nbytes, peer in sends:
                _call(nc.send, ptr, nbytes, byte, peer, comm, handle, what=f"ncclSend to rank {peer}")
            for ptr, nbytes, peer in recvs:
                _call(nc.recv, ptr, nbytes, byte, peer, comm, handle, what=f"ncclRecv from rank {peer}")
        finally:
            _call(nc.group_end, what="ncclGroupEnd")
        self._settle("enqueue grouped send/recv")

    def _type(self, dtype: str, layer: str) -> int:
        name = REDUCIBLE.get(dtype)
        if name is None:
            raise DeviceError(f"NCCL cannot reduce {dtype} tensors", where=f"layer {layer!r}",
                              hint=f"reduce one of {', '.join(REDUCIBLE)}, or run the plan on --target cpu")
        return int(getattr(self._nc.DataType, name))

    def _op(self, op: str) -> int:
        if op not in REDUCE_OPS:
            raise DeviceError(f"unknown reduction {op!r}", hint=f"use one of {', '.join(REDUCE_OPS)}")
        return int(getattr(self._nc.RedOp, REDUCE_OPS[op]))

    # ---- waiting, shutting down -------------------------------------------------------------
    def wait(self, stream: Any) -> None:
        """Return once the work enqueued on `stream` is done; RankError (communicator aborted)
        when it is not done within timeout_s, or when NCCL reports a failed peer."""
        self._live()
        driver.current_device(self.device)
        event = Event()
        try:
            event.record(stream if isinstance(stream, Stream) else Stream(stream))
            self._poll(lambda state: event.query(),
                       f"the enqueued collectives did not complete within {self.timeout_s:g} s")
        finally:
            event.close()

    def abort(self) -> None:
        """End the communicator now, in-flight collectives included (ncclCommAbort)."""
        comm, self._comm = getattr(self, "_comm", None), None
        if comm is not None:
            try:
                self._nc.comm_abort(comm)
            except Exception:  # already failing: the abort is best effort, the original error wins
                pass

    def close(self) -> None:
        """Finalize and destroy the communicator (abort it when finalizing does not finish)."""
        comm = getattr(self, "_comm", None)
        if comm is None:
            return
        try:
            _call(self._nc.comm_finalize, comm, what="ncclCommFinalize")
            self._settle("finalize the NCCL communicator")
        except (DeviceError, RankError):
            self.abort()
            return
        self._comm = None
        _call(self._nc.comm_destroy, comm, what="ncclCommDestroy")

    def __enter__(self) -> "NcclCommunicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NcclCommunicator(rank={self.rank}, ranks={self.ranks}, device={self.device})"


def _handle(stream: Any) -> int:
    """A stream (polykit Stream, CUstream or int) as the integer NCCL's bindings take."""
    return int(getattr(stream, "handle", stream) or 0)
