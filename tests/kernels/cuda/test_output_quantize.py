"""The e4m3 output stages of an FP8 model's LayerNorm and attention (fuse_output_quantize): cuda.norm.warp for
ai.polykit LayerNormQuantize (norm_warp.cu NW_Q8) and the flash tactics for ai.polykit AttentionQuantize
(flash_attention.cu FLASH_Q8), each writing the e4m3 QuantizeLinear of the value its 16-bit kernel stores.
Host side (no GPU): the layers the tactics take, their launches and kernels, and the kernels run on the host
(block_emulation.py): the e4m3 output equals QuantizeLinear's reference of the float output the same kernel
writes (LayerNorm: beside it; attention: the unquantized kernel's) bit for bit, and the float output matches the
reference. GPU: the same checks on the device (LayerNorm: the e4m3 output also within one e4m3 step of the reference's)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.quant.attention_quantize import KIND as ATTENTION
from polykit.compiler.ops.quant.layernorm_quantize import KIND
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.attention.flash_attention import compile_variants as flash_variants
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor
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
    node = Node(layer.kind, list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name, POLYKIT_DOMAIN)
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


def edge_feeds(layer, dtype, ys):
    """Feeds whose float output y is chosen value by value: scale 0 makes y = bias exactly, the bias holding e4m3
    values and rounding midpoints times ys (a float16 / bfloat16 rounding of them: ties and their neighbours),
    signed zeros, +-inf, NaNs, the type's largest and smallest values and randoms over many binades."""
    length = layer.in_shapes[0][-1]
    codes = np.arange(0x7F, dtype=np.uint8).view(E4M3).astype(np.float64)
    picks = np.concatenate([codes, (codes[1:] + codes[:-1]) / 2, [464, 500, 1e4]]) * float(ys)
    info = ml_dtypes.finfo(dtype)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, float(info.max), -float(info.max),
               float(info.smallest_subnormal), -float(info.smallest_subnormal)]
    pool = np.concatenate([picks, -picks, special, rng.standard_normal(64) * 2.0 ** rng.integers(-30, 15, 64)])
    with np.errstate(over="ignore"):
        bias = rng.choice(pool, length).astype(dtype)
    bias[:len(special)] = np.array(special).astype(dtype)
    return {"X": rng.standard_normal(layer.in_shapes[0]).astype(dtype), "S": np.zeros(length, dtype), "B": bias,
            "YS": np.array(ys, np.float32), "YZ": np.zeros((), E4M3)}


def assert_quantized(yq: np.ndarray, y: np.ndarray, ys) -> None:
    """yq is QuantizeLinear(y, ys) byte for byte, a NaN of y a NaN byte (its sign: e4m3_quantize.cuh)."""
    node = Node("QuantizeLinear", ["y", "s", "z"], ["q"])
    with np.errstate(all="ignore"):
        want = run_reference(node, [y, np.array(ys, np.float32), np.zeros((), E4M3)])[0].view(np.uint8)
    got, nan = yq.view(np.uint8), np.isnan(y.astype(np.float32))
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.all((got[nan] & 0x7F) == 0x7F)


#: scales inside the division-free range (the tests' 0.006, a third) and outside it on both sides (the division)
EDGE_SCALES = (0.006, 1 / 3, 2.0 ** -100, 2.0 ** 95)


@pytest.mark.parametrize("ys", EDGE_SCALES, ids=lambda s: f"{s:.3g}")
@pytest.mark.parametrize("shape,dtype,shift", [((4, 96), np.float16, {}), ((3, 100), np.float16, {}),
                                               ((4, 64), np.float32, {}), ((4, 64), ml_dtypes.bfloat16, {"Yq": 4})])
def test_the_emulated_kernel_quantizes_edge_values_as_quantize_linear(emulated, ys, shape, dtype, shift):
    layer = quantized_layer(shape, dtype)
    feeds = edge_feeds(layer, dtype, ys)
    tensors, views, _keep = host_buffers(layer, feeds, shift)
    find_tactic("cuda", KIND, WARP).enqueue(layer, emulated, tensors)
    y = views["Y"].astype(np.float32)
    np.testing.assert_array_equal(y, np.broadcast_to(feeds["B"].astype(np.float32), y.shape))
    assert np.isnan(y).any() and np.isinf(y).any()  # y = the bias: the edges reach the output stage
    assert_quantized(views["Yq"], views["Y"], ys)


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


# ---- AttentionQuantize on the flash tactics ------------------------------------------------------
FLASH = ("cuda.attention.flash", "cuda.attention.flash_q128", "cuda.attention.flash_kv128")
#: flash_attention_sm90.py's tactics (compute capability 9.0), which take AttentionQuantize where they take Attention
SM90 = ("cuda.attention.flash_sm90", "cuda.attention.flash_sm90_pp", "cuda.attention.flash_sm90_pp_s3",
        "cuda.attention.flash_sm90_pp_persist_s3")


def attention_quantize(plain: LayerDesc) -> LayerDesc:
    """`plain` (an Attention LayerDesc, inputs Q, K, V[, mask]) as AttentionQuantize writing Yq."""
    ins = tuple(plain.inputs) + (("",) if len(plain.inputs) == 3 else ()) + ("YS", "YZ")
    dtypes = tuple(plain.in_dtypes) + (("",) if len(plain.inputs) == 3 else ()) + ("float32", "float8_e4m3fn")
    shapes = tuple(plain.in_shapes) + (((),) if len(plain.inputs) == 3 else ()) + ((), ())
    return LayerDesc("attq", ATTENTION, ins, ("Yq",), dict(plain.attrs), domain=POLYKIT_DOMAIN, in_dtypes=dtypes,
                     out_dtypes=("float8_e4m3fn",), in_shapes=shapes, out_shapes=plain.out_shapes)


def bert_heads(dtype=np.float16, batch=2, seq=70, mask=True):
    """BERT's attention on head views of a packed [B, S, 3 E] projection is what the plans run; here [B, H, S, 64]
    tensors and an additive [B, 1, 1, S] mask, the output written [B, S, H, D] (out_layout bshd)."""
    from tests.kernels.cuda.test_flash_attention import _arrays, layer_for

    inputs = _arrays((batch, 2, seq, 64), (batch, 2, seq, 64), dtype)
    if mask:
        inputs["mask"] = (rng.standard_normal((batch, 1, 1, seq)) * 2).astype(dtype)
    return inputs, layer_for(inputs, (batch, seq, 2, 64), out_layout="bshd")


def test_only_the_flash_tactics_take_a_quantized_attention():
    inputs, plain = bert_heads()
    layer = attention_quantize(plain)
    assert sorted(t.name for t in candidates("cuda", ATTENTION, layer)) == sorted(FLASH + SM90)
    assert sorted(t.name for t in candidates("cuda", ATTENTION, layer, arch="sm_80")) == sorted(FLASH)
    (kernel,) = find_tactic("cuda", ATTENTION, FLASH[0]).kernels(layer)
    assert dict(kernel.defines)["FLASH_Q8"] == "1"
    assert "FLASH_Q8" not in dict(find_tactic("cuda", "Attention", FLASH[0]).kernels(plain)[0].defines)
    int8 = LayerDesc(layer.name, ATTENTION, layer.inputs, layer.outputs, layer.attrs, domain=POLYKIT_DOMAIN,
                     in_dtypes=layer.in_dtypes[:5] + ("int8",), out_dtypes=("int8",), in_shapes=layer.in_shapes,
                     out_shapes=layer.out_shapes)
    assert candidates("cuda", ATTENTION, int8) == []


def test_every_attention_storage_type_compiles_its_quantized_variant_in_ci():
    q8 = [k for k in flash_variants() if dict(k.defines).get("FLASH_Q8") == "1"]
    assert {(dict(k.defines)["ELEM"], dict(k.defines).get("ROWS", "1"), dict(k.defines)["BKV"]) for k in q8} == {
        (e, rows, bkv) for e in ("half_t", "bf16_t") for rows, bkv in (("1", "64"), ("2", "64"), ("1", "128"))}


@pytest.mark.parametrize("shape", range(4))
def test_the_sm90_tactics_launch_a_quantized_attention_with_the_e4m3_kernel_and_the_scale_last(shape):
    """The same launch as the layer's Attention (grid, block, shared memory, TMA maps, arguments) with O the e4m3
    tensor, the FLASH_Q8 kernel and y_scale appended (the kernel's last parameter)."""
    from polykit.kernels.cuda.attention.flash_attention_sm90 import SHAPES as SM90_SHAPES, _enqueue
    from tests.kernels.cuda.test_flash_attention_sm90 import _Launches

    inputs, plain = bert_heads(seq=128)
    layer = attention_quantize(plain)
    tensors = {n: DeviceTensor(0x100000 * (k + 1), a.shape, a.dtype) for k, (n, a) in enumerate(inputs.items())}
    out16 = DeviceTensor(0x1000000, plain.out_shapes[0], np.dtype(np.float16))
    q8 = dict(tensors, Yq=DeviceTensor(0x2000000, plain.out_shapes[0], E4M3),
              YS=DeviceTensor(0x3000000, (), np.dtype(np.float32)), YZ=DeviceTensor(0x3000100, (), E4M3))
    launches = []
    for lay, ts in ((plain, dict(tensors, Y=out16)), (layer, q8)):
        rec = _Launches(132)
        _enqueue(SM90_SHAPES[shape])(lay, rec, ts)
        launches += rec.launches
    (k16, grid16, block16, args16, smem16), (k8, grid8, block8, args8, smem8) = launches
    assert (grid8, block8, smem8) == (grid16, block16, smem16)
    assert dict(k8.defines) == dict(k16.defines, FLASH_Q8="1") and k8.arch == "sm_90a"
    assert args8[-1] == q8["YS"] and args8[3] == q8["Yq"] and args16[3] == out16
    assert len(args8) == len(args16) + 1
    assert [a for i, a in enumerate(args8[:-1]) if i != 3] == [a for i, a in enumerate(args16) if i != 3]
    with pytest.raises(DeviceError, match="float8_e4m3fn with a float32 scale"):
        _enqueue(SM90_SHAPES[shape])(layer, _Launches(132), dict(q8, Yq=DeviceTensor(0x2000000, plain.out_shapes[0],
                                                                                     np.dtype(np.float16))))


@pytest.fixture(scope="module")
def flash_emulated(tmp_path_factory):
    from tests.kernels.cuda.block_emulation import host_launcher, kernel_signature

    return host_launcher(tmp_path_factory, *kernel_signature("flash_attention.cu", "flash_attention"))


def run_attention(launcher, layer, inputs, tactic):
    dtype = np.dtype(layer.out_dtypes[0])
    out = np.full(int(np.prod(layer.out_shapes[0])) * dtype.itemsize, 0xFF, np.uint8).view(dtype)  # poisoned
    out = out.reshape(layer.out_shapes[0])
    feeds = dict(inputs, YS=np.array(Y_SCALE, np.float32), YZ=np.zeros((), E4M3))
    tensors = {n: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for n, a in feeds.items()}
    tensors[layer.outputs[0]] = DeviceTensor(out.ctypes.data, out.shape, out.dtype)
    find_tactic("cuda", layer.kind, tactic).enqueue(layer, launcher, tensors)
    return out, feeds


@pytest.mark.parametrize("tactic,dtype,mask", [(FLASH[0], np.float16, True), (FLASH[0], ml_dtypes.bfloat16, False),
                                               (FLASH[1], np.float16, True), (FLASH[2], np.float16, False)])
def test_the_emulated_flash_kernel_writes_quantize_linear_of_the_unquantized_kernel_s_output(flash_emulated, tactic,
                                                                                            dtype, mask):
    inputs, plain = bert_heads(dtype, mask=mask)
    o, _ = run_attention(flash_emulated, plain, inputs, tactic)
    layer = attention_quantize(plain)
    yq, _ = run_attention(flash_emulated, layer, inputs, tactic)
    np.testing.assert_array_equal(yq.view(np.uint8), quantize(o).view(np.uint8))
    assert_attention_close(plain, inputs, o, dtype)


def assert_attention_close(plain, inputs, o, dtype):
    """The unquantized output o within test_flash_attention's tolerance of the reference (near 0 a float16 error
    spans many e4m3 steps: Yq is held to QuantizeLinear of o, and o to the reference)."""
    from tests.kernels.cuda.test_flash_attention import TOL, reference as attention_reference

    want = attention_reference(plain, inputs).astype(np.float64)
    assert np.linalg.norm(o.astype(np.float64) - want) <= TOL[np.dtype(dtype)] * np.linalg.norm(want)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", FLASH)
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("seq", [70, 128, 200])
def test_a_quantized_attention_on_the_gpu_writes_quantize_linear_of_the_attention_s_output(tactic, dtype, seq):
    from polykit.runtime.cuda.harness import run_layer

    inputs, plain = bert_heads(dtype, batch=3, seq=seq)
    o = run_layer(plain, inputs, tactic=tactic)["Y"]
    feeds = dict(inputs, YS=np.array(Y_SCALE, np.float32), YZ=np.zeros((), E4M3))
    yq = run_layer(attention_quantize(plain), feeds, tactic=tactic)["Yq"]
    np.testing.assert_array_equal(yq.view(np.uint8), quantize(o).view(np.uint8))
    assert_attention_close(plain, inputs, o, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("ys", EDGE_SCALES, ids=lambda s: f"{s:.3g}")
@pytest.mark.parametrize("dtype", [np.float16, np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("misalign", [None, {"Yq": 4}])
def test_a_quantized_layer_norm_on_the_gpu_quantizes_edge_values_as_quantize_linear(ys, dtype, misalign):
    """The division-free quotient and the hardware conversion (sm_89+) on the values where they could part from
    the division and the encode: ties, neighbours of ties, saturation, infinities, NaNs, zeros of both signs,
    subnormal quotients; scales inside the division-free range and outside it (the division)."""
    layer = quantized_layer((5, 13, 768), dtype)
    feeds = edge_feeds(layer, dtype, ys)
    got = run_on_gpu(layer, feeds, misalign)
    y = got["Y"].astype(np.float32)
    np.testing.assert_array_equal(y, np.broadcast_to(feeds["B"].astype(np.float32), y.shape))
    assert_quantized(got["Yq"], got["Y"], ys)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", SM90)
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("seq,head", [(70, 64), (128, 64), (129, 64), (200, 128), (77, 128)])
def test_a_quantized_attention_on_sm90_writes_quantize_linear_of_the_attention_s_output(tactic, dtype, seq, head):
    """The e4m3 output (poisoned before the run) equal byte for byte to QuantizeLinear of the same tactic's
    16-bit output, that within the flash tolerance of the reference; [B, H, S, D] inputs with a mask, the output
    written [B, S, H, D] as BERT's head merge reads it."""
    from polykit.runtime.cuda.harness import run_layer
    from tests.kernels.cuda.test_flash_attention import _arrays, layer_for
    from tests.kernels.cuda.test_flash_attention_sm90 import require_sm90

    require_sm90()
    inputs = _arrays((3, 2, seq, head), (3, 2, seq, head), dtype)
    inputs["mask"] = (rng.standard_normal((3, 1, 1, seq)) * 2).astype(dtype)
    plain = layer_for(inputs, (3, seq, 2, head), out_layout="bshd")
    layer = attention_quantize(plain)
    assert find_tactic("cuda", ATTENTION, tactic).supports(layer)
    o = run_layer(plain, inputs, tactic=tactic)["Y"]
    feeds = dict(inputs, YS=np.array(Y_SCALE, np.float32), YZ=np.zeros((), E4M3))
    yq = run_layer(layer, feeds, tactic=tactic)["Yq"]
    np.testing.assert_array_equal(yq.view(np.uint8), quantize(o).view(np.uint8))
    assert_attention_close(plain, inputs, o, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("ys", EDGE_SCALES[:2], ids=lambda s: f"{s:.3g}")
def test_a_float32_quantized_layer_norm_on_the_gpu_matches_quantize_linear_over_a_wide_range(ys):
    """A million float32 outputs whose scales span 2^-40 .. 2^40 a column: quotients from far below e4m3's
    smallest subnormal to far past saturation, each converted by the device's division-free path and compared
    with QuantizeLinear of the same float output. No bias (a bias of the usual size kept every output's quotient
    above 2^-12 in 17 of 20 draws) and a generator of its own (the module's depends on the tests xdist ran first)."""
    layer = quantized_layer((256, 4096), np.float32, bias=False)
    own = np.random.default_rng(381)
    feeds = {"X": (own.standard_normal((256, 4096)) * 2 + 0.5).astype(np.float32),
             "S": (own.standard_normal(4096) * 2.0 ** own.uniform(-40, 40, 4096)).astype(np.float32),
             "YZ": np.zeros((), E4M3)}
    feeds["YS"] = np.array(ys, np.float32)
    got = run_on_gpu(layer, feeds)
    y = got["Y"].astype(np.float32)
    assert np.abs(y / np.float32(ys)).max() > 1e6 and np.abs(y[y != 0] / np.float32(ys)).min() < 2.0 ** -12
    assert_quantized(got["Yq"], got["Y"], ys)
