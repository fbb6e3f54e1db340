"""One com.microsoft node (or a small graph of them) as an ONNX model, run by onnxruntime's own
contrib kernels (CPU EP) and by polykit's cpu plan on the same random feeds."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Runtime

MS = "com.microsoft"


def model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    """`inputs` / `outputs`: (name, numpy dtype, shape); `initializers`: (name, array)."""
    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    graph = helper.make_graph(nodes, "g", [info(*i) for i in inputs], [info(*o) for o in outputs],
                              [helper.make_tensor(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape, a.ravel().tolist())
                               for n, a in initializers])
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    made.ir_version = 8
    return made


def ort(m: onnx.ModelProto, feeds: dict) -> dict:
    sess = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def polykit_cpu(m: onnx.ModelProto, feeds: dict) -> dict:
    engine = Runtime("cpu").deserialize_engine(build_plan(m, BuilderConfig(target="cpu")))
    return engine.create_execution_context().execute(feeds)


def assert_matches_onnxruntime(m: onnx.ModelProto, feeds: dict, atol=2e-5, rtol=1e-4) -> dict:
    want, got = ort(m, feeds), polykit_cpu(m, feeds)
    assert sorted(want) == sorted(got)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=rtol, err_msg=name)
    return got


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


F32, I32 = np.float32, np.int32
__all__ = ["MS", "F32", "I32", "TensorProto", "assert_matches_onnxruntime", "helper", "model", "ort", "polykit_cpu", "rand"]
