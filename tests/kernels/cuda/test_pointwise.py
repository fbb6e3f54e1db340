"""The pointwise code generator: geometry and codegen on the host, every op on the GPU vs its reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.pointwise import pointwise as pw
from polykit.kernels.cuda.pointwise import pointwise_signatures as pws
from polykit.kernels.cuda.pointwise.pointwise_expr import emit_expression

rng = np.random.default_rng(11)


def rand(shape, dtype=np.float32, lo=-3.0, hi=3.0):
    x = rng.uniform(lo, hi, size=shape)
    x[np.abs(x) < 1e-3] = 0.5  # never zeros
    return x.astype(dtype)


def layer(kind, inputs, attrs=None, precision="fp32", outputs=("Y",)):
    return LayerDesc(f"l_{kind}", kind, tuple(inputs), tuple(outputs), dict(attrs or {}), precision=precision)


# ---- host side (no GPU) -------------------------------------------------------------------------

def test_broadcast_geometry_merges_contiguous_dims_into_one():
    n, dims, strides, zm = pw.broadcast_geometry([(2, 3, 4), (2, 3, 4)], 1)
    assert (n, dims, strides, zm) == (24, [24], [[1], [1]], [0])


def test_broadcast_geometry_gives_zero_strides_on_broadcast_dims():
    n, dims, strides, _ = pw.broadcast_geometry([(3, 1, 5), (4, 5), (3, 4, 5)], 1)
    assert n == 60 and dims == [3, 4, 5]
    assert strides == [[5, 0, 1], [0, 5, 1], [20, 5, 1]]


def test_broadcast_geometry_masks_output_smaller_than_iteration_space():
    _, dims, strides, zm = pw.broadcast_geometry([(4, 5), (4, 1), (4, 5)], 2)
    assert dims == [4, 5] and strides[1] == [1, 0] and zm == [2, 0]


def test_emit_expression_chains_body_values_in_order():
    body = [{"op": "Mul", "inputs": ["a", "b"], "outputs": ["t"], "attrs": {}},
            {"op": "Gelu", "inputs": ["t"], "outputs": ["y"], "attrs": {"approximate": "tanh"}}]
    code, env = emit_expression(body, {"a": "A", "b": "B"})
    assert "auto v0 = pk_mul(A, B);" in code and "auto v1 = pk_gelu_tanh(v0);" in code
    assert env["y"] == "v1"


def test_emit_expression_rejects_unknown_op_with_polykit_error():
    from polykit.errors import PolykitError

    with pytest.raises(PolykitError, match="Conv"):
        emit_expression([{"op": "Conv", "inputs": ["a"], "outputs": ["y"]}], {"a": "A"})


def test_candidate_signatures_put_plan_float_type_first():
    assert pw.candidate_signatures(layer("Add", "ab", precision="fp16"))[0] == (("float16", "float16"), ("float16",))
    assert pw.candidate_signatures(layer("Add", "ab"))[0] == (("float32", "float32"), ("float32",))


def test_candidate_signatures_cover_int64_mask_cast_to_float():
    body = [{"op": "Cast", "inputs": ["m"], "outputs": ["f"], "attrs": {"to": 1}},
            {"op": "Mul", "inputs": ["f", "x"], "outputs": ["y"], "attrs": {}}]
    lay = LayerDesc("p", "Pointwise", ("m", "x"), ("y",), {"body": body}, domain="ai.polykit")
    assert (("int64", "float32"), ("float32",)) in pw.candidate_signatures(lay)


@pytest.mark.parametrize("base,exp", [("float32", "uint32"), ("float32", "uint64"), ("int32", "float32"),
                                      ("int64", "float32"), ("float16", "int16"), ("int64", "int32")])
def test_candidate_signatures_cover_onnx_pow_mixed_operand_pairs(base, exp):
    assert ((base, exp), (base,)) in pw.candidate_signatures(layer("Pow", "ab"))


def test_candidate_signatures_keep_mask_casts_to_the_usual_alternatives():
    body = [{"op": "Cast", "inputs": ["m"], "outputs": ["f"], "attrs": {"to": 1}},
            {"op": "Mul", "inputs": ["f", "x"], "outputs": ["y"], "attrs": {}}]
    lay = LayerDesc("p", "Pointwise", ("m", "x"), ("y",), {"body": body}, domain="ai.polykit")
    assert (("uint64", "float32"), ("float32",)) not in pw.candidate_signatures(lay)


def test_candidate_signatures_cover_bfloat16_storage():
    sigs = pw.candidate_signatures(layer("Celu", "x"))
    assert (("bfloat16",), ("bfloat16",)) in sigs
    assert (("float32",), ("bfloat16",)) in pw.candidate_signatures(layer("Cast", "x", {"to": 16}))
    assert (("bfloat16",), ("float32",)) in pw.candidate_signatures(layer("Cast", "x", {"to": 1}))


def test_cast_to_bfloat16_rounds_in_the_float_compute_type():
    code, env = emit_expression([{"op": "Cast", "inputs": ["x"], "outputs": ["y"], "attrs": {"to": 16}}],
                                   {"x": "a"})
    assert "pk_to_bf16(a)" in code


MASK_BODY = [{"op": "Add", "inputs": ["r", "o"], "outputs": ["p"], "attrs": {}},
             {"op": "Less", "inputs": ["p", "n"], "outputs": ["m"], "attrs": {}},
             {"op": "Where", "inputs": ["m", "z", "f"], "outputs": ["y"], "attrs": {}}]
MASK_SIG = (("int64", "int64", "int64", "float32", "float32"), ("float32",))


def mask_layer():
    return LayerDesc("mask", "Pointwise", ("r", "o", "n", "z", "f"), ("y",), {"body": MASK_BODY}, domain="ai.polykit")


def test_candidate_signatures_give_integer_types_to_inputs_that_only_feed_comparisons():
    assert MASK_SIG in pw.candidate_signatures(mask_layer())


def test_inputs_reaching_an_output_keep_the_data_type():
    body = MASK_BODY[:2] + [{"op": "Where", "inputs": ["m", "p", "f"], "outputs": ["y"], "attrs": {}}]
    lay = LayerDesc("m2", "Pointwise", ("r", "o", "n", "f"), ("y",), {"body": body}, domain="ai.polykit")
    assert (("int64", "int64", "int64", "float32"), ("int64",)) not in pw.candidate_signatures(lay)
    assert pws._compare_only_inputs(body, ["r", "o", "n", "f"], ["y"], pws._input_roles(body, ["r", "o", "n", "f"])) \
        == ["n"]


def test_identical_bodies_share_one_module_whatever_the_tensor_names():
    a = pw.pointwise_kernels(layer("Add", ("p", "q"), outputs=("r",)))
    b = pw.pointwise_kernels(layer("Add", ("u", "v"), outputs=("w",)))
    assert a[0].key() == b[0].key() and [k.name for k in a] == [k.name for k in b]


def test_generated_module_compiles_with_nvrtc():
    from cuda.core import Program, ProgramOptions

    src = pw.pointwise_kernels(layer("Sigmoid", "x"))[0].render()
    Program(src, "c++", ProgramOptions(arch="sm_80", std="c++17")).compile("cubin")


def test_pow_module_for_mixed_operand_dtypes_compiles_with_nvrtc():
    from cuda.core import Program, ProgramOptions

    sigs = [(("float32", "uint64"), ("float32",)), (("int32", "float32"), ("int32",)),
            (("int64", "float16"), ("int64",)), (("float16", "uint32"), ("float16",))]
    src = pw.pointwise_kernels(layer("Pow", "ab"), sigs)[0].render()
    Program(src, "c++", ProgramOptions(arch="sm_80", std="c++17")).compile("cubin")


def test_comparison_mask_module_compiles_with_nvrtc():
    from cuda.core import Program, ProgramOptions

    src = pw.pointwise_kernels(mask_layer(), [MASK_SIG])[0].render()
    Program(src, "c++", ProgramOptions(arch="sm_80", std="c++17")).compile("cubin")


def test_bfloat16_modules_compile_with_nvrtc():
    from cuda.core import Program, ProgramOptions

    sigs = [(("bfloat16",), ("bfloat16",)), (("bfloat16",), ("float32",)), (("float32",), ("bfloat16",))]
    for lay in (layer("Celu", "x"), layer("Cast", "x", {"to": 16})):
        sig = [s for s in sigs if s in pw.candidate_signatures(lay)]
        src = pw.pointwise_kernels(lay, sig)[0].render()
        Program(src, "c++", ProgramOptions(arch="sm_80", std="c++17")).compile("cubin")


# ---- GPU ----------------------------------------------------------------------------------------

def prewarm(layers):
    """Compile every module these tests need in parallel (fills the kernel cache once)."""
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.nvrtc import compile_many

    compile_many([k for lay in layers for k in pw.pointwise_kernels(lay)], driver.current_device().arch)


@pytest.fixture(scope="module", autouse=True)
def _warm_cache(request):
    from tests.conftest import gpu_available

    if gpu_available():
        layers = [layer(op, ["X"]) for op in UNARY] + [layer(op, ["A", "B"]) for op in BINARY_OPS]
        layers += [layer(op, ["A", "B"], precision="fp16") for op in ("Add", "Mul", "Div")]
        layers += [layer(op, ["A"], precision="fp16") for op in ("Sigmoid", "Gelu")]
        layers += [layer(op, ["A", "B"], {"fmod": 1} if f else {}) for op in ("Mod",) for f in (0, 1)]
        layers += [layer(op, ["A", "B"]) for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                                                    "And", "Or", "Xor")]
        layers += [layer("Cast", ["X"], {"to": t}) for t in (10, 1, 7, 9, 6)]
        layers += [layer(op, ["A", "B", "C"]) for op in ("Sum", "Mean", "Max", "Min", "Where")]
        prewarm(layers)
    yield

def check(lay, inputs, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    if not tol:
        tol = {"rtol": 1e-5, "atol": 1e-6}
    return assert_matches_reference(lay, inputs, **tol)


UNARY_DOMAIN = {"Log": (0.1, 5), "Sqrt": (0.1, 5), "Acosh": (1.1, 5), "Asin": (-0.9, 0.9), "Acos": (-0.9, 0.9),
                "Atanh": (-0.9, 0.9), "Reciprocal": (0.2, 3), "Tan": (-1.2, 1.2)}
UNARY = ["Abs", "Neg", "Sqrt", "Exp", "Log", "Erf", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos",
         "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Tanh", "Relu", "Sigmoid",
         "HardSwish", "Softplus", "Softsign", "Mish", "Identity", "Elu", "Selu", "Celu", "Gelu", "HardSigmoid",
         "ThresholdedRelu", "Shrink"]
SHAPES = [(1,), (7,), (3, 5, 17), (64, 129), (4, 256)]


@pytest.mark.gpu
@pytest.mark.parametrize("op", UNARY)
@pytest.mark.parametrize("shape", SHAPES)
def test_unary_op_matches_reference_fp32(op, shape):
    lo, hi = UNARY_DOMAIN.get(op, (-3, 3))
    check(layer(op, ["X"]), {"X": rand(shape, lo=lo, hi=hi)}, rtol=2e-6, atol=2e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("op,attrs", [("LeakyRelu", {"alpha": 0.3}), ("Elu", {"alpha": 0.7}), ("Celu", {"alpha": 2.0}),
                                      ("Gelu", {"approximate": "tanh"}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
                                      ("Shrink", {"bias": 0.2, "lambd": 0.8}), ("ThresholdedRelu", {"alpha": 0.5})])
def test_activation_attributes_are_honoured(op, attrs):
    check(layer(op, ["X"], attrs), {"X": rand((5, 33))}, rtol=2e-6, atol=2e-6)


BINARY_OPS = ["Add", "Sub", "Mul", "Div", "Max", "Min", "PRelu", "Pow"]
BINARY_SHAPES = [((7,), (7,)), ((3, 1, 5), (4, 5)), ((2, 3, 4, 5), (1,)), ((1,), (5, 3)), ((16, 33), (33,)),
                 ((8, 64), (8, 64)), ((2, 1, 6, 1), (1, 5, 1, 3))]


@pytest.mark.gpu
@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize("a_shape,b_shape", BINARY_SHAPES)
def test_broadcasting_binary_op_matches_reference_fp32(op, a_shape, b_shape):
    if op == "PRelu" and np.broadcast_shapes(a_shape, b_shape) != a_shape:
        a_shape = np.broadcast_shapes(a_shape, b_shape)  # the slope broadcasts one way only
    a = rand(a_shape, lo=0.2, hi=3) if op == "Pow" else rand(a_shape)
    check(layer(op, ["A", "B"]), {"A": a, "B": rand(b_shape)}, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["Add", "Mul", "Sigmoid", "Gelu", "Div"])
@pytest.mark.parametrize("a_shape,b_shape", [((3, 1, 5), (4, 5)), ((8, 64), (8, 64)), ((9,), (1,))])
def test_fp16_storage_computes_in_fp32(op, a_shape, b_shape):
    ins = ["A", "B"] if op in ("Add", "Mul", "Div") else ["A"]
    feeds = {"A": rand(a_shape, np.float16), "B": rand(b_shape, np.float16)}
    check(layer(op, ins, precision="fp16"), {k: feeds[k] for k in ins}, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8])
@pytest.mark.parametrize("op,attrs", [("Add", {}), ("Sub", {}), ("Mul", {}), ("Div", {}), ("Max", {}), ("Min", {}),
                                      ("Mod", {}), ("Mod", {"fmod": 1})])
def test_integer_binary_op_matches_reference(dtype, op, attrs):
    a = rng.integers(1, 100, size=(5, 7)).astype(dtype)
    b = rng.integers(1, 9, size=(7,)).astype(dtype)
    if np.issubdtype(dtype, np.signedinteger) and op != "Mod":
        a = (a - 50).astype(dtype)
    check(layer(op, ["A", "B"], attrs), {"A": a, "B": b}, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_comparison_yields_bool(op):
    a = rng.integers(-3, 3, size=(4, 9)).astype(np.float32)
    b = rng.integers(-3, 3, size=(9,)).astype(np.float32)
    check(layer(op, ["A", "B"]), {"A": a, "B": b}, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic_on_bool_tensors(op):
    a, b = rng.random((6, 5)) > 0.5, rng.random((5,)) > 0.5
    check(layer(op, ["A", "B"]), {"A": a, "B": b}, rtol=0, atol=0)


@pytest.mark.gpu
def test_not_and_isnan_isinf():
    check(layer("Not", ["A"]), {"A": rng.random((37,)) > 0.5}, rtol=0, atol=0)
    x = rand((41,))
    x[::5], x[1::7], x[2::9] = np.nan, np.inf, -np.inf
    check(layer("IsNaN", ["X"]), {"X": x}, rtol=0, atol=0)
    check(layer("IsInf", ["X"], {"detect_negative": 0}), {"X": x}, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape_c,shape_a,shape_b", [((5, 7), (5, 7), (5, 7)), ((7,), (3, 1, 7), (1,)), ((4, 1), (4, 6), (6,))])
def test_where_broadcasts_condition_and_branches(shape_c, shape_a, shape_b):
    feeds = {"C": rng.random(shape_c) > 0.5, "A": rand(shape_a), "B": rand(shape_b)}
    check(layer("Where", ["C", "A", "B"]), feeds, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("src,to", [(np.float32, 10), (np.float16, 1), (np.float32, 7), (np.int64, 1), (np.float32, 9),
                                    (np.bool_, 1), (np.int32, 7), (np.float32, 6), (np.uint8, 1)])
def test_cast_between_types(src, to):
    if src == np.bool_:
        x = rng.random((6, 11)) > 0.5
    elif np.issubdtype(src, np.integer):
        x = rng.integers(0, 100, size=(6, 11)).astype(src)
    else:
        x = rand((6, 11), src, lo=-50, hi=50)
    check(layer("Cast", ["X"], {"to": to}), {"X": x}, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3), (1000,), (3, 7, 11)])
def test_clip_with_min_max_inputs_and_with_max_omitted(shape):
    x = rand(shape)
    lo, hi = np.array(-0.5, np.float32), np.array(1.25, np.float32)
    check(layer("Clip", ["X", "L", "H"]), {"X": x, "L": lo, "H": hi}, rtol=0, atol=0)
    check(layer("Clip", ["X", "L", ""]), {"X": x, "L": lo}, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic_ops_over_three_broadcast_inputs(op):
    check(layer(op, ["A", "B", "C"]), {"A": rand((3, 4)), "B": rand((4,)), "C": rand((3, 1))}, rtol=1e-6, atol=1e-6)


def gelu_body():
    return [{"op": "Div", "inputs": ["x", "s2"], "outputs": ["t0"], "attrs": {}},
            {"op": "Erf", "inputs": ["t0"], "outputs": ["t1"], "attrs": {}},
            {"op": "Add", "inputs": ["t1", "one"], "outputs": ["t2"], "attrs": {}},
            {"op": "Mul", "inputs": ["x", "t2"], "outputs": ["t3"], "attrs": {}},
            {"op": "Mul", "inputs": ["t3", "bias"], "outputs": ["y"], "attrs": {}}]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1), (2, 5, 33), (8, 768), (3, 4)])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float16, 3e-3)])
def test_fused_body_runs_as_one_kernel(shape, dtype, tol):
    lay = LayerDesc("pw", "Pointwise", ("x", "s2", "one", "bias"), ("y",), {"body": gelu_body()}, domain="ai.polykit",
                    precision="fp16" if dtype == np.float16 else "fp32")
    feeds = {"x": rand(shape, dtype), "s2": np.array(1.4142135, dtype), "one": np.array(1.0, dtype),
             "bias": rand(shape[-1:], dtype)}
    assert len({k.key() for k in pw.pointwise_kernels(lay)}) == 1
    check(lay, feeds, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_fused_body_with_two_outputs_of_different_shapes():
    body = [{"op": "Relu", "inputs": ["a"], "outputs": ["r"], "attrs": {}},
            {"op": "Add", "inputs": ["r", "b"], "outputs": ["y"], "attrs": {}}]
    lay = LayerDesc("pw2", "Pointwise", ("a", "b"), ("r", "y"), {"body": body}, domain="ai.polykit")
    check(lay, {"a": rand((5, 1)), "b": rand((5, 6))}, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("a_dtype,b_dtype", [(np.float32, np.uint32), (np.float32, np.uint64),
                                             (np.int32, np.float32), (np.int64, np.float32)])
def test_pow_with_mixed_operand_dtypes(a_dtype, b_dtype):
    a = rng.integers(1, 5, size=(3, 4)).astype(a_dtype)
    b = rng.integers(0, 4, size=(4,)).astype(b_dtype)
    check(layer("Pow", ["A", "B"]), {"A": a, "B": b}, rtol=1e-6, atol=0)


BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("op,ins", [("Celu", ["A"]), ("Add", ["A", "B"]), ("Sigmoid", ["A"])])
def test_bfloat16_storage_computes_in_fp32(op, ins):
    feeds = {"A": rand((5, 33), BF16), "B": rand((33,), BF16)}
    check(layer(op, ins), {k: feeds[k] for k in ins}, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("src,to", [(np.float32, 16), (BF16, 1), (BF16, 7)])
def test_cast_to_and_from_bfloat16(src, to):
    x = rand((6, 11), src, lo=-50, hi=50)
    check(layer("Cast", ["X"], {"to": to}), {"X": x}, rtol=0, atol=0)


@pytest.mark.gpu
def test_mask_from_integer_positions_selects_float_branches():
    feeds = {"r": np.arange(12, dtype=np.int64).reshape(1, 12), "o": np.array([[0], [3], [7]], np.int64),
             "n": np.array(9, np.int64), "z": np.array(0.0, np.float32), "f": np.array(-np.inf, np.float32)}
    check(mask_layer(), feeds, rtol=0, atol=0)


@pytest.mark.gpu
def test_fused_mask_cast_from_int64():
    body = [{"op": "Cast", "inputs": ["m"], "outputs": ["f"], "attrs": {"to": 1}},
            {"op": "Sub", "inputs": ["one", "f"], "outputs": ["g"], "attrs": {}},
            {"op": "Mul", "inputs": ["g", "big"], "outputs": ["y"], "attrs": {}}]
    lay = LayerDesc("mask", "Pointwise", ("m", "one", "big"), ("y",), {"body": body}, domain="ai.polykit")
    feeds = {"m": rng.integers(0, 2, size=(2, 1, 1, 9)).astype(np.int64), "one": np.array(1.0, np.float32),
             "big": np.array(-10000.0, np.float32)}
    check(lay, feeds, rtol=0, atol=0)
