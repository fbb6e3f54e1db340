"""Shape chains of real exports under optimization profiles (issue 33): each pattern, written with
onnx.helper, builds one cpu plan that matches onnxruntime at the profile's min, an odd shape and max."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.profiles import Profile
from polykit.errors import BuildError, ShapeError
from polykit.runtime.engine import Runtime
from polykit.tools.cli.app import main
from tests.cli_models import fresh_plugins  # noqa: F401  (pytest fixture)
from tests.dynamic_models import convnet

NCHW = ["b", "c", "h", "w"]


def _model(nodes, consts=None, x_dims=NCHW, x_type=TensorProto.FLOAT, out_type=TensorProto.FLOAT,
           opset=17) -> onnx.ModelProto:
    """One input "x" (dims `x_dims`, named dims dynamic), one output "y" of unknown shape."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (consts or {}).items()]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", x_type, x_dims)],
                              [helper.make_tensor_value_info("y", out_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _feed(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-9, 10, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _convert(model, profile, tmp_path) -> bytes:
    """The plan `polykit convert --target cpu --trt-min/opt/max-shapes x:[...]` writes for `model`."""
    source, plan = tmp_path / "model.onnx", tmp_path / "model.plan"
    onnx.save_model(model, str(source))
    flags = [arg for flag, shape in zip(("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes"), profile)
             for arg in (flag, "x:[" + ",".join(map(str, shape)) + "]")]
    assert main(["convert", str(source), "-o", str(plan), "--target", "cpu", *flags]) == 0
    return plan.read_bytes()


def serves(model, profile, shapes, dtype=np.float32, atol=1e-5, tmp_path=None, target="cpu"):
    """Build `model` on `target` for Profile `profile` of input "x" (through `polykit convert` when
    `tmp_path` is given) and run it at each of `shapes` against onnxruntime (shape and values)."""
    plan = _convert(model, profile, tmp_path) if tmp_path is not None else \
        build_plan(model, BuilderConfig(target=target, profiles=[Profile({"x": profile})],
                                        builder_optimization_level=0 if target == "cpu" else 3)).serialize()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        for shape in shapes:
            feeds = {"x": _feed(shape, dtype)}
            got = ctx.execute(feeds)["y"]
            want = session.run(["y"], feeds)[0]
            assert got.shape == want.shape, (shape, got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol, err_msg=str(shape))


def _op(op, inputs, out, **attrs):
    return helper.make_node(op, inputs, [out], **attrs)


def _ints(**consts) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.int64) for k, v in consts.items()}


# ---- the patterns: one small model per cause ---------------------------------------------------
IMAGE_PROFILE = ((1, 3, 8, 8), (2, 3, 16, 16), (3, 3, 20, 20))
IMAGE_SHAPES = [(1, 3, 8, 8), (2, 3, 11, 13), (3, 3, 20, 20)]
WINDOW = 7


def relu_model() -> onnx.ModelProto:
    """Cause 6: dynamic (b, c, h, w), a profile that moves only b."""
    return _model([_op("Relu", ["x"], "y")])


def resize_scales_model(scale: float = 2.0, mode: str = "nearest") -> onnx.ModelProto:
    """Cause 1: F.interpolate(x, scale_factor=scale)."""
    return _model([_op("Resize", ["x", "", "scales"], "y", mode=mode)],
                  {"scales": np.array([1, 1, scale, scale], np.float32)})


def resize_sizes_model() -> onnx.ModelProto:
    """Cause 1: F.interpolate(x, size=(2h, w + 3)): Shape -> Slice -> Mul/Add -> Concat -> Resize(sizes)."""
    nodes = [_op("Shape", ["x"], "s"), _op("Slice", ["s", "zero", "two"], "nc"),
             _op("Gather", ["s", "two"], "h"), _op("Mul", ["h", "two"], "h2"),
             _op("Gather", ["s", "three"], "w"), _op("Add", ["w", "three"], "w3"),
             _op("Concat", ["nc", "h2", "w3"], "sizes", axis=0), _op("Resize", ["x", "", "", "sizes"], "y", mode="linear")]
    return _model(nodes, _ints(zero=[0], two=[2], three=[3]))


def swin_pad_model() -> onnx.ModelProto:
    """Cause 2: F.pad(x, (0, (-W) % 7, 0, (-H) % 7)) as the TorchScript exporter writes it: Shape -> Gather
    -> Neg -> Mod -> Concat -> Reshape (4, 2) -> Slice reversed -> Transpose -> Reshape -> Cast -> Pad."""
    nodes = [_op("Shape", ["x"], "s"),
             _op("Gather", ["s", "i2"], "h"), _op("Neg", ["h"], "nh"), _op("Mod", ["nh", "window"], "ph"),
             _op("Gather", ["s", "i3"], "w"), _op("Sub", ["zero", "w"], "nw"), _op("Mod", ["nw", "window"], "pw"),
             _op("Concat", ["zero", "pw", "zero", "ph"], "p4", axis=0),  # torch's order: last dim first
             _op("ConstantOfShape", ["four"], "z4", value=helper.make_tensor("z", TensorProto.INT64, [1], [0])),
             _op("Concat", ["p4", "z4"], "p8", axis=0), _op("Reshape", ["p8", "shape42"], "p42"),
             _op("Slice", ["p42", "m1", "low", "zero", "m1"], "rev"), _op("Transpose", ["rev"], "t", perm=[1, 0]),
             _op("Reshape", ["t", "m1"], "flat"), _op("Cast", ["flat"], "pads", to=TensorProto.INT64),
             _op("Pad", ["x", "pads"], "y")]
    return _model(nodes, _ints(i2=[2], i3=[3], window=[WINDOW], zero=[0], four=[4], shape42=[4, 2], m1=[-1],
                               low=[-(2 ** 62)]))


def window_partition_model() -> onnx.ModelProto:
    """Cause 3: x.view(B, H // 7, 7, W // 7, 7, C)... .reshape(B * (H // 7) * (W // 7), 49 * C, -1): Div and
    Mul of static dims read by Shape() times the dynamic batch."""
    nodes = [_op("Shape", ["x"], "s"), _op("Gather", ["s", "i0"], "b"),
             _op("Gather", ["s", "i2"], "h"), _op("Div", ["h", "window"], "nh"),
             _op("Gather", ["s", "i3"], "w"), _op("Div", ["w", "window"], "nw"),
             _op("Mul", ["nh", "nw"], "windows"), _op("Mul", ["b", "windows"], "bw"),
             _op("Unsqueeze", ["bw", "i0v"], "bw1"),
             _op("Concat", ["bw1", "c49", "m1"], "target", axis=0), _op("Reshape", ["x", "target"], "y")]
    return _model(nodes, _ints(i0=0, i2=2, i3=3, window=WINDOW, i0v=[0], c49=[3 * 49], m1=[-1]))


def resize_recomputed_sizes_model() -> onnx.ModelProto:
    """Cause 1: F.interpolate(x, scale_factor=1.5, recompute_scale_factor=True): sizes floor(float(h) * 1.5)
    computed in float (Shape -> Slice -> Cast -> Mul -> Floor -> Cast -> Concat -> Resize(sizes))."""
    nodes = [_op("Shape", ["x"], "s"), _op("Slice", ["s", "zero", "two"], "nc"), _op("Slice", ["s", "two", "four"], "hw"),
             _op("Cast", ["hw"], "f", to=TensorProto.FLOAT), _op("Mul", ["f", "scale"], "m"), _op("Floor", ["m"], "fl"),
             _op("Cast", ["fl"], "hw2", to=TensorProto.INT64), _op("Concat", ["nc", "hw2"], "sizes", axis=0),
             _op("Resize", ["x", "", "", "sizes"], "y", mode="linear")]
    return _model(nodes, {**_ints(zero=[0], two=[2], four=[4]), "scale": np.array([1.5, 1.5], np.float32)})


#: pattern -> (model, profile of "x", shapes run: min, odd ones, max)
PATTERNS = {
    "batch_only_relu": (relu_model, ((1, 4, 8, 8), (2, 4, 8, 8), (3, 4, 8, 8)),
                        [(1, 4, 8, 8), (2, 4, 8, 8), (3, 4, 8, 8)]),
    "resize_scale_2_nearest": (resize_scales_model, IMAGE_PROFILE, IMAGE_SHAPES),
    "resize_scale_0.5_linear": (lambda: resize_scales_model(0.5, "linear"), IMAGE_PROFILE, IMAGE_SHAPES),
    "resize_scale_1.5_nearest": (lambda: resize_scales_model(1.5, "nearest"), IMAGE_PROFILE, IMAGE_SHAPES),
    "resize_scale_0.7_linear": (lambda: resize_scales_model(0.7, "linear"), IMAGE_PROFILE, IMAGE_SHAPES),
    "resize_sizes_from_shape": (resize_sizes_model, IMAGE_PROFILE, IMAGE_SHAPES),
    "resize_recomputed_sizes": (resize_recomputed_sizes_model, IMAGE_PROFILE, IMAGE_SHAPES),
    "swin_pad": (swin_pad_model, ((1, 3, 8, 8), (2, 3, 16, 14), (3, 3, 28, 29)),
                 [(1, 3, 8, 8), (2, 3, 13, 9), (3, 3, 28, 29)]),
    "window_partition_batch_only": (window_partition_model, ((1, 3, 14, 21), (2, 3, 14, 21), (4, 3, 14, 21)),
                                    [(1, 3, 14, 21), (3, 3, 14, 21), (4, 3, 14, 21)]),
}


@pytest.mark.usefixtures("fresh_plugins")
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_pattern_built_by_convert_for_a_profile_matches_onnxruntime_at_min_odd_and_max(pattern, tmp_path):
    make, profile, shapes = PATTERNS[pattern]
    serves(make(), profile, shapes, tmp_path=tmp_path)


def test_resnet_with_dynamic_image_dims_builds_for_a_batch_only_profile():
    model = convnet()
    plan = build_plan(model, BuilderConfig(target="cpu", builder_optimization_level=0,
                                           profiles=[Profile({"image": ((1, 3, 32, 32), (2, 3, 32, 32),
                                                                        (4, 3, 32, 32))})]))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for batch in (1, 3, 4):
            feeds = {"image": _feed((batch, 3, 32, 32))}
            got = ctx.execute(feeds)["logits"]
            np.testing.assert_allclose(got, session.run(["logits"], feeds)[0], rtol=1e-4, atol=1e-4)


def test_resize_of_chosen_axes_scales_only_those():
    model = _model([_op("Resize", ["x", "", "scales"], "y", mode="nearest", axes=[3, 2])],
                   {"scales": np.array([3.0, 2.0], np.float32)}, opset=18)
    serves(model, IMAGE_PROFILE, IMAGE_SHAPES)


def test_resize_that_keeps_the_aspect_ratio_of_dynamic_dims_is_an_error_naming_the_resize():
    nodes = [_op("Resize", ["x", "", "", "sizes"], "r", mode="nearest", axes=[2, 3],
                 keep_aspect_ratio_policy="not_larger"),
             helper.make_node("Relu", ["r"], ["y"], name="after")]
    model = _model(nodes, {"sizes": np.array([32, 32])}, opset=18)
    with pytest.raises(ShapeError) as info:
        build_plan(model, BuilderConfig(target="cpu", profiles=[Profile({"x": IMAGE_PROFILE})]))
    assert "Resize" in info.value.where and "keep_aspect_ratio_policy" in info.value.what


# ---- cause 2, 3: every op of shape chains is evaluated over symbolic dims ---------------------------
HWC = ["b", "h", "w"]
HWC_PROFILE = ((1, 4, 6), (2, 8, 12), (3, 12, 20))
HWC_SHAPES = [(1, 4, 6), (3, 5, 7)]


#: op -> the nodes computing shape vector "v" (int64, elements >= 0) from "s" = Shape(x), x of dims (b, h, w)
VALUE_CASES = {
    "Shape": [],
    "Identity": [_op("Identity", ["s"], "v")],
    "Add": [_op("Add", ["s", "k123"], "v")],
    "Sub": [_op("Sub", ["s", "k012"], "v")],
    "Mul": [_op("Mul", ["s", "k213"], "v")],
    "Div": [_op("Div", ["s", "k124"], "v")],
    "Neg": [_op("Neg", ["s"], "n"), _op("Add", ["n", "k_big"], "v")],
    "Abs": [_op("Neg", ["s"], "n"), _op("Abs", ["n"], "v")],
    "Mod": [_op("Neg", ["s"], "n"), _op("Mod", ["n", "k7"], "v")],  # Swin's (-W) % window
    "Max": [_op("Max", ["s", "k2_6_10", "k213"], "v")],
    "Min": [_op("Min", ["s", "k2_6_10"], "v")],
    "Equal": [_op("Equal", ["s", "km1"], "c"), _op("Where", ["c", "k123", "s"], "v")],
    "Where": [_op("Greater", ["s", "k012"], "c"), _op("Where", ["c", "s", "k123"], "v")],
    "Less": [_op("Less", ["s", "k0"], "c"), _op("Where", ["c", "k123", "s"], "v")],
    "Greater": [_op("Greater", ["s", "k0"], "c"), _op("Where", ["c", "s", "k123"], "v")],
    "LessOrEqual": [_op("LessOrEqual", ["s", "k0"], "c"), _op("Where", ["c", "k123", "s"], "v")],
    "GreaterOrEqual": [_op("GreaterOrEqual", ["s", "k0"], "c"), _op("Where", ["c", "s", "k123"], "v")],
    "Gather": [_op("Gather", ["s", "i20"], "v")],
    "Slice": [_op("Slice", ["s", "k1", "k3"], "v")],
    "Concat": [_op("Slice", ["s", "k0", "k1"], "b"), _op("Concat", ["b", "k5"], "v", axis=0)],
    "Unsqueeze": [_op("Unsqueeze", ["s", "k0"], "u"), _op("Reshape", ["u", "km1"], "v")],
    "Squeeze": [_op("Unsqueeze", ["s", "k0"], "u"), _op("Squeeze", ["u", "k0"], "v")],
    "Reshape": [_op("Reshape", ["s", "k31"], "r"), _op("Reshape", ["r", "km1"], "v")],
    "Transpose": [_op("Concat", ["s", "k123"], "sk", axis=0), _op("Reshape", ["sk", "k23"], "r"),
                  _op("Transpose", ["r"], "t", perm=[1, 0]), _op("Reshape", ["t", "km1"], "v")],  # (b, 1, h, 2, w, 3)
    "Flatten": [_op("Reshape", ["s", "k31"], "r"), _op("Flatten", ["r"], "f", axis=0),
                _op("Reshape", ["f", "km1"], "v")],
    "Split": [helper.make_node("Split", ["s", "k12"], ["first", "v"], axis=0)],
    "Expand": [_op("Slice", ["s", "k0", "k1"], "b"), _op("Expand", ["b", "k2"], "v")],
    "Tile": [_op("Slice", ["s", "k1", "k2"], "h"), _op("Tile", ["h", "k2"], "v")],
    "Cast": [_op("Cast", ["s"], "c32", to=TensorProto.INT32), _op("Cast", ["c32"], "v", to=TensorProto.INT64)],
    "CastLike": [_op("CastLike", ["s", "k0"], "v")],
    "Size": [_op("Size", ["x"], "n"), _op("Unsqueeze", ["n", "k0"], "v")],
    # float arithmetic of dims (int(h * 0.7), ceil(w / 3 + 0.5)): Cast -> Mul/Div/Add/Sub/Neg -> Floor/Ceil -> Cast
    "Floor": [_op("Cast", ["s"], "f", to=TensorProto.FLOAT), _op("Mul", ["f", "f07"], "m"),
              _op("Sub", ["m", "f05"], "d"), _op("Floor", ["d"], "fl"), _op("Cast", ["fl"], "v", to=TensorProto.INT64)],
    "Ceil": [_op("Cast", ["s"], "f", to=TensorProto.FLOAT), _op("Div", ["f", "f3"], "q"), _op("Neg", ["q"], "n"),
             _op("Add", ["n", "f20"], "a"), _op("Ceil", ["a"], "c"), _op("Cast", ["c"], "v", to=TensorProto.INT64)],
    # torchvision's detection transform: floor(d * (12 * (1 / d))) in float32 (11 or 12, as d rounds)
    "Reciprocal": [_op("Cast", ["s"], "f", to=TensorProto.FLOAT), _op("Reciprocal", ["f"], "r"),
                   _op("Mul", ["r", "f12"], "q"), _op("Mul", ["f", "q"], "m"), _op("Floor", ["m"], "fl"),
                   _op("Cast", ["fl"], "v", to=TensorProto.INT64)],
    "ReduceProd": [_op("ReduceProd", ["s"], "v", axes=[0], keepdims=1)],
    "ReduceSum": [_op("ReduceSum", ["s", "k0"], "v", keepdims=1)],
    "ReduceMax": [_op("ReduceMax", ["s"], "v", axes=[0], keepdims=1)],
    "ReduceMin": [_op("ReduceMin", ["s"], "v", axes=[0], keepdims=1)],
}

VALUE_CONSTS = {"f07": np.array([1.0, 0.7, 0.7], np.float32), "f05": np.array([0.0, 0.5, 0.5], np.float32),
                "f3": np.array([1.0, 3.0, 3.0], np.float32), "f20": np.array([20.0, 20.0, 30.0], np.float32),
                "f12": np.full(3, 12.0, np.float32),
                **{name: np.array(v, np.int64) for name, v in {
    "k0": [0], "k1": [1], "k2": [2], "k3": [3], "k5": [5], "k7": [7], "km1": [-1], "k12": [1, 2], "k31": [3, 1], "k23": [2, 3],
    "k123": [1, 2, 3], "k012": [0, 1, 2], "k213": [2, 1, 3], "k124": [1, 2, 4], "k2_6_10": [2, 6, 10],
    "k_big": [20, 20, 30], "i20": [2, 0]}.items()}}


def value_model(op: str) -> onnx.ModelProto:
    """x (b, h, w) -> s = Shape(x) -> VALUE_CASES[op] -> v; y = ConstantOfShape(v, 1) * sum(x): a
    tensor whose shape is v's values, which the build needs as expressions of b, h and w."""
    nodes = [_op("Shape", ["x"], "s" if VALUE_CASES[op] else "v"), *VALUE_CASES[op],
             _op("ConstantOfShape", ["v"], "ones", value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])),
             _op("ReduceSum", ["x"], "total", keepdims=0), _op("Mul", ["ones", "total"], "y")]
    return _model(nodes, VALUE_CONSTS, x_dims=HWC, opset=17)


@pytest.mark.parametrize("op", sorted(VALUE_CASES))
def test_shape_chain_op_is_evaluated_over_dim_expressions(op):
    serves(value_model(op), HWC_PROFILE, HWC_SHAPES, atol=1e-4)


def test_the_table_of_evaluated_ops_is_the_set_tested_one_by_one():
    from polykit.compiler.graph.shape_values import EVALUATED_OPS

    assert EVALUATED_OPS == set(VALUE_CASES)


def test_integer_div_truncates_toward_zero_and_mod_with_fmod_takes_the_dividends_sign():
    nodes = [_op("Shape", ["x"], "s"), _op("Neg", ["s"], "n"),
             _op("Div", ["n", "k124"], "q"), _op("Mod", ["n", "k124b"], "r", fmod=1),  # trunc(-h/2), fmod(-w, 5)
             _op("Mul", ["q", "r"], "qr"), _op("Abs", ["qr"], "v"),
             _op("ConstantOfShape", ["v"], "y", value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))]
    consts = {**VALUE_CONSTS, "k124b": np.array([3, 4, 5], np.int64)}
    serves(_model(nodes, consts, x_dims=HWC), HWC_PROFILE, [(1, 4, 6), (3, 5, 7), (2, 11, 19)])


# ---- errors name the node that stopped the expression ------------------------------------------------
def _ones_of(shape_tensor):
    return _op("ConstantOfShape", [shape_tensor], "y", value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))


def test_a_shape_chain_op_without_dim_expressions_is_an_error_naming_the_consumer_and_the_op():
    nodes = [_op("Shape", ["x"], "s"), _op("Cast", ["s"], "f", to=TensorProto.FLOAT), _op("Sqrt", ["f"], "root"),
             _op("Floor", ["root"], "fl"), _op("Cast", ["fl"], "v", to=TensorProto.INT64), _ones_of("v")]
    with pytest.raises(BuildError) as info:
        build_plan(_model(nodes, x_dims=HWC), BuilderConfig(target="cpu", profiles=[Profile({"x": HWC_PROFILE})]))
    assert "ConstantOfShape" in info.value.where
    assert "'root'" in info.value.what and "Sqrt is not evaluated over symbolic dims" in info.value.what


def test_a_sign_decided_at_opt_that_flips_in_the_profile_names_the_node_that_decided_it():
    nodes = [_op("Shape", ["x"], "s"), _op("Sub", ["s", "k10"], "d"), _op("Abs", ["d"], "v"), _ones_of("v")]
    model = _model([*nodes[:2], helper.make_node("Abs", ["d"], ["v"], name="decides"), nodes[3]],
                   {"k10": np.array([0, 10, 0], np.int64)}, x_dims=HWC)  # |h - 10|: 10 - h at opt (h = 8)
    with pytest.raises(BuildError) as info:
        build_plan(model, BuilderConfig(target="cpu", profiles=[Profile({"x": HWC_PROFILE})]))
    assert "'decides'" in info.value.where and "max" in info.value.what
