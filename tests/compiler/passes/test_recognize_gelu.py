import math

import numpy as np

from .passes_testkit import graph, node, op_counts, run_and_compare, scalar

from polykit.compiler.passes import recognize_gelu

C = {"sqrt2": scalar(math.sqrt(2)), "inv_sqrt2": scalar(1 / math.sqrt(2)), "one": scalar(1.0), "half": scalar(0.5),
     "beta": scalar(math.sqrt(2 / math.pi)), "kappa": scalar(0.044715), "three": scalar(3.0)}


def _check(nodes, approximate=None, rtol=1e-5):
    g = graph(nodes, {"x": (2, 8)}, ["y"], C)
    out, changed = run_and_compare(g, recognize_gelu, rtol=rtol, atol=1e-5)
    assert changed and op_counts(out) == {"Gelu": 1}
    (gelu,) = out.nodes
    assert gelu.inputs == ["x"] and gelu.outputs == ["y"]
    assert gelu.attrs.get("approximate", "none") == (approximate or "none")


def test_torch_erf_export_is_recognized():
    # torch.onnx (TorchScript) gelu: Div -> Erf -> Add 1 -> Mul x -> Mul 0.5
    _check([node("Div", ["x", "sqrt2"], "d"), node("Erf", ["d"], "e"), node("Add", ["e", "one"], "a"),
            node("Mul", ["x", "a"], "m"), node("Mul", ["m", "half"], "y")])


def test_hf_erf_variant_with_half_first_and_inverse_sqrt2_is_recognized():
    _check([node("Mul", ["x", "half"], "h"), node("Mul", ["inv_sqrt2", "x"], "d"), node("Erf", ["d"], "e"),
            node("Add", ["one", "e"], "a"), node("Mul", ["a", "h"], "y")])


def test_torch_tanh_export_with_mul_cube_is_recognized():
    # torch.onnx gelu(approximate="tanh"): x*(x*x), kappa*cube, x+., beta*., Tanh, 1+., x*., half*.
    _check([node("Mul", ["x", "x"], "xx"), node("Mul", ["x", "xx"], "cube"), node("Mul", ["kappa", "cube"], "kc"),
            node("Add", ["x", "kc"], "s"), node("Mul", ["beta", "s"], "inner"), node("Tanh", ["inner"], "t"),
            node("Add", ["one", "t"], "a"), node("Mul", ["x", "a"], "m"), node("Mul", ["half", "m"], "y")], "tanh")


def test_hf_gelu_new_with_pow_is_recognized():
    _check([node("Mul", ["half", "x"], "h"), node("Pow", ["x", "three"], "p"), node("Mul", ["kappa", "p"], "kc"),
            node("Add", ["x", "kc"], "s"), node("Mul", ["s", "beta"], "inner"), node("Tanh", ["inner"], "t"),
            node("Add", ["t", "one"], "a"), node("Mul", ["h", "a"], "y")], "tanh")


def test_wrong_constant_is_not_recognized():
    g = graph([node("Div", ["x", "sqrt2"], "d"), node("Erf", ["d"], "e"), node("Add", ["e", "one"], "a"),
               node("Mul", ["x", "a"], "m"), node("Mul", ["m", "wrong"], "y")], {"x": (4,)}, ["y"],
              {**C, "wrong": scalar(0.6)})
    assert not recognize_gelu(g)


def test_intermediate_read_elsewhere_blocks_the_rewrite():
    g = graph([node("Div", ["x", "sqrt2"], "d"), node("Erf", ["d"], "e"), node("Add", ["e", "one"], "a"),
               node("Mul", ["x", "a"], "m"), node("Mul", ["m", "half"], "y")], {"x": (4,)}, ["y", "e"], C)
    assert not recognize_gelu(g)
