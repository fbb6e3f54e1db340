"""The cuda collective tactic's host side without a GPU: its schedule (NCCL transfers plus
reorders for an axis other than the leading one) run by simulated ranks — NCCL's semantics
in numpy over per-rank byte memories — against each collective's numpy definition, for 1-4
ranks, several axes and dtypes; and the checks that refuse what it cannot run."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.models.collective import (Collective, Reorder, collective_kernels, collective_workspace,
                                             enqueue_collective, run_steps, schedule, supports_collective)
from tests.kernels.cuda.recording_launcher import RecordingLauncher

REDUCERS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def reduce_all(arrays, op):
    if op == "avg":
        total = reduce_all(arrays, "sum")
        return (total / len(arrays)).astype(arrays[0].dtype)
    out = arrays[0].copy()
    for a in arrays[1:]:
        out = REDUCERS[op](out, a).astype(out.dtype)
    return out


class World:
    """NCCL's semantics over one byte memory per rank: each rank posts its call of a step,
    `resolve` then runs the collective across the ranks."""

    def __init__(self, ranks: int, nbytes: int):
        self.mem = [np.zeros(nbytes, np.uint8) for _ in range(ranks)]
        self.posted: dict[int, tuple] = {}

    def view(self, rank, ptr, nbytes, dtype=np.uint8):
        return self.mem[rank][ptr:ptr + nbytes].view(dtype)

    def resolve(self):
        ranks = len(self.mem)
        if not self.posted:
            return
        assert sorted(self.posted) == list(range(ranks)), f"only ranks {sorted(self.posted)} posted"
        kinds = {call[0] for call in self.posted.values()}
        assert len(kinds) == 1, f"ranks posted different collectives {kinds}"
        kind = kinds.pop()
        getattr(self, kind)({r: call[1:] for r, call in self.posted.items()})
        self.posted = {}

    def _typed(self, r, ptr, count, dtype):
        return self.view(r, ptr, count * np.dtype(dtype).itemsize, np.dtype(dtype)).copy()

    def all_reduce(self, calls, root=None):
        red = reduce_all([self._typed(r, c[0], c[2], c[3]) for r, c in calls.items()], calls[0][4])
        for r, c in calls.items():
            if root is None or r == root:
                self.view(r, c[1], red.nbytes, red.dtype)[:] = red

    def reduce(self, calls):
        roots = {c[5] for c in calls.values()}
        assert len(roots) == 1
        self.all_reduce(calls, root=roots.pop())

    def reduce_scatter(self, calls):
        n = len(calls)
        red = reduce_all([self._typed(r, c[0], c[2] * n, c[3]) for r, c in calls.items()], calls[0][4])
        for r, c in calls.items():
            piece = red[r * c[2]:(r + 1) * c[2]]
            self.view(r, c[1], piece.nbytes, piece.dtype)[:] = piece

    def broadcast(self, calls):
        send, _, nbytes, root = calls[0][:4]
        data = self.view(root, calls[root][0], nbytes).copy()
        for r, c in calls.items():
            self.view(r, c[1], nbytes)[:] = data

    def all_gather(self, calls):
        nbytes = calls[0][2]
        datas = [self.view(r, calls[r][0], nbytes).copy() for r in range(len(calls))]
        for r, c in calls.items():
            for j, d in enumerate(datas):
                self.view(r, c[1] + j * nbytes, nbytes)[:] = d

    def exchange(self, calls):
        sent = {(r, peer): [] for r in calls for peer in calls}
        for r, (sends, _) in calls.items():
            for ptr, nbytes, peer in sends:
                sent[(r, peer)].append(self.view(r, ptr, nbytes).copy())
        for r, (_, recvs) in calls.items():
            for ptr, nbytes, peer in recvs:
                assert sent[(peer, r)], f"rank {r} receives from {peer}, which sends it nothing"
                data = sent[(peer, r)].pop(0)
                assert data.nbytes == nbytes, f"rank {r} receives {nbytes} B from {peer}, which sends {data.nbytes}"
                self.view(r, ptr, nbytes)[:] = data
        assert not any(sent.values()), "a send has no matching receive"


class FakeComm:
    def __init__(self, world: World, rank: int, ranks: int):
        self.world, self.rank, self.ranks = world, rank, ranks

    def _post(self, *call):
        self.world.posted[self.rank] = call

    def all_reduce(self, send, recv, count, dtype, op, stream, layer):
        self._post("all_reduce", send, recv, count, dtype, op)

    def reduce(self, send, recv, count, dtype, op, root, stream, layer):
        self._post("reduce", send, recv, count, dtype, op, root)

    def reduce_scatter(self, send, recv, count, dtype, op, stream, layer):
        self._post("reduce_scatter", send, recv, count, dtype, op)

    def broadcast(self, send, recv, nbytes, root, stream, layer):
        self._post("broadcast", send, recv, nbytes, root)

    def all_gather(self, send, recv, nbytes, stream, layer):
        self._post("all_gather", send, recv, nbytes)

    def exchange(self, sends, recvs, stream, layer):
        self._post("exchange", list(sends), list(recvs))


def simulate(op, xs, axis, reduce="sum", root=0):
    """Run the tactic's schedule on len(xs) simulated ranks; each rank's output."""
    ranks, x0 = len(xs), xs[0]
    out_shape = list(x0.shape)
    if op in ("all_gather", "gather"):
        out_shape[axis] *= ranks
    elif op in ("reduce_scatter", "scatter"):
        out_shape[axis] //= ranks
    region = -(-max(x0.nbytes, int(np.prod(out_shape)) * x0.itemsize) // 256) * 256
    ptrs = {"x": 0, "y": region, "w0": 2 * region, "w1": 3 * region}
    world = World(ranks, 4 * region)
    for r, x in enumerate(xs):
        world.view(r, 0, x.nbytes)[:] = x.reshape(-1).view(np.uint8)
    c = Collective(op, reduce, ranks, tuple(range(ranks)), root, axis)
    comms = [FakeComm(world, r, ranks) for r in range(ranks)]

    def reorder_on(rank):
        def reorder(step: Reorder):
            es = x0.itemsize
            src = world.view(rank, ptrs[step.src], region, np.uint8).view(x0.dtype)
            dst = world.view(rank, ptrs[step.dst], region, np.uint8).view(x0.dtype)
            strided = np.lib.stride_tricks.as_strided
            strided(dst, step.dims, [s * es for s in step.dst_strides])[...] = \
                strided(src, step.dims, [s * es for s in step.src_strides])
        return reorder

    for step in schedule(op, x0.shape, axis, ranks):
        for r in range(ranks):
            run_steps([step], c, comms[r], ptrs, x0.dtype, None, "layer", reorder_on(r))
        world.resolve()
    nbytes = int(np.prod(out_shape)) * x0.itemsize
    return [world.view(r, region, nbytes, x0.dtype).reshape(out_shape) for r in range(ranks)]


def expected(op, xs, axis, reduce="sum", root=0):
    """Each rank's output by the interface's definition (None where it is unspecified)."""
    ranks = len(xs)
    if op == "all_reduce":
        return [reduce_all(xs, reduce)] * ranks
    if op == "reduce":
        return [reduce_all(xs, reduce) if r == root else None for r in range(ranks)]
    if op == "broadcast":
        return [xs[root]] * ranks
    if op == "all_gather":
        return [np.concatenate(xs, axis)] * ranks
    if op == "gather":
        return [np.concatenate(xs, axis) if r == root else None for r in range(ranks)]
    if op == "reduce_scatter":
        return np.split(reduce_all(xs, reduce), ranks, axis)
    if op == "scatter":
        return np.split(xs[root], ranks, axis)
    return [np.concatenate([np.split(xs[j], ranks, axis)[r] for j in range(ranks)], axis) for r in range(ranks)]


OPS = ["all_reduce", "reduce", "broadcast", "all_gather", "gather", "reduce_scatter", "scatter", "all_to_all"]


def rank_inputs(ranks, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-50, 50, size=shape).astype(dtype) for _ in range(ranks)]
    return [rng.standard_normal(shape).astype(dtype) for _ in range(ranks)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_schedule_on_simulated_ranks_matches_the_collectives_definition(op, ranks, axis):
    shape = [2, 3, 4]
    shape[axis] = 12  # divisible by 1..4
    root = ranks - 1
    xs = rank_inputs(ranks, tuple(shape), np.float32, seed=ranks * 10 + axis)
    got = simulate(op, xs, axis, root=root)
    for r, (g, want) in enumerate(zip(got, expected(op, xs, axis, root=root))):
        if want is not None:
            np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6, err_msg=f"{op} axis {axis} rank {r}/{ranks}")


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "reduce"])
@pytest.mark.parametrize("reduce", ["sum", "prod", "max", "min", "avg"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
def test_reductions_on_simulated_ranks_keep_the_dtype_and_match_numpy(op, reduce, dtype):
    xs = rank_inputs(3, (2, 6, 5), dtype, seed=7)
    got = simulate(op, xs, 1, reduce=reduce, root=1)
    for g, want in zip(got, expected(op, xs, 1, reduce=reduce, root=1)):
        if want is not None:
            assert g.dtype == want.dtype
            np.testing.assert_allclose(g.astype(np.float64), want.astype(np.float64), rtol=1e-3)


def test_leading_axis_moves_the_layers_own_tensors_without_workspace():
    for op in OPS:
        steps = schedule(op, (8, 3), 0, 4)
        assert [type(s).__name__ for s in steps] == ["Transfer"]
        assert (steps[0].send, steps[0].recv) == ("x", "y")


def test_leading_dims_of_one_count_as_the_leading_axis():
    assert [type(s).__name__ for s in schedule("all_gather", (1, 1, 6), 2, 2)] == ["Transfer"]


def test_inner_axis_all_to_all_reorders_before_and_after_the_transfer():
    kinds = [type(s).__name__ for s in schedule("all_to_all", (2, 4, 3), 1, 2)]
    assert kinds == ["Reorder", "Transfer", "Reorder"]


def layer(kind, shape, axis=0, ranks=2, dtype="float32", **attrs):
    op = attrs.pop("op", kind)
    out = list(shape)
    if kind in ("all_gather", "gather"):
        out[axis] *= ranks
    elif kind in ("reduce_scatter", "scatter"):
        out[axis] //= ranks
    return LayerDesc("coll", "DistCollective", ("x",), ("y",),
                     {"op": op, "reduce": "sum", "ranks": ranks, "group": list(range(ranks)), "root": 0,
                      "axis": axis, **attrs}, domain="ai.polykit", in_dtypes=(dtype,), out_dtypes=(dtype,),
                     in_shapes=(tuple(shape),), out_shapes=(tuple(out),)), tuple(out)


def descs(shape, out, dtype="float32"):
    return {"x": TensorDesc("x", dtype, tuple(shape), "input"), "y": TensorDesc("y", dtype, tuple(out), "output")}


def test_workspace_covers_one_region_per_reorder_buffer():
    lay, out = layer("all_to_all", (2, 4, 3), axis=1)
    assert collective_workspace(lay, descs((2, 4, 3), out), 132) == 2 * 256
    lay, out = layer("all_gather", (4, 3), axis=0)
    assert collective_workspace(lay, descs((4, 3), out), 132) == 0


def test_only_axial_collectives_declare_the_copy_kernels():
    assert collective_kernels(layer("all_reduce", (4, 3), ranks=2)[0]) == []
    names = {k.name for k in collective_kernels(layer("all_gather", (4, 3), axis=1)[0])}
    assert "copy_strided_4" in names and "transpose_tiled_4" in names


@pytest.mark.parametrize("attrs,dtype", [({"group": [1, 0]}, "float32"), ({"root": 2}, "float32"),
                                         ({"op": "scan"}, "float32"), ({"reduce": "xor"}, "float32"),
                                         ({}, "bool"), ({}, "int16")])
def test_supports_refuses_what_nccl_cannot_run(attrs, dtype):
    lay, _ = layer("all_reduce", (4, 3), dtype=dtype, **attrs)
    assert not supports_collective(lay)


def test_supports_takes_a_movement_collective_of_any_dtype():
    assert supports_collective(layer("all_gather", (4, 3), dtype="bool")[0])
    assert Collective.of(layer("scatter", (4, 3), root=1)[0]).root == 1


def tensors_of(shape, out):
    return {"x": DeviceTensor(0x10000, tuple(shape), np.dtype(np.float32)),
            "y": DeviceTensor(0x20000, tuple(out), np.dtype(np.float32))}


def test_a_group_of_one_without_a_communicator_copies_its_input():
    lay, out = layer("all_reduce", (4, 3), ranks=1)
    launcher = RecordingLauncher()
    enqueue_collective(lay, launcher, tensors_of((4, 3), out))
    assert len(launcher.launches) == 1 and launcher.launches[0][0].startswith("copy_strided_")
    assert [k.name for k in collective_kernels(lay)] == [k.name for k in collective_kernels(layer("gather", (4, 3))[0])]


def test_enqueue_without_a_communicator_says_how_to_attach_one():
    lay, out = layer("all_reduce", (4, 3))
    with pytest.raises(DeviceError, match="without a communicator") as info:
        enqueue_collective(lay, RecordingLauncher(), tensors_of((4, 3), out))
    assert "communicator=" in info.value.hint


def test_enqueue_refuses_a_communicator_of_another_group_size():
    lay, out = layer("all_reduce", (4, 3), ranks=2)
    launcher = RecordingLauncher()
    launcher.communicator = FakeComm(World(4, 16), 0, 4)
    with pytest.raises(DeviceError, match="collective of 2 ranks, the communicator has 4"):
        enqueue_collective(lay, launcher, tensors_of((4, 3), out))


def test_enqueue_refuses_a_split_that_does_not_divide():
    lay, _ = layer("reduce_scatter", (5, 3), ranks=2)
    launcher = RecordingLauncher()
    launcher.communicator = FakeComm(World(2, 16), 0, 2)
    with pytest.raises(DeviceError, match="does not divide"):
        enqueue_collective(lay, launcher, tensors_of((5, 3), (2, 3)))


def test_enqueue_on_an_inner_axis_copies_through_the_workspace_around_the_transfer():
    lay, out = layer("all_to_all", (2, 4, 3), axis=1)
    launcher = RecordingLauncher()
    world = World(2, 16)
    launcher.communicator = FakeComm(world, 0, 2)
    enqueue_collective(lay, launcher, tensors_of((2, 4, 3), out))
    assert launcher.workspaces == [256, 256]
    assert len(launcher.launches) == 2  # into rank-major order, then back
    assert all(name.startswith(("copy_strided_", "transpose_tiled_")) for name, _ in launcher.launches)
    kind, sends, recvs = world.posted[0]
    assert kind == "exchange" and [peer for *_, peer in sends] == [0, 1] and [n for _, n, _ in recvs] == [48, 48]
