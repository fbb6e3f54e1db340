"""Shape rules and importers of the signal ops."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from polykit.compiler.ir.graph import Node
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.errors import ShapeError

F32, I64 = np.dtype(np.float32), np.dtype(np.int64)


def infer(op, shapes, consts, attrs=None, dtypes=None):
    names = [f"in{i}" if s != "omitted" else "" for i, s in enumerate(shapes)]
    node = Node(op, names, ["out"], dict(attrs or {}), name=f"{op}_0")
    shapes = [None if s == "omitted" else s for s in shapes]
    dtypes = dtypes or [F32] + [I64] * (len(shapes) - 1)
    return find_shape_rule("", op)(InferContext(node, dtypes, shapes, consts))


@pytest.mark.parametrize("attrs,length,want", [
    ({}, None, (2, 9, 10, 2)),
    ({"onesided": 1}, None, (2, 5, 10, 2)),
    ({"onesided": 1}, 12, (2, 7, 10, 2)),
    ({"inverse": 1, "onesided": 1}, None, (2, 16, 10, 1)),
])
def test_dft_output_shape(attrs, length, want):
    consts = [None, None if length is None else np.array(length), np.array(1)]
    [(_, shape)] = infer("DFT", [(2, 9, 10, 1), "omitted" if length is None else (), ()], consts, attrs)
    assert shape == want


def test_dft_over_the_complex_dim_is_a_shape_error():
    with pytest.raises(ShapeError, match="signal dim"):
        infer("DFT", [(2, 9, 2), "omitted", ()], [None, None, np.array(-1)])


def _dft_model(opset, **attrs):
    node = helper.make_node("DFT", ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 8, 6, 1))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset,attrs,axis", [(17, {"axis": 2}, 2), (17, {}, 1), (20, {}, -2)])
def test_dft_import_puts_the_axis_in_an_input(opset, attrs, axis):
    graph = load_onnx(_dft_model(opset, **attrs))
    [node] = graph.nodes
    assert "axis" not in node.attrs and int(graph.initializers[node.inputs[2]]) == axis
    assert graph.value("y").shape == (1, 8, 6, 2)


def test_stft_with_a_window_gives_frames_and_one_sided_bins():
    [(_, shape)] = infer("STFT", [(3, 128, 1), (), (16,)], [None, np.array(8), None], dtypes=[F32, I64, F32])
    assert shape == (3, 15, 9, 2)


def test_stft_window_and_frame_length_must_agree():
    with pytest.raises(ShapeError, match="window has 16"):
        infer("STFT", [(3, 128, 1), (), (16,), ()], [None, np.array(8), None, np.array(20)],
              dtypes=[F32, I64, F32, I64])


def test_window_size_and_output_datatype():
    assert infer("HannWindow", [()], [np.array(10)], {"output_datatype": 11}, [I64]) == [(np.dtype(np.float64), (10,))]
    assert infer("BlackmanWindow", [()], [None], dtypes=[I64]) == [(F32, (None,))]


def test_mel_weight_matrix_is_spectrogram_bins_by_mel_bins():
    consts = [np.array(8), np.array(16), np.array(8192), np.array(0.0), np.array(4096.0)]
    assert infer("MelWeightMatrix", [()] * 5, consts, dtypes=[I64, I64, I64, F32, F32]) == [(F32, (9, 8))]
