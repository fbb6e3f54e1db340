"""RoiAlign and NonMaxSuppression reference kernels against onnxruntime, and NMS built with
BuilderConfig.input_values (its output count is decided at build time, as NonZero's)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import ShapeError
from polykit.runtime.engine import Runtime
from tests.kernels.reference.oracle import ort_run, ours

RNG = np.random.default_rng(44)


def roi_inputs(n=2, c=3, h=10, w=12, r=5):
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    corners = np.sort(RNG.uniform(-2, 14, (r, 2, 2)), axis=1)  # some boxes reach outside the image
    rois = np.stack([corners[:, 0, 0], corners[:, 0, 1], corners[:, 1, 0], corners[:, 1, 1]], 1).astype(np.float32)
    return [x, rois, RNG.integers(0, n, r).astype(np.int64)]


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("coords", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio,scale", [(0, 1.0), (2, 0.5)])
def test_roi_align_matches_onnxruntime(mode, coords, ratio, scale):
    ins = roi_inputs()
    attrs = {"mode": mode, "coordinate_transformation_mode": coords, "output_height": 3, "output_width": 4,
             "sampling_ratio": ratio, "spatial_scale": scale}
    np.testing.assert_allclose(ours("RoiAlign", ins, attrs)[0], ort_run("RoiAlign", ins, attrs, opset=21)[0],
                               rtol=1e-5, atol=1e-5)


def test_roi_align_batch_index_out_of_range_is_a_shape_error():
    ins = roi_inputs()
    ins[2][0] = 7
    with pytest.raises(ShapeError, match="batch_indices"):
        ours("RoiAlign", ins, {})


def nms_inputs(b=2, c=3, n=40, center=False):
    xy = RNG.uniform(0, 10, (b, n, 2))
    wh = RNG.uniform(0.5, 4, (b, n, 2))
    boxes = np.concatenate([xy, wh], -1) if center else np.concatenate([xy, xy + wh], -1)
    scores = RNG.uniform(0, 1, (b, c, n)).astype(np.float32)
    scores[0, 0, :4] = 0.5  # ties break by box index
    return [boxes.astype(np.float32), scores, np.array([7], np.int64), np.array([0.3], np.float32),
            np.array([0.2], np.float32)]


@pytest.mark.parametrize("center", [0, 1])
def test_nms_matches_onnxruntime(center):
    ins = nms_inputs(center=bool(center))
    got = ours("NonMaxSuppression", ins, {"center_point_box": center})[0]
    want = ort_run("NonMaxSuppression", ins, {"center_point_box": center})[0]
    assert got.shape[0] > 10
    np.testing.assert_array_equal(got, want)


def test_nms_without_score_threshold_or_limit_selects_nothing():
    ins = nms_inputs()[:2]
    assert ours("NonMaxSuppression", ins, {})[0].shape == (0, 3)


def nms_graph():
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max", "iou", "score"], ["sel"])
    graph = helper.make_graph([node], "nms", [
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [2, 40, 4]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, 3, 40]),
        helper.make_tensor_value_info("max", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("iou", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("score", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None)])
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))


def test_nms_with_bound_inputs_builds_a_static_count_and_runs_on_cpu():
    ins = nms_inputs()
    feeds = dict(zip(("boxes", "scores", "max", "iou", "score"), ins))
    plan = build_plan(nms_graph(), BuilderConfig(target="cpu", input_values=feeds))
    want = ort_run("NonMaxSuppression", ins)[0]
    assert plan.tensors["sel"].shape == want.shape
    with Runtime("cpu").deserialize_engine(plan).create_execution_context() as ctx:
        np.testing.assert_array_equal(ctx.execute(feeds)["sel"], want)
