"""The cuda WeightOnlyMatMul tactics (weight_only.cu): they compile with NVRTC (no GPU needed), and on
a GPU they compute the cpu reference's values on random packed weights of every type, odd shapes
and outputs poisoned first.

The dequantized weight is the reference's bit for bit (one rounding to the scale's type); the float32
sums run in another order than numpy's BLAS, so outputs agree to float32 rounding of the output's scale (ELEM = float: an output that
cancels to near zero carries the rounding of its large terms) or
to one rounding step of the 16-bit output (float16, bfloat16).
"""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ops.quant.weight_only import KIND, WEIGHT_TYPES
from polykit.kernels.cuda.int8.weight_only import GEMV_TILES, ROW_TILES, compile_variants
from polykit.kernels.cuda.int8.weight_only_mma import MMA_TILES
from polykit.kernels.cuda.int8.weight_only_mma_rows import ROWS_TILES
from polykit.kernels.cuda.int8.weight_only_mma_staged import ROLLED_TILES, STAGED_TILES
from tests.kernels.weight_only_cases import BF16, random_layer
#: activation dtype -> (rtol, atol) against the reference
#: every cuda tactic of the kind: the per-row kernel's row tiles and the bandwidth-bound kernel's tiles
TACTICS = [f"cuda.weight_only.m{rows}" for rows in ROW_TILES] + [tile.name for tile in GEMV_TILES]
TOLERANCE = {np.dtype(np.float32): (2e-5, 2e-5), np.dtype(np.float16): (2e-3, 2e-3), BF16: (1.6e-2, 1e-2)}


def test_every_variant_compiles_with_nvrtc():
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    units = unique_units(compile_variants())
    assert len(units) == 3 * (len(ROW_TILES) + len(GEMV_TILES))
    assert check_all(units, "sm_90") == len(units)


@pytest.mark.parametrize("fp16", [False, True])
def test_a_cuda_build_runs_weight_only_layers_on_these_tactics(fp16):
    """No GPU needed: an untimed cuda build lowers an INT4 MLP to WeightOnlyMatMul layers that a
    cuda.weight_only tactic runs (float16 ones in an --fp16 build: W4A16)."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx
    from tests.compiler.weight_only_models import mlp

    plan = build_plan(load_onnx(mlp("int4")), BuilderConfig(target="cuda", input_shapes={"x": (1, 4, 64)}, fp16=fp16,
                                                            builder_optimization_level=0))
    layers = [layer for layer in plan.layers if layer.kind == KIND]
    assert len(layers) == 2 and all(layer.tactic.startswith("cuda.weight_only.") for layer in layers)
    assert {layer.in_dtypes[0] for layer in layers} == {"float16" if fp16 else "float32"}


def check(layer, inputs, tactic):
    from polykit.runtime.cuda.harness import assert_matches_reference, reference_layer, run_layer

    if tactic in STAGED_SCALE_AFTER and int(layer.attrs["block_size"]) % 128 == 0:
        # row tiles of at most 8 rows in blocks within N and K scale each slice's sums (weight_only_mma_staged.cu's
        # AFTER): the weights unrounded, as weight_only_mma_rows's; the other tiles the reference's weights
        assert_near_the_reference(run_layer(layer, inputs, tactic=tactic)["Y"], layer, inputs)
        return
    rtol, atol = TOLERANCE[inputs["X"].dtype]
    if inputs["X"].dtype == np.float32:  # a float32 sum's rounding scales with the sum's terms, not its result
        atol += 2e-6 * float(np.abs(reference_layer(layer, inputs)["Y"]).max(initial=0.0))
    assert_matches_reference(layer, inputs, tactic=tactic, rtol=rtol, atol=atol)


def rows_expected(layer, inputs):
    """(exact, slack) for weight_only_mma_rows, which never rounds a weight to 16 bits: `exact` is Y of the unrounded
    weights (DequantizeLinear's (value - zero point) * scale in float64, X @ w.T in float64, + B, rounded to X's
    dtype); `slack` a float64 array of Y's shape: how far the cpu reference's sum (its weights rounded to the scale's
    type first) lies from the unrounded sum, element by element (both before the output rounding)."""
    from polykit.compiler.ops.quant.weight_only import unpack_values

    x, scale, zero, bias = inputs["X"], inputs["S"], inputs.get("Z"), inputs.get("B")
    k, block = int(layer.attrs["K"]), int(layer.attrs["block_size"])
    values = unpack_values(inputs["W"], k, str(layer.attrs["weight_type"])).astype(np.float64)
    index = np.arange(k) // block
    if zero is not None:
        values -= zero.astype(np.float64)[:, index]
    w = values * scale.astype(np.float64)[:, index]
    x64 = x.astype(np.float64).reshape(-1, k)
    exact = x64 @ w.T
    slack = np.abs(x64 @ w.astype(scale.dtype).astype(np.float64).T - exact)
    if bias is not None:
        exact = exact + bias.astype(np.float64)
    shape = (*x.shape[:-1], w.shape[0])
    return exact.reshape(shape).astype(x.dtype), slack.reshape(shape)


def assert_rows_match(got, layer, inputs):
    """A weight_only_mma_rows result: within TOLERANCE of the unrounded weights' Y (the kernel's own numerics),
    and within TOLERANCE of the cpu reference plus, element by element, the reference's own departure from the
    unrounded sum (its weights rounded to 16 bits: at bfloat16 and a sum that cancels, more than TOLERANCE)."""
    rtol, atol = TOLERANCE[inputs["X"].dtype]
    exact, _ = rows_expected(layer, inputs)
    np.testing.assert_allclose(got.astype(np.float64), exact.astype(np.float64), rtol=rtol, atol=atol)
    assert_near_the_reference(got, layer, inputs)


def assert_near_the_reference(got, layer, inputs):
    """Within TOLERANCE of the cpu reference plus, element by element, the reference's own departure from the
    unrounded sum (rows_expected's slack): what a kernel whose weights are the reference's and one that never rounds
    them both meet (weight_only_mma_staged's row tiles mix the two)."""
    from polykit.runtime.cuda.harness import reference_layer

    rtol, atol = TOLERANCE[inputs["X"].dtype]
    _, slack = rows_expected(layer, inputs)
    got = got.astype(np.float64)
    want = reference_layer(layer, inputs)["Y"].astype(np.float64)
    bad = np.abs(got - want) > atol + slack + rtol * np.abs(want)
    assert not bad.any(), (f"{int(bad.sum())} elements differ from the reference by more than TOLERANCE and its "
                           f"weights' rounding, first at {np.argwhere(bad)[:4].tolist()}: {got[bad][:4]} != "
                           f"{want[bad][:4]} (slack {slack[bad][:4]})")


# (X shape, N, block): M of 1..17 and 33 and rows folded from batch dims, N not a multiple of the 8 columns a
# block owns, K not a multiple of a 16-byte chunk, blocks that straddle chunks (7, 24), per channel (None)
CASES = [((1, 1), 1, None), ((1, 72), 37, 16), ((3, 100), 130, 7), ((2, 8, 64), 9, 32), ((16, 256), 64, 128),
         ((17, 96), 33, 24), ((5, 4096), 40, 128), ((33, 520), 21, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("weight_type", list(WEIGHT_TYPES))
@pytest.mark.parametrize("x_shape,n,block", CASES)
@pytest.mark.parametrize("tactic", TACTICS)
def test_float32_activations_equal_the_reference(x_shape, n, block, weight_type, tactic):
    layer, inputs = random_layer(x_shape, n, weight_type, block)
    check(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("weight_type", ["int4", "uint4", "float4_e2m1fn", "int8"])
@pytest.mark.parametrize("tactic", TACTICS)
def test_half_activations_and_scales_equal_the_reference(dtype, weight_type, tactic):
    layer, inputs = random_layer((4, 3, 200), 70, weight_type, 32, dtype=dtype, seed=TACTICS.index(tactic))
    check(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("tactic", [tile.name for tile in GEMV_TILES])
def test_aligned_half_rows_take_the_vector_staging_path(dtype, tactic):
    """K a multiple of 8: X's rows are 16-byte aligned, so weight_only_gemv stages them with 16-byte loads."""
    layer, inputs = random_layer((9, 1032), 45, "int4", 128, dtype=dtype, seed=3)
    check(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("zero_point,bias", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("tactic", ["cuda.weight_only.m4", GEMV_TILES[0].name, GEMV_TILES[-1].name])
def test_without_zero_points_or_bias(zero_point, bias, tactic):
    layer, inputs = random_layer((6, 136), 50, "int4", 16, zero_point=zero_point, bias=bias)
    check(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", ["cuda.weight_only.m1", GEMV_TILES[0].name])
def test_more_rows_than_the_grid_holds_step_over_m(tactic):
    layer, inputs = random_layer((70000, 32), 3, "uint4", 32, seed=5)
    check(layer, inputs, tactic)


@pytest.mark.gpu
def test_a_gpt2_sized_int4_mlp_plan_matches_its_float_dequantized_build():
    """The issue's acceptance: a plan with INT4 weight-only MatMuls (GPT-2's 768 -> 3072 -> 768 MLP)
    on the cuda target against the float-dequantized build of the same model on the cpu target."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.runtime.engine import Runtime
    from tests.compiler.weight_only_models import mlp

    model = load_onnx(mlp("int4", d=768, hidden=3072, block=128))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 7, 768)).astype(np.float32)}
    gpu = build_plan(model, BuilderConfig(target="cuda", input_shapes={"x": (1, 7, 768)}))
    assert [layer.kind for layer in gpu.layers].count(KIND) == 2
    cpu = build_plan(model, BuilderConfig(target="cpu", input_shapes={"x": (1, 7, 768)}, fp32_layers=("fc0", "fc1")))
    outputs = []
    for plan in (gpu, cpu):
        with Runtime(plan.target).deserialize_engine(plan) as engine:
            outputs.append(np.asarray(engine.create_execution_context().execute(feeds)["y"]))
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-4)


def emulate_gemv(tile, x, w, bias, bits):
    """weight_only_gemv's float32 arithmetic in numpy (no GPU): lane q of warp split s sums with fma
    the elements of chunks (t * KSPLIT + s) * 8 + q, step by step and in element order, for every
    row and column; the 8 lanes of a slot combine by shuffle-xor 4, 2, 1; warp split 0 adds the
    KSPLIT partials in order s = 0, 1, ..; then the bias (one float32 add). Returns (Y as float32,
    how many times each k was summed)."""
    m, k = x.shape
    per = 128 // bits
    step = tile.ksplit * 8 * per
    steps = -(-k // step)
    xp = np.zeros((m, steps * step), np.float64)
    wp = np.zeros((w.shape[0], steps * step), np.float64)
    xp[:, :k], wp[:, :k] = x, w
    acc = np.zeros((tile.ksplit, 8, m, w.shape[0]), np.float32)
    visits = np.zeros(steps * step, np.int64)
    for t in range(steps):
        for s in range(tile.ksplit):
            for q in range(8):
                for kk in range(((t * tile.ksplit + s) * 8 + q) * per, ((t * tile.ksplit + s) * 8 + q + 1) * per):
                    # fmaf: the product of two float32 values is exact in float64, one rounding of the sum
                    acc[s, q] = (xp[:, kk, None] * wp[None, :, kk] + acc[s, q]).astype(np.float32)
                    visits[kk] += 1
    for off in (4, 2, 1):  # every lane takes its own value plus lane q ^ off's, all lanes at once
        acc = acc + acc[:, np.arange(8) ^ off]
    y = acc[0, 0]
    for s in range(1, tile.ksplit):
        y = y + acc[s, 0]
    if bias is not None:
        y = y + bias.astype(np.float32)
    return y, visits


@pytest.mark.parametrize("tile", GEMV_TILES, ids=[tile.name for tile in GEMV_TILES])
@pytest.mark.parametrize("weight_type,k,block", [("int4", 300, 24), ("uint8", 137, 16), ("float4_e2m1fn", 64, 32)])
def test_the_gemv_split_k_and_fixed_order_reduction_sum_every_element_once(tile, weight_type, k, block):
    """No GPU: the numpy model of weight_only_gemv's lanes, warp splits and fixed-order combine
    visits each k of a row once (none past K counted: X is staged as zero there) and equals the
    reference to float32 rounding."""
    from polykit.compiler.ops.quant.weight_only_reference import dequantize_rows
    from polykit.compiler.ops.references import run_reference
    from polykit.compiler.plan.records import layer_as_node

    layer, inputs = random_layer((3, k), 11, weight_type, block, seed=k)
    w = dequantize_rows(inputs["W"], inputs["S"], inputs.get("Z"), k, block, weight_type).astype(np.float64)
    got, visits = emulate_gemv(tile, inputs["X"].astype(np.float64), w, inputs["B"], WEIGHT_TYPES[weight_type])
    assert (visits == 1).all() and visits.size >= k
    want = run_reference(layer_as_node(layer), [inputs.get(name) if name else None for name in layer.inputs])[0]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6 * scale)


@pytest.mark.parametrize("m,rows", [(1, 1), (16, 16)])
def test_the_gemv_estimate_ranks_a_tile_of_the_layers_rows_first(m, rows):
    """No GPU: on an H100's 132 SMs the cost model puts a 1-row tile first for decode (M = 1) and a
    16-row tile first at M = 16 (N = K = 4096, int4 blocked 128, float16 X), and every bw tactic
    predicts a time for a stamped layer."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.kernels.cuda.base import all_cuda_tactics
    from tests.compiler.weight_only_models import weight_only

    model = load_onnx(weight_only("int4", k=4096, n=4096, block=128, x_shape=(m, None), elem="float16"))
    plan = build_plan(model, BuilderConfig(target="cuda", input_shapes={"x": (m, 4096)}, builder_optimization_level=0))
    (layer,) = [layer for layer in plan.layers if layer.kind == KIND]
    tactics = {t.name: t for t in all_cuda_tactics() if t.kind == KIND}
    costs = {tile.name: tactics[tile.name].estimate(layer, 132) for tile in GEMV_TILES}
    assert all(cost is not None and cost > 0 for cost in costs.values())
    best = min(costs, key=costs.get)
    assert next(tile for tile in GEMV_TILES if tile.name == best).rows == rows


# ---- weight_only_mma and weight_only_mma_staged (tactics cuda.weight_only.mma_*: tensor cores, float16 /
# bfloat16 X, int4 / uint4) ----
STAGED_NAMES = [tile.name for tile in STAGED_TILES + ROLLED_TILES]
#: the staged tiles of one group (PG 1), whose row tiles of at most 8 rows scale each slice's sums where the block is
#: a multiple of 128 (weight_only_mma_staged.cu's AFTER: unrounded weights)
STAGED_SCALE_AFTER = [tile.name for tile in STAGED_TILES + ROLLED_TILES if tile.groups == 1]
MMA_TACTICS = [tile.name for tile in MMA_TILES] + STAGED_NAMES
#: weight_only_mma_rows (blocks of a multiple of 128 only; checked by assert_rows_match: it never rounds a weight)
ROWS_NAMES = [tile.name for tile in ROWS_TILES]
# (X shape, N, block): M = 1, 5 (one 8-row half of the mma tile), 16, 17 and 33 (row tiles stepping over M),
# rows folded from batch dims; N odd (n8 tiles past N); K a multiple of 16 but not of 32 or 128 (chunks and
# slices past K), K = 4096 (several load groups a warp; the staged tiles' splits of 2048 / 1024), K = 4112
# (every staged tile split, the last split 16 elements); blocks of 32, 64, 128
MMA_CASES = [((1, 272), 37, 32), ((5, 208), 21, 128), ((16, 144), 19, 32), ((17, 400), 13, 128),
             ((2, 8, 64), 9, 64), ((33, 4096), 40, 128), ((1, 4096), 300, 128), ((16, 4096), 264, 128),
             ((3, 4112), 70, 32)]


@pytest.mark.parametrize("family,tiles", [("weight_only_mma", MMA_TILES),
                                          ("weight_only_mma_staged", STAGED_TILES + ROLLED_TILES),
                                          ("weight_only_mma_rows", ROWS_TILES)])
def test_every_mma_variant_compiles_with_nvrtc(family, tiles):
    """One unit a tile and activation type (the staged kernel's reduce in the same unit; the rows kernel's reduce is
    the staged c16_k4096's unit), sm_80 and sm_90."""
    import importlib

    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    units = unique_units(importlib.import_module(f"polykit.kernels.cuda.int8.{family}").compile_variants())
    assert len(units) == 2 * len(tiles)
    for arch in ("sm_80", "sm_90"):
        assert check_all(units, arch) == len(units)


def stamped(weight_type="int4", x="float16", k=4096, block=128, m=1, n=4096):
    """A WeightOnlyMatMul layer as a build stamps it (types and shapes known)."""
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN
    from polykit.compiler.ops.quant.weight_only import padded_row_bytes
    from polykit.compiler.plan.records import LayerDesc

    nb = -(-k // block)
    zero = "int8" if weight_type.startswith("int") else "uint8"
    return LayerDesc("wo", KIND, ("X", "W", "S", "Z", "B"), ("Y",), {"weight_type": weight_type, "block_size": block,
                                                                       "K": k}, domain=POLYKIT_DOMAIN,
                     in_dtypes=(x, "uint8", x, zero, x), out_dtypes=(x,),
                     in_shapes=((m, k), (n, padded_row_bytes(k, WEIGHT_TYPES[weight_type])), (n, nb), (n, nb), (n,)),
                     out_shapes=((m, n),))


@pytest.mark.parametrize("change", [{}, {"x": "bfloat16"}, {"weight_type": "uint4"}, {"k": 272, "block": 32}])
def test_the_mma_tactics_take_16_bit_x_int4_weights_k_of_16_and_blocks_of_32(change):
    from polykit.kernels.cuda.int8.weight_only_mma import supports

    assert supports(stamped(**change))


@pytest.mark.parametrize("change", [{"x": "float32"}, {"weight_type": "int8"}, {"weight_type": "float4_e2m1fn"},
                                    {"k": 4104}, {"block": 16}, {"block": 48}])
def test_the_mma_tactics_refuse_what_the_cuda_core_kernels_run(change):
    from polykit.kernels.cuda.int8.weight_only_mma import supports

    assert not supports(stamped(**change))


def test_an_mma_tactic_refuses_float32_x_of_a_layer_built_by_hand_at_enqueue():
    """No GPU: a hand-built layer (no stamped types) passes supports(); its float32 X is a DeviceError
    that names the layer and the tactic, before anything launches."""
    from polykit.errors import DeviceError
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import find_tactic

    layer, inputs = random_layer((2, 64), 8, "int4", 32)
    tactic = find_tactic("cuda", KIND, MMA_TACTICS[0])
    assert tactic.supports(layer)
    tensors = {name: DeviceTensor(1 << 20, a.shape, a.dtype) for name, a in inputs.items()}
    tensors["Y"] = DeviceTensor(1 << 20, (2, 8), np.dtype(np.float32))
    with pytest.raises(DeviceError, match="float16 / bfloat16 X") as info:
        tactic.enqueue(layer, None, tensors)
    assert "'wo'" in str(info.value)


def test_a_staged_tactic_refuses_scales_past_32_bit_indices_at_enqueue():
    """No GPU: N x blocks a row >= 2^31 (the staged kernel's 32-bit scale index) is a DeviceError that names
    the layer and the tactic, before anything launches; one row fewer passes to the launch."""
    from polykit.errors import DeviceError
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import find_tactic

    layer, inputs = random_layer((1, 4096), 8, "int4", 32, dtype=np.float16)
    tactic = find_tactic("cuda", KIND, STAGED_NAMES[0])

    class Refuser:
        sm_count = 132

        def launch(self, *args, **kwargs):
            raise AssertionError("launched")

    for n, refused in ((2**31 // 128, True), (2**31 // 128 - 1, False)):
        shapes = {"W": (n, inputs["W"].shape[1]), "S": (n, 128), "Z": (n, 128), "B": (n,), "Y": (1, n)}
        tensors = {name: DeviceTensor(1 << 20, shapes.get(name, a.shape), a.dtype) for name, a in inputs.items()}
        tensors["Y"] = DeviceTensor(1 << 20, shapes["Y"], inputs["X"].dtype)
        expected = (DeviceError, "2\\^31") if refused else (AssertionError, "launched")
        with pytest.raises(expected[0], match=expected[1]) as info:
            tactic.enqueue(layer, Refuser(), tensors)
        assert not refused or ("'wo'" in str(info.value) and STAGED_NAMES[0] in str(info.value))
        # a build that knows N refuses the staged tiles there (weight_only_mma, 64-bit indices, still takes it)
        big = stamped(n=n, k=4096, block=32)
        assert tactic.supports(big) is not refused
        assert find_tactic("cuda", KIND, MMA_TILES[0].name).supports(big)


@pytest.mark.parametrize("m", [1, 4, 8, 16])
@pytest.mark.parametrize("x", ["float16", "bfloat16"])
def test_the_mma_estimate_is_below_every_gemv_tile_at_small_m(m, x):
    """No GPU: the cost models (weight_only_mma.cu's and weight_only_mma_staged.cu's headers) predict a
    tensor-core kernel under every bw tile at N = K = 4096, int4 blocked 128, on 132 SMs (among tactics
    of one priority, the estimate orders the timing)."""
    from polykit.kernels.cuda.base import all_cuda_tactics

    layer = stamped(x=x, m=m)
    tactics = {t.name: t for t in all_cuda_tactics() if t.kind == KIND}
    mma = [tactics[name].estimate(layer, 132) for name in MMA_TACTICS + ROWS_NAMES]
    gemv = [tactics[tile.name].estimate(layer, 132) for tile in GEMV_TILES]
    assert all(cost is not None and cost > 0 for cost in mma + gemv)
    assert min(mma) < min(gemv)


@pytest.mark.parametrize("m,best", [(1, ("c16_k4096", "c32_k4096", "c16_k4096_p2", "c32_k4096_p2")),
                                    (16, ("c32_k4096", "c32_k4096_p2"))])
def test_the_staged_estimate_ranks_an_unsplit_tile_first_and_32_columns_at_16_rows(m, best):
    """No GPU: at N = K = 4096 (int4 blocked 128, float16 X, 132 SMs) the staged model puts a tile whose
    block sums all of K first at M = 1 (X is small: a split would only add the reduce), a 32-column
    one at M = 16 (X, re-read once a block, costs half of the 16-column one's, and no reduce), and every
    staged tile under the measured weight_only_mma's estimate."""
    from polykit.kernels.cuda.base import all_cuda_tactics

    layer = stamped(m=m)
    tactics = {t.name: t for t in all_cuda_tactics() if t.kind == KIND}
    staged = {tile.name: tactics[tile.name].estimate(layer, 132) for tile in STAGED_TILES}
    assert min(staged, key=staged.get) in {f"cuda.weight_only.mma_staged_{name}" for name in best}
    assert max(staged.values()) < min(tactics[tile.name].estimate(layer, 132) for tile in MMA_TILES)


def test_a_split_staged_tactic_borrows_the_splits_float_sums_and_an_unsplit_one_nothing():
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import find_tactic

    layer = stamped(m=16)
    tensors = {name: DeviceTensor(0, shape, np.dtype(dtype))
               for name, shape, dtype in zip(layer.inputs, layer.in_shapes, layer.in_dtypes)}
    need = {tile.name: find_tactic("cuda", KIND, tile.name).workspace(layer, tensors, 132) for tile in STAGED_TILES}
    assert need == {tile.name: 0 if tile.k_block >= 4096 else 4 * (4096 // tile.k_block) * 16 * 4096
                    for tile in STAGED_TILES}


@pytest.mark.parametrize("m", [1, 16])
def test_a_level_0_build_takes_the_staged_kernel_then_the_mma_kernel_where_they_run_and_the_gemv_where_not(m):
    """The staged and mma tactics ran on a GPU (H100 2026-12-06) and timed builds picked a staged tile at
    M = 1 and 16, so the staged tiles rank first and the mma tiles next; a float32 X (which they all
    refuse) still gets the plain kernels."""
    from polykit.kernels.tactics import candidates

    staged = [tile.name for tile in STAGED_TILES if tile.groups == 1]
    rings = [tile.name for tile in STAGED_TILES if tile.groups > 1]  # slower where timed: beside the mma tiles
    rings += [tile.name for tile in ROLLED_TILES]  # untimed (twenty-fourth session): there too
    measured = [tile.name for tile in MMA_TILES]
    for layer, rows in ((stamped(m=m), ROWS_NAMES), (stamped(m=m, x="bfloat16", k=272, block=32), [])):
        # the rows tiles (untimed, blocks of a multiple of 128 only) beside the mma and ring tiles where they run
        found = candidates("cuda", KIND, layer, arch="sm_90")
        assert {t.name for t in found[:len(staged)]} == set(staged)
        assert {t.name for t in found[len(staged):len(staged) + len(measured) + len(rings) + len(rows)]} == \
            set(measured + rings + rows)
        assert {t.name: t.priority for t in found if t.name in STAGED_NAMES} == {
            **dict.fromkeys(staged, 12), **dict.fromkeys(rings, 11)}
        assert {t.name: t.priority for t in found if t.name in ROWS_NAMES} == dict.fromkeys(rows, 11)
    fp32 = candidates("cuda", KIND, stamped(m=m, x="float32"), arch="sm_90")
    assert fp32 and not any(t.name in MMA_TACTICS or t.name in STAGED_NAMES or t.name in ROWS_NAMES for t in fp32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("weight_type", ["int4", "uint4"])
@pytest.mark.parametrize("x_shape,n,block", MMA_CASES)
@pytest.mark.parametrize("tactic", MMA_TACTICS)
def test_mma_tactics_equal_the_reference(x_shape, n, block, weight_type, dtype, tactic):
    layer, inputs = random_layer(x_shape, n, weight_type, block, dtype=dtype, seed=n)
    check(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("x_shape,n,block", [((3, 1056), 7, 96), ((17, 4400), 37, 160)])
@pytest.mark.parametrize("tactic", STAGED_NAMES)
def test_staged_tactics_step_scale_blocks_that_do_not_divide_a_warps_step(x_shape, n, block, dtype, tactic):
    """Blocks of 96 / 160 elements: a warp's step from slice to slice (128 x WK) is not a whole number of
    blocks, so a lane's scale block advances with a carry (weight_only_mma_staged.cu's XsStream)."""
    layer, inputs = random_layer(x_shape, n, "int4", block, dtype=dtype, seed=block)
    check(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("zero_point,bias", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("tactic", MMA_TACTICS)
def test_mma_tactics_without_zero_points_or_bias(zero_point, bias, tactic):
    layer, inputs = random_layer((6, 144), 50, "int4", 32, dtype=np.float16, zero_point=zero_point, bias=bias)
    check(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("tactic", MMA_TACTICS)
def test_mma_tactics_take_zero_points_of_the_whole_8_bit_range(dtype, tactic):
    """Zero points far outside the 4-bit codes' range: bfloat16 subtracts them in a second exact step."""
    layer, inputs = random_layer((3, 256), 24, "uint4", 64, dtype=dtype, seed=7)
    inputs["Z"] = np.random.default_rng(7).integers(0, 256, inputs["Z"].shape).astype(np.uint8)
    check(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", MMA_TACTICS)
def test_mma_tactics_read_a_misaligned_x_element_by_element(tactic):
    """X 2 bytes past a 16-byte boundary: the kernel's element loads in place of its 16-byte ones."""
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    layer, inputs = random_layer((5, 144), 19, "int4", 32, dtype=np.float16, seed=2)
    got = run_layer(layer, inputs, tactic=tactic, misalign={"X": 2})["Y"]
    rtol, atol = TOLERANCE[np.dtype(np.float16)]
    np.testing.assert_allclose(got.astype(np.float32), reference_layer(layer, inputs)["Y"].astype(np.float32),
                               rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", MMA_TACTICS)
def test_the_mma_kernels_are_deterministic(tactic):
    """The K split's partials add in warp order (and the staged kernel's splits in split order): two runs
    give the same bits."""
    from polykit.runtime.cuda.harness import run_layer

    layer, inputs = random_layer((16, 4096), 64, "int4", 128, dtype=np.float16, seed=11)
    first, second = (run_layer(layer, inputs, tactic=tactic)["Y"] for _ in range(2))
    assert np.array_equal(first.view(np.uint16), second.view(np.uint16))


# weight_only_mma_rows on the GPU: MMA_CASES's blocks of 128 (and K = 4112 at 128, every rows tile split, the
# last split 16 elements), its zero-point, bias, alignment and determinism cases at block 128
ROWS_CASES = [case for case in MMA_CASES if case[2] % 128 == 0] + [((3, 4112), 70, 128), ((2, 544), 12, 256)]


def check_rows(layer, inputs, tactic, misalign=None):
    from polykit.runtime.cuda.harness import run_layer

    assert_rows_match(run_layer(layer, inputs, tactic=tactic, misalign=misalign)["Y"], layer, inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("weight_type", ["int4", "uint4"])
@pytest.mark.parametrize("x_shape,n,block", ROWS_CASES)
@pytest.mark.parametrize("tactic", ROWS_NAMES)
def test_rows_tactics_equal_the_reference(x_shape, n, block, weight_type, dtype, tactic):
    layer, inputs = random_layer(x_shape, n, weight_type, block, dtype=dtype, seed=n)
    check_rows(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("zero_point,bias", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("tactic", ROWS_NAMES)
def test_rows_tactics_without_zero_points_or_bias(zero_point, bias, tactic):
    layer, inputs = random_layer((6, 1152), 50, "int4", 128, dtype=np.float16, zero_point=zero_point, bias=bias)
    check_rows(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("tactic", ROWS_NAMES)
def test_rows_tactics_take_zero_points_of_the_whole_8_bit_range(dtype, tactic):
    """value - zero point down to -255: exact in bfloat16's 8 bits (weight_only_mma.cuh's WqDequant::diff)."""
    layer, inputs = random_layer((3, 256), 24, "uint4", 128, dtype=dtype, seed=7)
    inputs["Z"] = np.random.default_rng(7).integers(0, 256, inputs["Z"].shape).astype(np.uint8)
    check_rows(layer, inputs, tactic)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", ROWS_NAMES)
def test_rows_tactics_read_a_misaligned_x_element_by_element(tactic):
    layer, inputs = random_layer((5, 1040), 19, "int4", 128, dtype=np.float16, seed=2)
    check_rows(layer, inputs, tactic, misalign={"X": 2})


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", ROWS_NAMES)
def test_the_rows_kernels_are_deterministic(tactic):
    from polykit.runtime.cuda.harness import run_layer

    layer, inputs = random_layer((16, 4096), 64, "int4", 128, dtype=np.float16, seed=11)
    first, second = (run_layer(layer, inputs, tactic=tactic)["Y"] for _ in range(2))
    assert np.array_equal(first.view(np.uint16), second.view(np.uint16))


def test_the_rolled_tiles_run_where_their_shared_memory_fits_a_block():
    """The rolled tiles' weight slots beside 16 staged rows of K = 4096 fit an sm_90 block (227 KB) and not an
    sm_80 one (163 KB): they are sm_90 tactics only, and their launch asks for what the kernel lays out."""
    from polykit.kernels.cuda.int8.weight_only_mma_staged import ROLLED_TILES
    from polykit.kernels.tactics import candidates

    for tile in ROLLED_TILES:
        smem = tile.smem_bytes(16, 4096) + tile.part_bytes()
        assert smem <= 227 * 1024 and tile.threads * tile.slices * tile.tiles * 16 == \
            tile.smem_bytes(1, 4096) - (4096 + 8) * 2
    layer = stamped(m=16)
    on = {t.name for t in candidates("cuda", KIND, layer, arch="sm_90")}
    off = {t.name for t in candidates("cuda", KIND, layer, arch="sm_80")}
    rolled = {tile.name for tile in ROLLED_TILES}
    assert rolled <= on and not rolled & off and {t.name for t in STAGED_TILES} <= off
