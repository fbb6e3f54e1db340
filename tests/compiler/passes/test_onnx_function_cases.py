"""optimize() over ONNX's own `*_expanded` node cases: ops spelled out as subgraphs of
elementwise ops (the function bodies), so folding, recognizers and fusion all fire.
Each case must still give ONNX's expected outputs after optimization."""


import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes import optimize
from tests.onnx_node_cases import node_cases

MODULES = ("gelu layernormalization rmsnormalization mish hardswish hardsigmoid celu softsign thresholdedrelu "
           "elu selu leakyrelu prelu softplus swish meanvariancenormalization").split()


def _load_cases():
    prefixes = tuple(f"test_{m}" for m in MODULES) + ("test_layer_normalization", "test_mvn", "test_rms_normalization")
    return {name: c for name, c in node_cases(MODULES).items()
            if c.name.endswith("_expanded") and c.name.startswith(prefixes)
            and "bfloat16" not in c.name}  # bfloat16 is not a polykit dtype


CASES = _load_cases()


def _array(value):
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


@pytest.mark.parametrize("name", sorted(CASES))
def test_optimized_expanded_case_matches_onnx_expected_outputs(name):
    case = CASES[name]
    graph = load_onnx(case.model)
    inputs, expected = case.data_sets[0]
    out = optimize(graph)
    assert len(out.nodes) <= len(graph.nodes)
    got = evaluate_graph(out, {n: _array(v) for n, v in zip(graph.inputs, inputs)})
    for key, want in zip(graph.outputs, expected):
        want = _array(want)
        assert got[key].dtype == want.dtype
        np.testing.assert_allclose(got[key], want, rtol=max(case.rtol, 1e-4), atol=max(case.atol, 1e-5))


def test_gelu_function_bodies_become_gelu_nodes():
    for name in ("test_gelu_default_1_expanded", "test_gelu_tanh_1_expanded"):
        out = optimize(load_onnx(CASES[name].model))
        assert [n.op_type for n in out.nodes] == ["Gelu"], name
