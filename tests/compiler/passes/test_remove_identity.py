import numpy as np

from .passes_testkit import graph, node, op_counts, run_and_compare

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import remove_identity


def test_identity_is_removed_and_its_readers_read_its_input():
    g = graph([node("Relu", ["x"], "r"), node("Identity", ["r"], "i"), node("Exp", ["i"], "y")], {"x": (4,)}, ["y"])
    out, changed = run_and_compare(g, remove_identity)
    assert changed and op_counts(out) == {"Relu": 1, "Exp": 1}
    assert out.nodes[1].inputs == ["r"]


def test_identity_feeding_a_graph_output_keeps_the_output_name():
    g = graph([node("Relu", ["x"], "r"), node("Identity", ["r"], "y")], {"x": (4,)}, ["y"])
    out, _ = run_and_compare(g, remove_identity)
    assert op_counts(out) == {"Relu": 1} and out.nodes[0].outputs == ["y"] and out.outputs == ["y"]


def test_identity_from_graph_input_to_graph_output_stays():
    g = graph([node("Identity", ["x"], "y")], {"x": (4,)}, ["y"])
    assert not remove_identity(g)


def test_kept_tensor_is_not_renamed_away():
    g = graph([node("Relu", ["x"], "r"), node("Identity", ["r"], "i"), node("Exp", ["i"], "y")], {"x": (4,)}, ["y"])
    remove_identity(g, keep=frozenset({"i"}))
    assert any("i" in n.outputs for n in g.nodes)


def test_inference_dropout_is_removed():
    g = graph([node("Dropout", ["x", "ratio"], "d"), node("Exp", ["d"], "y")], {"x": (3, 2)}, ["y"],
              {"ratio": np.array(0.5, np.float32)})
    out, _ = run_and_compare(g, remove_identity)
    assert op_counts(out) == {"Exp": 1}


def test_dropout_whose_mask_is_read_stays():
    g = graph([node("Dropout", ["x"], ["d", "mask"]), node("Exp", ["d"], "y")], {"x": (3,)}, ["y", "mask"])
    assert not remove_identity(g)


def test_cast_to_the_same_dtype_goes_and_a_real_cast_stays():
    g = graph([node("Cast", ["x"], "c", to=1), node("Cast", ["c"], "h", to=10), node("Cast", ["h"], "y", to=1)],
              {"x": (3,)}, ["y"])
    out, _ = run_and_compare(g, remove_identity)
    assert [n.attrs["to"] for n in out.nodes] == [10, 1]


def test_reshape_to_the_same_shape_is_removed():
    g = graph([node("Reshape", ["x", "s"], "r"), node("Reshape", ["r", "s2"], "y")], {"x": (2, 3)}, ["y"],
              {"s": np.array([2, 3], np.int64), "s2": np.array([3, 2], np.int64)})
    out, _ = run_and_compare(g, remove_identity)
    assert len(out.nodes) == 1 and out.nodes[0].inputs[0] == "x"


def test_identity_transpose_goes_and_a_real_transpose_stays():
    g = graph([node("Transpose", ["x"], "t", perm=[0, 1]), node("Transpose", ["t"], "y", perm=[1, 0])],
              {"x": (2, 3)}, ["y"])
    out, _ = run_and_compare(g, remove_identity)
    assert [n.attrs["perm"] for n in out.nodes] == [[1, 0]]


def test_noop_expand_tile_and_pad_are_removed():
    g = graph([node("Expand", ["x", "shape"], "e"), node("Tile", ["e", "reps"], "t"),
               node("Pad", ["t", "pads"], "p"), node("Exp", ["p"], "y")], {"x": (2, 3)}, ["y"],
              {"shape": np.array([2, 3], np.int64), "reps": np.array([1, 1], np.int64),
               "pads": np.zeros(4, np.int64)})
    out, _ = run_and_compare(g, remove_identity)
    assert op_counts(out) == {"Exp": 1}


def test_a_slice_keeping_everything_goes_and_a_reversing_one_stays():
    big = np.array([2**63 - 1], np.int64)
    g = graph([node("Slice", ["x", "zero", "big", "ax"], "s"), node("Slice", ["s", "m1", "low", "ax", "m1"], "r"),
               node("Exp", ["r"], "y")], {"x": (4, 3)}, ["y"],
              {"zero": np.array([0], np.int64), "big": big, "ax": np.array([0], np.int64),
               "m1": np.array([-1], np.int64), "low": -big})
    out, _ = run_and_compare(g, remove_identity)
    assert op_counts(out) == {"Slice": 1, "Exp": 1} and out.nodes[0].inputs[0] == "x"


def test_fused_body_reading_a_removed_identity_is_renamed():
    body = [{"op": "Neg", "inputs": ["i"], "outputs": ["n"], "attrs": {}},
            {"op": "Exp", "inputs": ["n"], "outputs": ["y"], "attrs": {}}]
    g = graph([node("Relu", ["x"], "r"), node("Identity", ["r"], "i"),
               node("Pointwise", ["i"], "y", domain=POLYKIT_DOMAIN, body=body, fused_from=["neg", "exp"])],
              {"x": (4,)}, ["y"])
    out, _ = run_and_compare(g, remove_identity)
    assert out.nodes[1].attrs["body"][0]["inputs"] == ["r"]


def test_reshape_between_named_and_symbolic_dims_is_compared_not_crashed_on():
    """A dim a shape rule could only name (a str, as Range with an unknown limit gives) equals only
    itself: a Reshape from it to a build's SymInt dim stays, one to the same name goes."""
    from polykit.compiler.ir.graph import Value
    from polykit.compiler.ir.symbolic import SymInt, symbol

    g = graph([node("Relu", ["x"], "r"), node("Reshape", ["r", "shape"], "s"), node("Exp", ["s"], "y")],
              {"x": (4,)}, ["y"], {"shape": np.array([4], np.int64)})
    g.set_value(Value("r", np.dtype(np.float32), ("range(n)",)))
    g.set_value(Value("s", np.dtype(np.float32), (SymInt(4, symbol("n")),)))
    assert not remove_identity(g)
    g.set_value(Value("s", np.dtype(np.float32), ("range(n)",)))
    assert remove_identity(g) and op_counts(g) == {"Relu": 1, "Exp": 1}
