"""The cuda Loop and If whose outputs the run sizes (polykit.runtime.cuda.layer_outputs): a Loop whose
trip count is computed from inputs, or whose body's condition ends it, allocates its scan outputs once
it knows their length (growing by doubling), an If whose branches give other shapes allocates the
taken branch's. Without a GPU the layers' host side runs over emulated memory (HostBodies, as in
test_control_flow_scan); the gpu-marked tests in tests/backends/test_one_engine_per_shape.py run
the same models through the engine."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic
from polykit.runtime.cuda.layer_outputs import LayerOutputs
from polykit.runtime.cuda.sized import data_sized_members
from polykit.runtime.output_alloc import data_outputs
from tests.backends.test_one_engine_per_shape import _if_of_shapes_model, _model, _range_loop_model
from tests.kernels.cuda.test_control_flow_scan import HostBodies, HostLauncher


class LoopBodies(HostBodies):
    """HostBodies with the reads and writes a Loop and an If ask for."""

    def read(self, t: DeviceTensor) -> np.ndarray:
        return self.get(t.ptr, t.shape, t.dtype)

    def write(self, ptr: int, array: np.ndarray) -> None:
        self.put(ptr, array)

    def finish(self) -> None:
        pass


class HostBuffers:
    """LayerOutputs' allocator over HostBodies' memory: records sizes, frees and drains."""

    def __init__(self, host: HostBodies):
        self.host, self.events = host, []

    def alloc(self, nbytes: int):
        buffers = self

        class Buffer:
            ptr = self.host.alloc(nbytes)

            def __init__(self):
                self.nbytes = nbytes
                self.freed = False

            def free(self):
                self.freed = True
                buffers.events.append(("free", self.nbytes))

        self.events.append(("alloc", nbytes))
        return Buffer()

    def outputs(self, plan) -> LayerOutputs:
        return LayerOutputs(plan, self.alloc, lambda: self.events.append(("drain",)),
                            lambda dst, src, n, stream: self.host.copy(dst, src, n))


def _layer_run(plan, kind: str, values: dict[str, np.ndarray], tactic: str = "cuda.control_flow",
               host: "LoopBodies | None" = None):
    """Run the plan's `kind` layer (its `tactic`) on emulated memory (`host`, a LoopBodies by default)
    with its inputs from `values`: the LayerOutputs it sized (and the host), after one enqueue."""
    (layer,) = [lay for lay in plan.layers if lay.kind == kind]
    host = host or LoopBodies()
    buffers = HostBuffers(host)
    launcher = HostLauncher(host)
    launcher.outputs = buffers.outputs(plan)
    find_tactic("cuda", kind, tactic).enqueue(layer, launcher, layer_tensors(plan, layer, host, values))
    return layer, launcher.outputs, host, buffers


def layer_tensors(plan, layer, host: HostBodies, values: dict[str, np.ndarray]) -> dict[str, DeviceTensor]:
    """The layer's tensors in `host` memory at their planned shapes, poisoned (NaN, -7), inputs from `values`."""
    tensors = {}
    for name in (*layer.inputs, *layer.outputs):
        if not name:
            continue
        desc = plan.tensors[name]
        size = int(np.prod(desc.shape, dtype=np.int64)) * np.dtype(desc.dtype).itemsize
        tensors[name] = DeviceTensor(host.alloc(size), tuple(desc.shape), np.dtype(desc.dtype))
        host.put(tensors[name].ptr, np.full(desc.shape, np.nan if desc.np_dtype.kind == "f" else -7, desc.np_dtype))
        if name in values:
            host.put(tensors[name].ptr, values[name].astype(desc.np_dtype))
    return tensors


def _read(plan, layer, outputs: LayerOutputs, host: HostBodies, name: str) -> np.ndarray:
    decided = [o for o in data_outputs(plan) if o.tensor == name]
    shape = list(plan.tensors[name].shape)
    for axis_symbol, size in outputs.read(decided).items():
        shape[[o.axis for o in decided if o.symbol == axis_symbol][0]] = size
    return host.get(outputs.pointers()[name], tuple(shape), plan.tensors[name].np_dtype)


@pytest.mark.parametrize("start,limit,delta", [(1, 5, 2), (0.5, 40, 3), (3, 3, 1), (7, 2, 1), (0, 100, 1)])
def test_a_loop_of_a_trip_count_read_back_sizes_its_scan_output_to_it(start, limit, delta):
    plan = build_plan(_range_loop_model(), BuilderConfig(target="cuda"))  # its body passes its condition
    assert plan.profiles.sized == frozenset({"data(out)[0]"})
    trip = max(int(np.ceil((limit - start) / delta)), 0)
    values = {"trip": np.array(trip), "go": np.array(trip > 0), "start": np.array(start, np.float32),
              "delta": np.array(delta, np.float32)}
    layer, outputs, host, buffers = _layer_run(plan, "Loop", values)
    got = _read(plan, layer, outputs, host, "out")
    np.testing.assert_allclose(got, np.arange(start, limit, delta, dtype=np.float32), rtol=1e-6)
    assert buffers.events == [("alloc", 4 * max(trip, 1))], "one allocation of the trip count's rows"


def _counting_loop():
    """Loop(M="", cond) whose body stops once i + 1 reaches `limit`: the body's condition decides the
    iteration count; scan outputs collect i and 2 i as (2,) rows."""
    body = helper.make_graph(
        [helper.make_node("Add", ["i", "one"], ["next"]), helper.make_node("Less", ["next", "limit"], ["cond_out"]),
         helper.make_node("Identity", ["acc"], ["acc_out"]),
         helper.make_node("Unsqueeze", ["i", "zero"], ["i1"]), helper.make_node("Add", ["i1", "i1"], ["twice"]),
         helper.make_node("Concat", ["i1", "twice"], ["row"], axis=0)],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.INT64, []),
         helper.make_tensor_value_info("row", TensorProto.INT64, [2])],
        [helper.make_tensor("one", TensorProto.INT64, [], [1]), helper.make_tensor("zero", TensorProto.INT64, [1], [0])])
    model = _model([helper.make_node("Loop", ["", "go", "acc0"], ["acc", "rows"], body=body)],
                   [helper.make_tensor_value_info("go", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("acc0", TensorProto.INT64, []),
                    helper.make_tensor_value_info("limit", TensorProto.INT64, [])],
                   [helper.make_tensor_value_info("rows", TensorProto.INT64, None)])
    return model


@pytest.mark.parametrize("limit", [1, 2, 5, 9])
def test_a_loop_its_body_ends_grows_its_scan_output_keeping_the_rows_written(limit):
    model = _counting_loop()
    plan = build_plan(model, BuilderConfig(target="cuda", builder_optimization_level=0))
    assert plan.profiles.sized, "the body's condition decides the length: a sized dim"
    values = {"go": np.array(True), "acc0": np.array(4), "limit": np.array(limit)}
    layer, outputs, host, buffers = _layer_run(plan, "Loop", values)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, values)[0]
    np.testing.assert_array_equal(_read(plan, layer, outputs, host, "rows"), want)
    allocs = [e[1] for e in buffers.events if e[0] == "alloc"]
    assert allocs == [16 * 2 ** k for k in range(len(allocs))] and 16 * 2 ** (len(allocs) - 1) >= 16 * limit, allocs
    assert buffers.events.count(("free", allocs[0])) == (1 if len(allocs) > 1 else 0)


@pytest.mark.parametrize("cond", [True, False])
def test_an_if_whose_branches_give_other_shapes_allocates_the_taken_branch_shape(cond):
    x = np.random.default_rng(9).standard_normal((3, 5)).astype(np.float32)
    plan = build_plan(_if_of_shapes_model(), BuilderConfig(target="cuda", builder_optimization_level=0,
                                                         input_shapes={"cond": (), "x": (3, 5)}))
    assert data_sized_members(plan, LayerOutputs(plan).axes) == {"z": "z"}, "Relu(y) sized once the If ran"
    layer, outputs, host, _ = _layer_run(plan, "If", {"cond": np.array(cond), "x": x})
    np.testing.assert_array_equal(_read(plan, layer, outputs, host, layer.outputs[0]), x[:2] if cond else x.T)


@pytest.mark.gpu
def test_cuda_loop_its_body_ends_serves_every_length_from_one_engine():
    import polykit.backends.onnx_backend as backend

    model = _counting_loop()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rep = backend.prepare(model, "CUDA")
    for limit in (9, 1, 40, 3, 70):  # growing past the first room, then shorter runs reusing the buffer
        values = {"go": np.array(True), "acc0": np.array(4), "limit": np.array(limit)}
        (got,) = rep.run(values)
        want = session.run(None, values)[0]
        assert got.shape == want.shape, f"limit={limit}: rows {got.shape}, onnxruntime {want.shape}"
        np.testing.assert_array_equal(got, want, err_msg=f"limit={limit}")
    assert rep.builds == 1, f"{rep.builds} engines built (one expected)"


def test_tensors_two_loops_size_are_placed_as_soon_as_the_loop_they_need_has_run():
    from polykit.runtime.cuda.sized import SizedRegions, data_sized_groups

    first = _range_loop_model()
    loop2 = helper.make_node("Loop", ["trip", "go", "limit"], ["last2", "out2"], body=first.graph.node[-1].attribute[0].g)
    nodes = list(first.graph.node) + [loop2, helper.make_node("Relu", ["out"], ["a"]),
                                      helper.make_node("Neg", ["out2"], ["b"]),
                                      helper.make_node("Concat", ["a", "b"], ["c"], axis=0)]
    model = _model(nodes, list(first.graph.input), [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)], opset=21)
    plan = build_plan(model, BuilderConfig(target="cuda", fuse=False))
    assert plan.profiles.sized == frozenset({"data(out)[0]", "data(out2)[0]"}), plan.profiles.sized
    groups = data_sized_groups(plan, LayerOutputs(plan).axes)
    assert groups == [{"a": "a"}, {"c": "c"}, {"b": "b"}], groups
    host = HostBodies()
    regions = [SizedRegions(plan, HostBuffers(host).alloc, lambda: None, members=m) for m in groups]
    after_first = [r.bind({"data(out)[0]": 3}) for r in regions]
    assert set(after_first[0]) == {"a"} and after_first[1] == {} and after_first[2] == {}
    after_both = [r.bind({"data(out)[0]": 3, "data(out2)[0]": 5}) for r in regions]
    assert after_both[0] == after_first[0] and set(after_both[1]) == {"c"} and set(after_both[2]) == {"b"}
