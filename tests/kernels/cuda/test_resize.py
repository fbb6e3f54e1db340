"""Resize on cuda: host packing and a numpy model of resize.cu's per-element algorithm (CPU),
and the kernels themselves on the GPU against the reference -- every mode, coordinate mode,
nearest rule, antialias, exclude_outside, tf_crop_and_resize roi/extrapolation and
keep_aspect_ratio_policy."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.movement.resize import COORD, NEAREST, compile_variants, resize_geometry, supports
from polykit.compiler.ops.references import find_reference

rng = np.random.default_rng(13)


def layer(inputs=("X", "", "S"), **attrs):
    return LayerDesc("r", "Resize", tuple(inputs), ("Y",), attrs)


def reference(lay, feeds):
    from polykit.runtime.cuda.harness import reference_layer

    return reference_layer(lay, feeds)["Y"]


def tensor(a):
    return None if a is None or a.size == 0 else DeviceTensor(0, tuple(a.shape), a.dtype)


def geometry(lay, feeds, y_shape):
    get = lambda i: feeds.get(lay.inputs[i]) if len(lay.inputs) > i and lay.inputs[i] else None  # noqa: E731
    x = feeds[lay.inputs[0]]
    return resize_geometry(lay, DeviceTensor(0, tuple(x.shape), x.dtype), DeviceTensor(0, tuple(y_shape), x.dtype),
                           tensor(get(2)), tensor(get(3)), tensor(get(1)))


# -- a numpy model of resize.cu: the same per-element steps, so the algorithm (separable tap
# products, inline weight normalization, "outside on any axis" extrapolation, device-side
# scales) is checked against the reference here, where there is no GPU --------------------

def _src(coord, y, out_len, in_len, scale, r0, r1):
    if coord == 1:
        return in_len / 2 * (1 - out_len / (scale * in_len)) + (y + 0.5) / scale - 0.5
    if coord == 2:
        return 0.0 if out_len == 1 else (y + 0.5) / scale - 0.5
    if coord == 3:
        return 0.0 if out_len == 1 else y * (in_len - 1) / (out_len - 1)
    if coord == 4:
        return y / scale
    if coord == 5:
        return (y + 0.5) / scale
    if coord == 6:
        x = (r1 - r0) * (in_len - 1) / 2 if out_len == 1 else y * (r1 - r0) * (in_len - 1) / (out_len - 1)
        return x + r0 * (in_len - 1)
    return (y + 0.5) / scale - 0.5


def _nearest(x, rule, in_len):
    base = math.floor(x)
    ratio = x - base
    up = [ratio > 0.5, ratio >= 0.5, False, ratio > 0][rule]
    return min(max(base + up, 0), in_len - 1)


def _raw(mode, off, ratio, s, a):
    t = abs((off - ratio) * s)
    if mode == "linear":
        return 0.0 if t >= 1 else 1 - t
    return ((a + 2) * t - (a + 3)) * t * t + 1 if t <= 1 else (((a * t - 5 * a) * t + 8 * a) * t - 4 * a if t < 2 else 0.0)


def kernel_model(g, x, scales=None, sizes=None, roi=None):
    """What resize.cu computes for geometry `g` (float64, before the store's rounding)."""
    y = np.zeros(g.out_shape)
    if g.empty:
        return y
    xf = x.astype(np.float64).ravel()
    in_d, out_d, slot, crop = g.in_shape, g.out_shape, g.slot, g.coord == 6
    ratios = [sizes[slot[d]] / in_d[d] for d in range(g.rank) if slot[d] >= 0] if g.src >= 2 else []
    policy = (min if g.src == 2 else max)(ratios) if ratios else 0.0
    roi64 = None if roi is None else roi.astype(np.float64)
    has_roi = [crop and k >= 0 and roi64 is not None for k in slot]
    scale = [g.host_scale[d] if k < 0 or g.src == 0 else (float(scales[k]) if g.src == 1 else policy)
             for d, k in enumerate(slot)]
    r0 = [roi64[k] if has else 0.0 for k, has in zip(slot, has_roi)]
    r1 = [roi64[g.n_axes + k] if has else 1.0 for k, has in zip(slot, has_roi)]
    skip = [slot[d] < 0 or (in_d[d] == out_d[d] and scale[d] == 1.0 and (not crop or (r0[d], r1[d]) == (0.0, 1.0)))
            for d in range(g.rank)]
    stride = [int(np.prod(in_d[d + 1:], dtype=np.int64)) for d in range(g.rank)]
    for idx in np.ndindex(*out_d):
        base, axes, outside = 0, [], False
        for d, c in enumerate(idx):
            if skip[d]:
                base += c * stride[d]
                continue
            xs = _src(g.coord, float(c), out_d[d], in_d[d], scale[d], r0[d], r1[d])
            outside |= crop and (xs < 0 or xs > in_d[d] - 1)
            if g.mode == "nearest":
                base += _nearest(xs, g.rule, in_d[d]) * stride[d]
                continue
            f = math.floor(xs)
            rt = xs - f
            if rt == 0:
                rt, f = 1.0, f - 1
            s = scale[d] if g.antialias and scale[d] < 1 else 1.0
            start = math.floor(-(1.0 if g.mode == "linear" else 2.0) / s) + 1
            taps = range(start, 2 - start)
            w = np.array([_raw(g.mode, o, rt, s, g.cubic_a) for o in taps])
            if g.antialias and scale[d] < 1:
                w = w / w.sum()
            at = np.array([f + o for o in taps])
            if g.exclude:
                inside = (at >= 0) & (at < in_d[d])
                total = w[inside].sum()
                w = np.where(inside, w / (1.0 if total == 0 else total), 0.0)
            axes.append((np.clip(at, 0, in_d[d] - 1) * stride[d], w))
        if outside:
            y[idx] = g.extrapolation
            continue
        v = 0.0
        for combo in np.ndindex(*[len(w) for _, w in axes]):
            v += np.prod([axes[j][1][t] for j, t in enumerate(combo)]) * xf[base + sum(axes[j][0][t] for j, t in enumerate(combo))]
        y[idx] = v
    return y


def assert_model_matches_reference(lay, feeds, rtol=1e-6, atol=1e-6):
    want = reference(lay, feeds)
    get = lambda i: feeds.get(lay.inputs[i]) if len(lay.inputs) > i and lay.inputs[i] else None  # noqa: E731
    got = kernel_model(geometry(lay, feeds, want.shape), feeds[lay.inputs[0]], get(2), get(3), get(1))
    np.testing.assert_allclose(got, want.astype(np.float64), rtol=rtol, atol=atol)


def _backend_cases():
    """ONNX's Resize node cases; importing only their module takes 1 s where load_model_tests takes 15."""
    try:
        import onnx.backend.test.case.node.resize  # noqa: F401  (its exports register the cases)
        from onnx.backend.test.case.node import _NodeTestCases as cases
    except ImportError:  # the private layout moved: take the public, slower path
        from onnx.backend.test.loader import load_model_tests

        cases = load_model_tests(kind="node")
    return {t.name: t for t in cases if t.name.startswith("test_resize_")}


BACKEND = _backend_cases()


@pytest.mark.parametrize("name", sorted(BACKEND))
def test_kernel_model_matches_reference_on_onnx_backend_case(name):
    import onnx

    from polykit.compiler.graph.onnx_import import load_onnx

    case = BACKEND[name]
    model = onnx.load(case.model) if isinstance(case.model, str) else case.model
    graph = load_onnx(model)
    (node,) = graph.nodes
    inputs, _ = case.data_sets[0]
    feeds = dict(zip([i.name for i in model.graph.input], inputs))
    feeds.update(graph.initializers)
    lay = LayerDesc("r", "Resize", tuple(node.inputs), ("Y",), dict(node.attrs))
    assert_model_matches_reference(lay, feeds)


#: where polykit's reference (onnxruntime's convention) and ONNX's expected data disagree; cpu fails these too
REFERENCE_DIFFERS = {"test_resize_downsample_scales_linear_align_corners", "test_resize_downsample_scales_cubic_align_corners"}


@pytest.mark.parametrize("name", sorted(set(BACKEND) - REFERENCE_DIFFERS))
def test_backend_case_builds_for_cuda_and_its_layer_gives_the_expected_output(name):
    """The conformance path on the host: build the case's plan for the cuda target (input values
    bound when shapes depend on them, as the ONNX backend does), then run the built layer's
    geometry and tensors through the kernel model."""
    import onnx

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.errors import BuildError
    from polykit.kernels.cuda.movement.resize import _optional

    case = BACKEND[name]
    graph = load_onnx(onnx.load(case.model) if isinstance(case.model, str) else case.model)
    inputs, (expected,) = case.data_sets[0]
    feeds = dict(zip(graph.inputs, inputs))
    shapes = {k: v.shape for k, v in feeds.items()}
    try:
        plan = build_plan(graph, BuilderConfig(target="cuda", input_shapes=shapes))
    except BuildError:
        plan = build_plan(graph, BuilderConfig(target="cuda", input_shapes=shapes,
                                               input_values={k: v for k, v in feeds.items() if v.size <= 64}))
    (lay,) = [item for item in plan.layers if item.kind == "Resize"]
    assert lay.tactic == "cuda.resize"
    tensors = {n: DeviceTensor(0, tuple(d.shape), np.dtype(d.dtype)) for n, d in plan.tensors.items()}
    values = {**feeds, **plan.weights}
    g = resize_geometry(lay, tensors[lay.inputs[0]], tensors[lay.outputs[0]],
                        *(_optional(lay, tensors, i) for i in (2, 3, 1)))
    get = lambda i: values.get(lay.inputs[i]) if len(lay.inputs) > i and lay.inputs[i] else None  # noqa: E731
    got = kernel_model(g, values[lay.inputs[0]], get(2), get(3), get(1)).astype(expected.dtype)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-7)


MODEL_CASES = {
    "cubic_half_pixel_up": (layer(mode="cubic"), (2, 2, 5, 6), [1, 1, 1.6, 2.3]),
    "cubic_exclude_outside_a_half": (layer(mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5), (1, 2, 5, 6), [1, 1, 0.7, 1.9]),
    "cubic_align_corners_down": (layer(mode="cubic", coordinate_transformation_mode="align_corners"), (1, 1, 7, 9), [1, 1, 0.6, 0.45]),
    "cubic_antialias_down": (layer(mode="cubic", antialias=1), (1, 2, 9, 11), [1, 1, 0.4, 0.3]),
    "linear_antialias_mixed": (layer(mode="linear", antialias=1), (1, 2, 9, 5), [1, 1, 0.35, 1.5]),
    "linear_antialias_exclude": (layer(mode="linear", antialias=1, exclude_outside=1), (1, 1, 10, 7), [1, 1, 0.3, 0.6]),
    "cubic_antialias_exclude_pytorch": (layer(mode="cubic", antialias=1, exclude_outside=1,
                                              coordinate_transformation_mode="pytorch_half_pixel"), (1, 1, 8, 9), [1, 1, 0.5, 0.25]),
    "linear_rank3_sym": (layer(mode="linear", coordinate_transformation_mode="half_pixel_symmetric"), (3, 5, 4), [1.0, 0.6, 2.5]),
    "cubic_rank5_axes": (layer(mode="cubic", axes=[4, 2]), (1, 2, 3, 2, 5), [1.4, 2.0]),
}


@pytest.mark.parametrize("name", sorted(MODEL_CASES))
def test_kernel_model_matches_reference_with_scales(name):
    lay, shape, scales = MODEL_CASES[name]
    assert_model_matches_reference(lay, {"X": rng.standard_normal(shape).astype(np.float32),
                                         "S": np.array(scales, np.float32)})


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("roi_dtype", [np.float32, np.float64, np.float16])
def test_kernel_model_matches_reference_for_crop_and_resize(mode, roi_dtype):
    lay = layer(("X", "R", "", "Z"), mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
                extrapolation_value=7.5, axes=[3, 1])
    feeds = {"X": rng.standard_normal((2, 5, 3, 6)).astype(np.float32), "Z": np.array([9, 4], np.int64),
             "R": np.array([-0.2, 0.25, 1.3, 0.75], roi_dtype)}
    assert_model_matches_reference(lay, feeds)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_kernel_model_uses_the_aspect_policy_scale(policy, mode):
    lay = layer(("X", "", "", "Z"), mode=mode, keep_aspect_ratio_policy=policy, axes=[2, 3])
    feeds = {"X": rng.standard_normal((1, 2, 5, 7)).astype(np.float32), "Z": np.array([8, 9], np.int64)}
    assert_model_matches_reference(lay, feeds)


def test_kernel_model_rounds_like_the_reference_for_uint8():
    lay = layer(mode="cubic")
    feeds = {"X": rng.integers(0, 256, (1, 1, 5, 6)).astype(np.uint8), "S": np.array([1, 1, 1.5, 0.5], np.float32)}
    want = reference(lay, feeds)
    got = kernel_model(geometry(lay, feeds, want.shape), feeds["X"], feeds["S"])
    np.testing.assert_array_equal(np.clip(np.round(got), 0, 255).astype(np.uint8), want)


# -- host packing --------------------------------------------------------------------------

def test_every_mode_and_coordinate_mode_is_claimed():
    for mode in ("nearest", "linear", "cubic"):
        for coord in COORD:
            for policy in ("stretch", "not_larger", "not_smaller"):
                assert supports(layer(mode=mode, coordinate_transformation_mode=coord, keep_aspect_ratio_policy=policy))


def test_dtypes_without_a_kernel_are_refused_when_the_builder_stamps_them():
    stamped = LayerDesc("r", "Resize", ("X", "", "S"), ("Y",), {"mode": "cubic"}, in_dtypes=("int32", "", "float32"))
    assert not supports(stamped)
    assert supports(LayerDesc("r", "Resize", ("X", "", "S"), ("Y",), {"mode": "cubic"}, in_dtypes=("float16", "", "float32")))


def test_a_stamped_layer_compiles_only_its_own_kernel():
    from polykit.kernels.cuda.movement.resize import _kernels

    stamped = LayerDesc("r", "Resize", ("X", "", "S"), ("Y",), {"mode": "linear"}, in_dtypes=("float16", "", "float32"))
    assert [k.name for k in _kernels(stamped)] == ["resize_linear_f16", "resize_fast_linear_f16"]


def test_compile_variants_cover_every_mode_and_dtype():
    names = {k.name for k in compile_variants()}
    codes = ("f32", "f16", "bf16", "f64", "u8", "i8")
    assert {f"resize_{m}_{c}" for m in ("nearest", "linear", "cubic") for c in codes} | {
        f"resize_fast_{m}_{c}" for m in ("nearest", "linear") for c in codes} == names


def test_geometry_maps_each_axis_to_its_slot_in_the_axes_attribute():
    lay = layer(("X", "R", "", "Z"), mode="linear", coordinate_transformation_mode="tf_crop_and_resize", axes=[3, 1])
    feeds = {"X": np.ones((2, 5, 3, 6), np.float32), "Z": np.array([9, 4], np.int64), "R": np.zeros(4, np.float64)}
    g = geometry(lay, feeds, (2, 4, 3, 9))
    assert (g.slot, g.n_axes, g.roi_code, g.coord, g.src) == ((-1, 1, -1, 0), 2, 2, 6, 0)


def test_geometry_reads_the_policy_scale_on_the_device():
    lay = layer(("X", "", "", "Z"), mode="nearest", keep_aspect_ratio_policy="not_smaller", axes=[2, 3])
    g = geometry(lay, {"X": np.ones((1, 1, 2, 4), np.float32), "Z": np.array([1, 3], np.int64)}, (1, 1, 2, 4))
    assert g.src == 3


def test_geometry_flags_an_empty_input_with_a_nonempty_output():
    lay = layer(("X", "", "", "Z"), mode="linear")
    g = geometry(lay, {"X": np.ones((1, 0, 3), np.float32), "Z": np.array([1, 2, 3], np.int64)}, (1, 2, 3))
    assert g.empty == 1


def test_geometry_rejects_scales_and_sizes_together():
    lay = layer(("X", "", "S", "Z"), mode="linear")
    feeds = {"X": np.ones((1, 1, 2, 2), np.float32), "S": np.ones(4, np.float32), "Z": np.ones(4, np.int64)}
    with pytest.raises(DeviceError, match="exactly one"):
        geometry(lay, feeds, (1, 1, 2, 2))


def test_geometry_rejects_a_roi_of_the_wrong_length():
    lay = layer(("X", "R", "S"), mode="linear", coordinate_transformation_mode="tf_crop_and_resize")
    feeds = {"X": np.ones((1, 1, 2, 2), np.float32), "S": np.ones(4, np.float32), "R": np.ones(6, np.float32)}
    with pytest.raises(DeviceError, match="roi"):
        geometry(lay, feeds, (1, 1, 2, 2))


def test_the_gap_cases_have_a_backend_case_each():
    for name in ("test_resize_upsample_scales_cubic_A_n0p5_exclude_outside", "test_resize_tf_crop_and_resize_axes_3_2",
                 "test_resize_downsample_sizes_cubic_antialias", "test_resize_upsample_sizes_nearest_not_smaller"):
        assert name in BACKEND


# -- on the GPU ----------------------------------------------------------------------------

def check(lay, feeds, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", [c for c in COORD if c != "tf_crop_and_resize"])
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 2.0], [1, 1, 0.5, 0.75], [1, 1, 1.7, 0.6]])
def test_resize_with_scales(mode, coord, scales):
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    lay = layer(mode=mode, coordinate_transformation_mode=coord)
    check(lay, {"X": x, "S": np.array(scales, np.float32)}, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", list(NEAREST))
@pytest.mark.parametrize("sizes", [[1, 2, 9, 13], [1, 2, 3, 2], [1, 2, 1, 1]])
def test_resize_nearest_with_sizes(rule, sizes):
    x = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)
    lay = layer(("X", "", "", "Z"), mode="nearest", nearest_mode=rule, coordinate_transformation_mode="asymmetric")
    check(lay, {"X": x, "Z": np.array(sizes, np.int64)}, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODEL_CASES))
def test_resize_cubic_and_antialias_cases(name):
    lay, shape, scales = MODEL_CASES[name]
    check(lay, {"X": rng.standard_normal(shape).astype(np.float32), "S": np.array(scales, np.float32)},
          rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sizes", [[1, 1, 3, 2], [1, 1, 1, 1], [1, 1, 2, 5]])
def test_resize_antialias_with_sizes(mode, sizes):
    x = rng.standard_normal((1, 1, 7, 9)).astype(np.float32)
    lay = layer(("X", "", "", "Z"), mode=mode, antialias=1)
    check(lay, {"X": x, "Z": np.array(sizes, np.int64)}, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("roi_dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("sizes", [[9, 4], [1, 1], [6, 5]])
def test_resize_tf_crop_and_resize(mode, roi_dtype, sizes):
    lay = layer(("X", "R", "", "Z"), mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
                extrapolation_value=7.5, axes=[3, 1])
    feeds = {"X": rng.standard_normal((2, 5, 3, 6)).astype(np.float32), "Z": np.array(sizes, np.int64),
             "R": np.array([-0.2, 0.25, 1.3, 0.75], roi_dtype)}
    check(lay, feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_resize_tf_crop_and_resize_without_roi_is_the_full_image():
    lay = layer(("X", "", "S"), mode="linear", coordinate_transformation_mode="tf_crop_and_resize")
    check(lay, {"X": rng.standard_normal((1, 2, 4, 5)).astype(np.float32),
                "S": np.array([1, 1, 1.5, 0.8], np.float32)}, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("shape,sizes", [((1, 1, 2, 4), [1, 3]), ((1, 1, 2, 2), [7, 8]), ((2, 3, 5, 7), [8, 9])])
def test_resize_keep_aspect_ratio_policy(policy, mode, shape, sizes):
    lay = layer(("X", "", "", "Z"), mode=mode, keep_aspect_ratio_policy=policy, axes=[2, 3])
    check(lay, {"X": rng.standard_normal(shape).astype(np.float32), "Z": np.array(sizes, np.int64)},
          rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-3), (ml_dtypes.bfloat16, 1e-2), (np.float64, 1e-12)])
def test_resize_float_dtypes(mode, dtype, tol):
    x = rng.standard_normal((1, 3, 7, 9)).astype(dtype)
    lay = layer(("X", "", "", "Z"), mode=mode)
    check(lay, {"X": x, "Z": np.array([1, 3, 14, 5], np.int64)}, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("dtype,lo,hi", [(np.uint8, 0, 256), (np.int8, -128, 128)])
def test_resize_integer_dtypes_round_and_saturate(mode, dtype, lo, hi):
    x = rng.integers(lo, hi, (1, 3, 7, 9)).astype(dtype)
    lay = layer(("X", "", "", "Z"), mode=mode)
    check(lay, {"X": x, "Z": np.array([1, 3, 14, 5], np.int64)}, rtol=0, atol=1)


@pytest.mark.gpu
def test_resize_with_axes_attribute():
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    lay = layer(mode="linear", axes=[2, 3])
    check(lay, {"X": x, "S": np.array([1.5, 2.5], np.float32)}, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,scales", [((7,), [2.5]), ((1, 1, 1, 1), [1, 1, 3.0, 2.0]), ((2, 1, 3, 1, 4), [1, 1, 1.5, 2.0, 0.5])])
def test_resize_cubic_odd_ranks_and_unit_axes(shape, scales):
    lay = layer(mode="cubic", exclude_outside=1)
    check(lay, {"X": rng.standard_normal(shape).astype(np.float32), "S": np.array(scales, np.float32)},
          rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_resize_of_an_empty_axis_is_zeros():
    lay = layer(("X", "", "", "Z"), mode="linear")
    check(lay, {"X": np.zeros((1, 0, 3), np.float32), "Z": np.array([1, 2, 3], np.int64)}, rtol=0, atol=0)


# -- the fast kernel (RESIZE_FAST): one or two adjacent axes resized, nearest / linear ---------

def _geo(mode, x_shape, y_shape, inputs=("X", "", "", "Z"), **attrs):
    lay = layer(inputs, mode=mode, **attrs)
    feeds = {"X": np.ones(x_shape, np.float32), "Z": np.array(y_shape, np.int64), "S": np.ones(len(x_shape), np.float32)}
    return geometry(lay, feeds, y_shape)


@pytest.mark.parametrize("mode,x_shape,y_shape,attrs,want", [
    ("linear", (8, 21, 64, 64), (8, 21, 512, 512), {}, (2, 3)),            # FCN's final upsampling, NCHW
    ("nearest", (1, 3, 4, 16), (1, 6, 8, 16), {}, (1, 2)),                  # channels-last: inner 16
    ("linear", (2, 5, 7), (2, 5, 11), {}, (-1, 2)),                         # one axis
    ("linear", (2, 4, 6, 6), (2, 8, 6, 12), {}, None),                      # axes 1 and 3: not adjacent
    ("cubic", (1, 1, 4, 4), (1, 1, 8, 8), {}, None),
    ("linear", (1, 1, 4, 4), (1, 1, 8, 8), {"antialias": 1}, None),
    ("nearest", (1, 1, 4, 4), (1, 1, 8, 8), {"antialias": 1}, (2, 3)),     # antialias never touches nearest
    ("linear", (1, 1, 4, 4), (1, 1, 8, 8), {"coordinate_transformation_mode": "tf_crop_and_resize"}, None),
    ("linear", (1, 1, 4, 4), (1, 1, 4, 4), {}, None),                       # nothing changes length
])
def test_fast_axes_are_the_changed_adjacent_axes(mode, x_shape, y_shape, attrs, want):
    assert _geo(mode, x_shape, y_shape, **attrs).fast_axes() == want


def test_the_fast_launch_tiles_columns_and_rows_and_passes_outer_and_inner():
    g = _geo("linear", (8, 21, 64, 64), (8, 21, 512, 512))
    assert g.launch_shape() == ((2, 2048, 1), (256, 1, 1))  # 8 * 21 * 512 rows over 4096 blocks, strided
    narrow = _geo("nearest", (2, 3, 4, 1), (2, 3, 8, 1))
    assert narrow.launch_shape() == ((1, 1, 1), (32, 8, 1))  # 8 columns in a warp-wide block, 6 rows
    args = g.args(DeviceTensor(0, (8, 21, 64, 64), np.dtype(np.float32)),
                  DeviceTensor(0, (8, 21, 512, 512), np.dtype(np.float32)), 0, 0, 0)
    assert args[-6:-2] == [2, 3, 8 * 21, 1] and args[-2] == 0  # dh, dw, outer, inner, then empty


def test_a_policy_sized_resize_keeps_the_general_kernel():
    lay = layer(("X", "", "", "Z"), mode="linear", keep_aspect_ratio_policy="not_larger", axes=[2, 3])
    g = geometry(lay, {"X": np.ones((1, 1, 4, 4), np.float32), "Z": np.array([8, 8], np.int64)}, (1, 1, 8, 8))
    assert g.fast_axes() is None and g.launch_shape()[1] == (256, 1, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-6), (np.float16, 2e-3), (np.float64, 1e-12)])
@pytest.mark.parametrize("x_shape,sizes", [
    ((2, 3, 9, 13), [2, 3, 40, 27]),      # NCHW up, 2 axes, columns not a warp multiple
    ((2, 9, 13, 24), [2, 5, 31, 24]),     # channels-last: inner 24, 2 axes, one shrinks
    ((3, 4, 300), [3, 4, 517]),           # one axis, columns past one block
    ((1, 1, 1, 1), [1, 1, 3, 2]),
])
def test_fast_resize_matches_the_reference(mode, coord, dtype, tol, x_shape, sizes):
    lay = layer(("X", "", "", "Z"), mode=mode, coordinate_transformation_mode=coord)
    check(lay, {"X": rng.standard_normal(x_shape).astype(dtype), "Z": np.array(sizes, np.int64)}, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 2.0], [1, 1, 0.5, 1.5], [1, 1.2, 2.0, 2.0], [1.3, 1, 1, 2.5]])
def test_fast_resize_with_device_scales_and_the_general_fallback(mode, scales):
    """[1, 1.2, 2, 2] on 3 channels: the channel axis keeps its length (floor(3.6) = 3) but its
    device scale is not 1, so the fast launch runs the general path; [1.3, 1, 1, 2.5] on batch 2 likewise."""
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    check(layer(mode=mode), {"X": x, "S": np.array(scales, np.float32)}, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_fast_resize_at_a_segmentation_head_shape():
    """DeepLabV3 / FCN's last layer (bilinear 8x, 21 classes) in fp16, against the reference."""
    lay = layer(("X", "", "", "Z"), mode="linear", coordinate_transformation_mode="pytorch_half_pixel")
    check(lay, {"X": rng.standard_normal((2, 21, 32, 32)).astype(np.float16), "Z": np.array([2, 21, 256, 256], np.int64)},
          rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("dtype,lo,hi", [(np.uint8, 0, 256), (np.int8, -128, 128)])
def test_fast_resize_integer_dtypes(mode, dtype, lo, hi):
    x = rng.integers(lo, hi, (2, 3, 7, 9)).astype(dtype)
    check(layer(("X", "", "", "Z"), mode=mode), {"X": x, "Z": np.array([2, 3, 15, 4], np.int64)}, rtol=0, atol=1)


def fast_kernel_model(g, x, scales=None):
    """What resize.cu's resize_fast computes (float64, before the store's rounding), step by step as
    the kernel does: y as [outer, OH, OW, inner], W taps per column, H taps per row, the general
    path's weight products and summation order."""
    dh, dw = g.fast_axes()
    in_d, out_d = g.in_shape, g.out_shape
    inner = int(np.prod(in_d[dw + 1:], dtype=np.int64))
    IW, OW = in_d[dw], out_d[dw]
    IH, OH = (in_d[dh], out_d[dh]) if dh >= 0 else (1, 1)
    outer = int(np.prod(in_d[:dh if dh >= 0 else dw], dtype=np.int64))
    xf = x.astype(np.float64).ravel()
    scale = lambda d: float(scales[g.slot[d]]) if g.src == 1 else g.host_scale[d]  # noqa: E731

    def taps(c, out_len, in_len, s):
        xs = _src(g.coord, float(c), out_len, in_len, s, 0.0, 1.0)
        if g.mode == "nearest":
            return (_nearest(xs, g.rule, in_len),) * 2, (1.0, 0.0)
        f = math.floor(xs)
        rt = xs - f
        if rt == 0:
            rt, f = 1.0, f - 1
        clamp = lambda i: min(max(i, 0), in_len - 1)  # noqa: E731
        return (clamp(f), clamp(f + 1)), (_raw("linear", 0, rt, 1.0, 0.0), _raw("linear", 1, rt, 1.0, 0.0))

    y = np.zeros(outer * OH * OW * inner)
    for col in range(OW * inner):
        ow, ch = divmod(col, inner)
        (w0, w1), (a0, a1) = taps(ow, OW, IW, scale(dw))
        for row in range(outer * OH):
            o, oh = divmod(row, OH)
            i = row * OW * inner + col
            if dh < 0:
                base = o * IW * inner
                y[i] = xf[base + w0 * inner + ch] if g.mode == "nearest" else (
                    0.0 + a0 * xf[base + w0 * inner + ch]) + a1 * xf[base + w1 * inner + ch]
                continue
            (h0, h1), (b0, b1) = taps(oh, OH, IH, scale(dh))
            r0, r1 = (o * IH + h0) * IW * inner, (o * IH + h1) * IW * inner
            if g.mode == "nearest":
                y[i] = xf[r0 + w0 * inner + ch]
                continue
            v = 0.0
            for wt, at in ((a0 * b0, r0 + w0 * inner), (a1 * b0, r0 + w1 * inner), (a0 * b1, r1 + w0 * inner),
                           (a1 * b1, r1 + w1 * inner)):
                v += wt * xf[at + ch]
            y[i] = v
    return y.reshape(out_d)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                   "half_pixel_symmetric", "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("x_shape,y_shape", [((2, 3, 5, 7), (2, 3, 11, 4)), ((2, 5, 7, 6), (2, 9, 3, 6)),
                                             ((3, 4, 6), (3, 4, 13)), ((1, 1, 1, 1), (1, 1, 3, 2))])
def test_fast_kernel_model_gives_the_general_models_bits(mode, coord, x_shape, y_shape):
    """The fast kernel's decomposition (columns, strided rows, clamped taps) computes exactly what the
    general kernel's model computes, in float64, NCHW and channels-last alike (numpy models of both)."""
    lay = layer(("X", "", "", "Z"), mode=mode, coordinate_transformation_mode=coord)
    x = rng.standard_normal(x_shape)
    g = geometry(lay, {"X": x.astype(np.float32), "Z": np.array(y_shape, np.int64)}, y_shape)
    assert g.fast_axes() is not None
    np.testing.assert_array_equal(fast_kernel_model(g, x), kernel_model(g, x))
    np.testing.assert_allclose(kernel_model(g, x), reference(lay, {"X": x, "Z": np.array(y_shape, np.int64)}),
                               rtol=1e-12, atol=1e-12)


def test_fast_kernel_model_with_device_scales_gives_the_general_models_bits():
    lay = layer(mode="linear")
    x, s = rng.standard_normal((2, 3, 5, 8)), np.array([1, 1, 1.7, 0.6], np.float32)
    g = geometry(lay, {"X": x.astype(np.float32), "S": s}, (2, 3, 8, 4))
    assert g.src == 1 and g.fast_axes() == (2, 3)
    np.testing.assert_array_equal(fast_kernel_model(g, x, s), kernel_model(g, x, s))
