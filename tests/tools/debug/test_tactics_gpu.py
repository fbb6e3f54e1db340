"""GPU: `polykit debug tactics` finds the fault plugin's broken layers on the cuda target: fp32
against onnxruntime, fp16 (NCHW) against the outputs of the conservative build itself."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.tactic_replay import TacticReplay
from polykit.runtime.engine import Engine
from polykit.tools.data import results_io
from polykit.tools.cli.app import main
from polykit.tools.debug.tactics import DebugOptions, conservative_assignment, debug_tactics
from tests.cli_models import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fault_plugin")]

CONVNET = str(REPO / "tests" / "data" / "torch" / "convnet_ts.onnx")
CULPRITS = ["/blocks/blocks.0/c1/Conv", "/blocks/blocks.1/Conv"]


def _within_bound(builds: int, n: int) -> bool:
    return builds <= 2 * math.ceil(math.log2(n)) + 4


def test_the_cuda_fault_hunt_names_the_two_conv_layers_against_onnxruntime(monkeypatch, capsys):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.0/c1/Conv$|blocks.1/Conv")
    assert main(["debug", "tactics", CONVNET, "--target", "cuda", "--builder-optimization-level", "0",
                 "--atol", "1e-4", "--rtol", "1e-4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(c["layer"], c["tactic"], c["good_tactic"]) for c in doc["culprits"]] == [
        (name, "fault.Conv", "cuda.conv.igemm_simt") for name in CULPRITS]
    assert _within_bound(doc["builds"], len(doc["suspects"]))


def test_the_fp16_fault_hunt_against_the_conservative_builds_own_outputs(monkeypatch, tmp_path):
    config = BuilderConfig(target="cuda", builder_optimization_level=0, fp16=True, channels_last=False)
    faulty = build_plan(CONVNET, config)
    good = conservative_assignment(faulty.layers, "cuda", config)
    good_plan = build_plan(CONVNET, BuilderConfig(target="cuda", fp16=True, channels_last=False,
                                                  tactic_replay=TacticReplay.from_assignment(good)))
    feeds = [{"image": np.random.default_rng(7).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)}]
    with Engine(good_plan) as engine, engine.create_execution_context() as ctx:
        outputs = [ctx.execute(feeds[0])]
    inputs = results_io.save_feeds(tmp_path / "in.npz", feeds)
    reference = results_io.save_outputs(tmp_path / "ref.npz", {"conservative": outputs})
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.0/c1/Conv$|blocks.1/Conv")
    report = debug_tactics(CONVNET, config, DebugOptions(load_inputs=inputs, load_outputs=reference))
    assert [(c.layer, c.tactic) for c in report.result.culprits] == [(name, "fault.Conv") for name in CULPRITS]
    assert _within_bound(report.builds, len(report.result.suspects))
