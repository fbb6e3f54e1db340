"""Every collective between simulated cpu ranks, against its numpy definition, run as plans."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from polykit.compiler.builder.builder import Builder
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.network import NetworkDefinition
from polykit.compiler.ops.models.collective import COLLECTIVE_OPS
from polykit.errors import RankError, UsageError
from polykit.runtime.collectives import SimulatedGroup, run_simulated_ranks
from polykit.runtime.engine import Engine

REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def expected(op: str, xs: list[np.ndarray], i: int, how: str, axis: int, root: int) -> np.ndarray:
    """The collective's definition, written out for member i of len(xs)."""
    n = len(xs)
    if how == "avg":
        red = (np.sum(np.stack(xs).astype(np.float64), axis=0) / n)
    else:
        red = REDUCE[how](np.stack(xs).astype(np.float64), axis=0)
    red = red.astype(xs[0].dtype)
    cat = np.concatenate(xs, axis=axis)
    size = xs[0].shape[axis] // n
    take = lambda x, j: np.take(x, range(j * size, (j + 1) * size), axis=axis)  # noqa: E731
    return {
        "all_reduce": lambda: red,
        "reduce": lambda: red if i == root else np.zeros_like(xs[0]),
        "broadcast": lambda: xs[root],
        "all_gather": lambda: cat,
        "gather": lambda: cat if i == root else np.zeros_like(cat),
        "reduce_scatter": lambda: take(red, i),
        "scatter": lambda: take(xs[root], i),
        "all_to_all": lambda: np.concatenate([take(xs[j], i) for j in range(n)], axis=axis),
    }[op]()


def collective_plan(op: str, ranks: int, rank: int, shape: tuple, dtype, *, how="sum", axis=0, root=0):
    net = NetworkDefinition(f"{op}_r{rank}")
    x = net.add_input("x", dtype, shape)
    attrs = {"op": op, "ranks": ranks, "group": list(range(ranks)), "reduce": how, "axis": axis, "root": root}
    (y,) = net.add_node("DistCollective", [x], attrs, domain="ai.polykit", name="coll")
    net.mark_output(y)
    plan = Builder(BuilderConfig(target="cpu")).build(net.graph)
    plan.metadata.update(rank=rank, ranks=ranks)
    return plan


def run_collective(op, ranks, shape, dtype, **kw):
    rng = np.random.default_rng(ranks * 7 + len(op))
    xs = [(rng.standard_normal(shape) * 3 + 0.5).astype(dtype) if np.dtype(dtype).kind == "f"
          else rng.integers(-9, 10, shape).astype(dtype) for _ in range(ranks)]
    engines = [Engine(collective_plan(op, ranks, r, shape, dtype, **kw)) for r in range(ranks)]
    outs = run_simulated_ranks(engines, [{"x": x} for x in xs], timeout_s=20)
    return xs, [o["coll"] for o in outs]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("op", sorted(COLLECTIVE_OPS))
def test_collective_matches_numpy_definition_on_every_rank(op, ranks):
    for dtype, axis in ((np.float32, 0), (np.float64, 1), (np.int32, 2)):
        shape = [2, 3, 5]
        shape[axis] = 12  # 1, 2, 3 and 4 divide it
        xs, got = run_collective(op, ranks, tuple(shape), dtype, axis=axis, root=ranks - 1)
        for i, out in enumerate(got):
            want = expected(op, xs, i, "sum", axis, ranks - 1)
            assert out.dtype == np.dtype(dtype), (op, ranks, dtype)
            assert out.shape == want.shape, (op, ranks, dtype, axis, i)
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-5, err_msg=f"{op} ranks={ranks} rank {i} {dtype}")


@pytest.mark.parametrize("how", ["sum", "prod", "max", "min", "avg"])
@pytest.mark.parametrize("op", ["all_reduce", "reduce", "reduce_scatter"])
def test_reductions_match_numpy_definition(op, how):
    xs, got = run_collective(op, 3, (6, 4), np.float32, how=how, axis=0, root=1)
    for i, out in enumerate(got):
        np.testing.assert_allclose(out, expected(op, xs, i, how, 0, 1), rtol=1e-5, atol=1e-5, err_msg=f"{op}/{how} r{i}")


def test_collective_in_fp16_rounds_once():
    xs, got = run_collective("all_reduce", 4, (8, 8), np.float16)
    want = np.sum(np.stack(xs).astype(np.float64), axis=0).astype(np.float16)
    for out in got:
        np.testing.assert_array_equal(out, want)


def test_rank_that_never_arrives_is_named_within_the_timeout():
    """It waits the group's 0.5 s, not the default 60 s: the bound is half the default, which no
    load on the machine comes near."""
    engines = [Engine(collective_plan("all_reduce", 2, r, (4,), np.float32)) for r in range(2)]
    group = SimulatedGroup(2, timeout_s=0.5)
    start = time.monotonic()
    with engines[0].create_execution_context(communicator=group.communicator(0)) as ctx:
        with pytest.raises(RankError, match=r"rank 1 did not reach collective layer 'coll' within 0.5 s"):
            ctx.execute({"x": np.ones(4, np.float32)})
    assert 0.5 <= time.monotonic() - start < 30


def test_failing_rank_stops_the_others_with_its_name():
    engines = [Engine(collective_plan("all_gather", 2, r, (4,), np.float32)) for r in range(2)]
    feeds = [{"x": np.ones(4, np.float32)}, {"x": np.ones(5, np.float32)}]  # rank 1's feed is wrong
    start = time.monotonic()
    with pytest.raises(RankError, match=r"rank 1.*input 'x' has shape \(5,\)"):
        run_simulated_ranks(engines, feeds, timeout_s=600)
    assert time.monotonic() - start < 300  # rank 0 did not wait out the timeout (half of it: any load)


def test_plan_with_collectives_needs_a_communicator_of_its_rank():
    engine = Engine(collective_plan("all_reduce", 2, 1, (4,), np.float32))
    with pytest.raises(UsageError, match="rank 1 of 2: its collective layers need a communicator"):
        engine.create_execution_context()
    with pytest.raises(UsageError, match="communicator is rank 0 of 2, the plan rank 1 of 2"):
        engine.create_execution_context(communicator=SimulatedGroup(2).communicator(0))


def test_group_of_one_runs_without_a_communicator():
    engine = Engine(collective_plan("all_gather", 1, 0, (3, 2), np.float32, axis=1))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    with engine.create_execution_context() as ctx:
        np.testing.assert_array_equal(ctx.execute({"x": x})["coll"], x)


def test_subgroup_members_exchange_only_with_each_other():
    group = SimulatedGroup(4, timeout_s=10)
    results = {}

    def member(rank):
        members = (3, 1) if rank in (1, 3) else (0, 2)
        results[rank] = group.communicator(rank).exchange(np.array([rank]), members, "layer")

    threads = [threading.Thread(target=member, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [int(a[0]) for a in results[1]] == [3, 1] == [int(a[0]) for a in results[3]]
    assert [int(a[0]) for a in results[0]] == [0, 2]


def test_an_exchange_keeps_what_each_rank_sent_when_the_rank_reuses_its_buffer():
    # the cpu target writes layer outputs into its arena, so a rank's contribution is a view the
    # rank overwrites as soon as it moves on; the others must still read what it sent
    import threading

    group = SimulatedGroup(2)
    buffers = [np.full(4, float(r + 1), np.float32) for r in range(2)]
    got: dict[int, list] = {}
    first_done = threading.Event()

    def rank(r: int) -> None:
        result = group.communicator(r).exchange(buffers[r], (0, 1), "sum")
        if r == 0:
            buffers[0][...] = -99.0  # rank 0 moves on and reuses its buffer...
            first_done.set()
        else:
            assert first_done.wait(5)  # ...before rank 1 reads what the exchange gave it
        got[r] = [np.array(v) for v in result]

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for r in range(2):
        np.testing.assert_array_equal(got[r][0], np.full(4, 1.0, np.float32))
        np.testing.assert_array_equal(got[r][1], np.full(4, 2.0, np.float32))
