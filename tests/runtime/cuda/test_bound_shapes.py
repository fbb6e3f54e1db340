"""Host side of a cuda context's shape binding, without a GPU: the DeviceTensors carry a shape set
once per set, not once per run (polykit.runtime.cuda.bound_shapes), and the shape-tensor values'
region is copied to only when the set it holds changes (polykit.runtime.cuda.staging)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.profiles import Profile
from polykit.kernels.cuda.base import DeviceTensor
from polykit.runtime.cuda import staging
from polykit.runtime.cuda.bound_shapes import BoundShapes
from polykit.runtime.shapes import ShapeBinder
from tests.dynamic_models import tiny_bert

RANGE = ((1, 4), (2, 8), (4, 16))


@pytest.fixture(scope="module")
def bert_plan():
    """A cuda plan of the test suite's tiny BERT for a batch x sequence profile (level 0: built
    without a GPU); it has dynamic tensors and host-computed shape values."""
    cfg = BuilderConfig(target="cuda", builder_optimization_level=0,
                        profiles=[Profile({"input_ids": RANGE, "attention_mask": RANGE})])
    return build_plan(tiny_bert(), cfg)


def _context(plan):
    """The part of a CudaContext that bind_shapes touches, on null pointers."""
    from polykit.runtime.cuda.target import CudaContext

    class Outputs:
        def pointers(self):
            return {}

    class Engine:
        profile_steps = [["steps of profile 0"]]

    ctx = object.__new__(CudaContext)
    ctx.engine, ctx._sized, ctx._data_sized, ctx._outputs = Engine(), [], [], Outputs()
    ctx.tensors = BoundShapes.emulated(plan)
    ctx._bound = BoundShapes(ctx.tensors)
    return ctx


def test_the_context_rebinds_its_tensors_once_per_shape_set(bert_plan):
    binder = ShapeBinder(bert_plan)
    small, large = binder.bind({"input_ids": (1, 4), "attention_mask": (1, 4)}), \
        binder.bind({"input_ids": (4, 16), "attention_mask": (4, 16)})
    assert len(small.shapes) > 10 and small.values  # dynamic tensors and shape values to bind
    ctx = _context(bert_plan)
    ctx.bind_shapes(small)
    first = dict(ctx.tensors)
    assert all(first[n].shape == tuple(s) for n, s in small.shapes.items())
    ctx.bind_shapes(binder.bind({"input_ids": (1, 4), "attention_mask": (1, 4)}))  # the next run, same shapes
    assert all(ctx.tensors[n] is first[n] for n in first)  # nothing rebuilt
    ctx.bind_shapes(large)
    assert all(ctx.tensors[n].shape == tuple(s) for n, s in large.shapes.items())
    ctx.bind_shapes(small)  # back: every tensor carries the small set again
    assert {n: ctx.tensors[n].shape for n in small.shapes} == {n: tuple(s) for n, s in small.shapes.items()}


def test_a_new_set_rebuilds_only_the_tensors_whose_shape_changed_and_keeps_pointers():
    tensors = {"a": DeviceTensor(256, (2, 8), np.dtype(np.float16)), "b": DeviceTensor(512, (8,), np.dtype(np.int64)),
               "w": DeviceTensor(1024, (3, 3), np.dtype(np.float32))}

    class Set:
        def __init__(self, key, shapes):
            self.key, self.shapes = key, shapes

    bound = BoundShapes(tensors)
    assert bound.bind(Set((0, (2, 8)), {"a": (2, 8), "b": (8,)})) == 0  # already these shapes
    assert bound.bind(Set((0, (4, 8)), {"a": (4, 8), "b": (8,)})) == 1
    tensors["a"] = DeviceTensor(4096, (4, 8), np.dtype(np.float16))  # moved in place (a caller's address)
    assert bound.bind(Set((0, (4, 8)), {"a": (4, 8), "b": (8,)})) == 0
    assert bound.bind(Set((0, (1, 2)), {"a": (1, 2), "b": (2,)})) == 2
    assert tensors["a"] == DeviceTensor(4096, (1, 2), np.dtype(np.float16))  # the moved pointer kept
    assert tensors["w"].shape == (3, 3)
    assert bound.bind(Set((0, (2, 8)), {"a": (2, 8), "b": (8,)})) == 2


class _FakeBuffer:
    def __init__(self, nbytes, what="", allocator=None):
        self.nbytes, self.ptr = nbytes, 0x1000

    def free(self):
        pass


class _FakeBlock:
    def __init__(self, nbytes):
        self.nbytes, self.data, self.ptr = nbytes, bytearray(nbytes), 0x2000

    def write(self, offset, array):
        self.data[offset:offset + array.nbytes] = array.tobytes()

    def free(self):
        pass


def test_the_value_region_is_copied_to_only_when_its_shape_set_changes(monkeypatch, bert_plan):
    copies = []
    monkeypatch.setattr(staging, "DeviceBuffer", _FakeBuffer)
    monkeypatch.setattr(staging, "PinnedBlock", _FakeBlock)
    monkeypatch.setattr(staging.driver, "call", lambda name, *args, what="": copies.append((name, args)))
    layout, nbytes = staging.value_layout(bert_plan.tensors, bert_plan.memory.aliases)
    staged = staging.StagedValues(layout, nbytes)
    binder = ShapeBinder(bert_plan)
    small = binder.bind({"input_ids": (1, 4), "attention_mask": (1, 4)})
    large = binder.bind({"input_ids": (4, 16), "attention_mask": (4, 16)})
    for _ in range(3):  # runs at one shape: the region holds their values after the first
        staged.copy(small.key, small.values, stream=7)
    assert [name for name, _ in copies] == ["cuMemcpyHtoDAsync"]
    staged.copy(large.key, large.values, stream=7)
    staged.copy(large.key, large.values, stream=7)
    staged.copy(small.key, small.values, stream=7)  # back to the first set: its block is copied again
    assert [name for name, _ in copies] == ["cuMemcpyHtoDAsync"] * 3
    block, used = staged._blocks[small.key]
    assert copies[-1][1] == (0x1000, block.ptr, used, 7)
    for name, offset in layout.items():  # the block holds each value at its offset
        value = np.ascontiguousarray(small.values[name])
        got = np.frombuffer(bytes(block.data[offset:offset + value.nbytes]), dtype=value.dtype)
        np.testing.assert_array_equal(got, value.ravel())


@pytest.mark.gpu
def test_runs_at_one_shape_copy_no_values_and_rebuild_no_tensors_on_the_gpu(monkeypatch):
    """GPU: execute at (1, 16) three times, (3, 77) twice, (1, 16) again: the value region is copied
    to once per change of shape set (3 times), the DeviceTensors are rebuilt only then, and every
    run matches onnxruntime (a skipped copy or rebinding that went wrong would not)."""
    import onnxruntime as ort

    from polykit.runtime.cuda import driver
    from polykit.runtime.engine import Runtime
    from tests.runtime.test_dynamic_shapes import BERT_PROFILE, _bert_feeds

    model = tiny_bert()
    plan = build_plan(model, BuilderConfig(target="cuda", builder_optimization_level=0, profiles=[BERT_PROFILE]))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    feeds = {dims: _bert_feeds(rng, *dims) for dims in ((1, 16), (3, 77))}
    call, copies = driver.call, []
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        target = ctx._ctx
        region = target._staged.region.ptr

        def spy(name, *args, **kw):
            if name == "cuMemcpyHtoDAsync" and args and args[0] == region:
                copies.append(args[2])
            return call(name, *args, **kw)

        monkeypatch.setattr(driver, "call", spy)
        rebuilt, seen = [], {}
        for dims in [(1, 16)] * 3 + [(3, 77)] * 2 + [(1, 16)]:
            got = ctx.execute(feeds[dims])["out"]
            np.testing.assert_allclose(got, session.run(None, feeds[dims])[0], rtol=1e-3, atol=1e-3)
            now = dict(target.tensors)
            rebuilt.append(sum(1 for n, t in now.items() if seen.get(n) is not t))
            seen = now
        assert len(copies) == 3
        assert rebuilt[1] == rebuilt[2] == rebuilt[4] == 0 and rebuilt[3] > 0 and rebuilt[5] > 0
