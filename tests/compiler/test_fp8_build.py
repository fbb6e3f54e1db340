"""Implicit FP8 builds (BuilderConfig.fp8, --fp8): calibrated e4m3 scales (max |x| / 448), FP8
layers close to fp32 on the cpu target, the calibration cache marked `type=fp8`, and caches of the
other kind refused (docs/INT8.md "FP8")."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.calibration_cache import read_calibration_cache
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes.insert_qdq import quantize_weight_fp8
from polykit.errors import DataFileError, UsageError

from .fp8_models import E4M3
from .int8_models import convnet, feeds_for, mlp, small_resnet
from .test_int8_build import cosine, run

QUANT_KINDS = {"QConv", "QMatMul"}


@pytest.mark.parametrize("make, expected", [(convnet, {"QConv": 2, "QMatMul": 1}), (mlp, {"QMatMul": 2}),
                                            (small_resnet, {"QConv": 17, "QMatMul": 1})],
                         ids=["convnet", "mlp", "resnet"])
def test_fp8_build_runs_every_product_in_fp8_close_to_fp32(tmp_path, make, expected):
    model = load_onnx(make())
    batches = [feeds_for(make(), seed) for seed in range(4)]
    cache = tmp_path / "fp8.cache"
    level0 = {"builder_optimization_level": 0}  # no timing: plans of equal inputs are equal bytes
    fp32 = build_plan(model, BuilderConfig(target="cpu"))
    fp8 = build_plan(model, BuilderConfig(target="cpu", fp8=True, calibration_data=batches, calibration_cache=str(cache),
                                         **level0))
    kinds = [layer.kind for layer in fp8.layers]
    assert {k: kinds.count(k) for k in QUANT_KINDS if k in kinds} == expected
    assert not {"Conv", "Gemm", "MatMul"} & set(kinds)
    quant = [layer for layer in fp8.layers if layer.kind in QUANT_KINDS]
    assert all(layer.precision == "fp8" and layer.in_dtypes[2] == "float8_e4m3fn" for layer in quant)
    for seed in (100, 101):
        feeds = feeds_for(make(), seed)
        assert cosine(run(fp8, feeds), run(fp32, feeds)) >= 0.99
    # the cache: minmax scales max|x| / 448, type=fp8; a build from it gives the same plan bytes
    written = read_calibration_cache(cache)
    assert written.type == "fp8" and written.calibrator == "minmax"
    assert cache.read_text().splitlines()[0].endswith(" calibrator=minmax type=fp8")
    (name,) = batches[0]
    amax = max(float(np.abs(b[name]).max()) for b in batches)
    assert written.scales[name] == float(np.float32(amax / 448))
    again = build_plan(model, BuilderConfig(target="cpu", fp8=True, calibration_cache=str(cache), **level0))
    assert again.serialize() == fp8.serialize()


def test_fp8_weights_are_per_channel_amax_over_448():
    w = np.array([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [900.0, 1.0, -0.001]], np.float32)
    q, scale = quantize_weight_fp8(w, 0)
    assert q.dtype == E4M3
    assert scale.tolist() == [np.float32(2.0 / 448), 1.0, np.float32(900.0 / 448)]
    assert q[0].astype(np.float32).tolist() == [224.0, -448.0, 112.0]
    assert q[1].astype(np.float32).tolist() == [0.0, 0.0, 0.0] and float(q[2, 0]) == 448.0
    np.testing.assert_allclose(q.astype(np.float32) * scale[:, None], w, rtol=2 ** -4, atol=scale.max() * 2 ** -9)


def test_a_cache_of_the_other_kind_is_refused_naming_the_file(tmp_path):
    model = load_onnx(mlp())
    batches = [feeds_for(mlp(), seed) for seed in range(2)]
    int8_cache, fp8_cache = tmp_path / "int8.cache", tmp_path / "fp8.cache"
    build_plan(model, BuilderConfig(target="cpu", int8=True, calibration_data=batches, calibration_cache=int8_cache))
    build_plan(model, BuilderConfig(target="cpu", fp8=True, calibration_data=batches, calibration_cache=fp8_cache))
    assert read_calibration_cache(int8_cache).type == "int8"
    with pytest.raises(DataFileError, match="holds INT8 scales; this FP8 build") as info:
        build_plan(model, BuilderConfig(target="cpu", fp8=True, calibration_cache=int8_cache))
    assert str(int8_cache) in str(info.value)
    with pytest.raises(DataFileError, match="holds FP8 scales; this INT8 build") as info:
        build_plan(model, BuilderConfig(target="cpu", int8=True, calibration_cache=fp8_cache, calibration_data=batches))
    assert str(fp8_cache) in str(info.value)


def test_fp8_tensor_ranges_and_flag_conflicts():
    graph = load_onnx(convnet())
    plan = build_plan(graph, BuilderConfig(target="cpu", fp8=True, tensor_ranges={"x": (-1.5, 1.2), "r1": (0, 3),
                                                                                  "f": (0, 2)}))
    quantize_x = next(layer for layer in plan.layers if layer.kind == "QuantizeLinear" and layer.inputs[0] == "x")
    assert float(plan.weights[quantize_x.inputs[1]]) == np.float32(1.5 / 448)
    assert quantize_x.out_dtypes[0] == "float8_e4m3fn"
    with pytest.raises(UsageError, match="INT8 or to FP8, not both"):
        BuilderConfig(target="cpu", int8=True, fp8=True)
    with pytest.raises(UsageError, match="refittable"):
        BuilderConfig(target="cpu", fp8=True, refittable=True)


def test_a_calibrated_fp8_resnet_runs_its_convs_nhwc_exactly_as_nchw():
    # to_channels_last takes FP8 QConvs and QMatMuls too (what the cuda.fp8.sm90 tactics run): KRSC e4m3 weights,
    # the stem's 3 channels padded with e4m3 zeros; the exact cpu sums make both layouts equal
    model = load_onnx(small_resnet())
    cfg = BuilderConfig(target="cpu", fp8=True, calibration_data=[feeds_for(small_resnet(), s) for s in range(2)])
    nchw = build_plan(model, cfg)
    nhwc = build_plan(model, BuilderConfig(**{**cfg.__dict__, "channels_last": True}))
    convs = [layer for layer in nhwc.layers if layer.kind == "QConvNHWC"]
    # 17 convolutions and the classifier (a QMatMul of K 32: a 1x1 conv over its rows)
    assert len(convs) == 18 and all(layer.precision == "fp8" for layer in convs)
    assert "QMatMul" not in {layer.kind for layer in nhwc.layers}
    assert all(layer.in_shapes[0][-1] % 16 == 0 for layer in convs)
    # the image quantized to e4m3 NHWC, padded to 16 channels, in one layer (fuse_quantize_nhwc)
    assert nhwc.layers[0].kind == "QuantizeNHWC" and nhwc.layers[0].out_dtypes == ("float8_e4m3fn",)
    assert nhwc.layers[1].kind == "QConvNHWC" and nhwc.layers[1].inputs[0] == nhwc.layers[0].outputs[0]
    feeds = feeds_for(small_resnet(), 9)
    np.testing.assert_array_equal(run(nhwc, feeds), run(nchw, feeds))


def test_an_fp8_build_without_fp16_takes_the_gpus_arch_for_its_quantized_layers(tmp_path, monkeypatch):
    """A cuda build on a device of sm_90 (a stand-in DeviceInfo, nothing timed at level 0) runs an explicit FP8
    chain's convs on the sm_90a e4m3 tactics. The first GPU run (H100, 2026-12-05) found them unfolded to
    float: builds without --fp16 asked for no device, so only arch-free tactics counted."""
    from polykit.compiler.builder import builder
    from polykit.runtime.cuda.driver import DeviceInfo

    from .fp8_models import conv_chain

    monkeypatch.setattr(builder, "build_device",
                        lambda target, device=None: DeviceInfo(0, "stand-in sm_90", "sm_90", 132, 80 << 30, 232448))
    path, _ = conv_chain(tmp_path / "c.onnx")
    plan = build_plan(path, BuilderConfig(target="cuda", builder_optimization_level=0))
    convs = [layer.tactic for layer in plan.layers if layer.kind in ("QConvNHWC", "ConvNHWC", "Conv")]
    assert len(convs) == 2 and all(t.startswith("cuda.fp8.sm90_") for t in convs), convs


def test_an_fp8_resnet_on_sm90_runs_every_conv_on_the_fp8_tactics_identity_residuals_read_as_e4m3(tmp_path,
                                                                                                  monkeypatch):
    """`--fp8 --fp16` on a device of sm_90 (a stand-in DeviceInfo, level 0: nothing timed or compiled): every
    conv and the classifier on cuda.fp8.sm90_*, the identity blocks' last convs among them, reading the block's
    e4m3 input as their residual (dequantized in the epilogue). Before epilogue.py read e4m3 inputs, those convs
    were unfolded to float (ResNet-50: 12 of its 53 convs, on fp32 3xTF32 tiles)."""
    from polykit.compiler.builder import builder
    from polykit.compiler.ops.quant.int8 import QUANT_ARITY
    from polykit.runtime.cuda.driver import DeviceInfo

    from tests.conv_models import resnet

    model = resnet(depths=(2, 2, 1, 1), width=8, image=16, batch=2)
    cache = tmp_path / "fp8.cache"  # calibrated on the cpu (the cuda calibration engine would need the GPU)
    build_plan(model, BuilderConfig(target="cpu", fp8=True, calibration_cache=cache, builder_optimization_level=0,
                                    calibration_data=[feeds_for(model, seed) for seed in range(2)]))
    monkeypatch.setattr(builder, "build_device",
                        lambda target, device=None: DeviceInfo(0, "stand-in sm_90", "sm_90", 132, 80 << 30, 232448))
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, fp8=True, calibration_cache=cache,
                                           builder_optimization_level=0))
    products = [layer for layer in plan.layers if any(k in layer.kind for k in ("Conv", "Gemm", "MatMul"))]
    # 6 blocks of 3 convs, 4 downsampling shortcuts, the stem, the classifier
    assert len(products) == 24
    assert all(layer.precision == "fp8" and layer.tactic.startswith("cuda.fp8.sm90_") for layer in products), \
        [(layer.name, layer.kind, layer.tactic) for layer in products if not layer.tactic.startswith("cuda.fp8")]
    e4m3_residual = [layer for layer in products if "float8_e4m3fn" in layer.in_dtypes[QUANT_ARITY:]]
    # every block's last conv: the identity blocks of the first two stages read the block's input, the four
    # downsampling blocks their shortcut conv's output, which that conv writes in e4m3 (insert_qdq's
    # residual_candidates; float32 before, 4 bytes an element written and read)
    assert len(e4m3_residual) == 6
    dtype_of = {name: d for layer in plan.layers for name, d in zip(layer.outputs, layer.out_dtypes)}
    residual_dtypes = [dtype_of[layer.inputs[QUANT_ARITY]] for layer in e4m3_residual]
    assert residual_dtypes == ["float8_e4m3fn"] * 6, residual_dtypes
    assert "float32" not in [d for layer in products[:-1] for d in layer.out_dtypes]  # the classifier's logits only
    assert not {"DequantizeLinear", "ConvNHWC", "Conv"} & {layer.kind for layer in plan.layers}
