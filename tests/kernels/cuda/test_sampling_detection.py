"""GridSample, AffineGrid, DeformConv, RoiAlign and NonMaxSuppression on the GPU against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from tests.kernels.reference.test_detection import nms_inputs, roi_inputs
from tests.kernels.reference.test_sampling import deform_inputs, grid_sample_inputs

RNG = np.random.default_rng(55)


def layer(op, ins, attrs, names=None):
    names = names or [f"in{i}" if a is not None else "" for i, a in enumerate(ins)]
    return LayerDesc("l", op, tuple(names), ("y",), attrs), {n: a for n, a in zip(names, ins) if n}


def test_every_op_has_its_cuda_tactic():
    from polykit.kernels.tactics import candidates

    for op, name in (("GridSample", "cuda.sampling.grid_sample"), ("AffineGrid", "cuda.sampling.affine_grid"),
                     ("DeformConv", "cuda.sampling.deform_conv"), ("RoiAlign", "cuda.detection.roi_align"),
                     ("NonMaxSuppression", "cuda.detection.nms")):
        assert [t.name for t in candidates("cuda", op, LayerDesc("l", op, ("a", "b"), ("y",), {}))] == [name]


def test_float16_layers_are_left_to_the_cpu():
    from polykit.kernels.tactics import candidates

    half = LayerDesc("l", "GridSample", ("a", "b"), ("y",), {}, in_dtypes=("float16", "float16"))
    assert candidates("cuda", "GridSample", half) == []


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode, padding, align):
    from polykit.runtime.cuda.harness import assert_matches_reference

    lay, feeds = layer("GridSample", grid_sample_inputs(spatial=(9, 11), out=(7, 13), spread=1.4),
                       {"mode": mode, "padding_mode": padding, "align_corners": align})
    assert_matches_reference(lay, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_3d(mode, padding):
    from polykit.runtime.cuda.harness import assert_matches_reference

    lay, feeds = layer("GridSample", grid_sample_inputs(spatial=(4, 5, 6), out=(3, 4, 5)),
                       {"mode": mode, "padding_mode": padding, "align_corners": 1})
    assert_matches_reference(lay, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(2, 3, 5, 7), (2, 3, 4, 5, 6)])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid(dims, align):
    from polykit.runtime.cuda.harness import assert_matches_reference

    r = len(dims) - 2
    lay, feeds = layer("AffineGrid", [RNG.standard_normal((dims[0], r, r + 1)).astype(np.float32),
                                      np.array(dims, np.int64)], {"align_corners": align})
    assert_matches_reference(lay, feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [{}, {"mask": False, "bias": False, "group": 1, "og": 1},
                                {"strides": (2, 1), "dil": (1, 2), "pads": (0, 2, 1, 0)},
                                {"n": 1, "c": 64, "h": 24, "w": 24, "m": 32, "group": 1, "og": 4}])
def test_deform_conv(kw):
    from polykit.runtime.cuda.harness import assert_matches_reference

    ins, attrs = deform_inputs(**kw)
    lay, feeds = layer("DeformConv", ins, attrs)
    assert_matches_reference(lay, feeds, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("coords", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align(mode, coords, ratio):
    from polykit.runtime.cuda.harness import assert_matches_reference

    lay, feeds = layer("RoiAlign", roi_inputs(r=9), {"mode": mode, "coordinate_transformation_mode": coords,
                                                     "output_height": 4, "output_width": 3, "sampling_ratio": ratio,
                                                     "spatial_scale": 0.75})
    assert_matches_reference(lay, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("n", [40, 700])
def test_nms_selects_what_the_reference_selects(center, n):
    from polykit.runtime.cuda.harness import run_layer
    from polykit.compiler.ops.references import run_reference
    from polykit.compiler.ir.graph import Node

    ins = nms_inputs(n=n, center=bool(center))
    lay, feeds = layer("NonMaxSuppression", ins, {"center_point_box": center})
    want = run_reference(Node("NonMaxSuppression", list(lay.inputs), ["y"], dict(lay.attrs)), ins)[0]
    got = run_layer(lay, feeds, output_specs={"y": (want.shape, np.int64)})["y"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
def test_nms_model_built_with_bound_inputs_runs_on_cuda():
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Runtime
    from tests.kernels.reference.oracle import ort_run
    from tests.kernels.reference.test_detection import nms_graph

    ins = nms_inputs()
    feeds = dict(zip(("boxes", "scores", "max", "iou", "score"), ins))
    plan = build_plan(nms_graph(), BuilderConfig(target="cuda", input_values=feeds))
    with Runtime("cuda").deserialize_engine(plan).create_execution_context() as ctx:
        np.testing.assert_array_equal(ctx.execute(feeds)["sel"], ort_run("NonMaxSuppression", ins)[0])
