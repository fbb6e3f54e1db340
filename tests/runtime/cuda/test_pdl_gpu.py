"""GPU: Programmatic Dependent Launch (polykit.kernels.cuda.pdl) changes no result. One plan each of
a conv net, a transformer block (attention, LayerNorm, GELU MLP) and a model with an If and a Loop
(host-driven: body plans run eagerly on the layer's stream) is loaded with PDL off and on; run
eagerly and replayed from a captured CUDA graph, again and again, the outputs with PDL are bit-
identical to those without. A chain of many tiny kernels, each reading what the one before it
wrote while that one sleeps before writing, comes out exact: a kernel that started early but did
not wait would read a stale value."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig

pytestmark = pytest.mark.gpu

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(7)
RUNS = 6


def _w(name, *shape, scale=0.2):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _model(nodes, inputs, outputs, weights=()):
    graph = helper.make_graph(nodes, "pdl", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(weights))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_net():
    """conv-relu-conv (+ residual) -relu - maxpool - conv - global pool - flatten - gemm."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["t"]), helper.make_node("MaxPool", ["t"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w3"], ["q"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["q"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    weights = [_w("w1", 16, 3, 3, 3), _w("b1", 16), _w("w2", 16, 16, 3, 3), _w("b2", 16), _w("w3", 32, 16, 3, 3),
               _w("wf", 10, 32), _w("bf", 10)]
    return _model(nodes, [("x", F, [2, 3, 32, 32])], [("y", F, [2, 10])], weights), {"x": (2, 3, 32, 32)}


def transformer_block(seq=32, dim=64, heads=4):
    """x + attention(LayerNorm(x)), then + MLP(LayerNorm(.)) with GELU (erf form): one encoder block."""
    hd = dim // heads

    def heads_of(src, out):
        return [helper.make_node("Reshape", [src, "split"], [out + "_r"]),
                helper.make_node("Transpose", [out + "_r"], [out], perm=[0, 2, 1, 3])]

    nodes = [helper.make_node("LayerNormalization", ["x", "g1", "be1"], ["n1"], axis=-1, epsilon=1e-5)]
    for p in "qkv":
        nodes += [helper.make_node("MatMul", ["n1", f"w{p}"], [f"{p}0"]), helper.make_node("Add", [f"{p}0", f"b{p}"], [f"{p}1"])]
        nodes += heads_of(f"{p}1", f"{p}h")
    nodes += [helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["qks"]),
              helper.make_node("Softmax", ["qks"], ["pr"], axis=-1), helper.make_node("MatMul", ["pr", "vh"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctt"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctt", "merge"], ["cm"]),
              helper.make_node("MatMul", ["cm", "wo"], ["o0"]), helper.make_node("Add", ["o0", "bo"], ["o1"]),
              helper.make_node("Add", ["x", "o1"], ["h"]),
              helper.make_node("LayerNormalization", ["h", "g2", "be2"], ["n2"], axis=-1, epsilon=1e-5),
              helper.make_node("MatMul", ["n2", "wm1"], ["m0"]), helper.make_node("Add", ["m0", "bm1"], ["m1"]),
              helper.make_node("Div", ["m1", "sqrt2"], ["m2"]), helper.make_node("Erf", ["m2"], ["m3"]),
              helper.make_node("Add", ["m3", "one"], ["m4"]), helper.make_node("Mul", ["m1", "m4"], ["m5"]),
              helper.make_node("Mul", ["m5", "half"], ["m6"]),
              helper.make_node("MatMul", ["m6", "wm2"], ["m7"]), helper.make_node("Add", ["m7", "bm2"], ["m8"]),
              helper.make_node("Add", ["h", "m8"], ["y"])]

    def const(name, value, dtype=np.float32):
        return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)

    weights = [const("g1", 1 + RNG.standard_normal(dim) * 0.1), const("be1", RNG.standard_normal(dim) * 0.1),
               const("g2", 1 + RNG.standard_normal(dim) * 0.1), const("be2", RNG.standard_normal(dim) * 0.1),
               *[_w(f"w{p}", dim, dim) for p in "qkvo"], *[_w(f"b{p}", dim) for p in "qkvo"],
               _w("wm1", dim, 4 * dim), _w("bm1", 4 * dim), _w("wm2", 4 * dim, dim), _w("bm2", dim),
               const("split", [1, seq, heads, hd], np.int64), const("merge", [1, seq, dim], np.int64),
               const("scale", 1 / np.sqrt(hd)), const("sqrt2", np.sqrt(2)), const("one", 1.0), const("half", 0.5)]
    return _model(nodes, [("x", F, [1, seq, dim])], [("y", F, [1, seq, dim])], weights), {"x": (1, seq, dim)}


def if_and_loop():
    """If(flag) picks Relu(x) @ W or Tanh(x) @ W; a Loop of 5 iterations then carries v = tanh(v * 0.9 + c)
    over it, emitting each iteration's v as a scan output."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["tr"]), helper.make_node("MatMul", ["tr", "w"], ["ty"])],
                             "then", [], [helper.make_tensor_value_info("ty", F, [4, 16])])
    other = helper.make_graph([helper.make_node("Tanh", ["x"], ["er"]), helper.make_node("MatMul", ["er", "w"], ["ey"])],
                              "else", [], [helper.make_tensor_value_info("ey", F, [4, 16])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["go_in"], ["go_out"]), helper.make_node("Mul", ["v", "decay"], ["vd"]),
         helper.make_node("Add", ["vd", "c"], ["va"]), helper.make_node("Tanh", ["va"], ["v_out"]),
         helper.make_node("Identity", ["v_out"], ["scan"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("go_in", B, []),
                 helper.make_tensor_value_info("v", F, [4, 16])],
        [helper.make_tensor_value_info("go_out", B, []), helper.make_tensor_value_info("v_out", F, [4, 16]),
         helper.make_tensor_value_info("scan", F, [4, 16])])
    nodes = [helper.make_node("If", ["flag"], ["picked"], then_branch=then, else_branch=other),
             helper.make_node("Loop", ["trip", "go", "picked"], ["v", "steps"], body=body)]
    weights = [_w("w", 8, 16), _w("c", 4, 16), numpy_helper.from_array(np.array(0.9, np.float32), "decay"),
               numpy_helper.from_array(np.array(5, np.int64), "trip"), numpy_helper.from_array(np.array(True), "go")]
    model = _model(nodes, [("x", F, [4, 8]), ("flag", B, [])], [("v", F, [4, 16]), ("steps", F, [5, 4, 16])], weights)
    return model, {"x": (4, 8)}


def _feeds(shapes, seed, plan):
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    if "flag" in plan.inputs:
        feeds["flag"] = np.array(seed % 2 == 0)
    return feeds


def _runs(plan, shapes, pdl, cuda_graph):
    """Outputs of RUNS runs (each its own inputs, then the first inputs again) on an engine loaded with `pdl`."""
    from polykit.runtime.engine import Engine

    with Engine(plan, pdl=pdl) as engine:
        if pdl:
            target = engine._target_engine
            if not target.modules.pdl:
                pytest.skip(f"{target.info.arch} has no programmatic dependent launch")
            if not any(tactic.host_driven for _, tactic in target.steps):  # (If/Loop: their bodies' engines launch)
                assert target.modules._programmatic  # the plan's kernels really launch with the attribute
        with engine.create_execution_context(cuda_graph=cuda_graph) as ctx:
            return [ctx.execute(_feeds(shapes, seed % 3, plan)) for seed in range(RUNS)]


def _same(a, b):
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for name in x:
            assert x[name].dtype == y[name].dtype and np.array_equal(x[name], y[name], equal_nan=True), name


@pytest.mark.parametrize("make", [conv_net, transformer_block, if_and_loop])
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
def test_outputs_with_pdl_are_bit_identical(make, cuda_graph):
    model, shapes = make()
    plan = build_plan(model, BuilderConfig(target="cuda"))
    plain = _runs(plan, shapes, False, cuda_graph)
    _same(plain, _runs(plan, shapes, False, cuda_graph))  # the plan is deterministic run to run
    for _ in range(2):
        _same(plain, _runs(plan, shapes, True, cuda_graph))


def test_a_plan_built_with_pdl_launches_with_it():
    model, shapes = conv_net()
    plan = build_plan(model, BuilderConfig(target="cuda", pdl=True))
    assert plan.metadata["builder_config"]["pdl"] is True
    from polykit.runtime.engine import Engine

    with Engine(plan) as engine:
        assert engine.pdl
        with engine.create_execution_context() as ctx:
            ctx.execute(_feeds(shapes, 0, plan))


def test_many_tiny_dependent_kernels_each_see_the_last_ones_write():
    """2000 launches of one block each: read buf, sleep ~2 us, write buf + 1; the sum is exact only if
    every kernel waited for the whole of the one before it (every tenth is a unit launched plainly)."""
    from polykit.kernels.cuda.base import KernelSource
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules
    from polykit.runtime.cuda.memory import DeviceBuffer, download, upload
    from polykit.runtime.cuda.stream import CudaGraph, Stream

    body = ('(float* buf, long long n) {\n'
            '  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n'
            '  if (i >= n) return;\n'
            '  float v = buf[i];\n'
            '  __nanosleep(2000);\n'
            '  buf[i] = v + 1.0f;\n'
            '}\n')
    step = KernelSource("pdl_step", code='extern "C" __global__ void __launch_bounds__(256) pdl_step' + body)
    # the same step behind a macro the instrumenter refuses: compiled plain, launched without the attribute
    plain = KernelSource("plain_step", code='#define KERNEL __global__\nextern "C" KERNEL void plain_step' + body)
    info = driver.current_device()
    modules = KernelModules(info.arch, pdl=True)
    if not modules.pdl:
        pytest.skip(f"{info.arch} has no programmatic dependent launch")
    modules.load([step, plain])
    assert modules.programmatic(step) and not modules.programmatic(plain)
    n, launches = 256, 2000
    buf = DeviceBuffer(n * 4, what="stress buffer")
    stream = Stream()
    try:
        def record(s):
            run = CudaLauncher(modules, s.handle, lambda nbytes: 0, "stress")
            for i in range(launches):  # every tenth launch a plain one after (and before) early-triggering ones
                run.launch(plain if i % 10 == 9 else step, (1,), (n,), [buf.ptr, n])

        upload(buf.ptr, np.zeros(n, np.float32))
        record(stream)  # eagerly
        stream.synchronize()
        assert np.array_equal(download(buf.ptr, (n,), np.float32), np.full(n, launches, np.float32))
        graph = CudaGraph(stream, record)  # and as a captured graph (programmatic edges), replayed
        try:
            upload(buf.ptr, np.zeros(n, np.float32))
            for _ in range(3):
                graph.launch(stream)
            stream.synchronize()
            assert np.array_equal(download(buf.ptr, (n,), np.float32), np.full(n, 3 * launches, np.float32))
        finally:
            graph.close()
    finally:
        stream.close()
        buf.free()
        modules.close()


@pytest.mark.parametrize("tactic", ["cuda.weight_only.mma_staged_c16_k4096", "cuda.weight_only.mma_staged_c16_k4096_p2",
                                    "cuda.weight_only.mma_staged_c16_k4096_r",
                                    "cuda.weight_only.mma_staged_c64_k1024", "cuda.weight_only.mma_rows_n16_k4096",
                                    "cuda.weight_only.mma_rows_n64_k1024"])
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
def test_weight_only_layers_that_read_their_weights_before_the_wait_are_bit_identical(tactic, cuda_graph):
    """A chain of W4A16 layers whose kernels read their packed weights before griddepcontrol.wait (pdl.DEFER):
    each layer's X is the layer before's Y, so one that read X (or wrote Y) early would differ. K = 2048: the
    k1024 tiles split K, and their reduce (which waits first) adds the splits."""
    from benchmarks.weight_only_gemm import weight_only_chain
    from polykit.compiler.graph.onnx_import import load_onnx

    layers = 4
    chain = load_onnx(weight_only_chain("int4", 2048, layers, 128, 5))
    plan = build_plan(chain, BuilderConfig(target="cuda", builder_optimization_level=0,
                                           tactic_replay={f"fc{i}": tactic for i in range(layers)}))
    assert {plan.metadata["tactics"][f"fc{i}"] for i in range(layers)} == {tactic}

    def runs(pdl):
        from polykit.runtime.engine import Engine

        with Engine(plan, pdl=pdl) as engine:
            if pdl and not engine._target_engine.modules.pdl:
                pytest.skip("no programmatic dependent launch on this device")
            with engine.create_execution_context(cuda_graph=cuda_graph) as ctx:
                rng = np.random.default_rng(3)
                return [ctx.execute({"x": rng.standard_normal((5, 2048)).astype(np.float16)}) for _ in range(RUNS)]

    plain = runs(False)
    assert all(np.isfinite(r["y"]).all() and np.abs(r["y"]).max() > 0 for r in plain)
    for _ in range(3):
        _same(plain, runs(True))
