import json

import numpy as np

from .passes_testkit import graph, node, op_counts, run_and_compare

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import fuse_pointwise

PW = f"{POLYKIT_DOMAIN}:Pointwise"


def test_a_chain_becomes_one_pointwise_node_in_the_documented_format():
    g = graph([node("Add", ["x", "b"], "s", name="add0"), node("Sigmoid", ["s"], "g", name="sig0"),
               node("Mul", ["g", "x"], "y", name="mul0")], {"x": (2, 3), "b": (3,)}, ["y"])
    out, changed = run_and_compare(g, fuse_pointwise)
    (pw,) = out.nodes
    assert changed and (pw.op_type, pw.domain) == ("Pointwise", POLYKIT_DOMAIN)
    assert pw.inputs == ["x", "b"] and pw.outputs == ["y"]
    assert pw.attrs["body"] == [
        {"op": "Add", "inputs": ["x", "b"], "outputs": ["s"], "attrs": {}},
        {"op": "Sigmoid", "inputs": ["s"], "outputs": ["g"], "attrs": {}},
        {"op": "Mul", "inputs": ["g", "x"], "outputs": ["y"], "attrs": {}},
    ]
    assert pw.attrs["fused_from"] == ["add0", "sig0", "mul0"]
    json.dumps(pw.attrs)


def test_a_diamond_of_single_consumer_ops_fuses():
    g = graph([node("Add", ["x", "x"], "a"), node("Sigmoid", ["a"], "s"), node("Mul", ["a", "s"], "y")],
              {"x": (4,)}, ["y"])
    out, _ = run_and_compare(g, fuse_pointwise)
    assert op_counts(out) == {PW: 1}


def test_an_intermediate_read_outside_the_group_is_not_fused_away():
    g = graph([node("Exp", ["x"], "e"), node("Neg", ["e"], "n"), node("Abs", ["n"], "y"),
               node("Softmax", ["e"], "z")], {"x": (2, 3)}, ["y", "z"])
    out, _ = run_and_compare(g, fuse_pointwise)
    assert op_counts(out) == {"Exp": 1, PW: 1, "Softmax": 1}


def test_a_kept_intermediate_becomes_an_extra_output():
    g = graph([node("Exp", ["x"], "e"), node("Neg", ["e"], "n"), node("Abs", ["n"], "y")], {"x": (2, 3)}, ["y"])
    fuse_pointwise(g, keep=frozenset({"n"}))
    (pw,) = g.nodes
    assert pw.outputs == ["y", "n"]


def test_broadcast_inputs_and_const_clip_bounds_are_node_inputs():
    g = graph([node("Mul", ["x", "scale"], "m"), node("Clip", ["m", "lo", "hi"], "c"), node("Add", ["c", "b"], "y")],
              {"x": (2, 3, 4), "b": (1, 3, 1)}, ["y"],
              {"scale": np.array([0.5, 1.0, 2.0, 4.0], np.float32), "lo": np.array(-1, np.float32),
               "hi": np.array(1, np.float32)})
    out, _ = run_and_compare(g, fuse_pointwise)
    (pw,) = out.nodes
    assert pw.inputs == ["x", "scale", "lo", "hi", "b"]


def test_mixed_dtypes_with_compare_where_and_cast_fuse():
    g = graph([node("Greater", ["x", "zero"], "pos"), node("Where", ["pos", "x", "zero"], "r"),
               node("Cast", ["r"], "y", to=10)], {"x": (5,)}, ["y"], {"zero": np.array(0, np.float32)})
    out, _ = run_and_compare(g, fuse_pointwise)
    assert op_counts(out) == {PW: 1} and out.value("y").dtype == np.float16


def test_a_single_elementwise_op_is_left_alone():
    g = graph([node("Relu", ["x"], "r"), node("Softmax", ["r"], "y")], {"x": (2, 3)}, ["y"])
    assert not fuse_pointwise(g)
