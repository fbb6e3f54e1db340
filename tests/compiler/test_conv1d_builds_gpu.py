"""GPU: audio front-ends (Whisper's, wav2vec2's) whose dense 1-D convs run as ConvNHWC on the tensor
cores (to_channels_last), built for cuda fp16 and compared with the cpu plan in float32."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.runtime.engine import Runtime

from tests.conv_models import wav2vec2_frontend, whisper_frontend

pytestmark = pytest.mark.gpu

# (model, input name, input shape): odd lengths
FRONTENDS = {"whisper": (lambda: whisper_frontend(length=301), "mel", (2, 80, 301)),
             "wav2vec2": (lambda: wav2vec2_frontend(length=1603), "audio", (2, 1603))}


def _run(plan: Plan, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        (out,) = ctx.execute(feeds).values()
    return out


@pytest.mark.parametrize("level", [0, 3])
@pytest.mark.parametrize("name", sorted(FRONTENDS))
def test_cuda_fp16_audio_frontend_matches_the_cpu_plan(name, level):
    """Level 0 takes the first-priority tactic (on an H100 / H200 the wgmma conv: H = 1, kernel 1 x k),
    level 3 the fastest timed one; both within fp16 rounding of the float32 cpu plan."""
    from tests.kernels.cuda import on_sm90

    make, inp, shape = FRONTENDS[name]
    model = make()
    cuda = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level))
    convs = [layer for layer in cuda.layers if layer.kind == "ConvNHWC" and layer.attrs["group"] == 1]
    assert convs and not [layer for layer in cuda.layers if layer.kind == "Conv"]
    if level == 0 and on_sm90():
        assert all(layer.tactic.startswith("cuda.conv_nhwc.sm90_") for layer in convs), [c.tactic for c in convs]
    feeds = {inp: np.random.default_rng(3).standard_normal(shape).astype(np.float32)}
    got, want = _run(cuda, feeds), _run(build_plan(model, BuilderConfig(target="cpu")), feeds)
    assert got.shape == want.shape and np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
