"""Marking for layerwise debugging observes the engine, it does not change it: mark_all and
expose_tensors expose the ONNX tensors that lie between the layers of the unmarked build, list
the others as fused away, and leave layers and tactics as they were (polykit.compiler.builder.marking)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from polykit.backends.loaders import MARK_ALL, ModifyOutputs
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import BuildError
from polykit.runtime.engine import Runtime
from tests.tools.compare.layerwise_models import convnet, gelu_mlp

LEVEL0 = dict(target="cpu", builder_optimization_level=0)


@pytest.fixture(params=["convnet", "gelu_mlp"])
def fused_model(request, tmp_path):
    return {"convnet": convnet, "gelu_mlp": gelu_mlp}[request.param](tmp_path / f"{request.param}.onnx")


def _layers(plan):
    return [(l.name, l.kind, l.domain, l.inputs, l.fused_nodes, l.precision, l.tactic, l.tactic_params) for l in plan.layers]


def _feeds(plan, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.uniform(-1, 1, plan.tensors[n].shape).astype(plan.tensors[n].dtype) for n in plan.inputs}


def test_the_model_fuses_and_forced_marking_would_undo_it(fused_model):
    """The premise: fusion happens here, and forcing every tensor out (mark_outputs) undoes it."""
    import onnx

    graph = onnx.load(fused_model).graph
    every = tuple(o for n in graph.node for o in n.output if o not in {x.name for x in graph.output})
    plan = build_plan(fused_model, BuilderConfig(**LEVEL0))
    assert any(len(l.fused_nodes) > 1 for l in plan.layers)
    assert len(build_plan(fused_model, BuilderConfig(**LEVEL0, mark_outputs=every)).layers) > len(plan.layers)


def test_mark_all_builds_the_same_layers_and_tactics_as_the_unmarked_build(fused_model):
    plain = build_plan(fused_model, BuilderConfig(**LEVEL0))
    marked = build_plan(fused_model, BuilderConfig(**LEVEL0, mark_all=True))
    assert _layers(marked) == _layers(plain)
    assert len(marked.outputs) > len(plain.outputs)


def test_a_timed_marked_build_needs_no_timing_the_unmarked_build_did_not_record(fused_model, tmp_path):
    """Every layer the tuner sees in the marked build is one of the unmarked build's: the timing
    cache of the unmarked build answers them all (a miss would be a BuildError)."""
    cache = tmp_path / "timing.json"
    plain = build_plan(fused_model, BuilderConfig(target="cpu", save_timing_cache=str(cache)))
    marked = build_plan(fused_model, BuilderConfig(target="cpu", mark_all=True, load_timing_cache=str(cache),
                                                   error_on_timing_cache_miss=True))
    assert _layers(marked) == _layers(plain)


def test_mark_all_exposes_the_tensors_between_layers_and_lists_the_fused_ones(tmp_path):
    plan = build_plan(convnet(tmp_path / "c.onnx"), BuilderConfig(**LEVEL0, mark_all=True))
    assert plan.outputs == ["probs", "r1", "r2", "c3", "g", "f", "logits"]
    assert plan.metadata["fused_away"] == ["c1", "c2", "m"]
    assert all(plan.tensors[n].kind == "output" for n in plan.outputs)


def test_exposed_tensors_hold_the_values_onnxruntime_computes(tmp_path):
    model = convnet(tmp_path / "c.onnx")
    plan = build_plan(model, BuilderConfig(**LEVEL0, mark_all=True))
    feeds = _feeds(plan, seed=3)
    ours = Runtime().deserialize_engine(plan).create_execution_context().execute(feeds)
    sess = ort.InferenceSession(ModifyOutputs(model, outputs=MARK_ALL)().SerializeToString())
    theirs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for name in plan.outputs:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-4, atol=1e-5)


def test_expose_tensors_exposes_only_those_and_reports_a_fused_one(tmp_path):
    plan = build_plan(convnet(tmp_path / "c.onnx"), BuilderConfig(**LEVEL0, expose_tensors=("c3", "c2")))
    assert plan.outputs == ["probs", "c3"]
    assert plan.metadata["fused_away"] == ["c2"]
    assert plan.metadata["marked_outputs"] == ["c3"]


def test_forced_marks_still_keep_a_tensor_from_fusion(tmp_path):
    plan = build_plan(convnet(tmp_path / "c.onnx"), BuilderConfig(**LEVEL0, mark_outputs=("c2",)))
    assert "c2" in plan.outputs and "fused_away" not in plan.metadata


def test_exposing_an_unknown_tensor_is_a_build_error(tmp_path):
    with pytest.raises(BuildError, match="cannot mark 'nope' as an output"):
        build_plan(convnet(tmp_path / "c.onnx"), BuilderConfig(**LEVEL0, expose_tensors=("nope",)))


def test_an_fp16_marked_build_keeps_the_fp16_layers(tmp_path):
    model = convnet(tmp_path / "c.onnx")
    plain = build_plan(model, BuilderConfig(**LEVEL0, fp16=True))
    marked = build_plan(model, BuilderConfig(**LEVEL0, fp16=True, mark_all=True))
    assert _layers(marked) == _layers(plain)
    assert {marked.tensors[n].dtype for n in marked.outputs if n != "probs"} == {"float16"}


@pytest.mark.parametrize("fp16", [False, True])
def test_a_cuda_marked_build_keeps_the_layers_and_tactics_channels_last_included(tmp_path, fp16):
    """cuda plans build without a GPU (tactics by priority); fp16 cuda builds run convs NHWC, whose
    layout passes rename tensors: marking still changes nothing and exposes only ONNX-shaped tensors."""
    model = convnet(tmp_path / "c.onnx")
    config = dict(target="cuda", builder_optimization_level=0, fp16=fp16)
    plain = build_plan(model, BuilderConfig(**config))
    marked = build_plan(model, BuilderConfig(**config, mark_all=True))
    assert _layers(marked) == _layers(plain)
    onnx_shapes = {"r1": (1, 8, 16, 16), "r2": (1, 8, 16, 16), "c3": (1, 8, 16, 16), "g": (1, 8, 1, 1), "f": (1, 8),
                   "logits": (1, 5), "probs": (1, 5)}
    assert set(marked.outputs) | set(marked.metadata["fused_away"]) == set(onnx_shapes) | {"c1", "c2", "m"}
    assert all(marked.tensors[n].shape == onnx_shapes[n] for n in marked.outputs)
