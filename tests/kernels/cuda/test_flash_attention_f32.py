"""fp32 attention on tf32 tensor cores (cuda.attention.flash_f32: 3xTF32, fp32 accuracy;
cuda.attention.flash_tf32: one tf32 product for --tf32): which layers they take, what they
launch, and which an fp32 encoder build picks (CPU); results against the float64 reference
on random data with poisoned outputs, odd sizes, both layouts, masks, undefined rows and
broadcast batch / head dims, and a whole encoder against the cpu plan (GPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.tactics import find_tactic

F32, TF32 = "cuda.attention.flash_f32", "cuda.attention.flash_tf32"
LAYOUTS = ("q_layout", "k_layout", "v_layout", "out_layout")
#: 3xTF32 against the float64 reference: whole-tensor relative error and elementwise bounds.
#: numpy's emulation of the kernel's splits gives 1.4e-7 relative (BERT's shape); one tf32
#: product 4e-4, so these bounds fail a kernel that skips the small parts.
REL, RTOL, ATOL = 2e-6, 1e-5, 2e-6
rng = np.random.default_rng(11)


def rand(*shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def layer_for(inputs: dict, out_shape, layout: str = "bhsd", precision: str = "fp32", **attrs) -> LayerDesc:
    attrs = dict(attrs, **({a: layout for a in LAYOUTS} if layout != "bhsd" else {}))
    return LayerDesc("att", "Attention", tuple(inputs), ("Y",), attrs, domain="ai.polykit", precision=precision,
                     in_dtypes=tuple(np.dtype(a.dtype).name for a in inputs.values()), out_dtypes=("float32",),
                     in_shapes=tuple(tuple(a.shape) for a in inputs.values()), out_shapes=(tuple(out_shape),))


def qkv(q_shape, kv_shape) -> dict:
    return {"Q": rand(*q_shape), "K": rand(*kv_shape), "V": rand(*kv_shape)}


# ---- CPU: which layers, which kernels, what launch -------------------------------------------

@pytest.mark.parametrize("case,f32,tf32", [
    (dict(q=(2, 3, 8, 64), kv=(2, 3, 9, 64)), True, False),
    (dict(q=(2, 3, 8, 128), kv=(2, 3, 9, 128)), True, False),
    (dict(q=(2, 3, 8, 64), kv=(2, 3, 9, 64), precision="tf32"), False, True),
    (dict(q=(3, 8, 64), kv=(3, 9, 64)), True, False),
    (dict(q=(2, 3, 8, 32), kv=(2, 3, 9, 32)), False, False),      # head size 32: the simple tactic
    (dict(q=(2, 3, 8, 64), kv=(2, 3, 9, 64), dtype=np.float16), False, False),  # cuda.attention.flash's
])
def test_flash_f32_takes_fp32_heads_64_and_128_at_its_precision(case, f32, tf32):
    inputs = {n: a.astype(case.get("dtype", np.float32)) for n, a in qkv(case["q"], case["kv"]).items()}
    layer = layer_for(inputs, case["q"], precision=case.get("precision", "fp32"))
    if "dtype" in case:
        layer = replace(layer, out_dtypes=("float16",))
    assert find_tactic("cuda", "Attention", F32).supports(layer) is f32
    assert find_tactic("cuda", "Attention", TF32).supports(layer) is tf32


@pytest.mark.parametrize("mask,ok", [(rand(2, 1, 8, 9), True), (rng.random((8, 1)) > 0.5, True),
                                     (rand(2, 1, 8, 9).astype(np.float16), False), (rand(1, 2, 1, 8, 9), True),
                                     (rand(1, 1, 2, 1, 8, 9), False)],
                         ids=["fp32", "bool_key_broadcast", "fp16", "rank5", "rank6"])
def test_masks_of_the_layers_type_or_bool_up_to_rank_5_are_taken(mask, ok):
    inputs = {**qkv((2, 3, 8, 64), (2, 3, 9, 64)), "mask": mask}
    assert find_tactic("cuda", "Attention", F32).supports(layer_for(inputs, (2, 3, 8, 64))) is ok


class _Launches:
    """Records launch(kernel, grid, block, args, shared_mem) calls."""

    def __init__(self):
        self.calls = []

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.calls.append((kernel, tuple(grid), tuple(block), list(args), shared_mem))


@pytest.mark.parametrize("tactic,head,split3,bkv", [(F32, 64, "1", "64"), (F32, 128, "1", "32"), (TF32, 64, "0", "64")])
def test_launch_reads_bshd_strides_and_compiles_head_tile_and_products_in(tactic, head, split3, bkv):
    B, S, H = 2, 77, 3
    inputs = {**qkv((B, S, H, head), (B, 130, H, head)), "mask": rand(B, 1, 1, 130)}
    layer = layer_for(inputs, (B, S, H, head), layout="bshd", precision="fp32" if tactic == F32 else "tf32")
    tensors = {n: DeviceTensor(0x1000 * (i + 1), a.shape, a.dtype) for i, (n, a) in enumerate(inputs.items())}
    tensors["Y"] = DeviceTensor(0x9000, (B, S, H, head), np.dtype(np.float32))
    rec = _Launches()
    find_tactic("cuda", "Attention", tactic).enqueue(layer, rec, tensors)
    ((kernel, grid, block, args, smem),) = rec.calls
    assert dict(kernel.defines) == {"HD": str(head), "BKV": bkv, "SPLIT3": split3}
    assert grid == (2, H, B) and block == (128,) and smem == (64 + 4 * int(bkv)) * head * 4
    assert [int(a) for a in args[5:10]] == [S, 130, S * H * head, head, H * head]  # S, Skv, Q's (b, h, s) strides
    assert [int(a) for a in args[19:23]] == [130, 0, 0, 1]  # mask [B, 1, 1, Skv]


def encoder(B=2, S=50, H=4, D=64, seed=0):
    """One BERT-style self-attention block in fp32: Q/K/V projections with bias, heads split by
    Reshape + Transpose, K^T, scores / sqrt(D) + additive mask [B, 1, 1, S], Softmax, P V, heads
    merged, output projection."""
    r = np.random.default_rng(seed)
    E = H * D
    inits = {f"w{n}": (r.standard_normal((E, E)) / np.sqrt(E)).astype(np.float32) for n in "qkvo"}
    inits.update({f"b{n}": (r.standard_normal(E) * 0.1).astype(np.float32) for n in "qkv"})
    inits.update(split=np.array([B, S, H, D], np.int64), merge=np.array([B, S, E], np.int64),
                 sqrt_d=np.array(np.sqrt(D), np.float32))
    nodes = []
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"], name=f"{n}_proj"),
                  helper.make_node("Add", [f"{n}0", f"b{n}"], [f"{n}1"], name=f"{n}_bias"),
                  helper.make_node("Reshape", [f"{n}1", "split"], [f"{n}2"], name=f"{n}_split"),
                  helper.make_node("Transpose", [f"{n}2"], [f"{n}3"], perm=[0, 2, 1, 3], name=f"{n}_heads")]
    nodes += [helper.make_node("Transpose", ["k3"], ["kt"], perm=[0, 1, 3, 2], name="k_t"),
              helper.make_node("MatMul", ["q3", "kt"], ["s0"], name="scores"),
              helper.make_node("Div", ["s0", "sqrt_d"], ["s1"], name="scale"),
              helper.make_node("Add", ["s1", "mask"], ["s2"], name="masked"),
              helper.make_node("Softmax", ["s2"], ["p"], axis=-1, name="softmax"),
              helper.make_node("MatMul", ["p", "v3"], ["o0"], name="context"),
              helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3], name="o_heads"),
              helper.make_node("Reshape", ["o1", "merge"], ["o2"], name="o_merge"),
              helper.make_node("MatMul", ["o2", "wo"], ["y"], name="o_proj")]
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E]),
                                                helper.make_tensor_value_info("mask", TensorProto.FLOAT, [B, 1, 1, S])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, E])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def attention_layer(plan):
    (layer,) = [l for l in plan.layers if l.kind == "Attention"]
    return layer


@pytest.mark.parametrize("tf32,tactic", [(False, F32), (True, TF32)])
def test_an_fp32_encoder_built_for_cuda_by_priority_takes_the_flash_kernel_on_bshd_heads(tf32, tactic):
    plan = build_plan(encoder(), BuilderConfig(target="cuda", builder_optimization_level=0, tf32=tf32))
    layer = attention_layer(plan)
    assert layer.tactic == tactic and layer.precision == ("tf32" if tf32 else "fp32")
    # the head transposes folded away: q, k, v as views of the packed projection (pack_gemms) or bshd layouts
    assert all(layer.attrs.get(f"{t}_layout") == "bshd" or layer.attrs.get(f"{t}_view") is not None for t in "qkv")
    assert layer.attrs.get("out_layout") == "bshd"


# ---- GPU -------------------------------------------------------------------------------------

def check(layer, inputs, tactic=F32, rel=REL, rtol=RTOL, atol=ATOL) -> float:
    """Run `tactic` (outputs poisoned) against the float64 reference; fail naming the worst
    element, its value and the reference's. Returns the relative error."""
    from polykit.runtime.cuda.harness import reference_layer, relative_error, run_layer

    out = run_layer(layer, inputs, tactic=tactic, output_specs={"Y": (layer.out_shapes[0], np.float32)})["Y"]
    wide = {n: a.astype(np.float64) if a.dtype != np.bool_ else a for n, a in inputs.items()}
    ref = reference_layer(layer, wide)["Y"]
    assert out.shape == ref.shape
    nan_diff = np.argwhere(np.isnan(out) != np.isnan(ref))
    assert nan_diff.size == 0, f"NaN differs from the reference at {len(nan_diff)} elements, first {tuple(nan_diff[0])}: " \
                               f"got {out[tuple(nan_diff[0])]}, want {ref[tuple(nan_diff[0])]}"
    err = relative_error(out, ref)
    diff = np.where(np.isnan(ref), 0.0, np.abs(out.astype(np.float64) - ref))
    worst = np.unravel_index(np.argmax(diff - rtol * np.nan_to_num(np.abs(ref))), diff.shape)
    where = f"{tactic}: relative error {err:.3g}, worst at {tuple(int(i) for i in worst)}: got {out[worst]!r}, " \
            f"want {ref[worst]!r} (|diff| {diff[worst]:.3g}; max |diff| {diff.max():.3g})"
    assert err <= rel, where
    assert np.all(diff <= atol + rtol * np.nan_to_num(np.abs(ref))), where
    return err


SEQS = [(1, 1), (7, 77), (77, 7), (128, 128), (130, 513), (513, 130)]


@pytest.mark.gpu
@pytest.mark.parametrize("seqs", SEQS, ids=lambda s: f"S{s[0]}_Skv{s[1]}")
@pytest.mark.parametrize("head", [64, 128])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_flash_f32_matches_the_reference_at_fp32_accuracy(seqs, head, layout):
    (S, Skv), B, H = seqs, 2, 3
    shape = (lambda s: (B, s, H, head)) if layout == "bshd" else (lambda s: (B, H, s, head))
    inputs = qkv(shape(S), shape(Skv))
    check(layer_for(inputs, shape(S), layout=layout), inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("mask_shape,kind", [((2, 1, 1, 90), "add"), ((2, 3, 70, 90), "add"), ((90,), "add"),
                                             ((1, 1, 70, 1), "add"), ((2, 1, 70, 90), "bool"), ((2, 3, 1, 90), "bool")])
def test_flash_f32_with_additive_and_bool_masks_of_broadcast_shapes(mask_shape, kind):
    inputs = qkv((2, 3, 70, 64), (2, 3, 90, 64))
    inputs["mask"] = rand(*mask_shape) * 3 if kind == "add" else rng.random(mask_shape) > 0.4
    check(layer_for(inputs, (2, 3, 70, 64)), inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("head", [64, 128])
def test_fully_masked_and_infinite_rows_give_nan_or_zero_like_the_reference(zero, head):
    inputs = qkv((1, 2, 70, head), (1, 2, 80, head))
    mask = rng.random((1, 2, 70, 80)) > 0.3
    mask[0, 1, 4] = False    # every key masked
    mask[0, 0, 69] = False   # the last row of a partial query tile
    mask[0, 0, 10, 65:] = False  # masked only in the second key tile
    inputs["mask"] = mask
    inputs["Q"][0, 1, 30, 0] = np.inf  # a +-inf score: the reference's softmax is NaN there
    check(layer_for(inputs, (1, 2, 70, head), nan_probs_to_zero=zero), inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["kv_shared_by_heads", "q_shared_by_batch", "rank3"])
def test_broadcast_batch_and_head_dims(case):
    if case == "kv_shared_by_heads":
        inputs, out = {"Q": rand(2, 4, 33, 64), "K": rand(2, 1, 50, 64), "V": rand(2, 1, 50, 64)}, (2, 4, 33, 64)
    elif case == "q_shared_by_batch":
        inputs, out = {"Q": rand(1, 4, 33, 128), "K": rand(3, 4, 50, 128), "V": rand(3, 4, 50, 128)}, (3, 4, 33, 128)
    else:
        inputs, out = qkv((5, 40, 64), (5, 61, 64)), (5, 40, 64)
    check(layer_for(inputs, out), inputs)


@pytest.mark.gpu
def test_three_tf32_products_reach_fp32_accuracy_where_one_does_not():
    """The same BERT-shaped inputs: flash_f32 within REL; flash_tf32 (one tf32 product) > 50x
    further off, so a 3xTF32 kernel that lost its small parts could not pass the tests above."""
    inputs = {**qkv((8, 128, 12, 64), (8, 128, 12, 64)), "mask": np.where(rng.random((8, 1, 1, 128)) > 0.1, 0, -1e4)
              .astype(np.float32)}
    layer = layer_for(inputs, (8, 128, 12, 64), layout="bshd")
    exact = check(layer, inputs)
    rough = check(replace(layer, precision="tf32"), inputs, tactic=TF32, rel=3e-3, rtol=1e-1, atol=1e-2)
    assert rough > 50 * exact, f"1xTF32 error {rough:.3g} vs 3xTF32 {exact:.3g}"


@pytest.mark.gpu
def test_an_fp32_encoder_forced_to_flash_f32_matches_the_cpu_plan():
    from polykit.runtime.engine import Engine

    model = encoder(B=2, S=77, H=4, D=64)
    feeds = {"x": rng.standard_normal((2, 77, 256)).astype(np.float32),
             "mask": np.where(np.arange(77) < np.array([[77], [60]]), 0.0, -1e4).astype(np.float32)[:, None, None, :]}
    timed = attention_layer(build_plan(model, BuilderConfig(target="cuda")))
    assert timed.tactic in (F32, "cuda.attention.simple"), timed.tactic
    plan = build_plan(model, BuilderConfig(target="cuda", tactic_replay={timed.name: F32}))
    assert attention_layer(plan).tactic == F32
    cpu = build_plan(model, BuilderConfig(target="cpu"))
    outs = []
    for p in (plan, cpu):
        with Engine(p) as engine, engine.create_execution_context() as ctx:
            outs.append(ctx.execute(feeds)["y"])
    err = np.linalg.norm(outs[0] - outs[1]) / np.linalg.norm(outs[1])
    assert err < 1e-5, f"cuda plan (attention {F32}) vs cpu plan: relative error {err:.3g}"
