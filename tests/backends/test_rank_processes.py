"""Rank processes (polykit.backends.rank_processes + rank_worker) on the cpu target, without GPUs: the
process plumbing (plans in, .npz feeds and outputs, bfloat16 kept, per-query times), and the
error paths — a rank that fails names itself with its stderr, a rank that runs past the
timeout is stopped and named, the other ranks are killed, nothing hangs."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import DataFileError, RankError, UsageError
from polykit.runtime.engine import Runtime
from polykit.backends.rank_worker import check_rank
from polykit.backends.rank_processes import read_arrays, run_rank_processes, run_ranks, write_arrays

rng = np.random.default_rng(5)


def chain(width: int, hidden: int, seed: int, batch: int = 1) -> onnx.ModelProto:
    """x[1, width] -> Expand to [batch, width] -> MatMul -> Relu -> MatMul(hidden x hidden) -> Relu ->
    MatMul -> y[batch, width] (random non-zero weights)."""
    r = np.random.default_rng(seed)
    dims = [(width, hidden), (hidden, hidden), (hidden, width)]
    weights = [numpy_helper.from_array((r.standard_normal(d) / np.sqrt(d[0])).astype(np.float32), f"w{i}")
               for i, d in enumerate(dims)]
    weights.append(numpy_helper.from_array(np.array([batch, width], np.int64), "rows"))
    nodes = [helper.make_node("Expand", ["x", "rows"], ["xb"]), helper.make_node("MatMul", ["xb", "w0"], ["h0"]), helper.make_node("Relu", ["h0"], ["a0"]),
             helper.make_node("MatMul", ["a0", "w1"], ["h1"]), helper.make_node("Relu", ["h1"], ["a1"]),
             helper.make_node("MatMul", ["a1", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def endless(width: int) -> onnx.ModelProto:
    """x[1, width] -> a Loop of 10**12 trips adding 1 -> y: a query that outlasts any timeout on
    any machine (a big MatMul's time depends on the processor; this loop's count does not)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, width])],
        [numpy_helper.from_array(np.ones((1, width), np.float32), "one")])
    graph = helper.make_graph([helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)], "endless",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
                              [numpy_helper.from_array(np.array(10**12, np.int64), "trips"),
                               numpy_helper.from_array(np.array(True), "cond")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def cpu_plan(tmp_path: Path, name: str, width: int = 16, hidden: int = 16, seed: int = 0, batch: int = 1,
             model: onnx.ModelProto | None = None) -> Path:
    path = tmp_path / f"{name}.plan"
    model = chain(width, hidden, seed, batch) if model is None else model
    build_plan(model, BuilderConfig(target="cpu", builder_optimization_level=0)).save(path)
    return path


def test_each_rank_returns_its_own_plans_outputs(tmp_path):
    plans = [cpu_plan(tmp_path, "r0", seed=1), cpu_plan(tmp_path, "r1", seed=2)]
    x = rng.standard_normal((1, 16)).astype(np.float32)
    outs = run_ranks(plans, {"x": x}, target="cpu", timeout_s=120)
    for plan, out in zip(plans, outs):
        with Runtime("cpu").load_engine(plan) as engine, engine.create_execution_context() as ctx:
            want = ctx.execute({"x": x})["y"]
        np.testing.assert_array_equal(out["y"], want)
    assert not np.array_equal(outs[0]["y"], outs[1]["y"])


def test_rank_runs_report_query_times_and_weight_bytes(tmp_path):
    plan = cpu_plan(tmp_path, "r0", width=32, hidden=32)
    runs = run_rank_processes([plan], {"x": np.ones((1, 32), np.float32)}, target="cpu", timeout_s=120,
                              iterations=3, warmup=1)
    assert len(runs[0].times_ms) == 3 and all(t > 0 for t in runs[0].times_ms)
    assert runs[0].weight_bytes == 3 * 32 * 32 * 4  # (Expand to its own shape is folded away)
    assert runs[0].rank == 0 and runs[0].device is None


def test_a_rank_with_a_damaged_plan_is_named_with_its_error_and_the_others_stopped(tmp_path):
    good = cpu_plan(tmp_path, "r0", model=endless(16))
    bad = tmp_path / "r1.plan"
    bad.write_bytes(good.read_bytes()[:200])  # truncated
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run_ranks([good, bad], {"x": np.ones((1, 16), np.float32)}, target="cpu", timeout_s=600)
    assert "rank 1 exited with code 2" in info.value.what
    assert "PlanError" in info.value.what  # the worker's stderr, quoted
    # rank 0 (an endless query) was killed, not awaited until the timeout; half of it allows any load
    assert time.monotonic() - start < 300


def test_a_rank_past_the_timeout_is_stopped_and_named(tmp_path, monkeypatch):
    """The deadline passes once the light rank has exited (a clock that jumps then), so no race
    between the timeout and the light rank's start-up decides the outcome: on a loaded machine
    starting Python and polykit alone took 30 s of wall time (2.3 s of CPU)."""
    import types

    import polykit.backends.rank_processes as ranks_module

    light = cpu_plan(tmp_path, "light", width=4, hidden=4)  # 300 tiny queries
    heavy = cpu_plan(tmp_path, "heavy", model=endless(4))  # never finishes, however fast the processor
    procs = []

    def popen(*args, **kwargs):
        procs.append(subprocess.Popen(*args, **kwargs))
        return procs[-1]

    def monotonic():  # before the deadline while rank 0 runs, far past it once it exited
        return 0.0 if not procs or procs[0].poll() is None else 1e9

    monkeypatch.setattr(ranks_module, "subprocess", types.SimpleNamespace(Popen=popen, DEVNULL=subprocess.DEVNULL))
    monkeypatch.setattr(ranks_module, "time", types.SimpleNamespace(monotonic=monotonic, sleep=time.sleep))
    with pytest.raises(RankError, match=r"rank\(s\) 1 did not finish within 20 s and were stopped"):
        run_ranks([light, heavy], {"x": np.ones((1, 4), np.float32)}, target="cpu", timeout_s=20,
                  iterations=300)
    assert procs[0].returncode == 0 and procs[1].returncode is not None  # rank 1 killed, not left running


def test_plans_given_out_of_rank_order_are_refused():
    class Plan:
        metadata = {"rank": 1, "ranks": 2}

    check_rank(Plan(), 1, 2)
    with pytest.raises(RankError, match="built for rank 1, it runs as rank 0"):
        check_rank(Plan(), 0, 2)
    with pytest.raises(RankError, match="built for ranks 2, it runs as ranks 4"):
        check_rank(Plan(), 1, 4)


@pytest.mark.parametrize("devices", [[0], [0, 0], [0, -1]])
def test_a_cuda_rank_map_must_name_one_distinct_device_per_rank(tmp_path, devices):
    with pytest.raises(UsageError, match="distinct CUDA devices"):
        run_ranks([tmp_path / "a.plan", tmp_path / "b.plan"], {}, target="cuda", devices=devices)


def test_arrays_round_trip_through_npz_with_their_dtypes(tmp_path):
    import ml_dtypes

    arrays = {"a/b": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16), "mask": rng.random(4) > 0.5,
              "ids": rng.integers(0, 9, (3,)).astype(np.int64)}
    write_arrays(tmp_path / "x.npz", arrays)
    back = read_arrays(tmp_path / "x.npz")
    assert list(back) == list(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype
        np.testing.assert_array_equal(back[name].view(np.uint8), a.view(np.uint8))


def test_arrays_without_their_dtype_list_are_a_data_file_error(tmp_path):
    write_arrays(tmp_path / "x.npz", {"a": np.ones(2, np.float32)})
    (tmp_path / "x.npz.json").unlink()
    with pytest.raises(DataFileError, match="dtype list"):
        read_arrays(tmp_path / "x.npz")


def test_an_engine_refuses_a_target_instance_of_another_kind(tmp_path):
    from polykit.compiler.plan.file import Plan
    from polykit.errors import PlanError
    from polykit.runtime.cuda.target import CudaTarget
    from polykit.runtime.engine import Engine

    plan = Plan.load(cpu_plan(tmp_path, "r0"))
    with pytest.raises(PlanError, match="built for target 'cpu', not 'cuda'"):
        Engine(plan, CudaTarget(device=1))
