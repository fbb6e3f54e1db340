"""Refit (polykit.compiler.builder.refit): a plan built --refittable from weights A, refitted with
weights B, computes bit for bit what a plan built from B (with the same tactics) computes, over
each way the builder derives a weight; a live engine refits in place; bad refits are errors."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.refit import Refitter, record_of, refit_plan
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.file import Plan
from polykit.errors import BuildError, PlanError, UsageError
from polykit.runtime.engine import Engine
from tests.compiler import refit_models as models

CPU = BuilderConfig(target="cpu", refittable=True)


def run(plan: Plan, feeds: dict) -> dict:
    with Engine(plan).create_execution_context() as ctx:
        return ctx.execute(feeds)


def initializers(model) -> dict[str, np.ndarray]:
    return dict(load_onnx(model).initializers)


def refittable_values(plan: Plan, model) -> dict[str, np.ndarray]:
    """The model's initializers the plan can take (its refittable ones)."""
    names = record_of(plan)["weights"]
    return {n: a for n, a in initializers(model).items() if n in names}


def built_with_tactics_of(plan: Plan, model, config: BuilderConfig) -> Plan:
    return build_plan(model, replace(config, tactic_replay={layer.name: layer.tactic for layer in plan.layers}))


def assert_same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


FOLD_PATHS = {
    "conv_bn": (models.conv_bn, CPU),
    "conv_bn_nhwc": (models.conv_bn, replace(CPU, channels_last=True)),
    "gemm_matmul": (models.mlp, CPU),
    "folded_chain": (models.folded_chain, CPU),
    "conv_bn_fp16": (models.conv_bn, replace(CPU, fp16=True)),
    "gemm_matmul_fp16": (models.mlp, replace(CPU, fp16=True)),
    "qat_int8": (models.qat_conv, CPU),
    "packed_projections": (models.projections, CPU),
    "packed_projections_fp16": (models.projections, replace(CPU, fp16=True)),
}


@pytest.mark.parametrize("case", sorted(FOLD_PATHS))
def test_a_refitted_plan_computes_what_a_plan_built_from_the_new_weights_computes(case):
    make, config = FOLD_PATHS[case]
    model_a, model_b = make(0), make(1)
    plan_a = Plan.deserialize(build_plan(model_a, config).serialize())  # the record survives the file
    refitted = Plan.deserialize(refit_plan(plan_a, refittable_values(plan_a, model_b)).serialize())
    plan_b = built_with_tactics_of(plan_a, model_b, config)
    assert_same_bits(refitted.weights, plan_b.weights)
    feeds = models.feeds(model_a)
    out_a, out_refitted, out_b = run(plan_a, feeds), run(refitted, feeds), run(plan_b, feeds)
    assert_same_bits(out_refitted, out_b)
    assert any(out_a[n].tobytes() != out_b[n].tobytes() for n in out_b)  # the new weights mattered


def test_packed_projection_weights_come_from_the_caller_and_refit_into_the_packed_weight():
    model_a, model_b = models.projections(0), models.projections(1)
    plan_a = build_plan(model_a, CPU)
    gemms = [layer for layer in plan_a.layers if layer.kind in ("MatMul", "Gemm")]
    assert len(gemms) == 1 and gemms[0].out_shapes[0] == (3, 24)  # the three projections: one GEMM
    record = record_of(plan_a)
    assert all(record["weights"][n]["source"] == "caller" for n in ("wq", "wk", "wv"))  # concatenated
    refitted = refit_plan(plan_a, refittable_values(plan_a, model_b))
    packed = gemms[0].inputs[1]
    b = initializers(model_b)
    assert refitted.weights[packed].tobytes() == np.concatenate([b["wq"], b["wk"], b["wv"]], axis=1).tobytes()


def test_the_record_names_where_each_weight_lives():
    plan = build_plan(models.conv_bn(0), CPU)
    weights = record_of(plan)["weights"]
    assert weights["w1"]["source"] == "caller" and "w1" not in plan.weights  # folded with its BatchNormalization
    # the plan holds the classifier's weight as it is: the record keeps no second copy
    fc = next(n for n in weights if n.startswith("fc"))
    assert weights[fc]["source"] == "plan" and plan.weights[fc].tobytes() == initializers(models.conv_bn(0))[fc].tobytes()
    # small initializers (the BatchNormalizations' of 8 channels) stay in the recorded model
    assert {spec["source"] for spec in weights.values()} == {"plan", "model", "caller"}


def test_a_refit_keeps_the_values_of_the_weights_it_is_not_given():
    model_a, model_b = models.mlp(0), models.mlp(1)
    plan_a = build_plan(model_a, CPU)
    record = record_of(plan_a)
    carried = [n for n, spec in record["weights"].items() if spec["source"] != "caller"]
    assert carried and not [n for n, spec in record["weights"].items() if spec["source"] == "caller"]
    new = initializers(model_b)
    refitted = refit_plan(plan_a, {carried[0]: new[carried[0]]})
    expected_model = onnx.ModelProto()  # model A with that one weight of B's
    expected_model.CopyFrom(model_a)
    for t in expected_model.graph.initializer:
        if t.name == carried[0]:
            t.CopyFrom(numpy_helper.from_array(new[t.name], t.name))
    expected = built_with_tactics_of(plan_a, expected_model, CPU)
    assert_same_bits(refitted.weights, expected.weights)
    assert refitted.weights[carried[0]].tobytes() != plan_a.weights[carried[0]].tobytes()


def test_a_live_engine_refits_in_place_between_inferences():
    model_a, model_b = models.conv_bn(0), models.conv_bn(1)
    plan_a = build_plan(model_a, CPU)
    expected = run(built_with_tactics_of(plan_a, model_b, CPU), models.feeds(model_a))
    engine = Engine(plan_a)
    before = engine.create_execution_context()
    first = before.execute(models.feeds(model_a))
    refitter = Refitter(engine)
    for name, array in refittable_values(plan_a, model_b).items():
        assert refitter.set_named_weights(name, array)
    assert refitter.get_missing_weights() == []
    assert refitter.refit_cuda_engine()
    assert_same_bits(before.execute(models.feeds(model_a)), expected)  # a context made before the refit
    with engine.create_execution_context() as after:
        assert_same_bits(after.execute(models.feeds(model_a)), expected)
    assert first["logits"].tobytes() != expected["logits"].tobytes()
    before.close()


def test_a_refitter_lists_the_weights_it_still_needs_and_refuses_to_refit_without_them(caplog):
    plan = build_plan(models.conv_bn(0), CPU)
    refitter = Refitter(Engine(plan))
    needed = refitter.get_missing_weights()
    assert needed and set(needed) <= set(refitter.get_all_weights())
    refitter.set_named_weights(needed[0], initializers(models.conv_bn(1))[needed[0]])
    assert refitter.get_missing_weights() == needed[1:]
    before = {n: w.copy() for n, w in plan.weights.items()}
    with caplog.at_level(logging.ERROR, logger="polykit"):
        assert refitter.refit_cuda_engine() is False
    assert needed[1] in caplog.text
    assert_same_bits(plan.weights, before)


def test_a_plan_not_built_refittable_cannot_be_refitted():
    plan = build_plan(models.mlp(0), BuilderConfig(target="cpu"))
    assert "refit" not in plan.metadata
    with pytest.raises(PlanError, match="not built refittable") as info:
        refit_plan(plan, {})
    assert "--refittable" in info.value.hint
    with pytest.raises(PlanError, match="not built refittable"):
        Refitter(Engine(plan))


def test_a_weight_of_another_shape_or_dtype_or_an_unknown_name_is_refused_by_name():
    plan = build_plan(models.mlp(0), CPU)
    refitter = Refitter(Engine(plan))
    with pytest.raises(UsageError, match=r"'fc1.weight' is float32\[16, 32\], the plan was built with float32\[32, 16\]"):
        refitter.set_named_weights("fc1.weight", np.zeros((16, 32), np.float32))
    with pytest.raises(UsageError, match=r"'fc1.bias' is float64\[32\]"):
        refitter.set_named_weights("fc1.bias", np.zeros(32, np.float64))
    with pytest.raises(UsageError, match="'fc3.weight' is not a refittable weight") as info:
        refit_plan(plan, {"fc3.weight": np.zeros(3, np.float32)})
    assert "fc1.weight" in info.value.hint


def test_a_refit_lacking_folded_weights_names_them():
    plan = build_plan(models.conv_bn(0), CPU)
    with pytest.raises(UsageError, match="lacks .* weight"):
        refit_plan(plan, {})


def test_a_value_that_changes_what_the_builder_folds_is_refused():
    plan = build_plan(models.gelu_mlp(0), CPU)
    assert [layer.kind for layer in plan.layers] == ["MatMul"]  # the GELU recognized, in the MatMul's epilogue
    with pytest.raises(BuildError, match="differs|layers") as info:
        refit_plan(plan, {"half": np.array(0.25, np.float32)})  # no longer a GELU
    assert "rebuild" in info.value.hint


def test_a_refittable_build_refuses_int8_calibration():
    with pytest.raises(UsageError, match="refittable .* INT8"):
        BuilderConfig(target="cpu", refittable=True, int8=True)


def test_only_refittable_builds_record_it_in_their_config():
    assert "refittable" not in build_plan(models.mlp(0), BuilderConfig(target="cpu")).metadata["builder_config"]
    assert build_plan(models.mlp(0), CPU).metadata["builder_config"]["refittable"] is True


def test_a_damaged_refit_record_is_a_plan_error():
    plan = build_plan(models.mlp(0), CPU)
    plan.metadata["refit"]["weights"]["fc1.bias"]["source"] = "elsewhere"
    with pytest.raises(PlanError, match="refit"):
        Plan.deserialize(plan.serialize())


def test_a_plan_for_optimization_profiles_refits():
    from polykit.compiler.plan.profiles import Profile

    def dynamic(seed):
        model = models.mlp(seed)
        for value in (model.graph.input[0], model.graph.output[0]):
            value.type.tensor_type.shape.dim[0].dim_param = "N"
        return model

    config = replace(CPU, fp16=True, profiles=(Profile({"x": ((1, 16), (4, 16), (8, 16))}),))
    plan_a = build_plan(dynamic(0), config)
    refitted = refit_plan(plan_a, refittable_values(plan_a, dynamic(1)))
    plan_b = built_with_tactics_of(plan_a, dynamic(1), config)
    feeds = {"x": np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)}  # not the opt shape
    assert_same_bits(run(refitted, feeds), run(plan_b, feeds))


def test_a_new_model_whose_structure_constants_differ_is_refused(tmp_path):
    from onnx import TensorProto, helper

    from polykit.compiler.builder.refit import weights_from_file

    def model(shape):
        w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                 helper.make_node("Reshape", ["m", "shape"], ["y"], name="reshape")]
        graph = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(shape), "shape")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)

    plan = build_plan(model([2, 16]), CPU)
    onnx.save(model([16, 2]), str(tmp_path / "other.onnx"))
    with pytest.raises(UsageError, match="'shape' .* differs from the built model's: it is structure"):
        weights_from_file(tmp_path / "other.onnx", record_of(plan))
    onnx.save(model([2, 16]), str(tmp_path / "same.onnx"))
    assert set(weights_from_file(tmp_path / "same.onnx", record_of(plan))) == {"w"}


def test_a_model_with_control_flow_cannot_be_built_refittable():
    from onnx import TensorProto, helper

    def branch(op):
        return helper.make_graph([helper.make_node(op, ["x"], ["b"])], op, [],
                                 [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])

    nodes = [helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch("Identity"), else_branch=branch("Neg"))]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    build_plan(model, BuilderConfig(target="cpu"))  # it builds
    with pytest.raises(BuildError, match="control flow .* cannot be built refittable"):
        build_plan(model, CPU)
