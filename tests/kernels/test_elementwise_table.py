"""The elementwise op table: every row fuses and runs on the cpu target, every row is in the
NVRTC-compiled CUDA variants, and a row added at run time is fused and computed like the others."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import Builder
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.network import NetworkDefinition
from polykit.compiler.ops.math.elementwise import same_as_input
from polykit.compiler.ops.registry import SHAPE_RULES
from polykit.compiler.ops import elementwise_table as table
from polykit.kernels.cuda.pointwise import pointwise as pw
from polykit.kernels.cuda.pointwise.pointwise_expr import emit_expression
from polykit.compiler.ops.elementwise_table import ElementwiseOp, elementwise_ops, fusable_ops, register_elementwise
from polykit.compiler.ops.references import REFERENCE
from polykit.plugins import PluginError
from polykit.runtime.engine import Runtime

ROWS = elementwise_ops()
SHAPE = (2, 3, 4)


def _feeds(net: NetworkDefinition, rng) -> dict[str, np.ndarray]:
    g = net.graph
    feeds = {}
    for name in g.inputs:
        v = g.value(name)
        if v.dtype == np.bool_:
            feeds[name] = rng.random(v.shape) > 0.4
        elif v.dtype.kind in "iu":
            feeds[name] = rng.integers(1, 5, v.shape).astype(v.dtype)
        else:
            feeds[name] = rng.uniform(0.1, 0.9, v.shape).astype(v.dtype)
    return feeds


def _network(row: ElementwiseOp, attrs: dict) -> NetworkDefinition:
    """x0 [2,3,4] -> row(x0, x1 [4], x2 [3,1]) -> a second op (Not for a bool result, else Neg);
    bool inputs where the row reads a condition."""
    dtype = np.float64 if "float" in row.kinds else np.int32  # float64: Cast to float32 is no no-op
    net = NetworkDefinition(f"one_{row.name}")
    names = []
    for slot, shape in enumerate((SHAPE, (4,), (3, 1))[:row.arity]):
        role = row.role(slot)
        if row.name == "Clip" and slot:  # bounds are constants (fusable Clip)
            names.append(net.add_constant(np.array(-0.5 if slot == 1 else 0.6, dtype)))
        else:
            names.append(net.add_input(f"x{slot}", np.bool_ if role == "cond" else dtype, shape))
    (y,) = net.add_node(row.name, names, dict(attrs), name="op")
    net.mark_output(net.add_node("Not" if row.result == "bool" else "Neg", [y], name="next")[0])
    return net


def _run_cpu(net: NetworkDefinition, feeds):
    plan = Builder(BuilderConfig(target="cpu")).build(net.graph)
    out = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute(feeds)
    return plan, out


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_table_op_fuses_and_runs_on_the_cpu_target(row):
    rng = np.random.default_rng(3)
    for attrs in row.variants:
        net = _network(row, attrs)
        feeds = _feeds(net, rng)
        plan, out = _run_cpu(net, feeds)
        want = evaluate_graph(net.graph, feeds)
        bodies = [[s["op"] for s in layer.attrs.get("body", ())] for layer in plan.layers if layer.kind == "Pointwise"]
        if row.fusable:
            assert bodies == [[row.name, bodies[0][1]]], (attrs, [layer.kind for layer in plan.layers])
        else:
            assert not any(row.name in body for body in bodies)
        for name, value in want.items():
            assert out[name].dtype == value.dtype
            np.testing.assert_allclose(out[name], value, rtol=1e-6, equal_nan=True, err_msg=f"{row.name} {attrs}")


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_table_op_and_attribute_variant_is_in_the_nvrtc_compiled_variants(row):
    """tests/kernels/cuda/test_nvrtc_compile.py compiles pointwise.compile_variants(), the
    modules of these layers: each row's every variant sits in one of their bodies."""
    steps = [(s["op"], s["attrs"]) for layer in pw.variant_layers() for s in layer.attrs["body"]]
    for attrs in row.variants:
        assert (row.name, dict(attrs)) in steps
    args = ["a", "b", "c"][:row.arity]
    code, _ = emit_expression([{"op": row.name, "inputs": args, "outputs": ["y"], "attrs": row.variants[0]}],
                              dict(zip(args, ("A", "B", "C"))))
    assert code.startswith("    auto v0 = ") and "A" in code


def test_the_fusable_set_now_holds_swish_shrink_and_the_bitwise_ops():
    assert {"Swish", "Shrink", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift", "Mish"} <= fusable_ops()
    assert "Identity" not in fusable_ops()


def test_a_second_different_row_for_a_taken_op_is_refused():
    mish = table.elementwise_op("Mish")
    with pytest.raises(PluginError, match="Mish"):
        register_elementwise(ElementwiseOp("Mish", mish.shape, mish.reference, mish.cuda, fusable=False))


def test_a_row_with_an_unknown_result_kind_is_refused():
    with pytest.raises(PluginError, match="result"):
        ElementwiseOp("Odd", same_as_input, lambda node, inputs: inputs, lambda a, at: a[0], result="complex")


def _cube(node, inputs):
    x = inputs[0]
    return [(x.astype(np.float64) ** 3 * node.attrs.get("scale", 1.0)).astype(x.dtype)]


@pytest.fixture
def cube_row():
    """A new op, ScaledCube(x) = scale * x^3, registered as one row for the test's duration."""
    table.elementwise_ops()  # the built-in rows first
    row = register_elementwise(ElementwiseOp(
        "ScaledCube", same_as_input, _cube,
        lambda a, at: f"pk_mul(pk_mul({a[0]}, pk_mul({a[0]}, {a[0]})), {float(at.get('scale', 1.0))!r})",
        api="activation", params=("scale",)))
    yield row
    del table.ELEMENTWISE["ScaledCube"], SHAPE_RULES[("", "ScaledCube")], REFERENCE[("", "ScaledCube")]


def test_a_row_added_at_run_time_is_fused_and_computed_on_the_cpu_target(cube_row):
    rng = np.random.default_rng(5)
    net = NetworkDefinition("cube")
    x = net.add_input("x", np.float32, SHAPE)
    b = net.add_constant(rng.standard_normal(4).astype(np.float32))
    cube = net.add_activation(net.add_elementwise(x, b, "add"), "scaled_cube", scale=0.5)
    net.mark_output(net.add_activation(cube, "sigmoid"))
    feeds = {"x": rng.standard_normal(SHAPE).astype(np.float32)}
    plan, out = _run_cpu(net, feeds)
    (layer,) = plan.layers
    assert layer.kind == "Pointwise" and [s["op"] for s in layer.attrs["body"]] == ["Add", "ScaledCube", "Sigmoid"]
    s = (feeds["x"].astype(np.float64) + net.graph.initializers[b]) ** 3 * 0.5
    np.testing.assert_allclose(list(out.values())[0], 1 / (1 + np.exp(-s)), rtol=1e-5)
    code, _ = emit_expression(layer.attrs["body"], {n: n.upper() for n in layer.inputs})
    assert "pk_mul(pk_mul(v0, pk_mul(v0, v0)), 0.5)" in code
