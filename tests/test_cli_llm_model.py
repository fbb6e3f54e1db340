"""Acceptance: a small decoder block exported at opset 23 with the ONNX Attention and
RotaryEmbedding ops (GQA, causal, a KV cache) passes `polykit run --trt --onnxrt` on cpu, and on
cuda where a GPU is present."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.plugins import reset_plugin_manager
from polykit.tools.cli.app import main

E, HQ, HKV, D, S, PAST, MAX_POS = 64, 4, 2, 16, 7, 5, 32


@pytest.fixture(autouse=True)
def fresh_plugins():
    reset_plugin_manager()
    yield
    reset_plugin_manager()


def decoder_block(path) -> str:
    """x [1, S, E] -> RMSNorm -> Q/K/V projections -> RotaryEmbedding on Q and K (position ids
    PAST..PAST+S-1) -> causal GQA Attention over a cache of PAST steps -> output projection + residual."""
    rng = np.random.default_rng(3)

    def weight(name, *shape, scale=0.15):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    angles = np.arange(MAX_POS)[:, None] / (10000.0 ** (np.arange(D // 2) / (D // 2)))
    inits = [weight("wq", E, HQ * D), weight("wk", E, HKV * D), weight("wv", E, HKV * D), weight("wo", HQ * D, E),
             numpy_helper.from_array(np.ones(E, np.float32) + 0.1 * rng.standard_normal(E).astype(np.float32), "gamma"),
             numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
             numpy_helper.from_array(np.arange(PAST, PAST + S, dtype=np.int64)[None], "pos")]
    nodes = [
        helper.make_node("RMSNormalization", ["x", "gamma"], ["h"], axis=-1),
        helper.make_node("MatMul", ["h", "wq"], ["q"]),
        helper.make_node("MatMul", ["h", "wk"], ["k"]),
        helper.make_node("MatMul", ["h", "wv"], ["v"]),
        helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["q_rot"], num_heads=HQ),
        helper.make_node("RotaryEmbedding", ["k", "cos", "sin", "pos"], ["k_rot"], num_heads=HKV),
        helper.make_node("Attention", ["q_rot", "k_rot", "v", "", "past_key", "past_value"],
                         ["att", "present_key", "present_value"], is_causal=1, q_num_heads=HQ, kv_num_heads=HKV),
        helper.make_node("MatMul", ["att", "wo"], ["proj"]),
        helper.make_node("Add", ["x", "proj"], ["y"]),
    ]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "decoder_block",
        [helper.make_tensor_value_info("x", f32, [1, S, E]),
         helper.make_tensor_value_info("past_key", f32, [1, HKV, PAST, D]),
         helper.make_tensor_value_info("past_value", f32, [1, HKV, PAST, D])],
        [helper.make_tensor_value_info("y", f32, [1, S, E]),
         helper.make_tensor_value_info("present_key", f32, [1, HKV, PAST + S, D]),
         helper.make_tensor_value_info("present_value", f32, [1, HKV, PAST + S, D])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    out = str(path / "decoder_block.onnx")
    onnx.save(model, out)
    return out


def test_decoder_block_with_attention_and_rotary_passes_trt_vs_onnxrt_on_cpu(tmp_path, capsys):
    assert main(["run", decoder_block(tmp_path), "--trt", "--onnxrt", "--target", "cpu"]) == 0
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.gpu
def test_decoder_block_with_attention_and_rotary_passes_trt_vs_onnxrt_on_cuda(tmp_path, capsys):
    assert main(["run", decoder_block(tmp_path), "--trt", "--onnxrt", "--target", "cuda"]) == 0
    assert "PASSED" in capsys.readouterr().out
