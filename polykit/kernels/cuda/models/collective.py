"""Collective layers (kind DistCollective) on the cuda target: NCCL through the context's
communicator (`launcher.communicator`, a polykit.runtime.cuda.nccl.NcclCommunicator).

NCCL concatenates and splits along the flat leading dimension. A layer's `axis` is honoured
by `schedule`: with shape S and outer = prod(S[:axis]) > 1, the input is viewed as
[outer, ranks, chunk] and reordered rank-major ([ranks, outer, chunk]) in a workspace before
the transfer (reduce_scatter, scatter, all_to_all), and a rank-major result is reordered back
([outer, ranks, chunk]) after it (all_gather, gather, all_to_all), with movement.cu's strided
copy. Where outer == 1 (axis 0, or leading dims of 1) NCCL reads and writes the layer's own
tensors. all_reduce, reduce and broadcast are elementwise over ranks and ignore the axis.
all_to_all, gather and scatter are grouped ncclSend/ncclRecv (every NCCL 2.x has them).
On non-root ranks a reduce's or gather's output is left as it was (its contents are
unspecified; the cpu target writes zeros). A group of one rank without a communicator copies
the input to the output (what every collective of one rank computes). Only the whole communicator in rank order serves as a group (`group` must be
0..ranks-1): sub-groups would need communicators split per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, Launcher, cuda_tactic
from polykit.kernels.cuda.movement.movement import copy_kernels, launch_copy

#: ops whose attrs carry a reduction; ops that take a root; ops that split or join along `axis`
REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter"})
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})
AXIAL = frozenset({"all_gather", "gather", "reduce_scatter", "scatter", "all_to_all"})
#: the dtypes NCCL reduces (polykit.runtime.cuda.nccl.REDUCIBLE, not imported: no cuda-python here)
REDUCIBLE_DTYPES = frozenset({"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
                              "bfloat16"})
#: the 256-byte alignment of workspace regions
_ALIGN = 256


@dataclass(frozen=True)
class Reorder:
    """dst[c . dst_strides] = src[c . src_strides] for every index c of `dims` (elements).
    `root_only`: only the root rank runs it (it reorders the root's data)."""

    src: str
    dst: str
    dims: tuple[int, ...]
    src_strides: tuple[int, ...]
    dst_strides: tuple[int, ...]
    root_only: bool = False


@dataclass(frozen=True)
class Transfer:
    """One NCCL step of `op` from buffer `send` into buffer `recv`. `count` (elements): the
    whole tensor for all_reduce/reduce/broadcast, else one rank's chunk (all_gather/gather:
    the input; reduce_scatter/scatter: the output; all_to_all: one of the ranks pieces)."""

    op: str
    send: str
    recv: str
    count: int


Step = Reorder | Transfer


@dataclass(frozen=True)
class Collective:
    """A DistCollective layer's attributes, checked."""

    op: str
    reduce: str
    ranks: int
    group: tuple[int, ...]
    root: int
    axis: int

    @staticmethod
    def of(layer: Any) -> "Collective":
        a = layer.attrs
        ranks = int(a.get("ranks", 1))
        return Collective(str(a.get("op", "")), str(a.get("reduce", "sum")), ranks,
                          tuple(int(g) for g in a.get("group", range(ranks))), int(a.get("root", 0)),
                          int(a.get("axis", 0)))


def schedule(op: str, shape: Sequence[int], axis: int, ranks: int) -> tuple[Step, ...]:
    """The steps of collective `op` on an input of `shape` (buffers "x" in, "y" out, "w0"
    and "w1" workspace of the input's or output's size, whichever is larger)."""
    size = int(np.prod(shape, dtype=np.int64))
    if op not in AXIAL:
        return (Transfer(op, "x", "y", size),)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    if op in ("all_gather", "gather"):
        inner = size // max(outer, 1)
        if outer == 1:
            return (Transfer(op, "x", "y", size),)
        return (Transfer(op, "x", "w0", size),
                Reorder("w0", "y", (ranks, outer, inner), (outer * inner, inner, 1), (inner, ranks * inner, 1),
                        root_only=op == "gather"))
    chunk = size // max(outer, 1) // ranks  # one rank's piece of one outer row
    if outer == 1:
        return (Transfer(op, "x", "y", chunk),)
    rank_major = Reorder("x", "w0", (outer, ranks, chunk), (ranks * chunk, chunk, 1), (chunk, outer * chunk, 1),
                         root_only=op == "scatter")
    if op != "all_to_all":
        return (rank_major, Transfer(op, "w0", "y", outer * chunk))
    return (rank_major, Transfer(op, "w0", "w1", outer * chunk),
            Reorder("w1", "y", (ranks, outer, chunk), (outer * chunk, chunk, 1), (chunk, ranks * chunk, 1)))


def _workspaces(steps: Sequence[Step]) -> list[str]:
    names = {n for s in steps for n in ((s.src, s.dst) if isinstance(s, Reorder) else (s.send, s.recv))}
    return sorted(n for n in names if n.startswith("w"))


def _region(nbytes: int) -> int:
    return -(-max(int(nbytes), 1) // _ALIGN) * _ALIGN


def collective_workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
    """Bytes of the workspace regions the layer's schedule reorders through."""
    c = Collective.of(layer)
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    nbytes = max(int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize for t in (x, y))
    return len(_workspaces(schedule(c.op, tuple(x.shape), c.axis, c.ranks))) * _region(nbytes)


def supports_collective(layer: Any) -> bool:
    """Known op and reduction, the whole group in rank order, a reducible dtype for reductions."""
    try:
        c = Collective.of(layer)
    except (TypeError, ValueError):
        return False
    stored = layer.in_dtypes[0] if layer.in_dtypes else ""
    return (c.op in TRANSFERS and c.ranks >= 1 and c.group == tuple(range(c.ranks)) and 0 <= c.root < c.ranks
            and (c.op not in REDUCING or (c.reduce in ("sum", "prod", "max", "min", "avg")
                                          and (not stored or stored in REDUCIBLE_DTYPES))))


def collective_kernels(layer: Any) -> list:
    """The strided copies an axial collective may reorder through, or a group of one copies
    its input with (none for the others)."""
    c = Collective.of(layer)
    return copy_kernels(layer) if c.op in AXIAL or c.ranks == 1 else []


def _check(c: Collective, comm: Any, x: DeviceTensor, where: str) -> None:
    if comm is None:
        raise DeviceError("a collective layer ran without a communicator", where=where,
                          hint="create the execution context with communicator=NcclCommunicator(...)")
    if comm.ranks != c.ranks:
        raise DeviceError(f"the layer is a collective of {c.ranks} ranks, the communicator has {comm.ranks}",
                          where=where, hint="give each rank the plan built for its group size")
    if c.op in AXIAL and not (0 <= c.axis < max(len(x.shape), 1)):
        raise DeviceError(f"axis {c.axis} is out of range for a rank-{len(x.shape)} input", where=where)
    if c.op in AXIAL - {"all_gather", "gather"} and x.shape and x.shape[c.axis] % c.ranks:
        raise DeviceError(f"{c.op} splits dim {c.axis} of size {x.shape[c.axis]} into {c.ranks} equal chunks, "
                          "which does not divide", where=where, hint="rebuild the plan: the partitioner must keep "
                                                                      "split dims divisible by the rank count")


@dataclass(frozen=True)
class Call:
    """One Transfer as the communicator takes it: device pointers, sizes, this rank's view."""

    comm: Any
    c: Collective
    send: int
    recv: int
    count: int
    dtype: str
    itemsize: int
    stream: Any
    layer: str

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    @property
    def root(self) -> int:
        return self.c.group[self.c.root]

    def chunks(self, base: int) -> list[tuple[int, int, int]]:
        """(pointer, bytes, peer) of each rank's chunk of the buffer at `base`."""
        return [(base + j * self.nbytes, self.nbytes, j) for j in range(self.c.ranks)]

    def at_root(self, transfers: list) -> list:
        return transfers if self.comm.rank == self.root else []


#: op -> how its Transfer runs on the communicator (polykit.runtime.cuda.nccl.NcclCommunicator)
TRANSFERS: dict[str, Callable[[Call], None]] = {
    "all_reduce": lambda k: k.comm.all_reduce(k.send, k.recv, k.count, k.dtype, k.c.reduce, k.stream, k.layer),
    "reduce": lambda k: k.comm.reduce(k.send, k.recv, k.count, k.dtype, k.c.reduce, k.root, k.stream, k.layer),
    "reduce_scatter": lambda k: k.comm.reduce_scatter(k.send, k.recv, k.count, k.dtype, k.c.reduce, k.stream,
                                                      k.layer),
    "broadcast": lambda k: k.comm.broadcast(k.send, k.recv, k.nbytes, k.root, k.stream, k.layer),
    "all_gather": lambda k: k.comm.all_gather(k.send, k.recv, k.nbytes, k.stream, k.layer),
    "all_to_all": lambda k: k.comm.exchange(k.chunks(k.send), k.chunks(k.recv), k.stream, k.layer),
    "gather": lambda k: k.comm.exchange([(k.send, k.nbytes, k.root)], k.at_root(k.chunks(k.recv)), k.stream, k.layer),
    "scatter": lambda k: k.comm.exchange(k.at_root(k.chunks(k.send)), [(k.recv, k.nbytes, k.root)], k.stream,
                                         k.layer),
}


def run_steps(steps: Sequence[Step], c: Collective, comm: Any, ptrs: Mapping[str, int], dtype: np.dtype,
              stream: Any, layer: str, reorder: Callable[[Reorder], None]) -> None:
    """This rank's part of `steps`: transfers through `comm`, reorders through `reorder`."""
    for step in steps:
        if isinstance(step, Reorder):
            if not step.root_only or comm.rank == c.group[c.root]:
                reorder(step)
        else:
            TRANSFERS[step.op](Call(comm, c, ptrs[step.send], ptrs[step.recv], step.count, dtype.name,
                                    dtype.itemsize, stream, layer))


@cuda_tactic("DistCollective", "cuda.collective.nccl", kernels=collective_kernels, supports=supports_collective,
             workspace=collective_workspace)
def enqueue_collective(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    c = Collective.of(layer)
    comm = launcher.communicator
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    where = f"layer {layer.name!r}"
    if comm is None and c.ranks == 1:  # a group of one: every collective returns its input
        launch_copy(launcher, x, y, [x.size], [1], [1], where=where)
        return
    _check(c, comm, x, where)
    steps = schedule(c.op, tuple(x.shape), c.axis, c.ranks)
    region = _region(max(x.size, y.size) * x.dtype.itemsize)
    ptrs = {"x": x.ptr, "y": y.ptr, **{n: launcher.workspace(region) for n in _workspaces(steps)}}

    def reorder(step: Reorder) -> None:
        size = int(np.prod(step.dims, dtype=np.int64))
        launch_copy(launcher, DeviceTensor(ptrs[step.src], (size,), x.dtype),
                    DeviceTensor(ptrs[step.dst], (size,), x.dtype), step.dims, step.src_strides, step.dst_strides,
                    where=where)

    run_steps(steps, c, comm, ptrs, x.dtype, launcher.stream, layer.name, reorder)


def compile_variants() -> list:
    """No kernels of its own: the reorders are movement.cu's strided copies (compiled there)."""
    return []
