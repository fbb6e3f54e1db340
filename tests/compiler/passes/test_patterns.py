"""The pattern module the recognizers' rules are written in (passes/patterns.py)."""

from .passes_testkit import graph, node, op_counts, run_and_compare, scalar

from polykit.compiler.ir.graph import Node
from polykit.compiler.passes.patterns import Const, OneOf, Op, Prod, Rule, Scaled, Var, match_at, near, rewrite

SUB_XY = Op("Sub", (Var("x"), Var("y")))
ADD_ONE = Op("Add", (Var("x"), Const(near(1.0), name="one")), commutative=True)


def _root(g, output):
    return next(n for n in g.nodes if output in n.outputs)


def test_a_commutative_binary_op_matches_its_operands_in_either_order():
    for inputs in (["x", "c"], ["c", "x"]):
        g = graph([node("Add", inputs, "y")], {"x": (3,)}, ["y"], {"c": scalar(1.0)})
        m = match_at(g, ADD_ONE, _root(g, "y"))
        assert m is not None and m["x"] == "x" and m.values["one"] == 1.0


def test_a_non_commutative_op_matches_only_in_order():
    g = graph([node("Sub", ["b", "a"], "y")], {"a": (3,), "b": (3,)}, ["y"])
    m = match_at(g, SUB_XY, _root(g, "y"))
    assert (m["x"], m["y"]) == ("b", "a")
    assert match_at(g, Op("Sub", (Var("x"), Const())), _root(g, "y")) is None


def test_a_constant_predicate_decides_the_match():
    g = graph([node("Add", ["x", "c"], "y")], {"x": (3,)}, ["y"], {"c": scalar(2.0)})
    assert match_at(g, ADD_ONE, _root(g, "y")) is None
    assert match_at(g, Op("Add", (Var(), Const(lambda v: v > 1.5)), commutative=True), _root(g, "y")) is not None
    # a tensor that is not a one-element constant never satisfies Const
    g = graph([node("Add", ["x", "z"], "y")], {"x": (3,), "z": (3,)}, ["y"])
    assert match_at(g, Op("Add", (Var(), Const()), commutative=True), _root(g, "y")) is None


def test_a_name_bound_twice_must_be_the_same_tensor():
    square = Op("Mul", (Var("x"), Var("x")))
    g = graph([node("Mul", ["a", "a"], "y"), node("Mul", ["a", "b"], "z")], {"a": (3,), "b": (3,)}, ["y", "z"])
    assert match_at(g, square, _root(g, "y"))["x"] == "a"
    assert match_at(g, square, _root(g, "z")) is None


def test_an_intermediate_with_another_reader_blocks_the_match():
    pattern = Op("Neg", (Op("Exp", (Var("x"),)),))
    g = graph([node("Exp", ["x"], "e"), node("Neg", ["e"], "y")], {"x": (3,)}, ["y"])
    assert match_at(g, pattern, _root(g, "y")) is not None
    g = graph([node("Exp", ["x"], "e"), node("Neg", ["e"], "y"), node("Abs", ["e"], "z")], {"x": (3,)}, ["y", "z"])
    assert match_at(g, pattern, _root(g, "y")) is None


def test_an_intermediate_that_is_a_graph_output_or_kept_blocks_the_match():
    pattern = Op("Neg", (Op("Exp", (Var("x"),)),))
    g = graph([node("Exp", ["x"], "e"), node("Neg", ["e"], "y")], {"x": (3,)}, ["y", "e"])
    assert match_at(g, pattern, _root(g, "y")) is None
    g = graph([node("Exp", ["x"], "e"), node("Neg", ["e"], "y")], {"x": (3,)}, ["y"])
    assert match_at(g, pattern, _root(g, "y"), keep={"e"}) is None


def test_a_diamond_inside_the_pattern_is_one_use_enough():
    d = Op("Sub", (Var("x"), Var("m")), name="d")
    pattern = Op("Div", (d, Op("Abs", (d,))))
    g = graph([node("Sub", ["x", "m"], "d"), node("Abs", ["d"], "a"), node("Div", ["d", "a"], "y")],
              {"x": (3,), "m": (3,)}, ["y"])
    m = match_at(g, pattern, _root(g, "y"))
    assert m is not None and len(m.nodes) == 3


def test_a_product_matches_any_association_and_order_of_its_factors():
    pattern = Prod(Const(near(0.5), name="half"), Var("x"), Op("Exp", (Var("x"),)))
    half = {"h": scalar(0.5)}
    for nodes in ([node("Exp", ["x"], "e"), node("Mul", ["x", "h"], "xh"), node("Mul", ["xh", "e"], "y")],
                  [node("Exp", ["x"], "e"), node("Mul", ["e", "x"], "ex"), node("Mul", ["h", "ex"], "y")],
                  [node("Exp", ["x"], "e"), node("Mul", ["h", "e"], "he"), node("Mul", ["x", "he"], "y")]):
        g = graph(nodes, {"x": (3,)}, ["y"], half)
        m = match_at(g, pattern, _root(g, "y"))
        assert m is not None and m["x"] == "x" and len(m.nodes) == 3


def test_scaled_peels_a_chain_of_constant_factors():
    g = graph([node("Exp", ["x"], "e"), node("Mul", ["e", "two"], "a"), node("Div", ["a", "four"], "y")],
              {"x": (3,)}, ["y"], {"two": scalar(2.0), "four": scalar(4.0)})
    m = match_at(g, Scaled(Op("Exp", (Var("x"),)), "s"), _root(g, "y"))
    assert m is not None and m.values["s"] == 0.5 and m["x"] == "x" and len(m.nodes) == 3
    # a factor read elsewhere ends the peeling: what is left is no Exp
    g = graph([node("Exp", ["x"], "e"), node("Mul", ["e", "two"], "a"), node("Div", ["a", "four"], "y"),
               node("Neg", ["a"], "z")], {"x": (3,)}, ["y", "z"], {"two": scalar(2.0), "four": scalar(4.0)})
    assert match_at(g, Scaled(Op("Exp", (Var("x"),)), "s"), _root(g, "y")) is None


def test_one_of_takes_the_first_option_that_matches():
    pattern = Op("Neg", (OneOf(Op("Exp", (Var("x"),), node="which"), Op("Log", (Var("x"),), node="which")),))
    g = graph([node("Log", ["x"], "l"), node("Neg", ["l"], "y")], {"x": (3,)}, ["y"])
    assert match_at(g, pattern, _root(g, "y")).named["which"].op_type == "Log"


def test_rewrite_replaces_each_match_and_keeps_the_outputs():
    # softsign-like: x / (1 + |x|) -> Softsign
    pattern = Op("Div", (Var("x"), Op("Add", (Op("Abs", (Var("x"),)), Const(near(1.0))), commutative=True)))
    rule = Rule(pattern, lambda m: [Node("Softsign", [m["x"]], [m.root.outputs[0]], {}, name=f"{m.root.name}_ss")])
    nodes = [node("Abs", ["x"], "a"), node("Add", ["one", "a"], "d"), node("Div", ["x", "d"], "y"),
             node("Abs", ["y"], "a2"), node("Add", ["a2", "one"], "d2"), node("Div", ["y", "d2"], "z")]
    g = graph(nodes, {"x": (2, 3)}, ["z"], {"one": scalar(1.0)})
    out, changed = run_and_compare(g, lambda gg: rewrite(gg, [rule]))
    assert changed and op_counts(out) == {"Softsign": 2}


def test_a_larger_match_claims_its_nodes_before_a_smaller_one_inside_it():
    exp = Op("Exp", (Var("x"),))
    rules = [Rule(Op("Neg", (exp,)), lambda m: [Node("Sigmoid", [m["x"]], [m.root.outputs[0]], {}, name="big")]),
             Rule(exp, lambda m: [Node("Relu", [m["x"]], [m.root.outputs[0]], {}, name="small")])]
    g = graph([node("Exp", ["x"], "e"), node("Neg", ["e"], "y")], {"x": (3,)}, ["y"])
    assert rewrite(g, rules) and [n.name for n in g.nodes] == ["big"]


def test_a_rule_whose_accept_refuses_leaves_the_node_to_the_next_rule():
    exp = Op("Exp", (Var("x"),))
    rules = [Rule(exp, lambda m: [Node("Sigmoid", [m["x"]], [m.root.outputs[0]], {}, name="refused")],
                  accept=lambda m: False),
             Rule(exp, lambda m: [Node("Relu", [m["x"]], [m.root.outputs[0]], {}, name="taken")])]
    g = graph([node("Exp", ["x"], "y")], {"x": (3,)}, ["y"])
    assert rewrite(g, rules) and [n.name for n in g.nodes] == ["taken"]
