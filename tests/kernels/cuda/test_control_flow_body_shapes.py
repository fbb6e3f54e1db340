"""The cuda Loop over a body of run-time shapes (polykit.compiler.builder.bodies.body_profile): each iteration
binds the body's input shapes and iteration number, the carried values whose dims the run sizes live
in buffers the layer grows (polykit.runtime.cuda.layer_outputs), and a scan output whose rows change
shape is refused. Without a GPU the layer's host side runs over emulated memory (as in
test_control_flow_sized); the gpu-marked twins are tests/backends/test_loop_body_shapes_cuda.py."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import RuntimeInputError
from polykit.runtime.cuda.harness import reference_layer
from polykit.runtime.shapes import ShapeBinder
from tests.backends.test_loop_body_shapes import _feed, _sliding_sum_model
from tests.backends.test_one_engine_per_shape import _model
from tests.kernels.cuda.test_control_flow_sized import LoopBodies, _layer_run, _read


class ShapedBodies(LoopBodies):
    """LoopBodies whose body plans built for a profile take the shapes `bind` gave them (a ShapeBinder
    of the body plan, as the body's execution context has) and record each bind."""

    def __init__(self):
        super().__init__()
        self.bound, self.binds = {}, []

    def bind(self, plan, shapes, values):
        inputs = {n: tuple(shapes.get(n, plan.tensors[n].shape)) for n in plan.inputs}
        found = ShapeBinder(plan).bind(inputs, 0, values)
        self.bound[id(plan)] = found
        self.binds.append((dict(shapes), {n: int(v.reshape(-1)[0]) for n, v in values.items()}))
        return {n: tuple(found.shapes.get(n, plan.tensors[n].shape)) for n in plan.outputs}

    def run(self, plan, bindings) -> None:
        found = self.bound[id(plan)]

        def shape(name):
            return tuple(found.shapes.get(name, plan.tensors[name].shape))

        env = {n: self.get(bindings[n], shape(n), plan.tensors[n].np_dtype) for n in plan.inputs}
        env.update(plan.weights)
        env.update(found.values)
        for layer in plan.layers:
            env.update(reference_layer(layer, env))
        for name in plan.metadata["body_outputs"]:
            assert env[name].shape == shape(name), f"{name}: ran {env[name].shape}, bound {shape(name)}"
            self.put(bindings[name], env[name].astype(plan.tensors[name].np_dtype))


def _loop_run(plan, values):
    return _layer_run(plan, "Loop", values, host=ShapedBodies())


def _cuda_plan(model, shapes):
    plan = build_plan(model, BuilderConfig(target="cuda", input_shapes=shapes))
    (layer,) = [lay for lay in plan.layers if lay.kind == "Loop"]
    assert layer.tactic == "cuda.control_flow", layer.tactic
    assert layer.attrs["body"].profiles is not None, "the body should be built for a profile"
    return plan


@pytest.mark.parametrize("n", [0, 1, 3, 5])
def test_the_cuda_loop_binds_each_iteration_of_a_body_of_run_time_shapes(n):
    model = _sliding_sum_model()
    plan = _cuda_plan(model, {"n": (), "cond": (), "y": (1,)})
    feed = _feed(n)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    layer, outputs, host, _ = _loop_run(plan, feed)
    for name, w in zip(("res_y", "res_scan"), want):
        got = _read(plan, layer, outputs, host, name)
        assert got.shape == w.shape, f"n={n} {name}: shape {got.shape}, onnxruntime {w.shape}"
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6, err_msg=f"n={n} {name}")
    iterations = [v["i"] for _, v in host.binds]
    assert iterations == ([0] + list(range(1, n)) if n else [0]), f"binds of iteration numbers {iterations}"


@pytest.mark.parametrize("n", [6, 7])
def test_a_scan_output_whose_rows_change_shape_is_refused_naming_the_iteration(n):
    plan = _cuda_plan(_sliding_sum_model(), {"n": (), "cond": (), "y": (1,)})
    with pytest.raises(RuntimeInputError, match=r"iteration 5 gives scan output 2 the shape \(0,\)"):
        _loop_run(plan, _feed(n))


def _history_model():
    """Loop(M, cond, h) whose body appends i * w to its carried history h: h grows by one row per
    iteration (a dim the run sizes); the scan output is the row appended."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["f", "w"], ["row"]), helper.make_node("Unsqueeze", ["row", "zero"], ["row1"]),
         helper.make_node("Concat", ["h_in", "row1"], ["h_out"], axis=0)],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [None, 3]),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [3])],
        [helper.make_tensor("zero", TensorProto.INT64, [1], [0])])
    return _model([helper.make_node("Loop", ["n", "go", "h"], ["hist", "rows"], body=body)],
                  [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                   helper.make_tensor_value_info("go", TensorProto.BOOL, []),
                   helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 3]),
                   helper.make_tensor_value_info("w", TensorProto.FLOAT, [3])],
                  [helper.make_tensor_value_info("hist", TensorProto.FLOAT, None),
                   helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)])


def test_a_carried_history_that_grows_every_iteration_grows_its_buffer_keeping_what_it_holds():
    model = _history_model()
    plan = _cuda_plan(model, {"n": (), "go": (), "h": (2, 3), "w": (3,)})
    rng = np.random.default_rng(5)
    feed = {"n": np.array(9), "go": np.array(True), "h": rng.standard_normal((2, 3)).astype(np.float32),
            "w": rng.standard_normal(3).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    layer, outputs, host, buffers = _loop_run(plan, feed)
    for name, w in zip(("hist", "rows"), want):
        np.testing.assert_allclose(_read(plan, layer, outputs, host, name), w, rtol=1e-6, err_msg=name)
    allocs = [e[1] for e in buffers.events if e[0] == "alloc"]
    # the initial 2x3 history, the scan output's 9 rows at once, then the history doubling to 11x3
    assert allocs == [24, 9 * 12, 48, 96, 192], allocs
    assert [e[1] for e in buffers.events if e[0] == "free"] == [24, 48, 96], "each outgrown buffer freed"
