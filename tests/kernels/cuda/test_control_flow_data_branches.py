"""The cuda If over branches whose output lengths depend on data (polykit.kernels.cuda.models.control_flow
`_Branch`): a branch built for a profile (a filtered count reaches it) is bound to its inputs' shapes
first, and an output whose length a layer of the branch decides (NonZero, NonMaxSuppression) is written
into room of its bound at these input shapes and takes the length its run gave it. Without a GPU
the layer's host side runs over emulated memory (as in test_control_flow_sized). A Loop carrying a value
its body filters every iteration likewise takes its bound as room and the length each iteration gave.
The gpu-marked tests at the end run the same models, and one with such an If inside a Loop body,
through the engine."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic
from polykit.runtime.cuda.harness import reference_layer
from polykit.runtime.output_alloc import OutputSizes, data_outputs
from polykit.runtime.shapes import ShapeBinder
from tests.compiler.test_data_dependent_dims import (_check, _const, _detections, _filter, _model, _vectors,
                                                     boxes_and_offsets, filter_over_a_branch)
from tests.kernels.cuda.test_control_flow_body_shapes import ShapedBodies
from tests.kernels.cuda.test_control_flow_sized import HostBuffers, _layer_run, _read
from tests.kernels.cuda.test_control_flow_scan import HostLauncher

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _out(name, dtype):
    return helper.make_tensor_value_info(name, dtype, None)


def branches_of_two_filters():
    """x -> keep x > 0 -> If(flag): then keeps those above 0.5, else those above 1.0 (two lengths
    each branch's own NonZero decides); the chosen values doubled, and their count."""
    then = helper.make_graph(_filter("pos", 0.5, "hi", "t"), "then", [], [_out("hi", F)])
    other = helper.make_graph(_filter("pos", 1.0, "lo", "e"), "else", [], [_out("lo", F)])
    nodes = _filter("x", 0.0, "pos", "a") + [
        helper.make_node("If", ["flag"], ["chosen"], then_branch=then, else_branch=other),
        helper.make_node("Add", ["chosen", "chosen"], ["y"]), helper.make_node("Shape", ["chosen"], ["n"])]
    return _model(nodes, [("x", F, [12]), ("flag", B, [])], [("y", F), ("n", I64)])


def two_filters_in_a_loop():
    """Loop(3) whose body runs branches_of_two_filters' If on the even/odd iteration number over x
    (captured): the carried sum of the chosen values, and each iteration's count as a scan output."""
    then = helper.make_graph(_filter("x", 0.5, "hi", "t"), "then", [], [_out("hi", F)])
    other = helper.make_graph(_filter("x", 1.0, "lo", "e"), "else", [], [_out("lo", F)])
    body = helper.make_graph(
        [helper.make_node("Identity", ["go_in"], ["go_out"]), _const("two", 2, I64),
         helper.make_node("Mod", ["i", "two"], ["odd"]), _const("zero", 0, I64),
         helper.make_node("Equal", ["odd", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["chosen"], then_branch=then, else_branch=other),
         helper.make_node("ReduceSum", ["chosen"], ["s"], keepdims=0), helper.make_node("Add", ["acc", "s"], ["acc_out"]),
         helper.make_node("Shape", ["chosen"], ["n"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("go_in", B, []),
                 helper.make_tensor_value_info("acc", F, [])], [_out("go_out", B), _out("acc_out", F), _out("n", I64)])
    nodes = [_const("trip", 3, I64), _const("go", True, B), _const("acc0", 0.0),
             helper.make_node("Loop", ["trip", "go", "acc0"], ["acc", "counts"], body=body)]
    return _model(nodes, [("x", F, [8])], [("acc", F), ("counts", I64)])


def filtered_every_iteration():
    """Loop(trip) carrying v (x at first): each iteration keeps the elements of v - 0.4 above -0.5, a
    length the body's NonZero decides (the body is built for a profile of v's length); the count kept
    per iteration as a scan output."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["go_in"], ["go_out"]), _const("d", 0.4),
         helper.make_node("Sub", ["v", "d"], ["w"])] + _filter("w", -0.5, "v_out", "k") +
        [helper.make_node("Shape", ["v_out"], ["n"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("go_in", B, []),
                 helper.make_tensor_value_info("v", F, [None])], [_out("go_out", B), _out("v_out", F), _out("n", I64)])
    nodes = [_const("go", True, B), helper.make_node("Loop", ["trip", "go", "x"], ["v", "counts"], body=body)]
    return _model(nodes, [("x", F, [8]), ("trip", I64, [])], [("v", F), ("counts", I64)])


class RanBodies(ShapedBodies):
    """ShapedBodies that runs static body plans too, and bodies whose output lengths a layer of theirs
    decides from values: the reference kernels give the run's shapes, which `shapes` reads back (as
    the body's execution context does once the run read its counts). Each output must fit the bytes
    the body plan reserves for it (the room the layer gave it)."""

    def __init__(self, nbytes: int = 1 << 20):
        super().__init__()
        self.mem = np.zeros(nbytes, np.uint8)
        self.ran = {}

    def run(self, plan, bindings) -> None:
        found = self.bound.get(id(plan))
        if found is None:
            found = ShapeBinder(plan).bind({n: tuple(plan.tensors[n].shape) for n in plan.inputs})
        env = {n: self.get(bindings[n], tuple(found.shapes.get(n, plan.tensors[n].shape)), plan.tensors[n].np_dtype)
               for n in plan.inputs}
        env.update(plan.weights)
        env.update(found.values)
        for layer in plan.layers:
            env.update(reference_layer(layer, env))
        if plan.profiles is not None and plan.profiles.data:  # shape tensors of the decided sizes (Shape of a NonZero's)
            sizes = {o.symbol: env[o.tensor].shape[o.axis] for o in data_outputs(plan)}
            env.update(ShapeBinder(plan).bind_data(found, sizes).values)
        self.ran[id(plan)] = {}
        for name in plan.metadata["body_outputs"]:
            value = env[name].astype(plan.tensors[name].np_dtype)
            assert value.nbytes <= plan.tensors[name].nbytes, f"{name}: {value.nbytes} bytes past its reserved room"
            self.put(bindings[name], value)
            self.ran[id(plan)][name] = value.shape

    def shapes(self, plan):
        return dict(self.ran[id(plan)])


def _intermediates(model, feeds, names):
    """onnxruntime's values of the graph's tensors `names` ({name: elem type}) for `feeds`."""
    probe = type(model)()
    probe.CopyFrom(model)
    probe.graph.output.extend(_out(n, t) for n, t in names.items())
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(list(names), feeds)))


class IfRig:
    """The plan's If layer (cuda.control_flow; `name`: which one) over emulated memory (`nbytes`), one
    LayerOutputs across runs (as one context's): `run(values)` enqueues it with its inputs from `values`
    at their own shapes."""

    def __init__(self, plan, name: str | None = None, nbytes: int = 1 << 20):
        (self.layer,) = [lay for lay in plan.layers if lay.kind == "If" and name in (None, lay.name)]
        assert self.layer.tactic == "cuda.control_flow", self.layer.tactic
        self.plan, self.host = plan, RanBodies(nbytes)
        self.buffers = HostBuffers(self.host)
        self.launcher = HostLauncher(self.host)
        self.launcher.outputs = self.buffers.outputs(plan)

    def run(self, values) -> None:
        tensors = {}
        for name in (*self.layer.inputs, *self.layer.outputs):
            desc = self.plan.tensors[name]
            value = values.get(name, np.full(desc.shape, -7, desc.np_dtype)).astype(desc.np_dtype)
            tensors[name] = DeviceTensor(self.host.alloc(max(value.nbytes, desc.nbytes)), value.shape, desc.np_dtype)
            self.host.put(tensors[name].ptr, value)
        find_tactic("cuda", "If", "cuda.control_flow").enqueue(self.layer, self.launcher, tensors)

    def read(self, name):
        return _read(self.plan, self.layer, self.launcher.outputs, self.host, name)


def _cuda_plan(model):
    return build_plan(model, BuilderConfig(target="cuda", builder_optimization_level=0))


@pytest.mark.parametrize("kept", [0.0, 0.5, 1.0])
def test_the_cuda_if_binds_a_branch_a_filtered_count_reaches_and_sizes_its_nms_output(kept):
    model = boxes_and_offsets(True)
    plan = _cuda_plan(model)
    (layer,) = [lay for lay in plan.layers if lay.kind == "If"]
    assert all(layer.attrs[k].profiles.ranges != ({},) for k in ("then_branch", "else_branch")), \
        "both branches are built for a profile of the kept count"
    feeds = _detections(kept, 7)
    names = {"none": B, "kept_boxes": F, "kept_labels": I64, "kept_scores": F, "keep_if": I64}
    values = _intermediates(model, feeds, names)
    rig = IfRig(plan)
    rig.run(values)
    assert rig.host.binds and rig.host.binds[0][0]["kept_boxes"] == values["kept_boxes"].shape, rig.host.binds
    got = rig.read("keep_if")
    assert got.shape == values["keep_if"].shape, (got.shape, values["keep_if"].shape)
    np.testing.assert_array_equal(got, values["keep_if"])


@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("which", range(3))
def test_the_cuda_if_gives_a_branch_output_the_length_its_own_filter_decided(which, flag):
    model = filter_over_a_branch(False)
    plan = _cuda_plan(model)
    feeds = {"x": _vectors(12)[which], "flag": np.array(flag)}
    values = {**feeds, **_intermediates(model, feeds, {"chosen": F})}
    rig = IfRig(plan)
    rig.run(values)
    got = rig.read("chosen")
    assert got.shape == values["chosen"].shape, (got.shape, values["chosen"].shape)
    np.testing.assert_array_equal(got, values["chosen"])
    if not flag:  # the else branch's NonZero decides the length: room of its bound, the 12 floats of x
        assert rig.buffers.events == [("alloc", 12 * 4)], rig.buffers.events


@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("which", range(3))
def test_the_cuda_if_of_two_filtered_lengths_gives_the_taken_branch_length(which, flag):
    model = branches_of_two_filters()
    plan = _cuda_plan(model)
    feeds = {"x": _vectors(12, seed=4)[which] * 2, "flag": np.array(flag)}
    values = {**feeds, **_intermediates(model, feeds, {"pos": F, "chosen": F})}
    rig = IfRig(plan)
    rig.run(values)
    np.testing.assert_array_equal(rig.read("chosen"), values["chosen"])


def test_the_cuda_if_reuses_its_room_across_runs_of_other_lengths():
    """One LayerOutputs across runs: a later run of a shorter (or empty) kept set reuses the buffer."""
    model = branches_of_two_filters()
    rig = IfRig(_cuda_plan(model))
    for x in (_vectors(12, seed=4)[2] * 2, _vectors(12, seed=4)[1], _vectors(12)[0]):
        feeds = {"x": x, "flag": np.array(False)}
        values = {**feeds, **_intermediates(model, feeds, {"pos": F, "chosen": F})}
        rig.run(values)
        np.testing.assert_array_equal(rig.read("chosen"), values["chosen"])
    kept = int(np.count_nonzero(_vectors(12, seed=4)[2] > 0))
    assert rig.buffers.events == [("alloc", 4 * kept)], "room of the first run's bound (its kept count), then reused"


@pytest.mark.parametrize("trip", [0, 1, 3, 6])
@pytest.mark.parametrize("which", range(3))
def test_the_cuda_loop_carries_a_value_its_body_filters_every_iteration(which, trip):
    model = filtered_every_iteration()
    plan = _cuda_plan(model)
    feeds = {"x": _vectors(8, seed=3)[which] * 1.5, "trip": np.array(trip)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    layer, outputs, host, _ = _layer_run(plan, "Loop", {**feeds, "go": np.array(True)}, host=RanBodies())
    for name, w in zip(("v", "counts"), want):
        got = _read(plan, layer, outputs, host, name)
        assert got.shape == w.shape, (name, got.shape, w.shape)
        np.testing.assert_array_equal(got, w, err_msg=name)


def test_the_run_ends_a_segment_at_the_if_whose_output_its_branch_sizes():
    """The engine binds the If's output length after the If and before its consumers (a read-back, so
    the plan is never replayed as one CUDA graph across it): the If is the last layer of a segment."""
    plan = _cuda_plan(branches_of_two_filters())
    index = next(i for i, lay in enumerate(plan.layers) if lay.kind == "If")
    sizes = OutputSizes(plan)
    assert sizes, "a plan with data-dependent sizes runs in segments"

    class Sizes:
        def data_sizes(self, decided, stream):
            return {o.symbol: 1 for o in decided}

        def bind_shapes(self, shapes):
            pass

        def copy_in(self, name, value, stream):
            pass

    segments = []
    binder = ShapeBinder(plan)
    sizes.run(Sizes(), binder, binder.bind({"x": (12,), "flag": ()}), None, lambda ix: segments.append(list(ix)))
    ends = [s[-1] for s in segments if s]
    assert index in ends and any(s and s[0] > index for s in segments), segments


def test_models_of_this_file_match_onnxruntime_on_cpu():
    for model, feeds in _cases().values():
        _check(model, feeds)


def _cases():
    vectors = [{"x": x * 2} for x in _vectors(12, seed=4)]
    return {"if_of_two_filters": (branches_of_two_filters(),
                                  [{**f, "flag": np.array(flag)} for f in vectors for flag in (True, False)]),
            "if_of_two_filters_in_a_loop": (two_filters_in_a_loop(), [{"x": x * 2} for x in _vectors(8, seed=5)]),
            "filtered_every_iteration": (filtered_every_iteration(),
                                         [{"x": x * 1.5, "trip": np.array(t)} for x in _vectors(8, seed=3) for t in (0, 3, 6)])}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(_cases()))
def test_if_of_data_dependent_branches_on_cuda(case):
    model, feeds = _cases()[case]
    _check(model, feeds, target="cuda")
