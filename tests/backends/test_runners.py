import numpy as np
import pytest

from polykit.backends.base import RunnerRequest
from polykit.backends.builtin import make_onnxrt_runner, make_polykit_runner
from polykit.backends.loaders import EngineFromOnnx, OnnxFromPath
from polykit.backends.onnxrt import OnnxrtRunner, SessionFromOnnx, provider_names
from polykit.backends.polykit_runner import PolykitRunner
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import ModelLoadError, UsageError

X = np.random.default_rng(3).random((1, 16), dtype=np.float32)


def test_onnxrt_runner_infers_named_outputs(mlp):
    with OnnxrtRunner(SessionFromOnnx(mlp)) as runner:
        out = runner.infer({"x": X})
    assert set(out) == {"logits", "probs"}
    assert out["probs"].shape == (1, 10)


def test_onnxrt_runner_reports_input_metadata(mlp):
    with OnnxrtRunner(SessionFromOnnx(OnnxFromPath(mlp))) as runner:
        meta = runner.get_input_metadata()
    assert meta["x"].dtype == "float32" and meta["x"].shape == (1, 16)


def test_onnxrt_runner_keeps_dynamic_dims_symbolic(dyn_model):
    with OnnxrtRunner(SessionFromOnnx(dyn_model)) as runner:
        assert runner.get_input_metadata()["x"].shape == ("N", 4)


def test_polykit_runner_matches_onnxrt(mlp):
    with PolykitRunner(EngineFromOnnx(mlp, config=BuilderConfig(target="cpu"))) as trt, OnnxrtRunner(SessionFromOnnx(mlp)) as ort:
        a, b = trt.infer({"x": X}), ort.infer({"x": X})
    np.testing.assert_allclose(a["probs"], b["probs"], rtol=1e-5, atol=1e-6)


def test_runner_measures_inference_time(mlp):
    runner = PolykitRunner(EngineFromOnnx(mlp, config=BuilderConfig(target="cpu")))
    assert runner.last_inference_time() is None
    with runner:
        runner.infer({"x": X})
    assert runner.last_inference_time() > 0


def test_runner_must_be_active_to_infer(mlp):
    runner = OnnxrtRunner(SessionFromOnnx(mlp))
    with pytest.raises(UsageError):
        runner.infer({"x": X})


def test_runner_deactivate_releases_engine(mlp):
    runner = PolykitRunner(EngineFromOnnx(mlp, config=BuilderConfig(target="cpu")))
    runner.activate()
    assert runner.is_active and runner.engine is not None
    runner.deactivate()
    assert not runner.is_active and runner.engine is None


def test_polykit_runner_accepts_a_plan(mlp):
    from polykit.compiler.builder.builder import build_plan

    with PolykitRunner(build_plan(mlp, BuilderConfig(target="cpu"))) as runner:
        assert list(runner.get_input_metadata()) == ["x"]


def test_session_from_missing_path_is_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError):
        SessionFromOnnx(str(tmp_path / "none.onnx"))()


def test_provider_short_names_expand():
    assert provider_names(["cpu"]) == ["CPUExecutionProvider"]
    assert provider_names([]) == ["CPUExecutionProvider"]


def test_builtin_factories_mark_outputs_on_both_runners(mlp):
    req = RunnerRequest(model=mlp, target="cpu", mark_outputs=("h_relu",))
    for runner in (make_polykit_runner(req), make_onnxrt_runner(req)):
        with runner:
            assert "h_relu" in runner.infer({"x": X})


def test_builtin_polykit_factory_saves_engine(mlp, tmp_path):
    req = RunnerRequest(model=mlp, target="cpu", save_engine=str(tmp_path / "m.plan"))
    with make_polykit_runner(req):
        pass
    assert (tmp_path / "m.plan").read_bytes()[:8] == b"PLYKPLAN"
