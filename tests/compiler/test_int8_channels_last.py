"""INT8 convolutions channels-last (QConvNHWC): to_channels_last repacks QConv's weights (KRSC,
channels padded with W's zero points), pads X's channels with X's zero point, moves the epilogue's
inputs to NHWC; the result equals the NCHW layer's exactly, and a calibrated conv chain stays NHWC."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, Value
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes import to_channels_last
from polykit.compiler.passes.channels_last import INT8_CHANNEL_ALIGN
from polykit.compiler.ops.references import run_reference
from polykit.runtime.engine import Runtime

from .int8_models import feeds_for, mlp, quantize_with_onnxruntime, small_resnet

rng = np.random.default_rng(41)


def run(plan, feeds):
    with Runtime(plan.target).deserialize_engine(plan) as engine:
        return next(iter(engine.create_execution_context().execute(feeds).values()))


def qconv_graph(c: int, m: int, x_dtype=np.uint8, residual: bool = True) -> tuple[Graph, dict[str, np.ndarray]]:
    """x[2, c, 9, 7] (8-bit) -> QConv 3x3 (per-channel uint8-or-int8 weights, bias) [+ skip] -> Relu -> y float32."""
    w_dtype = np.int8
    inits = {"xz": np.array(rng.integers(0, 200) if x_dtype == np.uint8 else -3, x_dtype),
             "w": rng.integers(-128, 128, (m, c, 3, 3)).astype(w_dtype),
             "wz": rng.integers(-4, 5, m).astype(w_dtype), "s": rng.uniform(1e-3, 3e-3, m).astype(np.float32),
             "b": rng.standard_normal(m).astype(np.float32)}
    body = [{"op": "Relu", "inputs": ["raw"], "outputs": ["y"], "attrs": {}}]
    inputs = ["x", "xz", "w", "wz", "s", "b", "", ""]
    if residual:
        body = [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["a"], "attrs": {}},
                {"op": "Relu", "inputs": ["a"], "outputs": ["y"], "attrs": {}}]
        inputs.append("skip")
    node = Node("QConv", inputs, ["y"], {"pads": [1, 1, 1, 1], "epilogue": {"input": "raw", "body": body}},
                name="qconv", domain=POLYKIT_DOMAIN)
    g = Graph(name="qconv", nodes=[node], inputs=["x"] + (["skip"] if residual else []), outputs=["y"],
              initializers=inits)
    g.set_value(Value("x", np.dtype(x_dtype), (2, c, 9, 7)))
    if residual:
        g.set_value(Value("skip", np.dtype(np.float32), (2, m, 9, 7)))
    infer_shapes(g)
    info = np.iinfo(x_dtype)
    feeds = {"x": rng.integers(info.min, int(info.max) + 1, (2, c, 9, 7)).astype(x_dtype)}
    if residual:
        feeds["skip"] = rng.standard_normal((2, m, 9, 7)).astype(np.float32)
    return g, feeds


def nodes_of(g: Graph, op: str) -> list[Node]:
    return [n for n in g.nodes if n.op_type == op]


def test_qconv_becomes_qconv_nhwc_with_zero_point_padding_and_krsc_weights():
    g, _ = qconv_graph(c=3, m=5)
    assert to_channels_last(g)
    conv, = nodes_of(g, "QConvNHWC")
    pad, = nodes_of(g, "Pad")
    assert conv.name == "qconv" and conv.domain == POLYKIT_DOMAIN
    assert g.initializers[pad.inputs[1]].tolist() == [0, 0, 0, 0, 0, 0, 0, INT8_CHANNEL_ALIGN - 3]
    assert pad.inputs[2] == "xz"  # padding channels hold X's zero point: centered, they are 0
    w = g.initializers[conv.inputs[2]]
    assert w.shape == (5, 3, 3, INT8_CHANNEL_ALIGN)
    np.testing.assert_array_equal(w[..., :3], g.initializers["w"].transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(w[..., 3:], np.broadcast_to(g.initializers["wz"].reshape(5, 1, 1, 1), (5, 3, 3, 13)))
    skip = g.producers()[conv.inputs[8]]  # the residual arrives through a Transpose to NHWC, named in the body
    assert skip.op_type == "Transpose" and skip.inputs == ["skip"]
    assert conv.attrs["epilogue"]["body"][0]["inputs"] == ["raw", conv.inputs[8]]


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("c,residual", [(3, True), (16, False), (20, True)])
def test_the_nhwc_layer_computes_exactly_what_the_nchw_one_does(c, residual, x_dtype):
    g, feeds = qconv_graph(c=c, m=6, x_dtype=x_dtype, residual=residual)
    want = run(build_plan(g, BuilderConfig(target="cpu")), feeds)
    plan = build_plan(g, BuilderConfig(target="cpu", channels_last=True))
    assert "QConvNHWC" in {layer.kind for layer in plan.layers}
    np.testing.assert_array_equal(run(plan, feeds), want)


def test_the_nhwc_reference_is_the_nchw_reference_transposed():
    g, feeds = qconv_graph(c=16, m=7, residual=False)
    node, = g.nodes
    args = [feeds.get(n, g.initializers.get(n)) if n else None for n in node.inputs]
    want = run_reference(node, args)[0]
    nhwc = Node("QConvNHWC", node.inputs, node.outputs, node.attrs, name="q", domain=POLYKIT_DOMAIN)
    args[0], args[2] = args[0].transpose(0, 2, 3, 1), args[2].transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(run_reference(nhwc, args)[0], want.transpose(0, 2, 3, 1))


def test_a_calibrated_resnet_runs_its_int8_convs_nhwc_with_reformats_only_at_the_edges():
    model = load_onnx(small_resnet())
    ranges = BuilderConfig(target="cpu", int8=True, calibration_data=[feeds_for(small_resnet(), s) for s in range(2)])
    nchw = build_plan(model, ranges)
    nhwc = build_plan(model, BuilderConfig(**{**ranges.__dict__, "channels_last": True}))
    kinds = [layer.kind for layer in nhwc.layers]
    # the 17 convolutions and the classifier's GEMM (a 1x1 conv over its rows: symmetric INT8)
    assert kinds.count("QConvNHWC") == 18 and "QMatMul" not in kinds and kinds.count("Transpose") <= 2
    feeds = feeds_for(small_resnet(), 9)
    np.testing.assert_array_equal(run(nhwc, feeds), run(nchw, feeds))


def test_an_onnxruntime_quantized_resnet_gives_the_same_outputs_channels_last(tmp_path):
    path = quantize_with_onnxruntime(small_resnet(), tmp_path / "q.onnx", activations="uint8", per_channel=True)
    nhwc = build_plan(path, BuilderConfig(target="cpu", channels_last=True))
    assert "QConvNHWC" in {layer.kind for layer in nhwc.layers}
    feeds = feeds_for(small_resnet(), 4)
    np.testing.assert_array_equal(run(nhwc, feeds), run(build_plan(path, BuilderConfig(target="cpu")), feeds))


def test_symmetric_int8_gemms_run_channels_last_as_1x1_convs_over_their_rows():
    """An --int8 build's QMatMuls (int8 X and W, zero points 0) with K % 16 == 0 become 1x1
    QConvNHWC over their rows, marked symmetric, so the sm90 INT8 tiles (s8 wgmma) serve the
    GEMMs too; the cpu's exact integer sums make the plan equal the QMatMul plan bit for bit."""
    ranges = BuilderConfig(target="cpu", int8=True, calibration_data=[feeds_for(mlp(), s) for s in range(2)])
    plain = build_plan(load_onnx(mlp()), ranges)
    rows = build_plan(load_onnx(mlp()), BuilderConfig(**{**ranges.__dict__, "channels_last": True}))
    assert [layer.kind for layer in plain.layers].count("QMatMul") == 2
    convs = [layer for layer in rows.layers if layer.kind == "QConvNHWC"]
    assert len(convs) == 2 and "QMatMul" not in {layer.kind for layer in rows.layers}
    assert all(layer.attrs.get("symmetric") == 1 and layer.attrs["kernel_shape"] == [1, 1] for layer in convs)
    assert convs[0].in_shapes[0] == (1, 1, 4, 16) and convs[0].in_shapes[2] == (32, 1, 1, 16)
    feeds = feeds_for(mlp(), 9)
    np.testing.assert_array_equal(run(rows, feeds), run(plain, feeds))


def test_an_asymmetric_int8_gemm_stays_a_qmatmul(tmp_path):
    path = quantize_with_onnxruntime(mlp(), tmp_path / "q.onnx", activations="uint8", per_channel=True)
    nhwc = build_plan(path, BuilderConfig(target="cpu", channels_last=True))
    kinds = {layer.kind for layer in nhwc.layers}
    assert "QMatMul" in kinds and "QConvNHWC" not in kinds
