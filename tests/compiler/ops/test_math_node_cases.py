"""ONNX's own node test cases for the math op family, run through polykit.

Each case is imported with polykit.compiler.graph.onnx_import.load_onnx (importers + shape
rules), then evaluated node by node with the reference kernels; outputs must match ONNX's
expected values (dtype and shape exactly, values at rtol 1e-3 / atol 1e-5) and the
shape rules' static shapes must match the actual outputs.

Only the onnx case modules of these ops are imported (importing all 1884 cases takes ~20 s).
"""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.ops.registry import is_supported
from polykit.errors import PolykitError
from tests.onnx_node_cases import node_cases

CASE_MODULES = (
    "argmax argmin batch_normalization celu clip cumsum dequantizelinear dynamicquantizelinear einsum elu gelu "
    "groupnormalization hardmax hardsigmoid hardswish instance_normalization layernormalization leakyrelu "
    "logsoftmax lpnormalization meanvariancenormalization mish prelu quantizelinear reduce_log_sum "
    "reduce_log_sum_exp reducel1 reducel2 reducemax reducemean reducemin reduceprod reducesum reducesumsquare "
    "relu rmsnormalization selu shrink sigmoid softmax softplus softsign swish tanh thresholdedrelu topk trilu"
).split()

#: Cases polykit rejects on purpose, with the reason; each must fail with a PolykitError.
UNSUPPORTED: dict[str, str] = {}  # bfloat16 / float8 / 4- and 2-bit types run through ml_dtypes now


CASES = node_cases(CASE_MODULES)


def _as_array(value):
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


def _needs_other_families(model) -> list[str]:
    return sorted({n.op_type for n in model.graph.node if not is_supported(n.domain, n.op_type)})


def _assert_rejected_or_untyped(model) -> None:
    """A case with a dtype polykit lacks either fails to import or leaves its I/O untyped."""
    try:
        graph = load_onnx(model)
    except PolykitError:
        return
    untyped = [n for n in graph.inputs + graph.outputs if graph.value(n).dtype is None]
    assert untyped, "expected an I/O tensor of a dtype polykit does not represent"


@pytest.mark.parametrize("name", sorted(CASES))
def test_node_case_matches_onnx_expected_outputs(name):
    case = CASES[name]
    if name.removesuffix("_expanded") in UNSUPPORTED:
        _assert_rejected_or_untyped(case.model)
        return
    missing = _needs_other_families(case.model)
    if missing:
        pytest.skip(f"ops of other families not registered yet: {missing}")
    graph = load_onnx(case.model)
    inputs, expected = case.data_sets[0]
    real_inputs = [vi.name for vi in case.model.graph.input]
    feeds = {n: _as_array(v) for n, v in zip(real_inputs, inputs)}
    env = evaluate_graph(graph, feeds)
    for out_name, want in zip(graph.outputs, expected):
        want = _as_array(want)
        got = env[out_name]
        assert got.dtype == want.dtype, f"{out_name}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{out_name}: shape {got.shape} != {want.shape}"
        inferred = graph.value(out_name)
        assert inferred.dtype == want.dtype, f"{out_name}: inferred dtype {inferred.dtype}"
        if inferred.shape is not None and inferred.is_static:
            assert tuple(inferred.shape) == want.shape, f"{out_name}: inferred shape {inferred.shape}"
        if want.dtype.name.startswith(("bfloat", "float8", "float4")):  # ml_dtypes floats: compare in float32
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2**-6, atol=1e-5,
                                       err_msg=out_name)
        elif want.dtype.kind in "fc":
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5, err_msg=out_name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=out_name)


def test_every_unsupported_entry_names_a_real_case():
    assert set(UNSUPPORTED) <= set(CASES)
