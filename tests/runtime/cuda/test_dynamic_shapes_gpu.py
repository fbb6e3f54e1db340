"""GPU: one cuda plan built for an optimization profile serves every shape in it, within fp32
tolerance of onnxruntime, through execute (CUDA graphs captured per shape set) and enqueue."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Runtime
from tests.runtime.test_dynamic_shapes import CASES

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_profile_plan_serves_every_shape_within_fp32_tolerance(case):
    make, profile, shapes, feeds_of = CASES[case]
    model = make()
    plan = build_plan(model, BuilderConfig(target="cuda", profiles=[profile]))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    all_feeds = [feeds_of(rng, *dims) for dims in shapes]
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for _ in range(3):  # eager, then captured, then replayed: per shape set, shapes interleaved
            for feeds in all_feeds:
                got = ctx.execute(feeds)
                expected = session.run(None, feeds)
                for value, want in zip(got.values(), expected):
                    assert value.shape == want.shape
                    np.testing.assert_allclose(value, want, rtol=1e-3, atol=1e-3)


def test_cuda_enqueue_takes_the_shapes_set_on_the_context():
    from polykit.runtime.cuda.memory import DeviceBuffer, download, upload
    from polykit.runtime.cuda.stream import Stream

    make, profile, shapes, feeds_of = CASES["mlp"]
    plan = build_plan(make(), BuilderConfig(target="cuda", profiles=[profile]))
    rng = np.random.default_rng(4)
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        x_buf = DeviceBuffer(engine.plan.tensors["x"].nbytes)
        y_buf = DeviceBuffer(engine.plan.tensors["y"].nbytes)
        stream = Stream()
        try:
            for dims in shapes:
                feeds = feeds_of(rng, *dims)
                upload(x_buf.ptr, feeds["x"])
                ctx.set_input_shape("x", feeds["x"].shape)
                ctx.enqueue({"x": x_buf.ptr, "y": y_buf.ptr}, stream)
                got = download(y_buf.ptr, ctx.get_tensor_shape("y"), np.dtype(np.float32), stream.handle)
                stream.synchronize()
                np.testing.assert_allclose(got, ctx.execute(feeds)["y"], rtol=1e-5, atol=1e-5)
        finally:
            stream.close()
            x_buf.free()
            y_buf.free()
