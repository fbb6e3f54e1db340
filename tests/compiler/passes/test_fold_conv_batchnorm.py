import numpy as np
import pytest

from .passes_testkit import graph, node, op_counts, run_and_compare

from polykit.compiler.passes import fold_conv_batchnorm

RNG = np.random.default_rng(3)


def _bn_params(c):
    return {"scale": RNG.uniform(0.5, 2, c).astype(np.float32), "beta": RNG.standard_normal(c).astype(np.float32),
            "mean": RNG.standard_normal(c).astype(np.float32), "var": RNG.uniform(0.5, 2, c).astype(np.float32)}


def _bn(x, y, **attrs):
    return node("BatchNormalization", [x, "scale", "beta", "mean", "var"], y, **attrs)


@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_then_batchnorm_becomes_one_conv(with_bias):
    inits = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), **_bn_params(4)}
    conv_inputs = ["x", "w"]
    if with_bias:
        inits["b"] = RNG.standard_normal(4).astype(np.float32)
        conv_inputs.append("b")
    g = graph([node("Conv", conv_inputs, "c", pads=[1, 1, 1, 1]), _bn("c", "y", epsilon=1e-3)],
              {"x": (2, 3, 5, 5)}, ["y"], inits)
    out, changed = run_and_compare(g, fold_conv_batchnorm, rtol=1e-4, atol=1e-5)
    assert changed and op_counts(out) == {"Conv": 1} and out.nodes[0].outputs == ["y"]
    assert len(out.nodes[0].inputs) == 3


def test_batchnorm_in_training_mode_is_not_folded():
    g = graph([node("Conv", ["x", "w"], "c"), _bn("c", "y", training_mode=1)], {"x": (1, 2, 4, 4)}, ["y"],
              {"w": np.ones((2, 2, 1, 1), np.float32), **_bn_params(2)}, strict=False)
    assert not fold_conv_batchnorm(g)


def test_conv_output_read_elsewhere_is_not_folded():
    g = graph([node("Conv", ["x", "w"], "c"), _bn("c", "y"), node("Relu", ["c"], "z")], {"x": (1, 2, 4, 4)},
              ["y", "z"], {"w": np.ones((2, 2, 1, 1), np.float32), **_bn_params(2)})
    assert not fold_conv_batchnorm(g)


def test_matmul_then_batchnorm_becomes_gemm():
    g = graph([node("MatMul", ["x", "w"], "m"), _bn("m", "y")], {"x": (5, 3)}, ["y"],
              {"w": RNG.standard_normal((3, 4)).astype(np.float32), **_bn_params(4)})
    out, _ = run_and_compare(g, fold_conv_batchnorm, rtol=1e-4, atol=1e-5)
    assert op_counts(out) == {"Gemm": 1}


def test_gemm_with_transposed_weights_and_bias_folds_batchnorm():
    g = graph([node("Gemm", ["x", "w", "c"], "m", transB=1, alpha=0.5, beta=2.0), _bn("m", "y")], {"x": (5, 3)}, ["y"],
              {"w": RNG.standard_normal((4, 3)).astype(np.float32), "c": RNG.standard_normal(4).astype(np.float32),
               **_bn_params(4)})
    out, _ = run_and_compare(g, fold_conv_batchnorm, rtol=1e-4, atol=1e-5)
    assert op_counts(out) == {"Gemm": 1}
