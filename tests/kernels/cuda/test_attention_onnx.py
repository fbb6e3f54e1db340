"""ONNX Attention on cuda: the generic kernel on every variant and the fused path on the ones it
takes, against the reference (outputs poisoned); which tactic may run which layer (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.errors import PolykitError
from polykit.kernels.cuda.attention import attention_onnx

rng = np.random.default_rng(29)
NAMES = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
OUTS = ("Y", "present_key", "present_value", "qk")


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def layer(feeds, attrs, n_out=1, stamped=False):
    names = tuple(n if n in feeds else "" for n in NAMES)
    while not names[-1]:
        names = names[:-1]
    extra = {}
    if stamped:
        extra = {"in_dtypes": tuple(feeds[n].dtype.name if n else "" for n in names),
                 "in_shapes": tuple(tuple(feeds[n].shape) if n else () for n in names)}
    return LayerDesc("att", "Attention", names, OUTS[:n_out], dict(attrs), **extra)


VARIANTS = {
    "gqa_causal_past_qk_bias": (dict(Q=rand(2, 6, 3, 8), K=rand(2, 2, 3, 8), V=rand(2, 2, 3, 5),
                                     attn_mask=rand(2, 1, 3, 7), past_key=rand(2, 2, 4, 8),
                                     past_value=rand(2, 2, 4, 5)), dict(is_causal=1, qk_matmul_output_mode=2), 4),
    "3d_softcap_bool_mask_probs": (dict(Q=rand(2, 5, 32), K=rand(2, 7, 16), V=rand(2, 7, 12),
                                        attn_mask=rng.random((5, 7)) > 0.3),
                                   dict(q_num_heads=4, kv_num_heads=2, softcap=1.5, qk_matmul_output_mode=3), 4),
    "short_mask_nonpad_causal": (dict(Q=rand(3, 2, 2, 8), K=rand(3, 2, 6, 8), V=rand(3, 2, 6, 8),
                                      attn_mask=rand(3, 1, 2, 4), nonpad_kv_seqlen=np.array([6, 3, 1], np.int64)),
                                 dict(is_causal=1), 1),
    "window_with_past": (dict(Q=rand(1, 2, 4, 8), K=rand(1, 2, 4, 8), V=rand(1, 2, 4, 8),
                              past_key=rand(1, 2, 3, 8), past_value=rand(1, 2, 3, 8)),
                         dict(left_window_size=2, right_window_size=1), 3),
    "fully_masked_row": (dict(Q=rand(1, 1, 3, 4), K=rand(1, 1, 3, 4), V=rand(1, 1, 3, 4),
                              attn_mask=np.array([[True, False, True], [False] * 3, [True] * 3])),
                         dict(qk_matmul_output_mode=3), 4),
    "float64_long_keys": (dict(Q=rand(1, 2, 3, 16, dtype=np.float64), K=rand(1, 2, 300, 16, dtype=np.float64),
                               V=rand(1, 2, 300, 7, dtype=np.float64)), dict(scale=0.3), 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_generic_kernel_matches_reference(case):
    from polykit.runtime.cuda.harness import assert_matches_reference

    feeds, attrs, n_out = VARIANTS[case]
    tol = 1e-12 if feeds["Q"].dtype == np.float64 else 1e-4
    assert_matches_reference(layer(feeds, attrs, n_out), feeds, tactic="cuda.attention_onnx.generic", rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_generic_kernel_16bit_types_round_each_stage_like_the_reference(dtype):
    from polykit.compiler.ir.dtypes import to_numpy
    from polykit.runtime.cuda.harness import assert_matches_reference

    dt = np.dtype(np.float16) if dtype is np.float16 else np.dtype(to_numpy(16))
    feeds = {"Q": rand(2, 4, 5, 8).astype(dt), "K": rand(2, 2, 6, 8).astype(dt), "V": rand(2, 2, 6, 8).astype(dt)}
    assert_matches_reference(layer(feeds, {"is_causal": 1}), feeds, tactic="cuda.attention_onnx.generic",
                             rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("attrs,with_mask,with_past", [({}, True, False), ({"is_causal": 1}, False, True),
                                                       ({"scale": 0.2}, False, False)])
def test_fused_path_matches_reference(attrs, with_mask, with_past):
    from polykit.runtime.cuda.harness import assert_matches_reference

    feeds = {"Q": rand(2, 4, 33, 64), "K": rand(2, 4, 20, 64), "V": rand(2, 4, 20, 64)}
    skv = 20 + (5 if with_past else 0)
    if with_mask:
        feeds["attn_mask"] = rng.random((2, 1, 33, skv)) > 0.2
    if with_past:
        feeds["past_key"], feeds["past_value"] = rand(2, 4, 5, 64), rand(2, 4, 5, 64)
    lay = layer(feeds, attrs, 3 if with_past else 1, stamped=True)
    assert attention_onnx._fits_fused(lay)
    assert_matches_reference(lay, feeds, tactic="cuda.attention_onnx.fused", rtol=1e-4, atol=1e-5)


def test_onnx_attention_gets_its_own_tactics_and_not_the_fused_layers():
    from polykit.kernels.tactics import candidates

    feeds, attrs, n_out = VARIANTS["gqa_causal_past_qk_bias"]
    names = [t.name for t in candidates("cuda", "Attention", layer(feeds, attrs, n_out, stamped=True))]
    assert names == ["cuda.attention_onnx.generic"]
    plain = {"Q": rand(1, 2, 3, 8), "K": rand(1, 2, 4, 8), "V": rand(1, 2, 4, 8)}
    names = [t.name for t in candidates("cuda", "Attention", layer(plain, {"is_causal": 1}, stamped=True))]
    assert names == ["cuda.attention_onnx.fused", "cuda.attention_onnx.generic"]


@pytest.mark.parametrize("change", ["softcap", "gqa", "short_mask", "qk_output", "window", "fp64", "wide_head"])
def test_fused_path_refuses_variants_its_kernel_does_not_compute(change):
    feeds = {"Q": rand(1, 2, 3, 8), "K": rand(1, 2, 4, 8), "V": rand(1, 2, 4, 8)}
    attrs, n_out = {}, 1
    if change == "softcap":
        attrs["softcap"] = 2.0
    elif change == "gqa":
        feeds["K"], feeds["V"] = rand(1, 1, 4, 8), rand(1, 1, 4, 8)
    elif change == "short_mask":
        feeds["attn_mask"] = rand(3, 2)
    elif change == "qk_output":
        n_out = 4
    elif change == "window":
        attrs["left_window_size"] = 1
    elif change == "fp64":
        feeds = {k: v.astype(np.float64) for k, v in feeds.items()}
    else:
        feeds = {"Q": rand(1, 2, 3, 160), "K": rand(1, 2, 4, 160), "V": rand(1, 2, 4, 8)}
    assert not attention_onnx._fits_fused(layer(feeds, attrs, n_out, stamped=True))


#: ONNX's bfloat16 / float16 Attention cases (the op, and its function expansion whose Softmax,
#: ReduceMax and MatMuls run as layers of their own): the expected outputs round every stage to T
SIXTEEN_BIT_CASES = (r"^test_attention_(4d_causal|4d_padded_kv|4d_causal_padded_kv|4d_attn_mask_causal|3d_causal)"
                     r"_bf16(_expanded)?$|^test_attention_4d_(causal|gqa_with_past_and_present)_fp16(_expanded)?$")


@pytest.mark.gpu
def test_16bit_attention_conformance_cases_match_onnx_expected_outputs_on_cuda():
    """The generic kernel's bf16 softmax sums its probabilities as numpy does (one bf16-rounded
    addition at a time, in key order); the cuda Softmax rounds its 16-bit stages like the
    reference; the expansions' ReduceMax takes bf16; the MatMul + mask Add fused into one GEMM
    rounds the product to T before adding, as the two nodes do (test_sixteen_bit_bodies). Each
    case fails with polykit's message (e.g. the mismatch report)."""
    from polykit.tools.conformance import run_conformance

    report = run_conformance(["node"], "cuda", SIXTEEN_BIT_CASES)
    assert len(report.results) == 14
    failed = {r.name: r.message for r in report.results if r.status != "passed"}
    assert failed == {}


def test_every_layer_of_the_16bit_attention_cases_has_a_cuda_kernel():
    """Built for cuda without a GPU (tactics by priority), every layer of these cases' plans
    enqueues on a recording launcher: no layer refuses its storage type (the expansions'
    ReduceMax over a bf16 mask did)."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.ir.dtypes import to_numpy
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import find_tactic
    from polykit.tools.conformance import collect_cases

    from .recording_launcher import RecordingLauncher

    def device_tensor(shape, dtype):
        return DeviceTensor(0x1000, tuple(shape), np.dtype(to_numpy(16) if dtype == "bfloat16" else dtype))

    refused = {}
    for case in collect_cases(["node"], SIXTEEN_BIT_CASES):
        graph = load_onnx(case.model)
        shapes = {name: tuple(np.shape(x)) for name, x in zip(graph.inputs, case.data_sets[0][0])}
        plan = build_plan(graph, BuilderConfig(target="cuda", input_shapes=shapes, builder_optimization_level=0))
        for lay in plan.layers:
            tensors = {n: device_tensor(s, d) for n, s, d in zip(lay.inputs + lay.outputs, lay.in_shapes + lay.out_shapes,
                                                                 lay.in_dtypes + lay.out_dtypes) if n}
            try:
                find_tactic("cuda", lay.kind, lay.tactic).enqueue(lay, RecordingLauncher(), tensors)
            except PolykitError as exc:
                refused[f"{case.name}/{lay.name}"] = exc.what
    assert refused == {}


# ---- the flash route (attention_onnx_flash.py) --------------------------------------------

def _flash_cases():
    import ml_dtypes

    f16, bf16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)

    def r(*shape, dtype=f16):
        return rand(*shape).astype(dtype)

    mask = rng.random((2, 1, 200, 300)) > 0.2
    mask[1, 0, 7] = False  # a fully masked row: 0
    return {
        "gqa_causal_past_present": (dict(Q=r(2, 8, 33, 64), K=r(2, 2, 20, 64), V=r(2, 2, 20, 64),
                                         past_key=r(2, 2, 45, 64), past_value=r(2, 2, 45, 64)), dict(is_causal=1), 3),
        "gqa_causal_past_workspace_bf16": (dict(Q=r(1, 4, 130, 128, dtype=bf16), K=r(1, 1, 130, 128, dtype=bf16),
                                                V=r(1, 1, 130, 128, dtype=bf16), past_key=r(1, 1, 70, 128, dtype=bf16),
                                                past_value=r(1, 1, 70, 128, dtype=bf16)), dict(is_causal=1), 1),
        "causal_square_3d": (dict(Q=r(2, 257, 4 * 64), K=r(2, 257, 2 * 64), V=r(2, 257, 2 * 64)),
                             dict(is_causal=1, q_num_heads=4, kv_num_heads=2), 1),
        "cross_3d_mqa_bool_mask": (dict(Q=r(2, 200, 3 * 64), K=r(2, 300, 64), V=r(2, 300, 64), attn_mask=mask),
                                   dict(q_num_heads=3, kv_num_heads=1, scale=0.1), 1),
        "additive_mask_head_32": (dict(Q=r(2, 2, 77, 32), K=r(2, 2, 90, 32), V=r(2, 2, 90, 32),
                                       attn_mask=(rand(2, 2, 77, 90) * 3).astype(f16)), {}, 1),
        "causal_padding_mask_past_bf16": (dict(Q=r(2, 4, 100, 64, dtype=bf16), K=r(2, 2, 100, 64, dtype=bf16),
                                               V=r(2, 2, 100, 64, dtype=bf16), attn_mask=rng.random((2, 1, 1, 150)) > 0.2,
                                               past_key=r(2, 2, 50, 64, dtype=bf16),
                                               past_value=r(2, 2, 50, 64, dtype=bf16)), dict(is_causal=1), 3),
        "fp32_causal_past": (dict(Q=rand(1, 4, 40, 64), K=rand(1, 2, 40, 64), V=rand(1, 2, 40, 64),
                                  past_key=rand(1, 2, 9, 64), past_value=rand(1, 2, 9, 64)), dict(is_causal=1), 3),
    }


FLASH_CASES = _flash_cases()


def _flash_pairs():
    """(case, tactic) for each case and each route tactic that takes it (stamped layer)."""
    from polykit.kernels.tactics import candidates

    pairs = []
    for case, (feeds, attrs, n_out) in sorted(FLASH_CASES.items()):
        lay = layer(feeds, attrs, n_out, stamped=True)
        pairs += [(case, t.name) for t in candidates("cuda", "Attention", lay) if t.name.startswith("cuda.attention_onnx.flash")]
    return pairs


def test_every_flash_case_has_a_route():
    assert {case for case, _ in _flash_pairs()} == set(FLASH_CASES)


@pytest.mark.gpu
@pytest.mark.parametrize("case,tactic", _flash_pairs())
def test_flash_route_matches_reference(case, tactic):
    """Y against the reference (16-bit: the reference rounds each stage to T, the flash kernels keep
    the softmax in float, so a relative tolerance), present exactly."""
    from polykit.runtime.cuda.harness import reference_layer, relative_error, run_layer

    if tactic.endswith("_sm90"):
        from tests.kernels.cuda import on_sm90

        if not on_sm90():
            pytest.skip("needs a compute capability 9.0 GPU")
    feeds, attrs, n_out = FLASH_CASES[case]
    lay = layer(feeds, attrs, n_out, stamped=True)
    got, want = run_layer(lay, feeds, tactic=tactic), reference_layer(lay, feeds)
    tol = {"float16": 1e-2, "bfloat16": 4e-2}.get(np.dtype(feeds["Q"].dtype).name, 1e-5)
    assert relative_error(got["Y"], want["Y"]) <= tol
    for name in lay.outputs[1:]:
        np.testing.assert_array_equal(got[name], want[name])
