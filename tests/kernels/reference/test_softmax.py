"""Softmax / LogSoftmax / Hardmax reference kernels against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest


from .oracle import ort_run, ours

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_family_matches_onnxruntime_on_each_axis(op, axis):
    x = (RNG.standard_normal((3, 4, 5)) * 4).astype(np.float32)
    (got,), (want,) = ours(op, [x], {"axis": axis}), ort_run(op, [x], {"axis": axis}, opset=13)
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_softmax_defaults_to_last_axis():
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    (got,) = ours("Softmax", [x])
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-6)


def test_softmax_is_stable_for_large_logits():
    x = np.array([[1000.0, 1001.0, 1002.0]], np.float32)
    (sm,), (lsm,) = ours("Softmax", [x]), ours("LogSoftmax", [x])
    np.testing.assert_allclose(sm, [[0.09003057, 0.24472847, 0.66524096]], rtol=1e-6)
    np.testing.assert_allclose(lsm, [[-2.40760596, -1.40760596, -0.40760596]], rtol=1e-6)


def test_hardmax_marks_only_the_first_of_tied_maxima():
    x = np.array([[3.0, 7.0, 7.0, 1.0]], np.float32)
    (got,) = ours("Hardmax", [x])
    np.testing.assert_array_equal(got, [[0, 1, 0, 0]])


def test_softmax_float16_keeps_dtype():
    x = RNG.standard_normal((2, 5)).astype(np.float16)
    (got,) = ours("Softmax", [x])
    assert got.dtype == np.float16


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_family_of_an_empty_tensor_is_empty(op):
    (got,) = ours(op, [np.zeros((0, 4), np.float32)], {"axis": 0})
    assert got.shape == (0, 4) and got.dtype == np.float32


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_softmax_equals_onnx_reference_evaluator_bit_for_bit(dtype):
    """16-bit Softmax rounds each stage of the spec's function body to T (module docstring), as
    ONNX's reference does; rounding once from float64 misses its outputs by an ulp."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from polykit.compiler.ir.dtypes import to_numpy

    code = onnx.TensorProto.FLOAT16 if dtype == "float16" else onnx.TensorProto.BFLOAT16
    x = (RNG.standard_normal((8, 37)) * 3).astype(to_numpy(code))
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "sm",
                              [helper.make_tensor_value_info("x", code, list(x.shape))],
                              [helper.make_tensor_value_info("y", code, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = ours("Softmax", [x], {"axis": -1})
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.view(np.uint16), np.asarray(want).astype(x.dtype).view(np.uint16))
