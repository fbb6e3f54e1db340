"""benchmarks/dynamic_exports.py: every zoo model and both detectors get a profile whose odd shape
lies inside it; with torch and torchvision on a GPU machine, the detectors export with a dynamic
image size and one plan each matches onnxruntime at min, odd and max on cpu and on cuda."""

from __future__ import annotations

import pytest

from benchmarks.dynamic_exports import DETECTORS, markdown, model_names, shape_plan
from benchmarks.zoo_models import MODELS


@pytest.mark.parametrize("name", model_names())
def test_every_model_has_a_profile_whose_odd_shape_lies_inside(name):
    plan = shape_plan(name)
    assert plan and set(plan) == ({"x"} if name in DETECTORS else {s.name for m in MODELS if m.name == name
                                                                    for s in m.inputs})
    for spec in plan.values():
        (low, opt, high, odd), extra = spec["shapes"][:4], spec["shapes"][4:]  # extra: float32-rounding sizes
        assert len(low) == len(opt) == len(high) == len(odd) and all(len(e) == len(low) for e in extra)
        assert all(low[a] <= e[a] <= high[a] for e in extra for a in spec["axes"])
        for axis, dims in enumerate(zip(low, opt, high, odd)):
            if axis in spec["axes"]:
                assert dims[0] <= dims[1] <= dims[2] and dims[0] <= dims[3] <= dims[2] and dims[0] < dims[2]
                assert dims[3] not in (dims[0], dims[2])  # a shape neither corner is
            else:
                assert len(set(dims)) == 1


def test_inputs_that_share_a_dim_share_its_range():
    """Token ids and their attention mask: one batch and one sequence range."""
    plan = shape_plan("bert_base")
    assert plan["input_ids"]["shapes"] == plan["attention_mask"]["shapes"]
    assert plan["input_ids"]["axes"] == {0: "batch", 1: "sequence"}


def test_detectors_take_one_image_of_a_dynamic_size():
    for name in DETECTORS:
        spec = shape_plan(name)["x"]
        assert spec["axes"] == {2: "height", 3: "width"} and {s[0] for s in spec["shapes"]} == {1}


def test_the_table_names_failures_and_their_message():
    table = markdown([{"model": "a", "dynamic": ["batch"], "passed": True, "max_abs_error": 1.5e-6,
                       "runs": {k: {"ok": True} for k in ("min", "odd", "max")}},
                      {"model": "b", "passed": False, "error": "build: BuildError: x | y"}])
    assert "| a | batch | pass | ok | ok | ok | - | 1.5e-06 |  |" in table
    assert "| b |  | FAIL | - | - | - | - |  | build: BuildError: x / y |" in table


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("name, dynamic", [(DETECTORS[0], False), (DETECTORS[0], True), (DETECTORS[1], False),
                                           (DETECTORS[1], True)])  # Faster R-CNN's float32 resize sizes: dim_floats
def test_a_detector_export_matches_onnxruntime(tmp_path, name, dynamic, target):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from benchmarks.dynamic_exports import check_one, export

    export(name, tmp_path, dynamic)
    result = check_one(tmp_path, name, target, opt_level=0 if target == "cpu" else 3)
    assert result["passed"], result.get("error")


def test_detections_ranked_either_way_within_rounding_are_paired():
    import numpy as np

    from benchmarks.dynamic_exports import pair_detections

    want = {"boxes": np.array([[0, 0, 4, 4], [10, 10, 20, 20], [5, 5, 9, 9]], np.float32),
            "scores": np.array([0.9, 0.5000001, 0.5], np.float32), "labels": np.array([1, 2, 3])}
    swapped = {n: v[[0, 2, 1]] for n, v in want.items()}  # the near-tie ranked the other way
    paired = pair_detections(want, swapped)
    assert paired["order"].tolist() == [0, 2, 1]
    assert all(np.array_equal(paired[n], want[n]) for n in ("boxes", "scores", "labels"))
    relabelled = {**want, "labels": np.array([1, 2, 4])}  # a different class is no pair: compared in place
    assert pair_detections(want, relabelled)["labels"].tolist() == [1, 2, 4]
