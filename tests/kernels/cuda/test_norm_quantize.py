"""cuda.norm.warp for ai.polykit LayerNormQuantize (norm_warp.cu NW_Q8): LayerNorm whose output stage also
writes the e4m3 QuantizeLinear of the value it stores. Host side (no GPU): the layers the tactic takes, its
launch and kernel, and the kernel run on the host (block_emulation.py), whose e4m3 output equals
QuantizeLinear's reference of its own float output bit for bit and whose float output matches the reference.
GPU: the same checks on the device, the e4m3 output also within one e4m3 step of the reference's."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.quant.layernorm_quantize import KIND
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.reduce.norm import compile_variants, warp_launch
from polykit.kernels.tactics import candidates, find_tactic
from tests.kernels.cuda.test_norm_warp import WARP, emulated, host_buffers, tensors_at  # noqa: F401 (a fixture)

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
rng = np.random.default_rng(35)
#: |y| / Y_SCALE reaches past 448 (saturation) and down into e4m3's subnormals
Y_SCALE = np.float32(0.006)


def quantized_layer(shape, dtype=np.float16, *, float_out=True, bias=True):
    """A LayerNormQuantize LayerDesc stamped as the builder stamps it; outputs Yq [, Y]."""
    name, length = np.dtype(dtype).name, shape[-1]
    ins = ("X", "S", "B" if bias else "", "YS", "YZ")
    outs = ("Yq", "Y") if float_out else ("Yq",)
    return LayerDesc("lnq", KIND, ins, outs, {"axis": -1, "epsilon": 1e-5}, domain=POLYKIT_DOMAIN,
                     in_dtypes=(name, name, name if bias else "", "float32", "float8_e4m3fn"),
                     out_dtypes=("float8_e4m3fn", name)[:len(outs)],
                     in_shapes=(tuple(shape), (length,), (length,) if bias else (), (), ()),
                     out_shapes=(tuple(shape),) * len(outs))


def feeds_for(layer, dtype=np.float16):
    shape, length = layer.in_shapes[0], layer.in_shapes[0][-1]
    feeds = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(dtype),
             "S": (rng.standard_normal(length) + 1).astype(dtype),
             "YS": np.array(Y_SCALE, np.float32), "YZ": np.zeros((), E4M3)}
    if layer.inputs[2]:
        feeds["B"] = (rng.standard_normal(length) * 0.5).astype(dtype)
    return feeds


def quantize(y: np.ndarray) -> np.ndarray:
    """QuantizeLinear's reference (saturating e4m3, zero point +0) of y."""
    node = Node("QuantizeLinear", ["y", "s", "z"], ["q"])
    return run_reference(node, [y, np.array(Y_SCALE, np.float32), np.zeros((), E4M3)])[0]


def reference(layer, feeds) -> dict[str, np.ndarray]:
    node = Node(KIND, list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name, POLYKIT_DOMAIN)
    outs = run_reference(node, [feeds[n] if n else None for n in layer.inputs])
    return dict(zip(layer.outputs, outs))


def e4m3_ordinal(a: np.ndarray) -> np.ndarray:
    bits = np.asarray(a, E4M3).view(np.uint8).astype(np.int32)
    return np.where(bits & 0x80, -(bits & 0x7F), bits & 0x7F)


def test_the_reference_is_layer_norm_then_quantize_linear_of_its_stored_output():
    layer = quantized_layer((3, 64))
    feeds = feeds_for(layer)
    want = reference(layer, feeds)
    assert want["Yq"].dtype == E4M3 and want["Y"].dtype == np.float16
    np.testing.assert_array_equal(want["Yq"].view(np.uint8), quantize(want["Y"]).view(np.uint8))
    assert np.abs(want["Yq"].astype(np.float32)).max() == 448  # saturated, not NaN


@pytest.mark.parametrize("dtype", [np.float16, np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("float_out", [True, False])
def test_the_warp_tactic_takes_a_quantized_layer_norm_of_each_storage_type(dtype, float_out):
    layer = quantized_layer((8, 128, 768), dtype, float_out=float_out)
    assert [t.name for t in candidates("cuda", KIND, layer)] == [WARP]
    (kernel,) = find_tactic("cuda", KIND, WARP).kernels(layer)
    assert dict(kernel.defines)["NW_Q8"] == "1"


def test_an_int8_quantized_layer_norm_has_no_cuda_tactic():
    layer = quantized_layer((4, 64))
    layer = LayerDesc(layer.name, KIND, layer.inputs, layer.outputs, layer.attrs, domain=POLYKIT_DOMAIN,
                      in_dtypes=layer.in_dtypes[:4] + ("int8",), out_dtypes=("int8", "float16"),
                      in_shapes=layer.in_shapes, out_shapes=layer.out_shapes)
    assert candidates("cuda", KIND, layer) == []


def test_the_launch_passes_yq_and_the_scale_and_takes_vectors_only_where_yq_is_aligned():
    layer = quantized_layer((2, 3, 768))
    kernel, grid, block, args = warp_launch(layer, tensors_at(layer))
    tensors = tensors_at(layer)
    assert args[3] == tensors["Y"] and args[-2:] == [tensors["Yq"], tensors["YS"]] and args[-3] == 1
    assert warp_launch(layer, tensors_at(layer, shift={"Yq": 4}))[3][-3] == 0  # 8 e4m3 bytes a store
    alone = quantized_layer((2, 3, 768), float_out=False)
    assert warp_launch(alone, tensors_at(alone))[3][3] == 0  # no float output: Y is null


def test_every_storage_type_compiles_its_quantized_variant_in_ci():
    q8 = [k for k in compile_variants() if k.file == "norm_warp.cu" and dict(k.defines).get("NW_Q8") == "1"]
    assert {dict(k.defines)["ELEM"] for k in q8} == {"float", "half_t", "bf16_t"}
    assert {int(dict(k.defines)["NW_LANES"]) for k in q8} == {4, 32}


# ---- the kernel on the host ----------------------------------------------------------------------
@pytest.mark.parametrize("shape,dtype,bias,shift", [
    ((3, 96), np.float16, True, {}),                 # 4 lanes x 3 vectors, 8 e4m3 bytes a store
    ((5, 100), np.float16, True, {}),                # tail: element path
    ((9, 64), np.float32, False, {}),                # fp32: 4 e4m3 bytes a store
    ((3, 768), np.float16, True, {"Yq": 4}),         # misaligned Yq: element path
    ((6, 64), ml_dtypes.bfloat16, True, {}),
])
def test_the_emulated_kernel_writes_quantize_linear_of_its_own_output(emulated, shape, dtype, bias, shift):
    layer = quantized_layer(shape, dtype, bias=bias)
    feeds = feeds_for(layer, dtype)
    tensors, views, _keep = host_buffers(layer, feeds, shift)
    find_tactic("cuda", KIND, WARP).enqueue(layer, emulated, tensors)
    np.testing.assert_array_equal(views["Yq"].view(np.uint8), quantize(views["Y"]).view(np.uint8))
    want = reference(layer, feeds)
    tol = {np.float16: 2e-3, ml_dtypes.bfloat16: 2e-2}.get(dtype, 1e-5)
    np.testing.assert_allclose(views["Y"].astype(np.float64), want["Y"].astype(np.float64), rtol=tol, atol=tol)
    alone = quantized_layer(shape, dtype, float_out=False, bias=bias)
    tensors, only, _keep2 = host_buffers(alone, feeds, shift)
    find_tactic("cuda", KIND, WARP).enqueue(alone, emulated, tensors)
    np.testing.assert_array_equal(only["Yq"].view(np.uint8), views["Yq"].view(np.uint8))


# ---- GPU -------------------------------------------------------------------------------------------
def run_on_gpu(layer, feeds, misalign=None):
    from polykit.runtime.cuda.harness import run_layer

    return run_layer(layer, feeds, tactic=WARP, misalign=misalign)


@pytest.mark.gpu
@pytest.mark.parametrize("length", [7, 96, 768, 1024, 4096])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("misalign", [None, {"Yq": 4}])
def test_a_quantized_layer_norm_on_the_gpu_matches_quantize_linear_of_its_output(length, dtype, misalign):
    layer = quantized_layer((3, 11, length), dtype)
    feeds = feeds_for(layer, dtype)
    got = run_on_gpu(layer, feeds, misalign)
    np.testing.assert_array_equal(got["Yq"].view(np.uint8), quantize(got["Y"]).view(np.uint8))
    want = reference(layer, feeds)
    tol = {np.float32: 1e-4, np.float16: 5e-3}.get(dtype, 3e-2)
    np.testing.assert_allclose(got["Y"].astype(np.float64), want["Y"].astype(np.float64), rtol=tol, atol=tol)
    # Y differs from the reference's by its rounding at most, so Yq by at most one e4m3 step
    assert np.abs(e4m3_ordinal(got["Yq"]) - e4m3_ordinal(want["Yq"])).max() <= 1
    alone = quantized_layer((3, 11, length), dtype, float_out=False)
    np.testing.assert_array_equal(run_on_gpu(alone, feeds, misalign)["Yq"].view(np.uint8), got["Yq"].view(np.uint8))
