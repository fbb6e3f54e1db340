"""cuda.gemm.sparse24 (sparse24.cu): it compiles with NVRTC for sm_80 and sm_90 (plain and with an
epilogue), a cuda build (no GPU needed) gives an eligible layer the sparse tactic on its compressed
weight, and on a GPU the kernel computes what the decompressing cpu tactic does, on random 2:4
weights, odd shapes and poisoned outputs."""

from __future__ import annotations


import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.records import layer_as_node
from polykit.compiler.plan.sparse24 import KINDS, prune
from polykit.kernels.cpu.sparse24 import run_decompressed
from polykit.kernels.cuda.gemm import sparse24 as family


def model(kind: str, tokens: int, k: int, n: int, relu: bool = False, seed: int = 0):
    """One eligible layer (2:4 weight along K) with a bias: MatMul + Add, Gemm (transB, C), or a
    1x1 Conv with B over an image of `tokens` pixels (3 x tokens / 3); a Relu after it if asked."""
    rng = np.random.default_rng(seed)
    bias = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    if kind == "Conv":
        w = prune(rng.standard_normal((n, k, 1, 1)).astype(np.float32), axis=1)
        x_shape, y_shape = [2, k, 3, tokens // 3], [2, n, 3, tokens // 3]
        nodes = [helper.make_node("Conv", ["x", "W", "b"], ["h"], name="layer")]
    elif kind == "Gemm":
        w = prune(rng.standard_normal((n, k)).astype(np.float32), axis=1)
        x_shape, y_shape = [tokens, k], [tokens, n]
        nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], transB=1, alpha=0.5, name="layer")]
    else:
        w = prune(rng.standard_normal((k, n)).astype(np.float32), axis=0)
        x_shape, y_shape = [1, tokens, k], [1, tokens, n]
        nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="layer"), helper.make_node("Add", ["m", "b"], ["h"])]
    nodes.append(helper.make_node("Relu" if relu else "Identity", ["h"], ["y"], name="after"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(w, "W"), bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def sparse_layer(onnx_model, channels_last: bool = False):
    """(the eligible layer of a cuda fp16 build given the sparse tactic, the plan)."""
    cfg = dict(target="cuda", fp16=True, sparsity="enable", builder_optimization_level=0, channels_last=channels_last)
    dense = build_plan(onnx_model, BuilderConfig(**cfg))
    name = next(layer.name for layer in dense.layers if layer.kind in KINDS)
    plan = build_plan(onnx_model, BuilderConfig(**cfg, tactic_replay={name: "cuda.gemm.sparse24"}))
    return next(layer for layer in plan.layers if layer.name == name), plan


def test_every_variant_compiles_with_nvrtc_for_sm80_and_sm90():
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    layer, _ = sparse_layer(model("MatMul", 32, 64, 48, relu=True))
    assert layer.attrs.get("epilogue")  # the Add and Relu fused: the kernel with an epilogue
    units = unique_units(family.compile_variants() + family.kernels(layer))
    assert len(units) == 2
    for arch in ("sm_80", "sm_90"):
        assert check_all(units, arch) == 2


@pytest.mark.parametrize("kind", ["MatMul", "Gemm", "Conv"])
def test_a_cuda_fp16_build_runs_an_eligible_layer_on_the_compressed_weight(kind):
    layer, plan = sparse_layer(model(kind, 30, 64, 40))
    assert layer.tactic == "cuda.gemm.sparse24" and layer.inputs[1] == "W::sparse24"
    assert plan.weights["W::sparse24"].dtype == np.uint8 and layer.attrs["sparse24"]["dtype"] == "float16"
    assert [k["name"] for k in plan.metadata["kernels"]["layers"][layer.name]] == ["gemm_sparse24"]
    assert family.supports(layer)


def test_a_channels_last_build_runs_a_1x1_conv_nhwc_sparse():
    layer, _ = sparse_layer(model("Conv", 15, 32, 24, relu=True), channels_last=True)
    assert layer.kind == "ConvNHWC" and layer.tactic == "cuda.gemm.sparse24" and family.supports(layer)


def test_the_tactic_declines_an_fp32_layer_and_a_dense_one():
    layer, _ = sparse_layer(model("MatMul", 8, 64, 16))
    from dataclasses import replace

    assert not family.supports(replace(layer, precision="fp32"))
    assert not family.supports(replace(layer, attrs={k: v for k, v in layer.attrs.items() if k != "sparse24"}))


def gpu_check(kind: str, tokens: int, k: int, n: int, relu: bool = False, channels_last: bool = False):
    from polykit.runtime.cuda.harness import run_layer

    layer, plan = sparse_layer(model(kind, tokens, k, n, relu=relu, seed=tokens), channels_last=channels_last)
    rng = np.random.default_rng(k)
    x_name = layer.inputs[0]
    inputs = {x_name: rng.standard_normal(plan.tensors[x_name].shape).astype(np.float16)}
    inputs.update({name: plan.weights[name] for name in layer.inputs[1:] if name})
    out = layer.outputs[0]
    got = run_layer(layer, inputs, output_specs={out: (plan.tensors[out].shape, np.float16)})[out]
    want = run_decompressed(layer_as_node(layer), [inputs.get(n) for n in layer.inputs])[0]
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("kind,tokens,k,n", [("MatMul", 1, 32, 8), ("MatMul", 77, 96, 130), ("Gemm", 65, 64, 33),
                                             ("Conv", 21, 64, 70), ("MatMul", 200, 768, 72)])
def test_the_kernel_equals_the_decompressing_reference(kind, tokens, k, n):
    gpu_check(kind, tokens, k, n)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
def test_the_kernel_runs_the_epilogue_and_nhwc_convs(channels_last):
    gpu_check("Conv", 15, 32, 24, relu=True, channels_last=channels_last)
    gpu_check("MatMul", 9, 64, 40, relu=True)


@pytest.mark.parametrize("kind,has_bias", [("MatMul", False), ("Gemm", True), ("Conv", True)])
def test_a_fused_matmuls_epilogue_operand_is_not_taken_for_a_bias(kind, has_bias):
    """MatMul + Add(b) fuses the Add into the epilogue: the layer's input 2 is then the epilogue's
    operand, which the kernel must not add a second time as a bias (the H200 run of 2026-12-05 found
    every MatMul case off by b); Gemm's C and a Conv's B are biases."""
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.cuda.gemm import sparse24 as tactic
    from tests.kernels.cuda.recording_launcher import RecordingLauncher

    layer, plan = sparse_layer(model(kind, 9, 64, 40, seed=9))
    assert (kind == "MatMul") == bool(layer.attrs.get("epilogue")) and layer.inputs[2] == "b"
    tensors = {name: DeviceTensor(0x10000 * (i + 1), tuple(plan.tensors[name].shape), np.dtype(plan.tensors[name].dtype))
               for i, name in enumerate(n for n in (*layer.inputs, *layer.outputs) if n)}
    rec = RecordingLauncher()
    tactic.enqueue(layer, rec, tensors)
    (_, args), = rec.launches
    assert (args[2] == tensors["b"]) is has_bias and (args[2] == 0) is not has_bias
