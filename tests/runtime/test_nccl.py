"""NCCL on the cuda target (polykit.runtime.cuda.nccl + the cuda.collective.nccl tactic).

Without a GPU: the argument and plan checks. On one GPU (gpu-marked; nccl4py and libnccl.so.2
needed, else skipped with the reason): a 1-rank communicator, every collective against numpy
(the 1-rank result is the input, but the NCCL calls, streams, dtypes, workspace reorders and
CUDA-graph capture are real), joining a group whose peer never comes (a RankError within the
timeout, not a hang), and a collective layer inside a plan replayed as a CUDA graph. Tests
that need two GPUs skip naming the machine kind they need.

Device setup (the lead's H100): python3 -m pip install -q --no-index --no-deps --no-compile
--no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from polykit.errors import RankError, UsageError
from polykit.runtime.cuda.nccl import NcclCommunicator, check_communicator

OPS = ["all_reduce", "reduce", "broadcast", "all_gather", "gather", "reduce_scatter", "scatter", "all_to_all"]
TWO_GPUS = "needs 2 GPUs (device kind nvidia-h200-x2 or larger)"


def fake_plan(group: int, **metadata):
    layer = SimpleNamespace(name="coll", kind="DistCollective", attrs={"op": "all_reduce", "ranks": group})
    return SimpleNamespace(layers=[layer], metadata=metadata)


def test_a_multi_rank_plan_needs_a_communicator():
    with pytest.raises(UsageError, match="collective layer.*no communicator"):
        check_communicator(fake_plan(2, rank=0, ranks=2), None, 0)
    assert check_communicator(fake_plan(1), None, 0) is None  # one rank: the layers copy


def test_a_communicator_of_another_rank_or_device_is_refused():
    comm = SimpleNamespace(rank=1, ranks=2, device=1)
    assert check_communicator(fake_plan(2, rank=1, ranks=2), comm, 1) is comm
    with pytest.raises(RankError, match="built for rank 0, the communicator has rank 1"):
        check_communicator(fake_plan(2, rank=0, ranks=2), comm, 1)
    with pytest.raises(UsageError, match="on CUDA device 1, the engine on device 0"):
        check_communicator(fake_plan(2, rank=1, ranks=2), comm, 0)


@pytest.mark.parametrize("args,message", [((2, 2, bytes(128), 0), "outside a group"),
                                          ((0, 2, bytes(12), 0), "128 bytes")])
def test_communicator_arguments_are_checked_before_nccl_is_touched(args, message):
    with pytest.raises(UsageError, match=message):
        NcclCommunicator(*args)


# ---- on a GPU -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nccl():
    from polykit.runtime.cuda.nccl import unusable_reason

    reason = unusable_reason()
    if reason:
        pytest.skip(f"NCCL is not usable here: {reason} (install the nccl4py wheel: see this module's docstring)")


@pytest.fixture
def comm(nccl):
    from polykit.runtime.cuda.nccl import nccl_unique_id

    c = NcclCommunicator(0, 1, nccl_unique_id(), device=0, timeout_s=30)
    yield c
    c.close()


def gpu_count() -> int:
    from polykit.runtime.cuda.driver import device_count

    return device_count()


def collective_layer(op: str, shape: tuple, dtype: str, axis: int, reduce: str = "sum"):
    from polykit.compiler.plan.records import LayerDesc

    return LayerDesc("coll", "DistCollective", ("x",), ("y",),
                     {"op": op, "reduce": reduce, "ranks": 1, "group": [0], "root": 0, "axis": axis},
                     domain="ai.polykit", in_dtypes=(dtype,), out_dtypes=(dtype,), in_shapes=(shape,),
                     out_shapes=(shape,))


class OneLayer:
    """A collective layer's tensors, workspace and launcher on one stream (poisoned output)."""

    def __init__(self, layer, x: np.ndarray, comm):
        from polykit.kernels.cuda.base import DeviceTensor
        from polykit.kernels.cuda.models.collective import collective_kernels
        from polykit.runtime.cuda import driver
        from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules
        from polykit.runtime.cuda.memory import DeviceBuffer, fill_bytes, upload
        from polykit.runtime.cuda.stream import Stream

        info = driver.current_device(0)
        self.layer, self.comm = layer, comm
        self.modules = KernelModules(info.arch)
        self.modules.load(collective_kernels(layer))
        self.stream = Stream()
        self.buffers = [DeviceBuffer(x.nbytes, what="x"), DeviceBuffer(x.nbytes, what="y")]
        upload(self.buffers[0].ptr, x)
        fill_bytes(self.buffers[1].ptr, x.nbytes, 0xFF)
        self.tensors = {"x": DeviceTensor(self.buffers[0].ptr, x.shape, x.dtype),
                        "y": DeviceTensor(self.buffers[1].ptr, x.shape, x.dtype)}

        self.regions: list = []  # allocated by the first enqueue, reused by later ones (none while capturing)
        self.taken = 0

        def workspace(nbytes: int) -> int:
            if self.taken == len(self.regions):
                self.regions.append(DeviceBuffer(nbytes, what="workspace"))
                self.buffers.append(self.regions[-1])
            self.taken += 1
            return self.regions[self.taken - 1].ptr

        self.launcher = CudaLauncher(self.modules, self.stream.handle, workspace, layer.name)
        self.launcher.communicator = comm

    def enqueue(self, stream) -> None:
        from polykit.kernels.cuda.models.collective import enqueue_collective

        self.taken = 0
        enqueue_collective(self.layer, self.launcher, self.tensors)

    def upload(self, x: np.ndarray) -> None:
        from polykit.runtime.cuda.memory import upload

        upload(self.tensors["x"].ptr, x)

    def result(self) -> np.ndarray:
        from polykit.runtime.cuda.memory import download

        if self.comm is not None:
            self.comm.wait(self.stream)
        y = self.tensors["y"]
        return download(y.ptr, y.shape, y.dtype, self.stream.handle)

    def close(self) -> None:
        self.stream.synchronize()
        for b in self.buffers:
            b.free()
        self.stream.close()
        self.modules.close()


def random(shape, dtype: str, seed: int = 0) -> np.ndarray:
    r = np.random.default_rng(seed)
    if dtype == "bool":
        return r.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        return r.integers(0, 100, size=shape).astype(dtype)
    return r.standard_normal(shape).astype(np.float32).astype(np.dtype(dtype))


@pytest.mark.gpu
def test_one_rank_communicator_joins_and_refuses_work_after_close(nccl):
    from polykit.runtime.cuda.nccl import nccl_unique_id

    c = NcclCommunicator(0, 1, nccl_unique_id(), device=0, timeout_s=30)
    assert (c.rank, c.ranks, c.device) == (0, 1, 0)
    c.close()
    with pytest.raises(RankError, match="closed or was aborted"):
        c.all_reduce(0, 0, 0, "float32", "sum", 0, "coll")


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "int64", "uint8"])
@pytest.mark.parametrize("axis", [0, 1])
def test_every_collective_on_one_rank_returns_its_input(comm, op, dtype, axis):
    x = random((3, 4, 5), dtype, seed=len(op))
    run = OneLayer(collective_layer(op, x.shape, dtype, axis), x, comm)
    try:
        run.enqueue(run.stream)
        got = run.result()
    finally:
        run.close()
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8), err_msg=f"{op} {dtype} axis {axis}")


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", ["sum", "prod", "max", "min", "avg"])
def test_every_reduction_on_one_rank_returns_its_input(comm, reduce):
    x = random((6, 7), "float32", seed=3)
    run = OneLayer(collective_layer("all_reduce", x.shape, "float32", 0, reduce), x, comm)
    try:
        run.enqueue(run.stream)
        np.testing.assert_allclose(run.result(), x, rtol=1e-6)
    finally:
        run.close()


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["all_reduce", "all_to_all"])
def test_collectives_captured_in_a_cuda_graph_replay_on_new_inputs(comm, op):
    from polykit.runtime.cuda.stream import CudaGraph

    x = random((4, 6, 8), "float32", seed=1)
    run = OneLayer(collective_layer(op, x.shape, "float32", 1), x, comm)
    graph = None
    try:
        run.enqueue(run.stream)  # eager once (NCCL connects), then capture
        run.result()
        graph = CudaGraph(run.stream, run.enqueue)
        for seed in (2, 3):
            x2 = random(x.shape, "float32", seed=seed)
            run.upload(x2)
            graph.launch(run.stream)
            np.testing.assert_array_equal(run.result(), x2, err_msg=f"replay {seed}")
    finally:
        if graph is not None:
            run.stream.synchronize()
            graph.close()
        run.close()


@pytest.mark.gpu
def test_a_one_rank_collective_without_a_communicator_copies(nccl):
    x = random((5, 8), "float16", seed=4)
    run = OneLayer(collective_layer("all_gather", x.shape, "float16", 1), x, None)
    try:
        run.enqueue(run.stream)
        np.testing.assert_array_equal(run.result(), x)
    finally:
        run.close()


@pytest.mark.gpu
def test_joining_a_group_whose_peer_never_comes_is_a_rank_error_within_the_timeout(nccl):
    from polykit.runtime.cuda.nccl import nccl_unique_id

    start = time.monotonic()
    with pytest.raises(RankError, match=r"rank 0 of 2: timed out after 5 s waiting to join"):
        NcclCommunicator(0, 2, nccl_unique_id(), device=0, timeout_s=5)
    assert time.monotonic() - start < 30, "the abort after the timeout must not hang"


@pytest.mark.gpu
def test_a_collective_layer_in_a_plan_replays_as_a_cuda_graph(comm):
    pytest.importorskip("polykit.compiler.ops.models.collective", reason="needs the DistCollective op (dist-core's branch)")
    from polykit.compiler.builder.builder import Builder
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.network import NetworkDefinition
    from polykit.runtime.engine import Engine

    net = NetworkDefinition("coll_plan")
    x = net.add_input("x", np.float32, (4, 6))
    h = net.add_activation(x, "relu", name="relu")
    attrs = {"op": "all_reduce", "ranks": 1, "group": [0], "reduce": "sum", "axis": 0, "root": 0}
    (c,) = net.add_node("DistCollective", [h], attrs, domain="ai.polykit", name="coll")
    y = net.add_unary(c, "neg", name="neg")
    net.mark_output(y)
    plan = Builder(BuilderConfig(target="cuda")).build(net.graph)
    plan.metadata.update(rank=0, ranks=1)
    assert [l.tactic for l in plan.layers if l.kind == "DistCollective"] == ["cuda.collective.nccl"]
    with Engine(plan) as engine, engine.create_execution_context(communicator=comm) as ctx:
        for seed in range(4):  # eager, capture + replay, replays
            feed = random((4, 6), "float32", seed=seed)
            (out,) = ctx.execute({"x": feed}).values()
            np.testing.assert_array_equal(out, -np.maximum(feed, 0), err_msg=f"run {seed}")
        assert ctx._replays, "the layer loop was not captured as a CUDA graph"


@pytest.mark.gpu
def test_run_ranks_on_one_gpu_returns_the_plans_outputs(nccl, tmp_path):
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Runtime
    from polykit.backends.rank_processes import run_rank_processes
    from tests.backends.test_rank_processes import chain

    path = tmp_path / "m.plan"
    build_plan(chain(8, 32, seed=1), BuilderConfig(target="cuda")).save(path)
    x = random((1, 8), "float32", seed=9)
    (run,) = run_rank_processes([path], {"x": x}, target="cuda", devices=[0], timeout_s=300, iterations=3)
    with Runtime("cuda").load_engine(path) as engine, engine.create_execution_context() as ctx:
        np.testing.assert_allclose(run.outputs["y"], ctx.execute({"x": x})["y"], rtol=1e-5, atol=1e-6)
    assert run.device == 0 and len(run.times_ms) == 3


@pytest.mark.gpu
def test_two_ranks_all_reduce_across_two_gpus(nccl, tmp_path):
    if gpu_count() < 2:
        pytest.skip(f"{TWO_GPUS}; this machine has {gpu_count()}")
    pytest.importorskip("polykit.compiler.ops.models.collective", reason="needs the DistCollective op (dist-core's branch)")
    from polykit.compiler.builder.builder import Builder
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.network import NetworkDefinition
    from polykit.backends.rank_processes import run_ranks

    paths = []
    for rank in range(2):
        net = NetworkDefinition(f"ar{rank}")
        x = net.add_input("x", np.float32, (8, 6))
        s = net.add_elementwise(x, net.add_constant(np.full((1, 1), rank + 1, np.float32)), "mul", name="scale")
        attrs = {"op": "all_gather", "ranks": 2, "group": [0, 1], "reduce": "sum", "axis": 1, "root": 0}
        (y,) = net.add_node("DistCollective", [s], attrs, domain="ai.polykit", name="coll")
        net.mark_output(y)
        plan = Builder(BuilderConfig(target="cuda")).build(net.graph)
        plan.metadata.update(rank=rank, ranks=2)
        paths.append(tmp_path / f"m.rank{rank}.plan")
        plan.save(paths[-1])
    x = random((8, 6), "float32", seed=5)
    outs = run_ranks(paths, {"x": x}, target="cuda", devices=[0, 1], timeout_s=300)
    for out in outs:
        np.testing.assert_allclose(out["coll"], np.concatenate([x, 2 * x], axis=1), rtol=1e-6)
