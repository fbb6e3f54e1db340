"""cuda.norm_nhwc (ai.polykit GroupNormNHWC, norm_nhwc.cu): the split geometry and the three kernels'
arithmetic emulated on the host against the reference (CPU), NVRTC compiles of every variant (CPU),
and the kernels on a GPU against the reference (`gpu`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.group_norm_nhwc import NORM_ACTIVATIONS
from polykit.compiler.ops.nn.group_norm_nhwc_reference import group_norm_nhwc
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.reduce.norm_nhwc import (KERNELS, MAX_SPLITS, THREADS, compile_variants, geometry,
                                                    partials_shared_bytes, vec_width, workspace_bytes)
from polykit.kernels.tactics import candidates

RNG = np.random.default_rng(31)

# ([N, ..., C], groups): odd pixel counts, G in {1, 32, C}, C not a multiple of 8 (the scalar path),
# wav2vec2's conv0 (512 channels, a group each) and a UNet block's GroupNorm(32) at a small size
SHAPES = [((1, 37, 16), 16), ((2, 5, 7, 64), 32), ((1, 9, 11, 12), 1), ((2, 13, 6), 3), ((1, 3, 3, 20), 20),
          ((1, 401, 512), 512), ((1, 17, 15, 320), 32), ((3, 1, 1, 8), 2)]


def _merge(k, m, q, kb, mb, qb):
    """Chan's combination, as ng_merge (numpy arrays; kb == 0 leaves the state)."""
    n = k + kb
    w = np.where(n > 0, kb / np.where(n > 0, n, 1), 0)
    d = mb - m
    return n, m + d * w, q + qb + d * d * k * w


def _sigmoid32(v: np.ndarray) -> np.ndarray:
    """pointwise.cuh's pk_sigmoid in float32: 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below."""
    e = np.exp(-np.abs(v))
    return np.where(v >= 0, 1 / (1 + e), e / (1 + e)).astype(np.float32)


def _erf32(v: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(v).astype(np.float32)


#: ng_act of norm_nhwc.cu per NORM_ACTIVATIONS value, in float32 (the 16-bit GELU's pk_gelu16 is a fit of
#: the erf form within an fp16 ulp: the erf form stands for it here)
ACT32 = {
    "none": lambda v: v,
    "relu": lambda v: np.maximum(v, np.float32(0)),
    "sigmoid": _sigmoid32,
    "tanh": np.tanh,
    "silu": lambda v: v * _sigmoid32(v),
    "gelu": lambda v: np.float32(0.5) * v * (1 + _erf32(v * np.float32(0.70710678118654752440))),
    "gelu_tanh": lambda v: np.float32(0.5) * v * (1 + np.tanh(np.float32(0.79788456080286535588)
                                                                * (v + np.float32(0.044715) * v * v * v))),
}


def emulate(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, groups: int, eps: float, vec: int,
            activation: str = "none") -> np.ndarray:
    """norm_nhwc.cu's three kernels on the host in float32: each partials block's rows of threads
    (Welford over their strided pixels, then combined in row order), the stats blocks' strided
    per-thread combination and fixed tree, the apply's per-element formula and ng_act (the normalized
    value rounded to x's dtype, the activation in float32, rounded again at the store)."""
    n, c = x.shape[0], x.shape[-1]
    flat = x.reshape(n, -1, c).astype(np.float32)
    p = flat.shape[1]
    tx, ct, splits, chunk = geometry(n, p, c, x.dtype.itemsize, vec)
    rows = THREADS // tx
    assert ct * tx * vec >= c and rows * tx == THREADS and splits * chunk >= p > (splits - 1) * chunk
    part = np.zeros((n, splits, c, 2), np.float32)
    for s in range(splits):
        p0, p1 = s * chunk, min(p, (s + 1) * chunk)
        states = []
        for ly in range(rows):
            k, m, q = np.float32(0), np.zeros((n, c), np.float32), np.zeros((n, c), np.float32)
            for px in range(p0 + ly, p1, rows):
                k = np.float32(k + 1)
                d = flat[:, px] - m
                m = m + d * np.float32(1 / k)
                q = q + d * (flat[:, px] - m)
            states.append((np.full((n, c), k, np.float32), m, q))
        k, m, q = states[0]
        for kb, mb, qb in states[1:]:
            k, m, q = _merge(k, m, q, kb, mb, qb)
        part[:, s, :, 0], part[:, s, :, 1] = m, q
    cg = c // groups
    stats = np.zeros((n, groups, 2), np.float32)
    counts = np.array([min(p, (s + 1) * chunk) - s * chunk for s in range(splits)], np.float32)
    for g in range(groups):
        entries = splits * cg
        tk, tm, tq = (np.zeros((n, THREADS), np.float32) for _ in range(3))
        for e in range(entries):
            s, ch = e // cg, g * cg + e % cg
            i = e % THREADS
            tk[:, i], tm[:, i], tq[:, i] = _merge(tk[:, i], tm[:, i], tq[:, i], counts[s], part[:, s, ch, 0],
                                                  part[:, s, ch, 1])
        half = THREADS // 2
        while half:
            tk[:, :half], tm[:, :half], tq[:, :half] = _merge(tk[:, :half], tm[:, :half], tq[:, :half],
                                                              tk[:, half:2 * half], tm[:, half:2 * half],
                                                              tq[:, half:2 * half])
            half //= 2
        stats[:, g, 0], stats[:, g, 1] = tm[:, 0], 1 / np.sqrt(tq[:, 0] / tk[:, 0] + np.float32(eps))
    per_channel = np.repeat(stats, cg, axis=1)  # [N, C, 2]
    y = (flat - per_channel[:, None, :, 0]) * per_channel[:, None, :, 1] * scale.astype(np.float32) \
        + bias.astype(np.float32)
    if activation != "none":
        y = ACT32[activation](y.astype(x.dtype).astype(np.float32)).astype(np.float32)
    return y.reshape(x.shape).astype(x.dtype)


def _node(groups: int, eps: float = 1e-5, activation: str = "none") -> Node:
    return Node("GroupNormNHWC", ["x", "s", "b"], ["y"], {"num_groups": groups, "epsilon": eps,
                                                          "activation": activation}, name="gn", domain=POLYKIT_DOMAIN)


def _arrays(shape, dtype=np.float32):
    c = shape[-1]
    x = (RNG.standard_normal(shape) * 2 + 3).astype(dtype)  # an offset: a one-pass sum of squares would lose it
    return x, RNG.uniform(0.5, 1.5, c).astype(dtype), (RNG.standard_normal(c) * 0.1).astype(dtype)


#: the emulated cases: SHAPES and one whose 2003 pixels split in two uneven chunks (1002 + 1001) of
#: fp32 rows 32 bytes wide
EMULATED = SHAPES + [((1, 2003, 8), 2)]


def test_the_emulated_cases_split_the_pixels_in_several_chunks():
    splits = {shape: geometry(shape[0], int(np.prod(shape[1:-1])), shape[-1], 4, 1)[2] for shape, _ in EMULATED}
    assert splits[(1, 401, 512)] > 8 and splits[(1, 17, 15, 320)] > 8 and splits[(1, 2003, 8)] == 2


@pytest.mark.parametrize("shape,groups", EMULATED)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_host_emulation_of_the_split_kernels_matches_the_reference(shape, groups, dtype):
    x, s, b = _arrays(shape, dtype)
    wide = vec_width(np.dtype(dtype).itemsize)
    want = group_norm_nhwc(_node(groups), [x, s, b])[0]
    for vec in (1, wide) if shape[-1] % wide == 0 else (1,):
        got = emulate(x, s, b, groups, 1e-5, vec)
        tol = 1e-4 if dtype == np.float32 else 4e-3
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol,
                                   err_msg=f"vec {vec}")


#: cases of the activation: wav2vec2's conv0 shape (scaled), a UNet GroupNorm(32), the scalar path (C 12)
ACT_SHAPES = [((1, 401, 512), 512), ((2, 5, 7, 64), 32), ((1, 9, 11, 12), 3)]


@pytest.mark.parametrize("activation", NORM_ACTIVATIONS[1:])
@pytest.mark.parametrize("shape,groups", ACT_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_host_emulation_of_the_apply_kernel_with_its_activation_matches_the_reference(shape, groups, dtype,
                                                                                      activation):
    x, s, b = _arrays(shape, dtype)
    want = group_norm_nhwc(_node(groups, activation=activation), [x, s, b])[0]
    plain = group_norm_nhwc(_node(groups), [x, s, b])[0]
    assert not np.array_equal(want, plain)  # the activation changes the result
    vec = vec_width(np.dtype(dtype).itemsize) if shape[-1] % vec_width(np.dtype(dtype).itemsize) == 0 else 1
    got = emulate(x, s, b, groups, 1e-5, vec, activation)
    tol = 1e-4 if dtype == np.float32 else 4e-3
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def test_shape_rule_rejects_an_unknown_activation():
    """A plan's layers are re-inferred on load (check_layers): an activation the kernels do not know
    is a GraphError naming the node, with the values that are."""
    from polykit.compiler.graph.infer import infer_shapes
    from polykit.compiler.ir.graph import Graph, Value
    from polykit.errors import PolykitError

    node = _node(2, activation="swish")
    values = {"x": Value("x", np.dtype(np.float32), (1, 5, 8)), "s": Value("s", np.dtype(np.float32), (8,)),
              "b": Value("b", np.dtype(np.float32), (8,))}
    g = Graph([node], ["x", "s", "b"], ["y"], {}, values)
    with pytest.raises(PolykitError, match="unknown activation 'swish'") as info:
        infer_shapes(g, strict=True)
    assert "gelu_tanh" in (info.value.hint or "")
    node.attrs["activation"] = "silu"
    infer_shapes(g, strict=True)
    assert g.value("y").shape == (1, 5, 8)


def test_the_tactic_compiles_the_layers_activation_into_the_apply_kernel_only():
    lay = _layer((1, 9, 16), 4, np.float16, "gelu")
    (tactic,) = candidates("cuda", "GroupNormNHWC", lay)
    sources = {(k.name, dict(k.defines).get("NG_ACT"), dict(k.defines).get("PK_GELU16")) for k in tactic.kernels(lay)}
    assert sources == {("gn_nhwc_partials", None, None), ("gn_nhwc_stats", None, None),
                       ("gn_nhwc_apply", str(NORM_ACTIVATIONS.index("gelu")), "1")}
    assert not candidates("cuda", "GroupNormNHWC", _layer((1, 9, 16), 4, np.float16, "swish"))


def test_geometry_splits_wav2vec2_conv0_over_the_pixels():
    """[1, 15999, 512] fp16 (wav2vec2's first conv output at batch 1): hundreds of partial blocks, not
    one block a group, within MAX_SPLITS; the workspace holds the partials and the statistics."""
    tx, ct, splits, chunk = geometry(1, 15999, 512, 2, 8)
    assert (tx, ct) == (64, 1) and 256 <= splits <= MAX_SPLITS and (splits - 1) * chunk < 15999 <= splits * chunk
    assert workspace_bytes(1, splits, 512, 512) >= 8 * splits * 512 + 8 * 512
    assert partials_shared_bytes(tx, 8) <= 48 * 1024 and partials_shared_bytes(1, 1) <= 48 * 1024


def test_the_split_count_depends_on_the_shape_only():
    for shape in ((1, 4096, 320), (2, 1000, 24), (4, 7, 8)):
        assert geometry(*shape, 2, 1)[2:] == geometry(*shape, 2, 8)[2:]


def _layer(shape, groups, dtype, activation: str = "none") -> LayerDesc:
    c, name = shape[-1], np.dtype(dtype).name
    return LayerDesc("gn", "GroupNormNHWC", ("x", "s", "b"), ("y",),
                     {"num_groups": groups, "epsilon": 1e-5, "activation": activation},
                     domain=POLYKIT_DOMAIN, in_dtypes=(name,) * 3, in_shapes=(shape, (c,), (c,)),
                     out_dtypes=(name,), out_shapes=(shape,))


def test_tactic_takes_float_layers_and_lists_its_kernels():
    (tactic,) = candidates("cuda", "GroupNormNHWC", _layer((1, 9, 16), 4, np.float16))
    assert tactic.name == "cuda.norm_nhwc"
    assert {k.name for k in tactic.kernels(_layer((1, 9, 16), 4, np.float16))} == set(KERNELS)
    assert not candidates("cuda", "GroupNormNHWC", _layer((1, 9, 16), 4, np.float64))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_variant_compiles_with_nvrtc(arch):
    nvrtc = pytest.importorskip("polykit.runtime.cuda.nvrtc")
    units = nvrtc.unique_units(compile_variants())
    # a unit per storage type and vector width, the three kernels in each; the apply kernel with each of
    # the six activations in each storage type
    assert len(units) == 6 + 6 * 3
    if arch == "sm_80":  # NVRTC's front end, as CI's whole-table check of the second arch (tests/kernel_units.py)
        for unit in units:
            nvrtc.check_front_end(unit, arch)
        return
    try:
        from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

        checked = check_all(units, arch)
    except Exception as exc:  # no NVRTC library on this machine
        if "nvrtc" in str(exc).lower() and "load" in str(exc).lower():
            pytest.skip(str(exc))
        raise
    assert checked == len(units)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,groups", SHAPES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_kernels_match_the_reference_on_the_gpu(shape, groups, dtype):
    from polykit.runtime.cuda.harness import assert_matches_reference

    x, s, b = _arrays(shape, dtype)
    tol = 1e-4 if dtype == np.float32 else 8e-3
    assert_matches_reference(_layer(shape, groups, dtype), {"x": x, "s": s, "b": b}, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", NORM_ACTIVATIONS[1:])
@pytest.mark.parametrize("shape,groups,dtype", [((1, 401, 512), 512, np.float16), ((1, 9, 11, 12), 3, np.float16),
                                                ((2, 5, 7, 64), 32, np.float32)])
def test_apply_kernel_with_each_activation_matches_the_reference_on_the_gpu(shape, groups, dtype, activation):
    """The fp16 16-byte (C 512) and scalar (C 12) apply kernels and an fp32 one with NG_ACT against the
    reference."""
    from polykit.runtime.cuda.harness import assert_matches_reference

    x, s, b = _arrays(shape, dtype)
    tol = 1e-4 if dtype == np.float32 else 8e-3
    assert_matches_reference(_layer(shape, groups, dtype, activation), {"x": x, "s": s, "b": b}, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_misaligned_tensors_take_the_scalar_path_on_the_gpu():
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    shape = (1, 33, 64)
    x, s, b = _arrays(shape, np.float16)
    lay = _layer(shape, 32, np.float16)
    got = run_layer(lay, {"x": x, "s": s, "b": b}, misalign={"x": 2})
    want = reference_layer(lay, {"x": x, "s": s, "b": b})
    np.testing.assert_allclose(got["y"].astype(np.float64), want["y"].astype(np.float64), rtol=8e-3, atol=8e-3)
