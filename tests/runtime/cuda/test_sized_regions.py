"""Run-time-sized tensors on cuda (polykit.runtime.cuda.sized), the parts that run without a GPU:
which tensors a size set's region holds, where they lie in it, and the bounded cache of regions
with the holds CUDA graphs put on them (device memory faked by a recording allocator)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.file import Plan
from polykit.compiler.builder.value_ranges import ruled_profile
from polykit.runtime.cuda.sized import MAX_SIZED_SETS, SizedRegions, sized_members
from polykit.runtime.shapes import ShapeBinder

X_SHAPE = (2, 3, 4)
#: Reshape targets of x's 24 elements, each a distinct size set, more than the cache keeps
TARGETS = [[a, b, 24 // (a * b)] for a in (1, 2, 3, 4) for b in (1, 2, 3) if 24 % (a * b) == 0]


def _view_chain():
    """a = Reshape(x, shape) (a view of the input: arena), b = Relu(a), c = Flatten(b) (a view of b),
    d = Neg(c), e = Sigmoid(b), f = Tanh(e); outputs d, f."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Flatten", ["b"], ["c"], axis=0), helper.make_node("Neg", ["c"], ["d"]),
             helper.make_node("Sigmoid", ["b"], ["e"]), helper.make_node("Tanh", ["e"], ["f"])]
    g = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE)),
                                           helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("d", "f")])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


def _topk():
    g = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1)], "topk",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE)),
                           helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


def _cuda_plan(model, name, opt, **config):
    graph = load_onnx(model)
    feeds = {"x": np.ones(X_SHAPE, np.float32), name: np.array(opt, np.int64)}
    shapes = {k: v.shape for k, v in feeds.items()}
    profile = ruled_profile(graph, shapes, feeds)
    plan = build_plan(graph, BuilderConfig(target="cuda", input_shapes=shapes, profiles=[profile], **config))
    return Plan.deserialize(plan.serialize())


class FakeDevice:
    """Buffers at distinct fake addresses; records allocations, frees and drains in order."""

    def __init__(self):
        self.events: list[tuple] = []
        self.live: dict[int, int] = {}
        self._next = 1 << 20

    def alloc(self, nbytes):
        device = self

        class Buffer:
            ptr, size = device._next, nbytes

            def free(self):
                device.events.append(("free", self.ptr))
                del device.live[self.ptr]

        device._next += 1 << 20
        device.live[Buffer.ptr] = nbytes
        device.events.append(("alloc", Buffer.ptr, nbytes))
        return Buffer()

    def drain(self):
        self.events.append(("drain",))


def _dims(plan, name, value):
    shapes = {n: plan.tensors[n].shape for n in plan.inputs}
    return ShapeBinder(plan).bind(shapes, 0, {name: np.array(value)})


def test_the_region_holds_run_time_sized_tensors_and_their_views_not_views_of_arena_tensors():
    plan = _cuda_plan(_view_chain(), "shape", [2, 3, 4], fuse=False)
    assert plan.memory.aliases.get("a") == "x" and plan.memory.aliases.get("c") == "b", plan.memory.aliases
    assert sized_members(plan) == {"b": "b", "c": "b", "d": "d", "e": "e", "f": "f"}


@pytest.mark.parametrize("value", [[2, 3, 4], [1, 24, 1], [-1, 2, 0]])
def test_views_share_their_source_bytes_and_tensors_live_together_never_overlap(value):
    plan = _cuda_plan(_view_chain(), "shape", [2, 3, 4], fuse=False)
    shapes = _dims(plan, "shape", value)
    regions = SizedRegions(plan, FakeDevice().alloc, lambda: None)
    layout = regions.layout(shapes.dims)
    assert layout.offsets["c"] == layout.offsets["b"], "a view must read its source's bytes"
    life, members = plan.memory.lifetimes, regions.members
    spans = {}
    for name, root in members.items():
        nbytes = int(np.prod(shapes.shapes[root])) * 4
        assert nbytes == 96, f"{name}: every tensor of the chain has x's 24 floats"
        spans[name] = (layout.offsets[name], layout.offsets[name] + nbytes)
        assert spans[name][1] <= layout.nbytes, f"{name} runs past the region ({layout.nbytes} bytes)"
    for p in members:
        for q in members:
            live_together = not (life[p][1] < life[q][0] or life[q][1] < life[p][0])
            if p < q and members[p] != members[q] and live_together:
                assert spans[p][1] <= spans[q][0] or spans[q][1] <= spans[p][0], f"{p} {spans[p]} overlaps {q} {spans[q]}"


def test_a_size_set_larger_than_the_opt_gets_a_region_sized_for_it():
    plan = _cuda_plan(_topk(), "k", [2])
    regions = SizedRegions(plan, FakeDevice().alloc, lambda: None)
    opt = regions.layout(_dims(plan, "k", [2]).dims)
    big = regions.layout(_dims(plan, "k", [4]).dims)
    assert plan.tensors["i"].nbytes == 2 * 3 * 2 * 8, "the plan records the opt size"
    # y: 2x3x4 float32 = 96 bytes, i: 2x3x4 int64 = 192 bytes, both outputs: slots of their own
    assert sorted((big.offsets["y"], big.offsets["i"])) == [0, 256] and big.nbytes == 256 + 256
    assert big.nbytes > plan.tensors["i"].nbytes and opt.nbytes == 512


def test_regions_are_cached_per_size_set_and_the_oldest_freed_past_the_bound():
    plan = _cuda_plan(_view_chain(), "shape", [2, 3, 4], fuse=False)
    device = FakeDevice()
    regions = SizedRegions(plan, device.alloc, device.drain)
    assert len(TARGETS) > MAX_SIZED_SETS + 1
    first = dict(regions.bind(_dims(plan, "shape", TARGETS[0]).dims))
    assert dict(regions.bind(_dims(plan, "shape", TARGETS[0]).dims)) == first, "the same sizes, the same region"
    for value in TARGETS[1:]:
        regions.bind(_dims(plan, "shape", value).dims)
    assert regions.live == MAX_SIZED_SETS == len(device.live)
    frees = [e for e in device.events if e[0] == "free"]
    assert len(frees) == len(TARGETS) - MAX_SIZED_SETS and frees[0] == ("free", device.events[0][1])
    assert all(device.events[device.events.index(f) - 1] == ("drain",) for f in frees), \
        "a region is freed only after the device drained"
    again = dict(regions.bind(_dims(plan, "shape", TARGETS[0]).dims))
    assert again != first and regions.live == MAX_SIZED_SETS, "an evicted size set gets a new region"
    regions.free()
    assert device.live == {} and regions.live == 0


def test_a_region_a_graph_holds_outlives_its_eviction_and_is_found_again():
    plan = _cuda_plan(_view_chain(), "shape", [2, 3, 4], fuse=False)
    device = FakeDevice()
    regions = SizedRegions(plan, device.alloc, device.drain)
    held = dict(regions.bind(_dims(plan, "shape", TARGETS[0]).dims))
    release = regions.hold()
    for value in TARGETS[1:MAX_SIZED_SETS + 1]:  # evicts TARGETS[0] from the cache
        regions.bind(_dims(plan, "shape", value).dims)
    assert regions.live == MAX_SIZED_SETS + 1, "the held region must stay besides the cached ones"
    assert dict(regions.bind(_dims(plan, "shape", TARGETS[0]).dims)) == held, "binding its sizes again must revive it"
    release()
    release()  # a second release changes nothing
    assert device.events[0][1] in device.live, "still cached after the graph let go"
    regions.free()
    assert device.live == {}


def test_a_released_region_that_left_the_cache_is_freed():
    plan = _cuda_plan(_view_chain(), "shape", [2, 3, 4], fuse=False)
    device = FakeDevice()
    regions = SizedRegions(plan, device.alloc, device.drain)
    regions.bind(_dims(plan, "shape", TARGETS[0]).dims)
    release = regions.hold()
    for value in TARGETS[1:MAX_SIZED_SETS + 1]:
        regions.bind(_dims(plan, "shape", value).dims)
    held = device.events[0][1]
    assert held in device.live and regions.live == MAX_SIZED_SETS + 1
    release()
    assert held not in device.live and regions.live == MAX_SIZED_SETS
    assert device.events[-2:] == [("drain",), ("free", held)]
    regions.free()


def test_a_plan_without_shape_rules_has_no_region():
    plan = _cuda_plan(_topk(), "k", [2])
    static = Plan.deserialize(build_plan(load_onnx(_topk()), BuilderConfig(
        target="cuda", input_shapes={"x": X_SHAPE, "k": (1,)}, input_values={"k": np.array([2])})).serialize())
    assert sized_members(plan) and not SizedRegions(static, FakeDevice().alloc)
