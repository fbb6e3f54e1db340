"""Data-dependent output sizes at run time: one plan serves inputs whose values give outputs of
different sizes (NonZero, Compress, Unique, NonMaxSuppression and their consumers), on the cpu
target here and on the cuda target on a GPU; the plan reserves each size's bound."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.profiles import Profile
from polykit.compiler.ir.symbolic import symbol
from polykit.errors import PlanError
from polykit.runtime.engine import Runtime
from polykit.runtime.output_alloc import data_outputs

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
rng = np.random.default_rng(13)


def _model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def nonzero_chain():
    """NonZero -> Transpose -> Cast -> Mul by 2 and Shape(NonZero) as a second output."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"]),
             helper.make_node("Cast", ["t"], ["tf"], to=F), helper.make_node("Constant", [], ["two"], value=two),
             helper.make_node("Mul", ["tf", "two"], ["y"]), helper.make_node("Shape", ["nz"], ["s"])]
    return _model(nodes, [("x", F, [3, 5])], [("y", F), ("s", I64)])


def sparse(shape, kept):
    x = rng.standard_normal(shape).astype(np.float32) + 5
    return (x * (rng.random(shape) < kept)).astype(np.float32)


def nonzero_want(x):
    nz = np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)
    return {"y": nz.T.astype(np.float32) * 2, "s": np.array(nz.shape, np.int64)}


def compress_model():
    return _model([helper.make_node("Compress", ["x", "c"], ["y"], axis=1), helper.make_node("Relu", ["y"], ["r"])],
                  [("x", F, [4, 6]), ("c", B, [6])], [("r", F)])


def unique_model():
    node = helper.make_node("Unique", ["x"], ["u", "idx", "inv", "cnt"], sorted=1)
    return _model([node, helper.make_node("Neg", ["u"], ["nu"])], [("x", F, [10])],
                  [("nu", F), ("idx", I64), ("inv", I64), ("cnt", I64)])


def nms_model():
    limits = [helper.make_tensor(n, t, [1], [v]) for n, t, v in (("m", I64, 3), ("iou", F, 0.5), ("sc", F, 0.2))]
    nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in limits]
    nodes.append(helper.make_node("NonMaxSuppression", ["boxes", "scores", "m", "iou", "sc"], ["sel"]))
    return _model(nodes, [("boxes", F, [1, 8, 4]), ("scores", F, [1, 2, 8])], [("sel", I64)], opset=11)


def unique_want(x):
    u, idx, inv, cnt = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    return {"nu": -u, "idx": idx.astype(np.int64), "inv": inv.reshape(-1).astype(np.int64),
            "cnt": cnt.astype(np.int64)}


def _boxes(count_apart):
    """8 boxes of which the first `count_apart` lie apart and the rest overlap box 0."""
    boxes = np.zeros((1, 8, 4), np.float32)
    for i in range(8):
        x0 = 10.0 * i if i < count_apart else 0.5
        boxes[0, i] = (x0, 0.0, x0 + 5.0, 5.0)
    return boxes


def nms_want(boxes, scores):
    import onnxruntime as ort

    sess = ort.InferenceSession(nms_model().SerializeToString(), providers=["CPUExecutionProvider"])
    return {"sel": sess.run(None, {"boxes": boxes, "scores": scores})[0]}


def feeds_cases():
    """(name, model, [(feeds, expected outputs)]) with different counts, 0 included."""
    nz = [(x, nonzero_want(x)) for x in (sparse((3, 5), k) for k in (0.0, 0.2, 0.6, 1.0))]
    cmp = []
    for kept in (0.0, 0.5, 1.0):
        x, c = rng.standard_normal((4, 6)).astype(np.float32), rng.random(6) < kept
        cmp.append(({"x": x, "c": c}, {"r": np.maximum(np.compress(c, x, axis=1), 0)}))
    uq = [({"x": x}, unique_want(x)) for x in (np.full(10, 3.0, np.float32),
                                                rng.integers(0, 4, 10).astype(np.float32),
                                                rng.permutation(10).astype(np.float32))]
    nms = []
    for apart, low in ((8, 0.0), (3, 0.0), (1, 0.9)):
        boxes, scores = _boxes(apart), rng.random((1, 2, 8)).astype(np.float32)
        scores[0, 1] *= low
        nms.append(({"boxes": boxes, "scores": scores}, nms_want(boxes, scores)))
    # an Identity to the graph output, which remove_identity folds: the data symbol follows the new name
    renamed = _model([helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Identity", ["nz"], ["idx"])],
                     [("x", F, [3, 5])], [("idx", I64)])
    return [("nonzero", nonzero_chain(), [({"x": x}, w) for x, w in nz]), ("compress", compress_model(), cmp),
            ("nonzero_to_output", renamed, [({"x": x}, {"idx": np.stack(np.nonzero(x))}) for x, _ in nz]),
            ("unique", unique_model(), uq), ("nms", nms_model(), nms)]


CASES = {name: (model, runs) for name, model, runs in feeds_cases()}


def run_all(model, runs, target):
    plan = build_plan(model, BuilderConfig(target=target))
    plan = Plan.deserialize(plan.serialize())  # what a saved plan does
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        for _ in range(2):  # a second pass: a replayed loop would keep the first run's sizes
            for feeds, want in runs:
                got = ctx.execute(feeds)
                for name, ref in want.items():
                    assert got[name].shape == ref.shape, (name, got[name].shape, ref.shape)
                    np.testing.assert_array_equal(got[name], ref, err_msg=f"output {name}")
                    assert ctx.get_tensor_shape(name) == ref.shape
    return plan


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_cpu_plan_serves_inputs_with_different_output_sizes(case):
    model, runs = CASES[case]
    plan = run_all(model, runs, "cpu")
    assert plan.profiles is not None and plan.profiles.data  # a data symbol, not baked values
    assert "input_values" not in plan.metadata


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_cuda_plan_serves_inputs_with_different_output_sizes(case):
    model, runs = CASES[case]
    run_all(model, runs, "cuda")


def test_the_plan_reserves_the_bound_and_names_the_deciding_layer():
    plan = build_plan(nonzero_chain(), BuilderConfig(target="cpu"))
    sym = "data(nz)[1]"
    assert plan.profiles.data == {sym: 15}  # 15 elements: at most 15 non-zeros
    assert plan.tensors["nz"].dims == (2, symbol(sym)) and plan.tensors["nz"].nbytes == 2 * 15 * 8
    assert plan.tensors["y"].nbytes == 15 * 2 * 4
    (out,) = data_outputs(plan)
    assert (out.symbol, out.tensor, out.axis, plan.layers[out.layer].kind) == (sym, "nz", 1, "NonZero")


def test_a_profile_bounds_the_data_symbol_by_the_input_dims():
    x = helper.make_tensor_value_info("x", F, ["n", 4])
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["nz"])], "m", [x],
                              [helper.make_tensor_value_info("nz", I64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[Profile({"x": ((1, 4), (2, 4), (5, 4))})]))
    assert plan.tensors["nz"].nbytes == 2 * 5 * 4 * 8  # the bound at the largest corner
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        for n, kept in ((1, 0.0), (5, 0.5), (3, 1.0)):
            x = sparse((n, 4), kept)
            np.testing.assert_array_equal(ctx.execute({"x": x})["nz"], np.array(np.nonzero(x)))


def test_a_plan_whose_data_symbol_no_layer_writes_is_refused():
    from dataclasses import replace

    plan = build_plan(nonzero_chain(), BuilderConfig(target="cpu"))
    assert plan.layers[0].kind == "NonZero"
    with pytest.raises(PlanError, match="no layer writes a tensor whose dim is the data symbol 'data\\(nz\\)\\[1\\]'"):
        data_outputs(replace(plan, layers=plan.layers[1:]))
