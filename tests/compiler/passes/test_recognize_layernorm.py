import pytest
import numpy as np

from .passes_testkit import graph, node, op_counts, run_and_compare, scalar

from polykit.compiler.passes import recognize_layernorm

RNG = np.random.default_rng(7)
C = {"axes": np.array([-1], np.int64), "two": scalar(2.0), "eps": scalar(1e-5),
     "gamma": RNG.uniform(0.5, 1.5, 16).astype(np.float32), "beta": RNG.standard_normal(16).astype(np.float32)}


def _stats(square):
    return [node("ReduceMean", ["x", "axes"], "mean"), node("Sub", ["x", "mean"], "d"), square,
            node("ReduceMean", ["sq", "axes"], "var"), node("Add", ["var", "eps"], "ve"), node("Sqrt", ["ve"], "std")]


def test_torch_export_with_gamma_and_beta_is_recognized():
    nodes = _stats(node("Pow", ["d", "two"], "sq")) + [
        node("Div", ["d", "std"], "n"), node("Mul", ["n", "gamma"], "g"), node("Add", ["g", "beta"], "y")]
    g = graph(nodes, {"x": (2, 5, 16)}, ["y"], C)
    out, changed = run_and_compare(g, recognize_layernorm, rtol=1e-4, atol=1e-5)
    assert changed and op_counts(out) == {"LayerNormalization": 1}
    (ln,) = out.nodes
    assert ln.attrs["axis"] == -1 and abs(ln.attrs["epsilon"] - 1e-5) < 1e-9 and ln.outputs == ["y"]


def test_tf_style_mul_square_and_reciprocal_without_affine_is_recognized():
    nodes = _stats(node("Mul", ["d", "d"], "sq")) + [node("Reciprocal", ["std"], "inv"), node("Mul", ["d", "inv"], "y")]
    g = graph(nodes, {"x": (3, 16)}, ["y"], C)
    out, _ = run_and_compare(g, recognize_layernorm, rtol=1e-4, atol=1e-5)
    assert op_counts(out) == {"LayerNormalization": 1}


def test_normalizing_the_last_two_axes_gives_axis_minus_two():
    nodes = _stats(node("Pow", ["d", "two"], "sq")) + [node("Div", ["d", "std"], "y")]
    g = graph(nodes, {"x": (2, 3, 4)}, ["y"], {**C, "axes": np.array([1, 2], np.int64)})
    out, _ = run_and_compare(g, recognize_layernorm, rtol=1e-4, atol=1e-5)
    assert out.nodes[0].attrs["axis"] == -2


def test_reducing_a_leading_axis_is_not_recognized():
    nodes = _stats(node("Pow", ["d", "two"], "sq")) + [node("Div", ["d", "std"], "y")]
    g = graph(nodes, {"x": (2, 3, 4)}, ["y"], {**C, "axes": np.array([1], np.int64)})
    assert not recognize_layernorm(g)


def test_a_kept_intermediate_blocks_the_rewrite():
    nodes = _stats(node("Pow", ["d", "two"], "sq")) + [node("Div", ["d", "std"], "y")]
    g = graph(nodes, {"x": (3, 16)}, ["y"], C)
    assert not recognize_layernorm(g, keep=frozenset({"var"}))


def test_tf_export_with_rsqrt_and_folded_affine_is_recognized():
    # tf2onnx: r = rsqrt(var + eps) * gamma; y = x * r + (beta - mean * r)
    nodes = [node("ReduceMean", ["x", "axes"], "mean"), node("Sub", ["x", "mean"], "d"), node("Mul", ["d", "d"], "sq"),
             node("ReduceMean", ["sq", "axes"], "var"), node("Add", ["var", "eps"], "ve"), node("Sqrt", ["ve"], "std"),
             node("Reciprocal", ["std"], "rstd"), node("Mul", ["rstd", "gamma"], "r"), node("Mul", ["x", "r"], "xr"),
             node("Mul", ["mean", "r"], "mr"), node("Sub", ["beta", "mr"], "shift"), node("Add", ["xr", "shift"], "y")]
    g = graph(nodes, {"x": (2, 5, 16)}, ["y"], C)
    out, changed = run_and_compare(g, recognize_layernorm, rtol=1e-4, atol=1e-5)
    assert changed and op_counts(out) == {"LayerNormalization": 1}
    assert out.nodes[0].inputs[0] == "x" and out.nodes[0].outputs == ["y"]


def _rms(square, inverse, gamma=True, axes=C["axes"]):
    """LLaMA / T5 as exported: ms = ReduceMean(x^2), std = Sqrt(ms + eps), n = x * rsqrt form, y = gamma * n."""
    nodes = [square, node("ReduceMean", ["sq", "axes"], "ms"), node("Add", ["ms", "eps"], "mse"), node("Sqrt", ["mse"], "std")]
    nodes += inverse
    nodes += [node("Mul", ["gamma", "n"], "y")] if gamma else []
    return graph(nodes, {"x": (2, 5, 16)}, ["y" if gamma else "n"], {**C, "one": scalar(1.0), "axes": axes})


RMS_FORMS = {
    "llama: x * (1 / sqrt)": (node("Pow", ["x", "two"], "sq"), [node("Div", ["one", "std"], "inv"), node("Mul", ["x", "inv"], "n")]),
    "x / sqrt": (node("Pow", ["x", "two"], "sq"), [node("Div", ["x", "std"], "n")]),
    "x*x, reciprocal": (node("Mul", ["x", "x"], "sq"), [node("Reciprocal", ["std"], "inv"), node("Mul", ["inv", "x"], "n")]),
}


@pytest.mark.parametrize("form", sorted(RMS_FORMS))
@pytest.mark.parametrize("gamma", [True, False])
def test_rms_norm_forms_become_rms_normalization(form, gamma):
    square, inverse = RMS_FORMS[form]
    out, changed = run_and_compare(_rms(square, inverse, gamma), recognize_layernorm, rtol=1e-4, atol=1e-5)
    assert changed and op_counts(out) == {"RMSNormalization": 1}
    (rms,) = out.nodes
    assert rms.attrs["axis"] == -1 and abs(rms.attrs["epsilon"] - 1e-5) < 1e-9
    assert out.initializers[rms.inputs[1]].shape == (16,)


def test_an_rms_norm_over_a_leading_axis_or_with_a_shared_intermediate_stays():
    square, inverse = RMS_FORMS["x / sqrt"]
    g = _rms(square, inverse, axes=np.array([1], np.int64))  # not the trailing axes
    assert not recognize_layernorm(g)
    g = _rms(square, inverse)
    g.outputs.append("ms")  # the mean square is read outside
    assert not recognize_layernorm(g)
