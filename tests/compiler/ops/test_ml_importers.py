"""ai.onnx.ml Binarizer / ArrayFeatureExtractor importers: the rewritten graph matches onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

from polykit.compiler.ir import dtypes
from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import ShapeError

RNG = np.random.default_rng(23)


def _model(op, feeds, shapes=None, **attrs):
    node = helper.make_node(op, list(feeds), ["z"], domain="ai.onnx.ml", **attrs)
    inputs = [helper.make_tensor_value_info(n, dtypes.to_onnx(v.dtype), (shapes or {}).get(n, v.shape))
              for n, v in feeds.items()]
    graph = helper.make_graph([node], "g", inputs, [onnx.ValueInfoProto(name="z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 10
    return model


def _check(model, feeds):
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = evaluate_graph(load_onnx(model), feeds)["z"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_binarizer_matches_onnxruntime():
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    _check(_model("Binarizer", {"x": x}, threshold=0.25), {"x": x})


def test_binarizer_of_float64_keeps_the_dtype():  # onnxruntime runs float32 only
    x = RNG.standard_normal((7,))
    got = evaluate_graph(load_onnx(_model("Binarizer", {"x": x}, threshold=0.25)), {"x": x})["z"]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, (x > 0.25).astype(np.float64))


@pytest.mark.parametrize("shape,idx", [((3, 4), [0, 3, 1]), ((2, 3, 5), [[4, 0]]), ((6,), [5, 2])])
def test_array_feature_extractor_matches_onnxruntime(shape, idx):
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32), "y": np.array(idx, np.int64)}
    _check(_model("ArrayFeatureExtractor", feeds), feeds)


def test_array_feature_extractor_of_an_input_of_unknown_rank_is_refused():
    feeds = {"x": np.zeros((3, 4), np.float32), "y": np.array([0], np.int64)}
    model = _model("ArrayFeatureExtractor", feeds)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(ShapeError, match="rank is unknown"):
        load_onnx(model)
