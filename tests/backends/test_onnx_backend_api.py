"""polykit.backends.onnx_backend implements onnx.backend.base.Backend, and ONNX's BackendTest runs on it."""

from __future__ import annotations

import unittest

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import polykit.backends.onnx_backend as backend


def _add_model():
    g = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])], "add",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_module_level_functions_follow_the_backend_api():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 2, 3)).astype(np.float32)
    rep = backend.prepare(_add_model(), "CPU")
    (c,) = rep.run([a, b])
    np.testing.assert_allclose(c, a + b)
    (c2,) = backend.run_model(_add_model(), [a, b])
    np.testing.assert_allclose(c2, a + b)


def test_run_node_runs_a_single_node_proto():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    (y,) = backend.run_node(helper.make_node("Abs", ["x"], ["y"]), [x])
    np.testing.assert_array_equal(y, np.abs(x))


def test_supports_device_cpu_always_and_rejects_unknown_devices():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("TPU")


SELECTED = ("test_abs_cpu", "test_add_bcast_cpu", "test_where_example_cpu", "test_gemm_default_single_elem_vector_bias_cpu")


@pytest.fixture(scope="module")
def selected_suite() -> unittest.TestSuite:
    import onnx.backend.test

    bt = onnx.backend.test.BackendTest(backend, __name__)
    for name in SELECTED:
        bt.include(name + "$")
    return bt.test_suite


def test_onnx_backend_test_suite_passes_selected_node_cases(selected_suite):
    result = unittest.TestResult()
    selected_suite.run(result)  # cases not included are reported as skipped
    problems = result.failures + result.errors
    assert not problems, problems[0][1]
    assert result.testsRun - len(result.skipped) == len(SELECTED)


def test_a_rep_builds_one_engine_for_every_value_of_a_shape_tensor_input():
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    rep = backend.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), "CPU")
    x = np.random.default_rng(2).standard_normal((2, 6)).astype(np.float32)
    for target in ([3, 4], [4, 3], [-1, 2], [0, -1], [3, 4]):
        (y,) = rep.run([x, np.array(target, np.int64)])
        np.testing.assert_array_equal(y, x.reshape(target if target != [0, -1] else [2, 6]))
    assert rep.builds == 1  # the target ranges over [-1, 12] per element (value_ranges)


def test_a_rep_serves_every_float_scale_from_one_engine():
    g = helper.make_graph(  # Resize's scales are floats: a float domain, the shape rule runs at bind time
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")], "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]),
         helper.make_tensor_value_info("scales", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    rep = backend.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]), "CPU")
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    for scale in (2.0, 3.0, 1.0, 2.0):
        (y,) = rep.run([x, np.array([1, 1, scale, scale], np.float32)])
        np.testing.assert_array_equal(y, x.repeat(int(scale), 2).repeat(int(scale), 3))
    assert rep.builds == 1  # scales range over (0, 2^48]: one ruled engine


def test_a_rep_builds_one_engine_for_data_dependent_output_sizes():
    g = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["i"]), helper.make_node("Unique", ["x"], ["u"])], "select",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("i", TensorProto.INT64, None),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, None)],
    )
    rep = backend.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), "CPU")
    rng = np.random.default_rng(4)
    for kept in (0.0, 0.3, 1.0):
        x = (rng.integers(1, 4, (2, 5)) * (rng.random((2, 5)) < kept)).astype(np.float32)
        i, u = rep.run([x])
        np.testing.assert_array_equal(i, np.array(np.nonzero(x)))
        np.testing.assert_array_equal(u, np.unique(x))
    assert rep.builds == 1  # the sizes are bound at run time, not per input value


def test_a_rep_built_once_serves_inputs_of_other_values():
    rep = backend.prepare(_add_model(), "CPU")
    rng = np.random.default_rng(3)
    for _ in range(2):
        a, b = rng.standard_normal((2, 2, 3)).astype(np.float32)
        (c,) = rep.run([a, b])
        np.testing.assert_array_equal(c, a + b)
    assert rep.builds == 1
