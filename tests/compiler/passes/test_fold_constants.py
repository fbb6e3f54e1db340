import numpy as np

from .passes_testkit import graph, node, op_counts, run_and_compare, scalar

from polykit.compiler.passes import fold_constants
from polykit.compiler.ops.registry import SHAPE_RULES
from polykit.compiler.ops.references import REFERENCE


def test_constant_chain_becomes_one_initializer():
    g = graph([node("Mul", ["a", "b"], "ab"), node("Add", ["ab", "one"], "c"), node("Add", ["x", "c"], "y")],
              {"x": (2, 3)}, ["y"], {"a": np.full((3,), 2.0, np.float32), "b": np.arange(3, dtype=np.float32),
                                     "one": scalar(1.0)})
    out, changed = run_and_compare(g, fold_constants)
    assert changed and op_counts(out) == {"Add": 1}
    np.testing.assert_array_equal(out.initializers["c"], [1.0, 3.0, 5.0])


def test_constant_node_folds_into_an_initializer():
    g = graph([node("Constant", [], "k", value=np.array([1.5, -2.0], np.float32)), node("Mul", ["x", "k"], "y")],
              {"x": (4, 2)}, ["y"])
    out, _ = run_and_compare(g, fold_constants)
    assert "k" in out.initializers and op_counts(out) == {"Mul": 1}


def test_shape_chain_of_static_tensor_folds_into_reshape_constant():
    g = graph([
        node("Shape", ["x"], "s"),
        node("Gather", ["s", "zero"], "n", axis=0),
        node("Unsqueeze", ["n", "zero_axes"], "n1"),
        node("Concat", ["n1", "minus_one"], "target", axis=0),
        node("Reshape", ["x", "target"], "y"),
    ], {"x": (2, 3, 4)}, ["y"], {"zero": np.array(0, np.int64), "zero_axes": np.array([0], np.int64),
                                  "minus_one": np.array([-1], np.int64)})
    out, _ = run_and_compare(g, fold_constants)
    assert op_counts(out) == {"Reshape": 1}
    np.testing.assert_array_equal(out.initializers["target"], [2, -1])


def test_shape_of_a_symbolic_tensor_stays():
    g = graph([node("Shape", ["x"], "s"), node("Reshape", ["x", "s"], "y")], {"x": (("batch", 3), np.float32)}, ["y"])
    assert not fold_constants(g)
    assert op_counts(g) == {"Shape": 1, "Reshape": 1}


def test_random_ops_never_fold(monkeypatch):
    monkeypatch.setitem(REFERENCE, ("", "RandomUniformLike"), lambda n, ins: [np.random.rand(*ins[0].shape)])
    g = graph([node("RandomUniformLike", ["k"], "r"), node("Add", ["x", "r"], "y")], {"x": (3,)}, ["y"],
              {"k": np.ones(3, np.float32)}, strict=False)
    fold_constants(g)
    assert op_counts(g)["RandomUniformLike"] == 1


def test_a_failing_node_stays_while_others_fold(monkeypatch):
    def boom(node, inputs):
        raise ValueError("kernel failure")

    monkeypatch.setitem(SHAPE_RULES, ("", "Boom"), lambda ctx: [(ctx.dtype(0), ctx.shape(0))])
    monkeypatch.setitem(REFERENCE, ("", "Boom"), boom)
    g = graph([node("Mul", ["a", "a"], "aa"), node("Add", ["x", "aa"], "y"),
               node("Boom", ["a"], "r"), node("Add", ["x", "r"], "z")],
              {"x": (6,)}, ["y", "z"], {"a": np.arange(6, dtype=np.float32)})
    assert fold_constants(g)
    assert "aa" in g.initializers and "r" not in g.initializers
    assert op_counts(g)["Boom"] == 1


def test_huge_expand_is_not_materialized():
    g = graph([node("Expand", ["one", "shape"], "big"), node("Add", ["x", "big"], "y")],
              {"x": (64, 64)}, ["y"], {"one": np.ones((1, 1), np.float32), "shape": np.array([64, 64], np.int64)})
    assert not fold_constants(g, max_elements=1000)
    assert fold_constants(g, max_elements=1 << 20)
    assert g.initializers["big"].shape == (64, 64)


def test_castlike_of_a_constant_folds_to_the_target_dtype():
    g = graph([node("CastLike", ["half", "x"], "h"), node("Mul", ["x", "h"], "y")], {"x": ((3,), np.float16)}, ["y"],
              {"half": np.array(0.5, np.float64)})
    out, _ = run_and_compare(g, fold_constants)
    assert op_counts(out) == {"Mul": 1} and out.initializers["h"].dtype == np.float16


def test_a_folded_tensor_takes_its_values_shape_over_a_stale_unknown_one():
    """A shape rule that knew nothing earlier (an If's branch output, before the If was inlined)
    leaves no unknown shape behind: readers of the initializer see (3,)."""
    from polykit.compiler.ir.graph import Value

    g = graph([node("Mul", ["a", "b"], "ab"), node("Add", ["x", "ab"], "y")], {"x": (2, 3)}, ["y"],
              {"a": np.full((3,), 2.0, np.float32), "b": np.arange(3, dtype=np.float32)})
    g.set_value(Value("ab", np.dtype(np.float32), None))
    assert fold_constants(g)
    assert g.value("ab").shape == (3,)
    np.testing.assert_array_equal(g.initializers["ab"], [0.0, 2.0, 4.0])


def test_a_relative_position_bias_table_gathered_by_a_constant_index_folds():
    """Swin's bias: table[index] (an output larger than the table) reshaped and transposed is a constant."""
    rng = np.random.default_rng(0)
    table, index = rng.standard_normal((169, 3)).astype(np.float32), rng.integers(0, 169, 49 * 49).astype(np.int64)
    g = graph([node("Gather", ["table", "index"], "g"), node("Reshape", ["g", "shape"], "r"),
               node("Transpose", ["r"], "bias", perm=[2, 0, 1]), node("Add", ["x", "bias"], "y")],
              {"x": (2, 3, 49, 49)}, ["y"],
              {"table": table, "index": index, "shape": np.array([49, 49, 3], np.int64)})
    out, changed = run_and_compare(g, fold_constants)
    assert changed and op_counts(out) == {"Add": 1}
    np.testing.assert_array_equal(out.initializers["bias"], table[index].reshape(49, 49, 3).transpose(2, 0, 1))
