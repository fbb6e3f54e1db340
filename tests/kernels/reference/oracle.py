"""Shared oracles for the reference-kernel tests: run one op through polykit's reference
kernel and through onnxruntime on the same inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import helper

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.references import run_reference


def run(op, inputs, n_out=1, **attrs):
    node = Node(op, [f"x{i}" if v is not None else "" for i, v in enumerate(inputs)], [f"y{i}" for i in range(n_out)], attrs, "n")
    return run_reference(node, list(inputs))


def ort(op, inputs, n_out=1, opset=21, **attrs):
    from polykit.compiler.ir import dtypes

    names = [f"x{i}" if v is not None else "" for i, v in enumerate(inputs)]
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, dtypes.to_onnx(v.dtype), v.shape) for n, v in zip(names, inputs) if n],
        [onnx.ValueInfoProto(name=o) for o in node.output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: v for n, v in zip(names, inputs) if n})


def assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def ort_run(op, inputs, attrs=None, opset=22, n_out=1):
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    node = helper.make_node(op, names, [f"out{i}" for i in range(n_out)], **(attrs or {}))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
         for n, x in zip(names, inputs) if n],
        [onnx.ValueInfoProto(name=f"out{i}") for i in range(n_out)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: x for n, x in zip(names, inputs) if n})


def ours(op, inputs, attrs=None, n_out=1):
    node = Node(op, [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)],
                [f"out{i}" for i in range(n_out)], dict(attrs or {}), name=op)
    return run_reference(node, inputs)
