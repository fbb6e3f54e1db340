"""Dims computed through float arithmetic (polykit.compiler.graph.dim_floats): a plan evaluates them with
the graph's float32 rounding at every step, as onnxruntime does, so it agrees with onnxruntime at the
image sizes where float32 and exact arithmetic give different dims. Each test finds such sizes with
numpy first and asserts that they differ, so it proves the case it runs."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.symbolic import FLOAT_OPS, ShapeEvalError, bounds, evaluate, expr_from_json, expr_to_json, \
    remainder_size
from polykit.compiler.plan.profiles import Profile
from polykit.runtime.engine import Runtime
from tests.compiler.test_dynamic_shape_chains import _model, _op, serves

F32 = np.float32
SIDES = (4, 64)  # the profile's range of h and w
PROFILE = ((1, 1, 4, 4), (1, 1, 16, 16), (1, 1, 64, 64))
SMALL, LARGE = 20.0, 40.0  # torchvision's min_size / max_size, scaled down


def _spread(found: list, count: int = 4) -> list:
    """`count` of `found`, first to last."""
    assert found, "no size in the profile where float32 and exact arithmetic differ"
    return [found[i * (len(found) - 1) // max(count - 1, 1)] for i in range(count)]


# ---- torchvision's GeneralizedRCNNTransform: floor(d * min(20 / min(h, w), 40 / max(h, w))) -> Resize(sizes) --
def transform_model():
    """Shape -> Slice [h, w] -> ReduceMin/ReduceMax -> Cast float -> Reciprocal -> Mul by min/max size ->
    Min -> (Cast h, w float) Mul -> Floor -> Cast int64 -> Concat -> Resize(sizes), as the exporter writes it."""
    nodes = [_op("Shape", ["x"], "s"), _op("Slice", ["s", "k2", "k4"], "hw"),
             _op("ReduceMin", ["hw"], "lo", keepdims=0), _op("Cast", ["lo"], "lof", to=TensorProto.FLOAT),
             _op("Reciprocal", ["lof"], "rlo"), _op("Mul", ["rlo", "small"], "s1"),
             _op("ReduceMax", ["hw"], "hi", keepdims=0), _op("Cast", ["hi"], "hif", to=TensorProto.FLOAT),
             _op("Reciprocal", ["hif"], "rhi"), _op("Mul", ["rhi", "large"], "s2"),
             _op("Min", ["s1", "s2"], "scale"), _op("Cast", ["hw"], "hwf", to=TensorProto.FLOAT),
             _op("Mul", ["hwf", "scale"], "scaled"), _op("Floor", ["scaled"], "fl"),
             _op("Cast", ["fl"], "size", to=TensorProto.INT64), _op("Slice", ["s", "k0", "k2"], "nc"),
             _op("Concat", ["nc", "size"], "sizes", axis=0),
             _op("Resize", ["x", "", "", "sizes"], "y", mode="linear")]
    consts = {"k0": np.array([0], np.int64), "k2": np.array([2], np.int64), "k4": np.array([4], np.int64),
              "small": np.array(SMALL, np.float32), "large": np.array(LARGE, np.float32)}
    return _model(nodes, consts)


def _transform_sizes(h: int, w: int, exact: bool) -> tuple[int, int]:
    if exact:
        scale = min(Fraction(int(SMALL), min(h, w)), Fraction(int(LARGE), max(h, w)))
        return math.floor(h * scale), math.floor(w * scale)
    scale = min(F32(1) / F32(min(h, w)) * F32(SMALL), F32(1) / F32(max(h, w)) * F32(LARGE))
    return int(np.floor(F32(h) * scale)), int(np.floor(F32(w) * scale))


def test_detection_transform_resize_matches_onnxruntime_where_float32_and_exact_sizes_differ():
    grid = [(h, w) for h in range(SIDES[0], SIDES[1] + 1) for w in range(SIDES[0], SIDES[1] + 1)]
    differ = [hw for hw in grid if _transform_sizes(*hw, exact=False) != _transform_sizes(*hw, exact=True)]
    shapes = [(1, 1, h, w) for h, w in _spread(differ)]
    # (4, 64) resizes to (2, 40): wider than at any corner (all (20, 20)), so the plan reserves the bound
    serves(transform_model(), PROFILE, shapes + [(1, 1, 4, 64), (1, 1, 64, 4), (1, 1, 23, 37)], atol=1e-4)


# ---- Div / Mul / Floor / Ceil round trips and a Cast that truncates ------------------------------------------
def _ones_of(v: str):
    return _op("ConstantOfShape", [v], "y", value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))


ROUND_TRIPS = {
    # v = [floor(h / 7 * 7), ceil(w / 7 * 7)]: exactly [h, w], in float32 one less / more at some sizes
    "div-mul-floor-ceil": ([_op("Div", ["hwf", "seven"], "q"), _op("Mul", ["q", "seven"], "m"),
                            _op("Floor", ["m"], "fl"), _op("Ceil", ["m"], "ce"),
                            _op("Concat", ["fl", "ce"], "both", axis=0), _op("Gather", ["both", "pick"], "vf"),
                            _op("Cast", ["vf"], "v", to=TensorProto.INT64)],
                           lambda d, exact: (d if exact else int(np.floor(F32(d[0]) / F32(7) * F32(7))),
                                             d[1] if exact else int(np.ceil(F32(d[1]) / F32(7) * F32(7))))),
    # v = trunc(d * 0.3 / 0.3): a Cast to int64 truncates what float32 leaves just below d
    "mul-div-cast": ([_op("Mul", ["hwf", "p3"], "m"), _op("Div", ["m", "p3"], "q"),
                      _op("Cast", ["q"], "v", to=TensorProto.INT64)],
                     lambda d, exact: tuple(d) if exact else tuple(int(F32(x) * F32(0.3) / F32(0.3)) for x in d)),
}


@pytest.mark.parametrize("case", sorted(ROUND_TRIPS))
def test_float_round_trip_of_dims_matches_onnxruntime_where_float32_and_exact_differ(case):
    chain, sizes = ROUND_TRIPS[case]
    nodes = [_op("Shape", ["x"], "s"), _op("Slice", ["s", "k0", "k2"], "hw"),
             _op("Cast", ["hw"], "hwf", to=TensorProto.FLOAT), *chain, _ones_of("v")]
    consts = {"k0": np.array([0], np.int64), "k2": np.array([2], np.int64), "seven": np.array(7.0, np.float32),
              "p3": np.array(0.3, np.float32), "pick": np.array([0, 3], np.int64)}
    model = _model(nodes, consts, x_dims=["h", "w"])
    grid = [(h, w) for h in range(SIDES[0], SIDES[1] + 1) for w in range(SIDES[0], SIDES[1] + 1)]
    differ = [hw for hw in grid if sizes(hw, False) != sizes(hw, True)]
    serves(model, ((4, 4), (16, 16), (64, 64)), _spread(differ))


# ---- the expressions: evaluation, their plan form, bounds -------------------------------------------------
SCALE = ["fmin", ["f*", ["f/", ["f32", 1.0], ["f32", ["min", "h", "w"]]], ["f32", SMALL]],
         ["f*", ["f/", ["f32", 1.0], ["f32", ["max", "h", "w"]]], ["f32", LARGE]]]
RESIZED_H = ["floor", ["f*", ["f32", "h"], SCALE]]


def test_a_float_expression_evaluates_with_float32_rounding_at_every_step():
    term = expr_from_json(RESIZED_H, {"h", "w"})
    for h in range(SIDES[0], SIDES[1] + 1):
        for w in range(SIDES[0], SIDES[1] + 1):
            assert evaluate(term, {"h": h, "w": w}) == _transform_sizes(h, w, exact=False)[0]


def test_float_expression_survives_its_json_form():
    term = expr_from_json(RESIZED_H, {"h", "w"})
    assert expr_from_json(expr_to_json(term), {"h", "w"}) == term


@pytest.mark.parametrize("bad, why", [
    (["f+", "h", 1], "gives a float where an int"),            # a float op as a dim
    (["floor", "h"], "is not a float operation"),              # floor of an int
    (["+", ["f32", "h"], 1], "gives a float where an int"),     # a float inside int arithmetic
    (["trunc", ["f32", 1e300]], "not finite or is beyond"),     # a float constant past the plan's bound
    (["floor", ["f*", ["f32", "h"]]], "takes 2 args"),
])
def test_a_plan_expression_that_mixes_floats_and_ints_is_refused(bad, why):
    with pytest.raises(ValueError, match=why):
        expr_from_json(bad, {"h"})


def test_a_float_division_by_zero_is_a_shape_eval_error():
    with pytest.raises(ShapeEvalError, match="division by zero"):
        evaluate(expr_from_json(["floor", ["f/", ["f32", 1.0], ["f32", "h"]]], {"h"}), {"h": 0})


def test_bounds_of_a_float_expression_hold_every_value_in_the_ranges():
    term = expr_from_json(RESIZED_H, {"h", "w"})
    low, high = bounds(term, {"h": SIDES, "w": SIDES})
    values = [evaluate(term, {"h": h, "w": w}) for h in range(SIDES[0], SIDES[1] + 1) for w in range(SIDES[0], SIDES[1] + 1)]
    assert low <= min(values) and max(values) <= high
    assert max(values) > max(evaluate(term, {"h": d, "w": d}) for d in (4, 16, 64))  # the corners miss it
    corners = [{"h": d, "w": d} for d in (4, 16, 64)]
    assert remainder_size([term], corners) >= max(values)


def test_every_float_op_is_exercised_by_name():
    assert set(FLOAT_OPS) == {"f32", "f64", "f+", "f-", "f*", "f/", "fmin", "fmax", "floor", "ceil", "trunc"}
    two = {"h": 2}
    for op, args, want in [("f+", [["f32", "h"], ["f32", 0.5]], 2), ("f-", [["f32", "h"], ["f32", 0.5]], 1),
                           ("fmax", [["f32", "h"], ["f32", 3.5]], 3), ("fmin", [["f32", "h"], ["f32", 3.5]], 2)]:
        assert evaluate(expr_from_json(["trunc", [op, *args]], {"h"}), two) == want
    assert evaluate(expr_from_json(["ceil", ["f64", ["f/", ["f32", "h"], ["f32", 3.0]]]], {"h"}), two) == 1


def test_a_loaded_plan_shares_equal_subexpressions_and_binds_the_shapes_the_built_one_gives():
    """Plan loading makes equal dim subexpressions one object (the scale every resized dim holds), so
    the binder evaluates each once per shape set; the shapes are those of the plan as built."""
    from polykit.compiler.ir.symbolic import Expr
    from polykit.runtime.engine import Runtime
    from polykit.runtime.shapes import ShapeBinder

    built = build_plan(transform_model(), BuilderConfig(target="cpu", profiles=[Profile({"x": PROFILE})]))
    with Runtime().deserialize_engine(built.serialize()) as engine:
        loaded = engine.plan
    quotients: dict[str, set[int]] = {}

    def walk(term):
        if isinstance(term, Expr):
            if term.op == "f/":
                quotients.setdefault(str(term), set()).add(id(term))
            for arg in term.args:
                walk(arg)

    for t in loaded.tensors.values():
        for d in t.dims:
            walk(d)
    assert quotients and all(len(ids) == 1 for ids in quotients.values())
    for shape in ((1, 1, 4, 64), (1, 1, 23, 37), (1, 1, 64, 64)):
        assert ShapeBinder(loaded).bind({"x": shape}).shapes == ShapeBinder(built).bind({"x": shape}).shapes


# ---- cuda (the lead's GPU session) ---------------------------------------------------------------------------
@pytest.mark.gpu
def test_detection_transform_resize_on_cuda_where_float32_and_exact_sizes_differ():
    grid = [(h, w) for h in range(SIDES[0], SIDES[1] + 1) for w in range(SIDES[0], SIDES[1] + 1)]
    differ = [hw for hw in grid if _transform_sizes(*hw, exact=False) != _transform_sizes(*hw, exact=True)]
    serves(transform_model(), PROFILE, [(1, 1, h, w) for h, w in _spread(differ)] + [(1, 1, 4, 64)], atol=1e-4,
           target="cuda")


@pytest.mark.gpu
def test_faster_rcnn_with_a_dynamic_image_size_on_cuda(tmp_path):
    """benchmarks/dynamic_exports.py's Faster R-CNN (torchvision, random weights) exported with a dynamic
    image size: one cuda plan matches onnxruntime at min, odd, max and the float32-rounding sizes."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from benchmarks.dynamic_exports import check_one, export

    name = "fasterrcnn_mobilenet_v3_large_320_fpn"
    export(name, tmp_path)
    result = check_one(tmp_path, name, "cuda", 3)
    assert result["passed"], result.get("error")
    assert sum(label.startswith("f32 ") for label in result["runs"]) == 4


# ---- Resize by scales the graph computes from the dims ----------------------------------------------------
def test_resize_by_a_scale_computed_from_the_dims_sizes_its_output_as_onnxruntime():
    """scale = 20 * (1 / h) in float32 -> Resize(scales = [1, 1, scale, scale]): onnxruntime's output
    dims are trunc(scale * d) in float32 (19 where the exact 20 * h / h is 20), an expression of h and w."""
    nodes = [_op("Shape", ["x"], "s"), _op("Gather", ["s", "i2"], "h"), _op("Cast", ["h"], "hf", to=TensorProto.FLOAT),
             _op("Reciprocal", ["hf"], "r"), _op("Mul", ["r", "twenty"], "scale"),
             _op("Unsqueeze", ["scale", "k0"], "sv"), _op("Concat", ["ones", "sv", "sv"], "scales", axis=0),
             _op("Resize", ["x", "", "scales"], "y", mode="nearest")]
    consts = {"i2": np.array(2, np.int64), "k0": np.array([0], np.int64), "twenty": np.array(20.0, np.float32),
              "ones": np.array([1.0, 1.0], np.float32)}

    def dims(h, w, exact):
        if exact:
            return 20, math.floor(Fraction(20 * w, h))
        scale = F32(1) / F32(h) * F32(20)
        return int(scale * F32(h)), int(scale * F32(w))

    grid = [(h, w) for h in range(SIDES[0], SIDES[1] + 1) for w in range(SIDES[0], SIDES[1] + 1)]
    differ = [hw for hw in grid if dims(*hw, exact=False) != dims(*hw, exact=True)]
    serves(_model(nodes, consts), PROFILE, [(1, 1, h, w) for h, w in _spread(differ)] + [(1, 1, 4, 64)])


def test_float_arithmetic_of_a_static_dim_beside_a_dynamic_one():
    """Shape (h, 6) -> float -> * 0.7 -> Ceil -> Reciprocal -> ... : the static element stays a plain
    float32 through every op, the dynamic one a float expression."""
    nodes = [_op("Shape", ["x"], "s"), _op("Cast", ["s"], "f", to=TensorProto.FLOAT), _op("Mul", ["f", "p7"], "m"),
             _op("Ceil", ["m"], "c"), _op("Reciprocal", ["c"], "r"), _op("Mul", ["r", "twelve"], "q"),
             _op("Neg", ["q"], "n"), _op("Neg", ["n"], "p"), _op("Floor", ["p"], "fl"),
             _op("Cast", ["fl"], "v", to=TensorProto.INT64), _ones_of("v")]
    consts = {"p7": np.array(0.7, np.float32), "twelve": np.array(12.0, np.float32)}
    serves(_model(nodes, consts, x_dims=["h", 6]), ((1, 6), (8, 6), (30, 6)), [(1, 6), (7, 6), (13, 6), (30, 6)])


def test_a_data_symbol_bounded_through_a_float_dim_reserves_its_upper_bound():
    """A filter's count bounded by a resized (float) dim, and a second filter over what it kept: both
    reserve the bound over the profile's ranges, not the corners' values."""
    from polykit.compiler.ir.symbolic import symbol

    resized = expr_from_json(RESIZED_H, {"h", "w"})
    data = {"data(a)[0]": resized, "data(b)[0]": symbol("data(a)[0]")}  # in bound order
    corners = [{"h": d, "w": d, "data(a)[0]": evaluate(resized, {"h": d, "w": d})} for d in (4, 16, 64)]
    for env in corners:
        env["data(b)[0]"] = env["data(a)[0]"]
    high = bounds(resized, {"h": SIDES, "w": SIDES})[1]
    assert high > max(env["data(a)[0]"] for env in corners)
    assert remainder_size([symbol("data(b)[0]"), 3], corners, data) == 3 * high


# ---- the transform's batching after the resize: Pad to a multiple of DIVISIBLE (issue 33 on cuda) -------------
DIVISIBLE = 4  # torchvision's size_divisible (32), scaled down: every corner resizes to 20 x 20, which pads nothing


def padded_transform_model():
    """transform_model's Resize, then torchvision's _onnx_batch_images: Shape [h, w] -> Cast float -> / 4 ->
    Ceil -> * 4 -> Cast int64 -> - [h, w] -> pads -> Pad. Square corners pad nothing; 19 x 19 (float32
    rounding) pads both axes, 30 x 16 (37 x 20) the height alone."""
    model = transform_model()
    resize = model.graph.node[-1]
    resize.output[0] = "resized"
    model.graph.node.extend([
        _op("Shape", ["resized"], "rs"), _op("Slice", ["rs", "k2", "k4"], "rhw"),
        _op("Cast", ["rhw"], "rhwf", to=TensorProto.FLOAT), _op("Div", ["rhwf", "divisible"], "q"),
        _op("Ceil", ["q"], "qc"), _op("Mul", ["qc", "divisible"], "padded"),
        _op("Cast", ["padded"], "phw", to=TensorProto.INT64), _op("Sub", ["phw", "rhw"], "grow"),
        _op("Concat", ["zeros6", "grow"], "pads", axis=0), _op("Pad", ["resized", "pads"], "y")])
    model.graph.initializer.extend([numpy_helper.from_array(np.array(float(DIVISIBLE), np.float32), "divisible"),
                                    numpy_helper.from_array(np.zeros(6, np.int64), "zeros6")])
    return model


def _padded_sizes() -> list:
    """Sizes of the profile where the float32 resize differs from the exact one and the Pad grows a
    leading axis (the height), none of which any corner does."""
    grid = [(h, w) for h in range(SIDES[0], SIDES[1] + 1) for w in range(SIDES[0], SIDES[1] + 1)]
    found = [hw for hw in grid if _transform_sizes(*hw, exact=False) != _transform_sizes(*hw, exact=True)
             and _transform_sizes(*hw, exact=False)[0] % DIVISIBLE]
    corners = [_transform_sizes(d, d, exact=False) for d in (PROFILE[0][2], PROFILE[1][2], PROFILE[2][2])]
    assert all(h % DIVISIBLE == 0 and w % DIVISIBLE == 0 for h, w in corners)
    return [(1, 1, h, w) for h, w in _spread(found)] + [(1, 1, 30, 16)]


def test_a_cuda_plan_built_without_a_gpu_gives_each_layer_a_tactic_that_serves_the_padded_sizes():
    """The cuda plan (built here, no GPU) binds onnxruntime's shapes at the sizes where the Pad grows the
    height, and every layer's tactic serves its layer at those shapes (its `serves`, else its `supports`: the
    builder's witness points, polykit.compiler.plan.witnesses, ask it there; pad_last serves them through its
    fallback to the generic pad kernel)."""
    from polykit.compiler.plan.file import Plan
    from polykit.compiler.plan.profiles import at_corner, tensors_at
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.shapes import ShapeBinder

    model = padded_transform_model()
    plan = Plan.deserialize(build_plan(model, BuilderConfig(target="cuda", profiles=[Profile({"x": PROFILE})],
                                                            builder_optimization_level=3)).serialize())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    binder = ShapeBinder(plan)
    for shape in _padded_sizes():
        bound = binder.bind({"x": shape})
        want = session.run(["y"], {"x": np.zeros(shape, np.float32)})[0].shape
        assert bound.shapes[plan.outputs[0]] == want, shape
        at = tensors_at(plan.tensors, bound.dims)
        for layer in plan.layers:
            tactic = find_tactic(plan.target, layer.kind, layer.tactic)
            assert tactic is not None and (tactic.serves or tactic.supports)(at_corner(layer, at)), \
                (shape, layer.name, layer.tactic)


def test_the_padded_transform_matches_onnxruntime_where_float32_and_exact_sizes_differ():
    serves(padded_transform_model(), PROFILE, _padded_sizes() + [(1, 1, 16, 16), (1, 1, 64, 4)], atol=1e-4)


@pytest.mark.gpu
def test_the_padded_transform_on_cuda_where_the_pad_grows_the_height():
    serves(padded_transform_model(), PROFILE, _padded_sizes() + [(1, 1, 16, 16), (1, 1, 64, 4)], atol=1e-4,
           target="cuda")


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_half_precision_build_keeps_the_float_dims_in_float32(target):
    """fp16 converts float32 activations to half, not the float32 values the host computes from the input
    dims (the transform's scale): in half the sizes that follow them were unknown (Faster R-CNN's fp16
    build failed, benchmarks/dynamic_screen.py) and would round otherwise than the model's float32.
    The cuda plan is built here without a GPU: its bound shapes are the cpu plan's."""
    grid = [(h, w) for h in range(SIDES[0], SIDES[1] + 1) for w in range(SIDES[0], SIDES[1] + 1)]
    differ = [hw for hw in grid if _transform_sizes(*hw, exact=False) != _transform_sizes(*hw, exact=True)]
    from polykit.runtime.shapes import ShapeBinder

    plan = build_plan(transform_model(), BuilderConfig(target=target, profiles=[Profile({"x": PROFILE})],
                                                       builder_optimization_level=0, fp16=True))
    binder = ShapeBinder(plan)
    for h, w in _spread(differ):
        assert binder.bind({"x": (1, 1, h, w)}).shapes["y"] == (1, 1, *_transform_sizes(h, w, exact=False))


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_half_precision_plan_resizes_to_onnxruntime_s_sizes(target):
    grid = [(h, w) for h in range(SIDES[0], SIDES[1] + 1) for w in range(SIDES[0], SIDES[1] + 1)]
    differ = [hw for hw in grid if _transform_sizes(*hw, exact=False) != _transform_sizes(*hw, exact=True)]
    plan = build_plan(transform_model(), BuilderConfig(target=target, profiles=[Profile({"x": PROFILE})],
                                                       builder_optimization_level=0, fp16=True))
    session = ort.InferenceSession(transform_model().SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for h, w in _spread(differ):
            feeds = {"x": rng.random((1, 1, h, w), dtype=np.float32)}
            got, want = ctx.execute(feeds)["y"], session.run(["y"], feeds)[0]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=2e-3)  # the image in half: inputs within 1, 11 bits
