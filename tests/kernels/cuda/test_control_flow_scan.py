"""The cuda Scan on any scan axes and directions, against onnxruntime.

Without a GPU the layer's host side runs over host memory: `HostBodies` stands in for the
BodyDriver (pointers index one byte array; a body plan runs layer by layer with the reference
kernels), so the slicing, staging and strided copies the tactic asks for are checked exactly;
on a GPU the same models run through the engine.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic

rng = np.random.default_rng(23)
F = TensorProto.FLOAT
L = 5


def two_input_scan(a_axis: int, b_axis: int, out_axes: tuple[int, int, int], in_dirs: tuple[int, int],
                   out_dirs: tuple[int, int, int]) -> onnx.ModelProto:
    """Scan over a (3, L, 4) on `a_axis` and b (3, 4, L) on `b_axis` (slices 3 x 4 each): a
    running sum of a_t * b_t (state) and three scan outputs (the sum, the product, its
    negation) stacked on `out_axes`."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["a_t", "b_t"], ["p"]),
         helper.make_node("Add", ["acc_in", "p"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["y_sum"]),
         helper.make_node("Neg", ["p"], ["y_neg"])],
        "step", [helper.make_tensor_value_info(n, F, [3, 4]) for n in ("acc_in", "a_t", "b_t")],
        [helper.make_tensor_value_info(n, F, [3, 4]) for n in ("acc_out", "y_sum", "p", "y_neg")])
    outs = [helper.make_tensor_value_info("acc", F, [3, 4])]
    for name, axis in zip(("ys", "ps", "ns"), out_axes):
        shape = [3, 4]
        shape.insert(axis % 3, L)
        outs.append(helper.make_tensor_value_info(name, F, shape))
    scan = helper.make_node("Scan", ["acc0", "a", "b"], ["acc", "ys", "ps", "ns"], body=body, num_scan_inputs=2,
                            scan_input_axes=[a_axis, b_axis], scan_output_axes=list(out_axes),
                            scan_input_directions=list(in_dirs), scan_output_directions=list(out_dirs))
    graph = helper.make_graph([scan], "two_input_scan",
                              [helper.make_tensor_value_info("acc0", F, [3, 4]),
                               helper.make_tensor_value_info("a", F, [3, L, 4]),
                               helper.make_tensor_value_info("b", F, [3, 4, L])], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


CASES = {
    "inputs_on_1_and_2_outputs_on_1_0_2": two_input_scan(1, 2, (1, 0, 2), (0, 0), (0, 0, 0)),
    "negative_axes_reverse_b": two_input_scan(-2, -1, (-2, -3, -1), (0, 1), (0, 0, 0)),
    "reverse_outputs": two_input_scan(1, -1, (2, 1, 0), (1, 0), (1, 0, 1)),
}


def feeds() -> dict[str, np.ndarray]:
    return {"acc0": rng.standard_normal((3, 4)).astype(np.float32),
            "a": rng.standard_normal((3, L, 4)).astype(np.float32),
            "b": rng.standard_normal((3, 4, L)).astype(np.float32)}


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))


class HostBodies:
    """The BodyDriver's operations over host memory (module docstring)."""

    def __init__(self, nbytes: int = 1 << 20):
        self.mem = np.zeros(nbytes, np.uint8)
        self.top = 256
        self.strided_copies = 0

    def alloc(self, nbytes: int) -> int:
        ptr, self.top = self.top, self.top + -(-max(nbytes, 1) // 256) * 256
        assert self.top <= self.mem.size, "host memory of the emulated device is full"
        return ptr

    def put(self, ptr: int, array: np.ndarray) -> None:
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        self.mem[ptr:ptr + raw.size] = raw

    def get(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return self.mem[ptr:ptr + n].copy().view(dtype).reshape(shape)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.mem[dst:dst + nbytes] = self.mem[src:src + nbytes].copy()

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int) -> None:
        assert width <= min(dst_pitch, src_pitch), "cuMemcpy2D needs pitches of at least the width"
        self.strided_copies += 1
        for r in range(rows):
            self.copy(dst + r * dst_pitch, src + r * src_pitch, width)

    def run(self, plan, bindings) -> None:
        from polykit.runtime.cuda.harness import reference_layer

        def dtype(name):
            return np.dtype(plan.tensors[name].dtype)

        env = {n: self.get(bindings[n], tuple(plan.tensors[n].shape), dtype(n)) for n in plan.inputs}
        env.update(plan.weights)
        for layer in plan.layers:
            env.update(reference_layer(layer, env))
        for name in plan.metadata["body_outputs"]:
            self.put(bindings[name], env[name].astype(dtype(name)))


class HostLauncher:
    stream = None
    communicator = None
    sm_count = 132

    def __init__(self, bodies: HostBodies):
        self.bodies = bodies

    def workspace(self, nbytes: int) -> int:
        return self.bodies.alloc(nbytes)


def scan_layer(model: onnx.ModelProto, inputs: dict):
    plan = build_plan(model, BuilderConfig(target="cuda", builder_optimization_level=0,
                                           input_shapes={k: v.shape for k, v in inputs.items()}))
    (layer,) = [lay for lay in plan.layers if lay.kind == "Scan"]
    assert layer.tactic == "cuda.control_flow"
    return plan, layer


@pytest.mark.parametrize("case", sorted(CASES))
def test_scan_on_other_axes_slices_and_stacks_like_onnxruntime_on_emulated_memory(case):
    inputs = feeds()
    plan, layer = scan_layer(CASES[case], inputs)
    host = HostBodies()
    tensors = {}
    for name in (*layer.inputs, *layer.outputs):
        desc = plan.tensors[name]
        t = DeviceTensor(0, tuple(desc.shape), np.dtype(desc.dtype))
        tensors[name] = DeviceTensor(host.alloc(t.size * t.dtype.itemsize), t.shape, t.dtype)
        if name in inputs:
            host.put(tensors[name].ptr, inputs[name])
    find_tactic("cuda", "Scan", "cuda.control_flow").enqueue(layer, HostLauncher(host), tensors)
    want = onnxruntime_outputs(CASES[case], inputs)
    for name in layer.outputs:
        got = host.get(tensors[name].ptr, tensors[name].shape, tensors[name].dtype)
        np.testing.assert_allclose(got, want[name], rtol=1e-6, atol=1e-6, err_msg=f"{case}: output {name!r}")
    assert host.strided_copies > 0  # every case has a slice off axis 0


def test_scan_workspace_holds_one_staging_buffer_per_strided_slice():
    """a (3, L, 4) on axis 1 and b (3, 4, L) on axis 2 are strided (3 x 4 floats, 48 bytes ->
    256 each); outputs on axes 1, 0, 2: two strided, the one on axis 0 is contiguous."""
    from polykit.kernels.cuda.models.control_flow import _scan_workspace

    inputs = feeds()
    plan, layer = scan_layer(CASES["inputs_on_1_and_2_outputs_on_1_0_2"], inputs)
    assert _scan_workspace(layer, plan.tensors, 132) == 4 * 256


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_scan_on_other_axes_matches_onnxruntime(case):
    from polykit.runtime.engine import Engine

    inputs = feeds()
    plan = build_plan(CASES[case], BuilderConfig(target="cuda", input_shapes={k: v.shape for k, v in inputs.items()}))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        first, second = ctx.execute(inputs), ctx.execute(inputs)
    for name, ref in onnxruntime_outputs(CASES[case], inputs).items():
        np.testing.assert_allclose(first[name], ref, rtol=1e-5, atol=1e-5, err_msg=f"{case}: output {name!r}")
        np.testing.assert_array_equal(second[name], first[name], err_msg=f"{case}: second run of {name!r}")
