"""GPU: one cuda plan serves every value of a shape-tensor input (a Reshape target, TopK's k, Pad's
pads, Expand's shape, Tile's repeats fed as inputs): the shapes they decide are the ops' shape
rules run at bind time, and those tensors get device memory per size set
(polykit.runtime.cuda.sized). Outputs match onnxruntime and the cpu target's plan, for values
whose outputs are larger than the opt's too, through eager runs and CUDA-graph replays."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.runtime.engine import MAX_REPLAYS, Runtime
from tests.runtime.test_shape_rules import ruled_plan

pytestmark = pytest.mark.gpu

X_SHAPE = (2, 3, 8)


def _model(nodes, second: str, count: int, outputs=("y",)):
    g = helper.make_graph(nodes, "ruled",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE)),
                           helper.make_tensor_value_info(second, TensorProto.INT64, [count])],
                          [helper.make_tensor_value_info(o, TensorProto.INT64 if o == "i" else TensorProto.FLOAT, None)
                           for o in outputs])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


def _node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, **attrs)


#: name -> (model, the shape-tensor input, its values: the first is the opt, every one runs on that plan)
CASES = {
    # the Reshape's output feeds kernels (Relu, then a Shape -> Reshape chain the host computes)
    "reshape": (_model([_node("Reshape", ["x", "shape"], ["a"]), _node("Shape", ["a"], ["s"]),
                        _node("Relu", ["x"], ["b"]), _node("Reshape", ["b", "s"], ["c"]),
                        _node("Add", ["a", "c"], ["y"])], "shape", 3), "shape",
                [[3, 2, 8], [6, -1, 1], [48, 1, 1], [0, 8, -1], [2, 3, 8]]),
    "topk": (_model([_node("TopK", ["x", "k"], ["y", "i"], axis=-1)], "k", 1, ("y", "i")), "k",
             [[2], [8], [1], [5], [0]]),
    "pad": (_model([_node("Pad", ["x", "pads"], ["p"]), _node("Neg", ["p"], ["y"])], "pads", 6), "pads",
            [[0, 1, 0, 0, 2, 1], [3, 4, 5, 6, 7, 9], [0, -1, -2, 0, 0, -3], [0, 0, 0, 0, 0, 0]]),
    "expand": (_model([_node("Expand", ["x", "shape"], ["y"])], "shape", 4), "shape",
               [[1, 2, 3, 8], [7, 2, 3, 8], [4, 1, 1, 1], [1, 1, 3, 8]]),
    "tile": (_model([_node("Tile", ["x", "repeats"], ["t"]), _node("Sigmoid", ["t"], ["y"])], "repeats", 3), "repeats",
             [[1, 1, 1], [3, 2, 5], [1, 4, 1], [2, 1, 2]]),
    "reduce_axes": (_model([_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], "axes", 2), "axes",
                    [[0, 2], [1, 2], [-1, 0], [-2, -3]]),
}

#: cases with values whose output is larger than the opt's
GROWING = ("topk", "pad", "expand", "tile")


def _plan(model, name, opt, target):
    return ruled_plan(model, {"x": np.zeros(X_SHAPE, np.float32), name: np.array(opt, np.int64)}, target)


def _check(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_cuda_plan_serves_every_value_like_onnxruntime_and_the_cpu_plan(case):
    model, name, values = CASES[case]
    x = np.random.default_rng(11).standard_normal(X_SHAPE).astype(np.float32)
    feeds = [{"x": x, name: np.array(v, np.int64)} for v in values]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    cuda_plan = _plan(model, name, values[0], "cuda")
    if case in GROWING:
        largest = max(session.run(None, f)[0].nbytes for f in feeds)
        assert largest > cuda_plan.tensors["y"].nbytes, "some value must give y more bytes than the opt's"
    with Runtime("cpu").deserialize_engine(_plan(model, name, values[0], "cpu")) as cpu, \
            Runtime("cuda").deserialize_engine(cuda_plan) as engine, engine.create_execution_context() as ctx:
        for round_ in ("eager", "captured", "replayed"):  # per size set; the sets interleave
            for feed in feeds:
                got = ctx.execute(feed)
                with cpu.create_execution_context() as cpu_ctx:
                    on_cpu = cpu_ctx.execute(feed)
                for out, want in zip(model.graph.output, session.run(None, feed)):
                    what = f"{case} {name}={feed[name].tolist()} {out.name} ({round_})"
                    _check(got[out.name], want, what + " vs onnxruntime")
                    _check(got[out.name], on_cpu[out.name], what + " vs the cpu plan")
                    assert ctx.get_tensor_shape(out.name) == want.shape, what


def _allocation(ptr: int) -> int | None:
    """The base of this process's device allocation holding `ptr`, None when none does (freed).
    Per process, so other tests on the GPU at the same time do not disturb it (cuMemGetInfo would)."""
    from polykit.runtime.cuda import driver

    err, base, _ = driver.drv().cuMemGetAddressRange(ptr)
    return int(base) if int(err) == 0 else None


def test_size_sets_past_the_cache_bound_are_evicted_and_an_old_one_comes_back_right():
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.sized import MAX_SIZED_SETS

    model, name, _ = CASES["expand"]
    # Expand to [n, 2, 3, 8] floats: 3 MiB more per size set
    values = [[16384 * (k + 1), 2, 3, 8] for k in range(MAX_SIZED_SETS + MAX_REPLAYS + 3)]
    x = np.random.default_rng(12).standard_normal(X_SHAPE).astype(np.float32)
    driver.current_device(0)
    pointers = set()  # every region pointer y had
    with Runtime("cuda").deserialize_engine(_plan(model, name, [1, 2, 3, 8], "cuda")) as engine:
        with engine.create_execution_context() as ctx:
            regions = ctx._ctx._sized
            arena = _allocation(ctx._ctx.arena.base)
            for value in values + values[:2]:  # twice each: eager, then a captured graph holds its region
                for _ in range(2):
                    y = ctx.execute({"x": x, name: np.array(value, np.int64)})["y"]
                    assert y.shape == tuple(value) and np.array_equal(y[-1], x), f"Expand to {value}"
                pointers.add(ctx._ctx.tensors["y"].ptr)
                assert regions.live <= MAX_SIZED_SETS + MAX_REPLAYS, \
                    f"{regions.live} regions live: the cache bound is {MAX_SIZED_SETS}, graphs hold <= {MAX_REPLAYS}"
                held = {_allocation(p) for p in pointers} - {None, arena}
                assert len(held) <= regions.live, f"{len(held)} allocations hold past y pointers, {regions.live} regions live"
            first = values[0]
            y = ctx.execute({"x": x, name: np.array(first, np.int64)})["y"]  # evicted long ago: a new region
            np.testing.assert_array_equal(y, np.broadcast_to(x, first), err_msg="the first size set, again")
        assert regions.live == 0, "closing the context must free every region"
        assert [p for p in pointers if _allocation(p) is not None] == [], "region memory still allocated after close"


def test_enqueue_takes_the_values_set_on_the_context():
    from polykit.runtime.cuda.memory import DeviceBuffer, download, upload
    from polykit.runtime.cuda.stream import Stream

    model, name, values = CASES["pad"]
    x = np.random.default_rng(13).standard_normal(X_SHAPE).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with Runtime("cuda").deserialize_engine(_plan(model, name, values[0], "cuda")) as engine, \
            engine.create_execution_context() as ctx:
        stream = Stream()
        x_buf, p_buf, y_buf = DeviceBuffer(x.nbytes), DeviceBuffer(6 * 8), DeviceBuffer(1 << 16)
        try:
            upload(x_buf.ptr, x)
            for value in values + values:
                pads = np.array(value, np.int64)
                upload(p_buf.ptr, pads)
                ctx.set_input_values(name, pads)
                ctx.enqueue({"x": x_buf.ptr, name: p_buf.ptr, "y": y_buf.ptr}, stream)
                shape = ctx.get_tensor_shape("y")
                got = download(y_buf.ptr, shape, np.dtype(np.float32), stream.handle)
                _check(got, session.run(None, {"x": x, name: pads})[0], f"enqueue with pads {value}")
        finally:
            stream.close()
            for buf in (x_buf, p_buf, y_buf):
                buf.free()


def test_the_onnx_backend_on_cuda_builds_one_engine_for_every_value():
    from polykit.backends import onnx_backend

    model, name, values = CASES["topk"]
    x = np.random.default_rng(14).standard_normal(X_SHAPE).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rep = onnx_backend.prepare(model, "CUDA")
    for value in values:
        feed = {"x": x, name: np.array(value, np.int64)}
        for got, want in zip(rep.run(feed), session.run(None, feed)):
            _check(got, want, f"backend TopK k={value}")
    assert rep.builds == 1, f"{rep.builds} engines built for {len(values)} values of k"
