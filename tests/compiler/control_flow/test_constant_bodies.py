"""Bodies the build knows more about: captured constants inside bodies, Ifs on constant conditions."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes import optimize
from polykit.compiler.plan.file import Plan
from polykit.runtime.engine import Engine
from tests.compiler.control_flow.models import outer_axes_scan, rank_guarded

RNG = np.random.default_rng(11)


def _run(plan: Plan, feeds: dict) -> dict:
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        return ctx.execute(feeds)


def _scan_feeds() -> dict:
    return {n: RNG.standard_normal(shape).astype(np.float32) for n, shape in
            (("s0", (4, 4)), ("k", (6, 4)), ("v", (6, 4)))}


def test_a_scan_body_reading_outer_constant_axes_builds_with_them_inlined_and_matches_onnxruntime():
    model, feeds = outer_axes_scan(), _scan_feeds()
    plan = build_plan(model, BuilderConfig(target="cpu"))
    scan = next(layer for layer in plan.layers if layer.kind == "Scan")
    body = scan.attrs["body"]
    assert list(scan.inputs) == ["s0", "k", "v"] and "polykit_captures" not in scan.attrs
    assert list(body.inputs) == ["s_in", "k_t", "v_t"]
    assert tuple(body.tensors["s_out"].shape) == (4, 4) and tuple(body.tensors["y_t"].shape) == (4,)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip(("s", "ys"), sess.run(None, feeds)))
    got = _run(plan, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank", [4, 5])
def test_an_if_on_a_constant_condition_becomes_its_taken_branch_even_when_the_other_cannot_fit(rank):
    dims = np.array([2, 3, 7, 3, 5][: rank - 1] + [5], np.int64) if rank == 5 else np.array([2, 3, 3, 5], np.int64)
    optimized = optimize(load_onnx(rank_guarded(rank)))
    assert not any(n.op_type == "If" for n in optimized.nodes)
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    plan = build_plan(rank_guarded(rank), BuilderConfig(target="cpu", input_values={"dims": dims}))
    np.testing.assert_array_equal(_run(plan, {"dims": dims, "x": x})["y"], x * np.arange(5, dtype=np.float32))


def test_range_takes_one_element_operands_as_its_scalars():
    from polykit.compiler.ops.tensor.constants_reference import range_
    from polykit.compiler.ir.graph import Node

    node = Node("Range", ["a", "b", "c"], ["y"], name="r")
    out = range_(node, [np.array([2], np.int64), np.array([11], np.int64), np.array(3, np.int64)])[0]
    np.testing.assert_array_equal(out, [2, 5, 8])
