"""Swin-style window attention through whole builds: scores + a relative-position bias [1, H, N, N],
viewed [B, W, H, N, N] + a per-window shift mask, viewed back, softmax, times V (torchvision's
shifted-window block), head size 32, N = 49. The cpu plan against onnxruntime, which tactic a cuda
fp16 plan built at level 0 gives it (no GPU needed), and the cuda plan against onnxruntime (GPU)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder import builder as builder_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Runtime

H, N, D, W = 3, 49, 32, 4


def window_block(B: int, shifted: bool = True):
    """q, k, v [B*W, H, N, D] -> attention -> [B*W, N, H, D] (the heads' transpose before the merge)."""
    rng = np.random.default_rng(7)
    bias = rng.standard_normal((1, H, N, N)).astype(np.float32)
    mask = np.where(rng.random((1, W, 1, N, N)) > 0.3, 0.0, -100.0).astype(np.float32)
    mask[..., 0] = 0.0  # every row keeps a key
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("scale", np.array(D ** -0.5, np.float32)), ("bias", bias), ("mask", mask),
        ("split", np.array([B, W, H, N, N], np.int64)), ("merge", np.array([-1, H, N, N], np.int64))]]
    nodes = [helper.make_node("Mul", ["q", "scale"], ["qs"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qs", "kt"], ["s"]), helper.make_node("Add", ["s", "bias"], ["sb"])]
    if shifted:
        nodes += [helper.make_node("Reshape", ["sb", "split"], ["s5"]), helper.make_node("Add", ["s5", "mask"], ["sm5"]),
                  helper.make_node("Reshape", ["sm5", "merge"], ["sm"])]
    nodes += [helper.make_node("Softmax", ["sm" if shifted else "sb"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"]), helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3])]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B * W, H, N, D]) for n in "qkv"]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [B * W, N, H, D])
    graph = helper.make_graph(nodes, "window_attention", io, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # onnxruntime reads it


def _feeds(B: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(B)
    return {n: rng.standard_normal((B * W, H, N, D)).astype(np.float32) for n in "qkv"}


def _compare(model, B: int, config: BuilderConfig, tol: float) -> list:
    plan = build_plan(model, config)
    feeds = _feeds(B)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = Runtime().deserialize_engine(plan).create_execution_context().execute(feeds)["y"]
    assert np.abs(np.asarray(got, np.float64) - want).max() <= tol * np.abs(want).max()
    return plan.layers


@pytest.mark.parametrize("shifted", [True, False])
@pytest.mark.parametrize("B", [1, 2])
def test_cpu_plan_of_window_attention_is_one_attention_layer_matching_onnxruntime(B, shifted):
    layers = _compare(window_block(B, shifted), B, BuilderConfig(target="cpu"), 1e-5)
    kinds = Counter(layer.kind for layer in layers)
    assert kinds["Attention"] == 1 and kinds["Softmax"] == 0 and kinds["Add"] == 0


@pytest.mark.parametrize("arch", [None, "sm_90"])
@pytest.mark.parametrize("B", [1, 2])
def test_cuda_fp16_plan_runs_window_attention_on_the_flash_kernel(B, arch, monkeypatch):
    from polykit.runtime.cuda.driver import DeviceInfo

    gpu = None if arch is None else DeviceInfo(0, f"test GPU {arch}", arch, 132, 80 << 30, 227 * 1024)
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: gpu)
    plan = build_plan(window_block(B), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert not [layer for layer in plan.layers if layer.kind == "Softmax"]
    # head size 32: the mma.sync kernel (the wgmma one takes 64 / 128); one image: the windows stay
    # the batch and the mask is [W, H, N, N]; more: batch dims (B, W) of rank 5, the mask broadcast
    # over the batch (the flash kernel's outer batch index)
    assert att.tactic == "cuda.attention.flash"
    assert att.in_shapes[3] == ((W, H, N, N) if B == 1 else (1, W, H, N, N))
    # the heads' transpose after it is the output's "bshd" layout either way
    assert att.attrs["out_layout"] == "bshd" and att.out_shapes[0] == ((B * W, N, H, D) if B == 1 else (B, W, N, H, D))


@pytest.mark.gpu
@pytest.mark.parametrize("shifted", [True, False])
@pytest.mark.parametrize("B", [1, 2])
def test_cuda_fp16_plan_of_window_attention_matches_onnxruntime(B, shifted):
    layers = _compare(window_block(B, shifted), B, BuilderConfig(target="cuda", fp16=True), 2e-2)
    assert Counter(layer.kind for layer in layers)["Attention"] == 1
