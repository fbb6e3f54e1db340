"""Plans wherever models go: the file type from the magic bytes, the engine runner on a plan,
runners that cannot run plans refused, build options refused for a plan."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.backends.base import RunnerRequest
from polykit.backends.loaders import PLAN_MAGIC, model_type
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import MAGIC
from polykit.errors import PlanError, UsageError
from polykit.tools.compare.accuracy import make_runners


@pytest.fixture
def mlp_plan(mlp, tmp_path):
    """The MLP's cpu plan saved under a name that says nothing about its type."""
    path = tmp_path / "model.bin"
    build_plan(mlp, BuilderConfig(target="cpu")).save(path)
    return str(path)


def test_the_light_magic_is_the_plan_format_magic():
    assert PLAN_MAGIC == MAGIC


def test_model_type_reads_the_magic_bytes_not_the_name(mlp, mlp_plan, tmp_path):
    assert model_type(mlp_plan) == "plan"
    assert model_type(mlp) == "onnx"
    assert model_type(tmp_path / "missing.plan") == "onnx"  # the loader that opens it reports it missing


def test_engine_runner_runs_a_plan_with_the_plans_inputs(mlp, mlp_plan):
    from polykit.backends.onnxrt import OnnxrtRunner, SessionFromOnnx

    (runner,) = make_runners(["trt"], RunnerRequest(model=mlp_plan))
    x = np.random.default_rng(5).uniform(-1, 1, (1, 16)).astype(np.float32)
    with runner, OnnxrtRunner(SessionFromOnnx(mlp)) as ort:
        meta = runner.get_input_metadata()
        assert meta["x"].shape == (1, 16) and meta["x"].dtype == "float32"
        np.testing.assert_allclose(runner.infer({"x": x})["probs"], ort.infer({"x": x})["probs"], rtol=1e-5, atol=1e-6)


def test_onnxrt_cannot_run_a_plan(mlp_plan):
    with pytest.raises(UsageError, match="plan file, which the onnxrt runner cannot run") as info:
        make_runners(["trt", "onnxrt"], RunnerRequest(model=mlp_plan))
    assert "runners for plan files: trt" in str(info.value)


@pytest.mark.parametrize("options, flag", [(dict(fp16=True), "--fp16"), (dict(mark_all=True), "--mark-all"),
                                           (dict(load_tactics="t.json"), "--load-tactics")])
def test_build_options_with_a_plan_are_refused(mlp_plan, options, flag):
    with pytest.raises(UsageError, match=f"{flag} steer"):
        make_runners(["trt"], RunnerRequest(model=mlp_plan, **options))


def test_a_plan_for_another_target_is_a_plan_error(mlp_plan):
    (runner,) = make_runners(["trt"], RunnerRequest(model=mlp_plan, target="cuda"))
    with pytest.raises(PlanError, match="built for target 'cpu'"):
        runner.activate()
