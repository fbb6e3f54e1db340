"""ONNX's own node test cases for the tensor ops, run through polykit's importer, shape rules
and reference kernels (node by node), compared with the expected outputs.

The pass list is every case of these ops except the ones in NOT_RUN (with the reason) and
those using element types polykit does not run (bfloat16, float8, int4, ...): those must be
refused with a PolykitError where polykit can see the type (a Cast target, an initializer).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from polykit.compiler.ir import dtypes
from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import PolykitError
from polykit.tools.conformance import undefined_elements
from tests.onnx_node_cases import node_cases

# onnx.backend.test.case.node modules holding the cases of the ops this family implements
CASE_MODULES = (
    "reshape flatten transpose squeeze unsqueeze concat split slice gather gatherelements gathernd "
    "scatternd scatterelements scatter expand tile pad dropout cast castlike shape size constant "
    "constantofshape rangeop eyelike onehot nonzero compress reversesequence unique"
).split()

NOT_RUN = {
    "test_range_float_type_positive_delta_expanded": "function body uses Loop (not a tensor op)",
    "test_range_float16_type_positive_delta_expanded": "function body uses Loop (not a tensor op)",
    "test_range_int32_type_negative_delta_expanded": "function body uses Loop (not a tensor op)",
    "test_range_bfloat16_type_positive_delta_expanded": "function body uses Loop (not a tensor op)",
}

#: the pass list must not shrink silently (e.g. a case module failing to load)
MIN_PASSING = 178


def _load_cases():
    return [tc for name, tc in node_cases(CASE_MODULES).items() if _is_ours(name)]


_PREFIXES = (
    "test_reshape", "test_flatten", "test_transpose", "test_squeeze", "test_unsqueeze", "test_concat",
    "test_split", "test_slice", "test_gather", "test_scatter", "test_expand", "test_tile",
    "test_constant_pad", "test_edge_pad", "test_reflect_pad", "test_wrap_pad", "test_dropout",
    "test_training_dropout", "test_cast", "test_shape", "test_size", "test_constant",
    "test_range", "test_eyelike", "test_onehot", "test_nonzero", "test_compress", "test_reversesequence",
    "test_unique",
)


def _is_ours(name: str) -> bool:
    return name.startswith(_PREFIXES)


CASES = _load_cases()


def _unsupported_types(model) -> list[str]:
    """Element types in the model's signature, initializers or Cast targets polykit does not run."""
    import onnx

    found = []
    for vi in list(model.graph.input) + list(model.graph.output):
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else None
        if vi.type.HasField("tensor_type") and elem not in dtypes.ONNX_TO_NUMPY:
            found.append(dtypes.ONNX_TYPE_NAMES.get(elem, str(elem)))
        elif not vi.type.HasField("tensor_type"):
            found.append(vi.type.WhichOneof("value"))
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i not in dtypes.ONNX_TO_NUMPY:
                found.append(dtypes.ONNX_TYPE_NAMES.get(attr.i, str(attr.i)))
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type not in dtypes.ONNX_TO_NUMPY:
                found.append(dtypes.ONNX_TYPE_NAMES.get(attr.t.data_type, str(attr.t.data_type)))
    return found


def _arrays(values) -> list:
    from onnx import numpy_helper

    return [numpy_helper.to_array(v) if hasattr(v, "data_type") else np.asarray(v) for v in values]


def _skip_reason(tc) -> str | None:
    if tc.name in NOT_RUN:
        return NOT_RUN[tc.name]
    bad = _unsupported_types(tc.model)
    return f"element types polykit does not run: {sorted(set(bad))}" if bad else None


PASS_LIST = [tc for tc in CASES if _skip_reason(tc) is None]


def test_pass_list_covers_the_tensor_op_cases():
    assert len(PASS_LIST) >= MIN_PASSING, f"only {len(PASS_LIST)} cases in the pass list"


@pytest.mark.parametrize("tc", PASS_LIST, ids=[tc.name for tc in PASS_LIST])
def test_node_case_matches_onnx_expected_outputs(tc):
    """Elements ONNX leaves undefined (a float -> integer cast of NaN or out-of-range values,
    whose expected values come from ml_dtypes' processor-dependent casts) are not compared."""
    with np.errstate(all="ignore"):
        graph = load_onnx(tc.model)
        for inputs, expected in tc.data_sets:
            env = evaluate_graph(graph, dict(zip(graph.inputs, _arrays(inputs))))
            undefined = undefined_elements(tc.model, _arrays(inputs))
            for name, want, skip in zip(graph.outputs, _arrays(expected), undefined):
                got = env[name]
                assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, got.dtype)
                seen, ref = (got, want) if skip is None else (got[~skip], want[~skip])
                if want.dtype == object:
                    np.testing.assert_array_equal(seen, ref)
                else:
                    np.testing.assert_allclose(seen, ref, rtol=tc.rtol, atol=tc.atol, err_msg=name)
                inferred = graph.value(name)
                assert inferred.dtype == got.dtype
                assert inferred.shape is not None and len(inferred.shape) == got.ndim
                assert all(not isinstance(d, int) or d == s for d, s in zip(inferred.shape, got.shape)), inferred


@pytest.mark.parametrize("tc", PASS_LIST, ids=[tc.name for tc in PASS_LIST])
def test_node_case_shapes_are_exact_when_inputs_are_constant(tc):
    from onnx import numpy_helper

    model = copy.deepcopy(tc.model)
    inputs, expected = tc.data_sets[0]
    for vi, value in zip(model.graph.input, _arrays(inputs)):
        model.graph.initializer.append(numpy_helper.from_array(value, vi.name))
    graph = load_onnx(model)
    for name, want in zip(graph.outputs, _arrays(expected)):
        assert graph.value(name).shape == want.shape
        assert graph.value(name).dtype == want.dtype


CAST_TO_UNSUPPORTED = [
    tc for tc in CASES
    if tc.name not in NOT_RUN and tc.model.graph.node[0].op_type == "Cast"
    and any(a.name == "to" and a.i not in dtypes.ONNX_TO_NUMPY for a in tc.model.graph.node[0].attribute)
]


@pytest.mark.parametrize("tc", CAST_TO_UNSUPPORTED, ids=[tc.name for tc in CAST_TO_UNSUPPORTED])
def test_cast_to_an_unsupported_type_is_refused_with_the_node_named(tc):
    with pytest.raises(PolykitError, match="Cast") as info:
        load_onnx(tc.model)
    assert "not supported" in str(info.value)
