"""Builder: input shapes, marked outputs, tactics, precision, special outputs, metadata."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import Builder, build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.file import Plan, weight_offsets
from polykit.errors import BuildError, UsageError
from polykit.runtime.engine import Runtime

B = np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)


def _chain_model(batch="N"):
    """y = abs((x + b) * x) - b, with intermediates s, p, a."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Add", ["x", "b"], ["s"], name="add"),
        helper.make_node("Mul", ["s", "x"], ["p"], name="mul"),
        helper.make_node("Abs", ["p"], ["a"], name="abs"),
        helper.make_node("Sub", ["a", "b"], ["y"], name="sub"),
    ]
    graph = helper.make_graph(nodes, "chain", [x], [y], [numpy_helper.from_array(B, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _run(plan: Plan, **feeds):
    return Runtime().deserialize_engine(plan).create_execution_context().execute(feeds)


def _x(n=2, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


CPU = dict(target="cpu")


def test_dynamic_input_without_shape_is_a_build_error_naming_it():
    with pytest.raises(BuildError, match="input 'x' has dynamic shape") as info:
        build_plan(_chain_model(), BuilderConfig(**CPU))
    assert "--input-shapes" in str(info.value)


def test_input_shapes_make_the_plan_static():
    plan = build_plan(_chain_model(), BuilderConfig(**CPU, input_shapes={"x": (3, 4)}))
    assert plan.tensors["x"].shape == (3, 4) and plan.tensors["y"].shape == (3, 4)


def test_input_shapes_for_an_unknown_input_is_an_error():
    with pytest.raises(BuildError, match="'z', which is not a graph input"):
        build_plan(_chain_model(2), BuilderConfig(**CPU, input_shapes={"z": (1,)}))


def test_input_shapes_of_the_wrong_rank_is_an_error():
    with pytest.raises(BuildError, match="rank 2"):
        build_plan(_chain_model(), BuilderConfig(**CPU, input_shapes={"x": (3, 4, 5)}))


def test_input_shapes_cannot_change_a_static_dim():
    with pytest.raises(BuildError, match="cannot override"):
        build_plan(_chain_model(2), BuilderConfig(**CPU, input_shapes={"x": (2, 5)}))


def test_built_plan_computes_the_model():
    x = _x(2)
    out = _run(build_plan(_chain_model(2), BuilderConfig(**CPU)), x=x)
    np.testing.assert_allclose(out["y"], np.abs((x + B) * x) - B, rtol=1e-6)


def test_build_plan_accepts_path_modelproto_and_graph(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_chain_model(2), str(path))
    cfg = BuilderConfig(**CPU)
    from_path = build_plan(str(path), cfg).serialize()
    assert build_plan(_chain_model(2), cfg).serialize() == from_path
    assert Builder(cfg).build(load_onnx(_chain_model(2))).serialize() == from_path


def test_builder_leaves_the_callers_graph_untouched():
    graph = load_onnx(_chain_model())
    before = [(n.op_type, list(n.inputs), list(n.outputs)) for n in graph.nodes]
    Builder(BuilderConfig(**CPU, input_shapes={"x": (2, 4)})).build(graph)
    assert [(n.op_type, list(n.inputs), list(n.outputs)) for n in graph.nodes] == before
    assert graph.value("x").shape == ("N", 4)


def test_marked_intermediate_is_an_output_with_its_value():
    x = _x(2, seed=1)
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU, mark_outputs=("p",)))
    assert plan.outputs == ["y", "p"]
    assert plan.tensors["p"].kind == "output"
    assert any("p" in layer.outputs for layer in plan.layers)
    np.testing.assert_allclose(_run(plan, x=x)["p"], (x + B) * x, rtol=1e-6)


def test_marked_intermediate_is_kept_from_fusion():
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU, fuse=True, mark_outputs=("s", "a")))
    written = {o for layer in plan.layers for o in layer.outputs}
    assert {"s", "a", "y"} <= written
    x = _x(2, seed=2)
    out = _run(plan, x=x)
    np.testing.assert_allclose(out["s"], x + B, rtol=1e-6)
    np.testing.assert_allclose(out["a"], np.abs((x + B) * x), rtol=1e-6)


def test_marking_an_unknown_tensor_is_an_error():
    with pytest.raises(BuildError, match="cannot mark 'nope'"):
        build_plan(_chain_model(2), BuilderConfig(**CPU, mark_outputs=("nope",)))


def test_mark_all_exposes_every_intermediate_of_an_unfused_build():
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU, mark_all=True, fuse=False))
    assert plan.outputs[0] == "y" and set(plan.outputs) == {"y", "s", "p", "a"}
    x = _x(2, seed=3)
    out = _run(plan, x=x)
    np.testing.assert_allclose(out["a"], np.abs((x + B) * x), rtol=1e-6)


def test_mark_all_leaves_fusion_alone_and_lists_the_fused_tensors():
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU, mark_all=True))
    assert plan.outputs == ["y"] and len(plan.layers) == 1
    assert plan.metadata["fused_away"] == ["s", "p", "a"]


def test_forced_mark_all_makes_every_intermediate_an_output_of_a_fused_build():
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU, mark_all=True, force_marks=True))
    assert set(plan.outputs) == {"y", "s", "p", "a"} and not plan.metadata.get("fused_away")
    x = _x(2, seed=5)
    out = _run(plan, x=x)
    np.testing.assert_allclose(out["s"], x + B, rtol=1e-6)
    np.testing.assert_allclose(out["p"], (x + B) * x, rtol=1e-6)


def test_every_layer_gets_the_cpu_reference_tactic():
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU))
    assert plan.layers and all(layer.tactic == "cpu.reference" for layer in plan.layers)
    assert plan.metadata["tactics"] == {layer.name: layer.tactic for layer in plan.layers}


def test_fp16_on_cpu_records_precision_and_runs_half():
    x = _x(2, seed=4)
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU, fp16=True))
    assert all(layer.precision == "fp16" for layer in plan.layers)
    np.testing.assert_allclose(_run(plan, x=x)["y"], np.abs((x + B) * x) - B, rtol=2e-3, atol=2e-3)


def test_fp16_build_of_a_pure_copy_is_exact():
    """Polygraphy's run example: `run identity.onnx --trt --fp16` must not round an fp32 copy."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2, 4, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 21)])
    feed = np.random.default_rng(0).random((1, 2, 4, 4), dtype=np.float32)
    plan = build_plan(model, BuilderConfig(**CPU, fp16=True))
    np.testing.assert_array_equal(_run(plan, X=feed)["Y"], feed)


def test_constant_graph_output_is_copied_out_by_an_identity_layer():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "g", [x], [y, c],
                              [numpy_helper.from_array(np.array([3.0, 4.0], np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    plan = build_plan(model, BuilderConfig(**CPU))
    assert plan.outputs == ["y", "c"] and plan.tensors["c"].kind == "output"
    out = _run(plan, x=np.array([1.0, 1.0], np.float32))
    np.testing.assert_array_equal(out["c"], [3.0, 4.0])
    np.testing.assert_array_equal(out["y"], [4.0, 5.0])


def test_a_constant_output_read_inside_a_fused_layer_is_renamed_in_its_body_too():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [])
    nodes = [helper.make_node("Greater", ["x", "c"], ["m"], name="gt"),
             helper.make_node("Where", ["m", "x", "c"], ["y"], name="where")]
    graph = helper.make_graph(nodes, "g", [x], [y, c], [numpy_helper.from_array(np.array(0.5, np.float32), "c")])
    plan = build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), BuilderConfig(**CPU))
    assert any(layer.kind == "Pointwise" for layer in plan.layers)
    back = Plan.deserialize(plan.serialize())  # the plan check re-runs the fused body's shape rule
    out = _run(back, x=np.array([0.2, 0.7, 1.5], np.float32))
    np.testing.assert_array_equal(out["y"], np.array([0.5, 0.7, 1.5], np.float32))
    assert out["c"] == np.float32(0.5)


def test_a_tensor_too_large_for_a_plan_is_a_build_error():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**40, 2**20])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**40, 2**20])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    with pytest.raises(BuildError, match=r"tensor 'x' has shape \(1099511627776, 1048576\): .* beyond what a plan holds"):
        build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), BuilderConfig(**CPU))


def test_graph_input_that_is_also_an_output_is_returned():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g", [x], [y, x])
    plan = build_plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), BuilderConfig(**CPU))
    out = _run(plan, x=np.array([1.0, -2.0], np.float32))
    np.testing.assert_array_equal(out["x"], [1.0, -2.0])
    np.testing.assert_array_equal(out["y"], [-1.0, 2.0])


def test_metadata_names_version_model_and_config():
    cfg = BuilderConfig(**CPU, input_shapes={"x": (2, 4)})
    plan = build_plan(_chain_model(), cfg)
    import polykit

    assert plan.metadata["polykit_version"] == polykit.__version__
    assert plan.metadata["source_model"] == "chain"
    assert BuilderConfig.from_json(plan.metadata["builder_config"]) == cfg


def test_weight_tensor_offsets_match_the_weight_blob():
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU, fold_constants=False))
    offsets = weight_offsets({n: w.nbytes for n, w in plan.weights.items()})
    for name in plan.weights:
        assert plan.tensors[name].kind == "weight" and plan.tensors[name].offset == offsets[name]


def test_activation_offsets_come_from_the_memory_plan():
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU, fuse=False))
    for name, t in plan.tensors.items():
        if t.kind != "weight":
            assert t.offset == plan.memory.offsets[name]
            assert t.offset + t.nbytes <= plan.memory.arena_bytes


def test_unknown_target_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown target 'tpu'"):
        build_plan(_chain_model(2), BuilderConfig(target="tpu"))


def test_unknown_memory_strategy_is_a_usage_error():
    with pytest.raises(UsageError, match="memory strategy"):
        BuilderConfig(memory_strategy="random")


def test_fused_plan_round_trips_through_bytes_and_runs_the_same():
    plan = build_plan(_chain_model(2), BuilderConfig(**CPU, fuse=True, mark_outputs=("p",)))
    back = Plan.deserialize(plan.serialize())
    x = _x(2, seed=5)
    a, b = _run(plan, x=x), _run(back, x=x)
    for name in plan.outputs:
        np.testing.assert_array_equal(a[name], b[name])


def _bert_tiny():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "torch" / "bert_tiny_ts.onnx"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    import onnxruntime as ort

    shapes = {i.name: tuple(d if isinstance(d, int) else 2 for d in i.shape)
              for i in ort.InferenceSession(str(path)).get_inputs()}
    return str(path), shapes


def test_exported_transformer_builds_byte_identical_plans_without_timing():
    path, shapes = _bert_tiny()
    cfg = BuilderConfig(**CPU, input_shapes=shapes, builder_optimization_level=0)
    assert build_plan(path, cfg).serialize() == build_plan(path, cfg).serialize()


def test_timed_builds_from_one_warm_timing_cache_are_byte_identical(tmp_path):
    path, shapes = _bert_tiny()
    cache = tmp_path / "timing.json"
    build_plan(path, BuilderConfig(**CPU, input_shapes=shapes, save_timing_cache=cache))
    cfg = BuilderConfig(**CPU, input_shapes=shapes, load_timing_cache=cache)
    first = build_plan(path, cfg)
    assert first.metadata["tuning"]["timed_tactics"] == 0 and first.metadata["tuning"]["cache_hits"] > 0
    assert first.serialize() == build_plan(path, cfg).serialize()


def test_cuda_plan_records_the_kernels_of_every_layer_without_a_gpu():
    from polykit.runtime.tactic_check import plan_kernels

    try:
        plan = build_plan(_chain_model(2), BuilderConfig(target="cuda"))
    except BuildError as exc:
        pytest.skip(f"cuda tactics for these layers are not there yet: {exc.what}")
    assert plan.target == "cuda"
    assert set(plan.metadata["kernels"]["layers"]) == {layer.name for layer in plan.layers}
    back = Plan.deserialize(plan.serialize(), expect_target="cuda")
    for layer in back.layers:
        assert layer.tactic.startswith("cuda.")
        sources = plan_kernels(back, layer)
        assert sources and all(s.name for s in sources)
        assert [{"name": s.name, "key": s.key()} for s in sources] == plan.metadata["kernels"]["layers"][layer.name]


def test_cuda_plan_stores_no_source_text():
    try:
        plan = build_plan(_chain_model(2), BuilderConfig(target="cuda"))
    except BuildError as exc:
        pytest.skip(f"cuda tactics for these layers are not there yet: {exc.what}")
    table = plan.metadata["kernels"]
    assert set(table) == {"layers"}
    assert {key for rows in table["layers"].values() for row in rows for key in row} == {"name", "key"}


def test_shape_from_a_non_constant_value_is_a_build_error_naming_the_tensor():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [2])  # data cast to a shape: no shape-tensor input
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Cast", ["s"], ["si"], to=TensorProto.INT64),
                               helper.make_node("Reshape", ["x", "si"], ["y"])], "g", [x, s], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(BuildError, match="tensor 'y' has non-static shape"):
        build_plan(model, BuilderConfig(**CPU))
