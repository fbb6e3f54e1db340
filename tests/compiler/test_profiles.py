"""Optimization profiles at build time: validation, symbolic plan tensors, corner checks."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.profiles import Profile
from polykit.errors import BuildError, UsageError
from tests.dynamic_models import encoder, mlp

MLP_PROFILE = Profile({"x": ((1, 1, 16), (4, 8, 16), (8, 32, 16))})


def _cfg(*profiles, **kw):
    return BuilderConfig(target="cpu", profiles=list(profiles), **kw)


@pytest.mark.parametrize("triple, what", [
    (((2, 16), (1, 16), (4, 16)), "dim 0 min 2, opt 1, max 4"),
    (((1, 16), (2, 16, 1), (4, 16)), "ranks 2/3/2"),
    ("nope", "not \\(min shape, opt shape, max shape\\)"),
])
def test_malformed_profile_names_the_input_and_dim(triple, what):
    with pytest.raises(UsageError, match=what) as err:
        Profile({"x": triple})
    assert "'x'" in err.value.what


def test_profile_of_another_rank_than_the_model_names_the_input():
    with pytest.raises(BuildError, match="input 'x' rank 2; the model's input has rank 3"):
        build_plan(mlp(), _cfg(Profile({"x": ((1, 16), (2, 16), (4, 16))})))


def test_profile_that_moves_a_static_model_dim_names_the_dim():
    with pytest.raises(BuildError, match="dim 2 the range \\[16, 16, 17\\]; the model fixes that dim to 16"):
        build_plan(mlp(), _cfg(Profile({"x": ((1, 1, 16), (2, 2, 16), (4, 4, 17))})))


def test_profile_without_a_dynamic_input_says_what_to_pass():
    with pytest.raises(BuildError, match="no shapes for dynamic input 'mask'") as err:
        build_plan(encoder(layers=1), _cfg(Profile({"x": ((1, 1, 32), (2, 8, 32), (4, 16, 32))})))
    assert "--trt-min-shapes" in err.value.hint


def test_dims_the_model_names_alike_must_get_the_same_range():
    prof = Profile({"x": ((1, 1, 32), (2, 8, 32), (4, 16, 32)), "mask": ((1, 1), (2, 8), (4, 17))})
    with pytest.raises(BuildError, match="same model dim 'seq'"):
        build_plan(encoder(layers=1), _cfg(prof))


def test_profile_build_records_dim_expressions_opt_shapes_and_max_bytes():
    plan = build_plan(mlp(), _cfg(MLP_PROFILE))
    y = plan.tensors["y"]
    assert [str(d) for d in y.dims] == ["batch", "tokens", "8"]
    assert y.shape == (4, 8, 8)  # opt
    assert y.nbytes == 8 * 32 * 8 * 4  # max
    assert plan.profiles.ranges == ({"batch": (1, 4, 8), "tokens": (1, 8, 32)},)
    flat = next(t for t in plan.tensors.values() if t.dims and len(t.dims) == 2)
    assert str(flat.dims[0]) == "(batch*tokens)"


def test_profile_plan_round_trips_through_its_bytes():
    plan = build_plan(mlp(), _cfg(MLP_PROFILE))
    back = Plan.deserialize(plan.serialize())
    assert back.profiles == plan.profiles
    assert back.tensors == plan.tensors
    assert back.serialize() == plan.serialize()


def test_profile_with_equal_min_opt_max_builds_the_static_plan():
    shape = (2, 5, 16)
    static = build_plan(mlp(), BuilderConfig(target="cpu", input_shapes={"x": shape}))
    pinned = build_plan(mlp(), _cfg(Profile({"x": (shape, shape, shape)})))
    assert not any(t.dims for t in pinned.tensors.values())
    assert [l.kind for l in pinned.layers] == [l.kind for l in static.layers]


def test_reshape_that_cannot_hold_across_the_profile_is_a_build_error_naming_the_node():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = numpy_helper.from_array(np.array([4, 3], dtype=np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="fixed_reshape")], "g", [x], [y],
                              [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(BuildError, match="cannot reshape .* at profile 0's min shape") as err:
        build_plan(model, _cfg(Profile({"x": ((1, 6), (2, 6), (4, 6))})))
    assert "fixed_reshape" in err.value.where


def test_two_profiles_reserve_the_largest_corner_of_either():
    small = Profile({"x": ((1, 1, 16), (2, 2, 16), (2, 4, 16))})
    large = Profile({"x": ((4, 4, 16), (8, 8, 16), (8, 64, 16))})
    plan = build_plan(mlp(), _cfg(small, large))
    assert plan.tensors["y"].nbytes == 8 * 64 * 8 * 4
    assert plan.tensors["y"].shape == (2, 2, 8)  # the first profile's opt


def test_tactic_whose_kernels_bake_a_size_is_not_eligible_for_a_dynamic_layer():
    from dataclasses import replace

    from polykit.compiler.plan.profiles import generic_corners, tensors_at
    from polykit.compiler.builder.tuner import serves_corners
    from polykit.kernels.cuda.base import KernelSource
    from polykit.kernels.tactics import all_tactics

    plan = build_plan(mlp(), _cfg(MLP_PROFILE))
    gemm = next(l for l in plan.layers if l.kind == "Gemm")
    corners = [env for _, _, env in plan.profiles.corners()]
    exact = [tensors_at(plan.tensors, env) for env in corners]
    generic = [tensors_at(plan.tensors, env) for env in generic_corners(corners)]
    simt = next(t for t in all_tactics("cuda") if t.name == "cuda.gemm.simt" and t.kind == "Gemm")
    assert serves_corners(simt, gemm, exact, generic)
    baked = replace(simt, kernels_fn=lambda layer: [KernelSource("gemm", defines=(("M", str(layer.in_shapes[0][0])),))])
    assert not serves_corners(baked, gemm, exact, generic)
    assert not serves_corners(replace(simt, dynamic_sizes=False), gemm, exact, generic)


def test_shape_chains_become_values_the_engine_writes_instead_of_layers():
    plan = build_plan(encoder(layers=1), _cfg(Profile({"x": ((1, 1, 32), (2, 8, 32), (4, 40, 32)),
                                                       "mask": ((1, 1), (2, 8), (4, 40))})))
    assert not {"Shape", "Gather", "Concat"} & {l.kind for l in plan.layers}
    values = sorted(tuple(map(str, t.value)) for t in plan.tensors.values() if t.value)
    assert ("batch", "seq", "32") in values  # the merge of the heads' output
    # the heads' [batch, seq, 4, 8] Reshape targets are gone: Attention reads q, k and v as views of
    # one packed projection (pack_gemms, fold_attention_layouts' `#k` views)
    (att,) = [l for l in plan.layers if l.kind == "Attention"]
    assert len(set(att.inputs[:3])) == 1 and "#1" in str(att.attrs["q_view"])


def _max_of_batch_model(decided: bool = False):
    """y = max(batch, 3): a Max node (an expression of the batch), or Where(Greater(batch, 3), batch, 3),
    whose comparison a build decides at opt."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, None)
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape", end=1)]
    if decided:
        nodes += [helper.make_node("Greater", ["s", "three"], ["g"], name="greater_than_3"),
                  helper.make_node("Where", ["g", "s", "three"], ["y"], name="max_with_3")]
    else:
        nodes += [helper.make_node("Max", ["s", "three"], ["y"], name="max_with_3")]
    three = numpy_helper.from_array(np.array([3], dtype=np.int64), "three")
    graph = helper.make_graph(nodes, "g", [x], [y], [three])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_value_decided_at_opt_that_differs_at_a_corner_is_a_build_error_naming_the_node():
    with pytest.raises(BuildError, match=r"shape tensor 'y' holds \[3\] at profile 0's min shape") as err:
        build_plan(_max_of_batch_model(decided=True), _cfg(Profile({"x": ((1, 4), (4, 4), (8, 4))})))
    assert "max_with_3" in err.value.where


@pytest.mark.parametrize("decided, low", [(True, 3), (False, 1)])
def test_shape_value_that_holds_over_the_profile_is_an_engine_output(decided, low):
    """A comparison holds over [3, 8]; Max, an expression, over any batch."""
    from polykit.runtime.engine import Runtime

    plan = build_plan(_max_of_batch_model(decided), _cfg(Profile({"x": ((low, 4), (4, 4), (8, 4))})))
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for batch in range(low, 9):
            assert ctx.execute({"x": np.zeros((batch, 4), np.float32)})["y"].tolist() == [max(batch, 3)]


@pytest.mark.parametrize("case", ["embedding", "encoder", "convnet", "mlp", "tiny_bert"])
@pytest.mark.parametrize("fp16", [False, True])
def test_cuda_plans_for_profiles_build_with_kernels_that_take_sizes_at_run_time(case, fp16):
    from tests.runtime.test_dynamic_shapes import CASES

    make, profile, _, _ = CASES[case]
    plan = build_plan(make(), BuilderConfig(target="cuda", profiles=[profile], fp16=fp16))
    back = Plan.deserialize(plan.serialize())
    assert back.profiles == plan.profiles and any(t.dims for t in back.tensors.values())
    assert all(layer.tactic.startswith("cuda.") for layer in back.layers)


def _expand_to_where_of_dims_model():
    """Expand to Where(Equal(shape, -1), 1, shape), the HF exporter's guard for -1 dims (Equal and
    Where fuse into a Pointwise node)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(np.array([-1, -1], dtype=np.int64), "minus"),
             numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "ones"),
             numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8), "row")]
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Equal", ["s", "minus"], ["is_free"], name="equal"),
             helper.make_node("Where", ["is_free", "ones", "s"], ["target"], name="where"),
             helper.make_node("Slice", ["row", "zero", "m1", "one"], ["cols"], name="cols"),
             helper.make_node("Expand", ["cols", "target"], ["e"], name="expand"),
             helper.make_node("Add", ["e", "x"], ["y"], name="add")]
    inits += [numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
              numpy_helper.from_array(np.array([1], dtype=np.int64), "one")]
    nodes.insert(3, helper.make_node("Slice", ["s", "one", "two"], ["m1"], name="m_of_shape"))
    inits.append(numpy_helper.from_array(np.array([2], dtype=np.int64), "two"))
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_expand_to_a_where_of_dims_keeps_its_dim_expressions():
    from polykit.runtime.engine import Runtime

    plan = build_plan(_expand_to_where_of_dims_model(), _cfg(Profile({"x": ((1, 1), (2, 4), (4, 8))})))
    assert [str(d) for d in plan.tensors["e"].dims] == ["n", "m"]
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        np.testing.assert_array_equal(ctx.execute({"x": x})["y"], x + np.linspace(-1, 1, 8, dtype=np.float32)[:5])


def test_tactics_are_timed_at_each_profiles_opt_shape(monkeypatch):
    import polykit.compiler.builder.tuner as tuner
    from polykit.compiler.ir.symbolic import evaluate

    timed: dict[str, set] = {}
    real = tuner.time_candidates

    def spy(target, layer, pairs, tensors, *args):
        for n, shape in zip(layer.inputs, layer.in_shapes):
            timed.setdefault(n, set()).add(("stamped", shape))
        for n in layer.inputs + layer.outputs:
            if n:
                timed.setdefault(n, set()).add(("tensor", tensors[n].shape))
        return real(target, layer, pairs, tensors, *args)

    monkeypatch.setattr(tuner, "time_candidates", spy)
    plan = build_plan(mlp(), _cfg(MLP_PROFILE, Profile({"x": ((1, 1, 16), (2, 2, 16), (2, 2, 16))}),
                                  builder_optimization_level=5))
    dynamic = {n for n in timed if plan.tensors.get(n) is not None and plan.tensors[n].dims}
    assert dynamic, "the cpu build timed no layer with dynamic tensors"
    for name in dynamic:  # profile 0's opt, then profile 1's (profile_tactics)
        shapes = {tuple(evaluate(d, opt) for d in plan.tensors[name].dims)
                  for opt in ({"batch": 4, "tokens": 8}, {"batch": 2, "tokens": 2})}
        assert {shape for _, shape in timed[name]} == shapes, name


def _column_mean_model():
    """ReduceMean over the middle axis of (n, l, 32): a column span (squeeze-excitation's pool)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "l", 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1, name="pool")
    return helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=10)


def test_a_split_reduction_serves_a_profile_whose_short_corner_needs_no_split():
    """cuda.reduce.span.split is a candidate only where its split pays (supports), but its enqueue
    runs the span kernel where it does not, so it serves a profile corner whose columns are too
    short to split (`serves`): a profile over image sizes keeps it (EfficientNet's and MobileNetV3's
    pools took the unsplit kernel there: benchmarks/dynamic_vs_static.py)."""
    from dataclasses import replace

    from polykit.compiler.builder.tuner import serves_corners
    from polykit.compiler.plan.profiles import at_corner, generic_corners, tensors_at
    from polykit.kernels.tactics import find_tactic

    profile = Profile({"x": ((1, 256, 32), (2, 4096, 32), (4, 8192, 32))})
    plan = build_plan(_column_mean_model(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                                          profiles=[profile]))
    pool = next(l for l in plan.layers if l.kind == "ReduceMean")
    assert pool.tactic == "cuda.reduce.span.split"
    split = find_tactic("cuda", "ReduceMean", "cuda.reduce.span.split")
    corners = [env for _, _, env in plan.profiles.corners()]
    exact = [tensors_at(plan.tensors, env) for env in corners]
    generic = [tensors_at(plan.tensors, env) for env in generic_corners(corners)]
    low = [t for t in exact if t[pool.inputs[0]].shape[1] == 256]
    assert low and not split.supports(at_corner(pool, low[0]))  # no split at the short corner
    assert serves_corners(split, pool, exact, generic)
    assert not serves_corners(replace(split, serves=None), pool, exact, generic)


def test_the_row_broadcast_pointwise_serves_a_profile_whose_batch_1_corner_broadcasts_nothing():
    """BERT's embeddings Add, x [B, S, E] + position [1, S, E] with B in 1..8: at B = 1 no row
    broadcast is left, so cuda.pointwise.rows does not `support` that corner, but its enqueue runs
    the plain entries there, so it `serves` it and the dynamic plan keeps it (benchmarks/
    dynamic_vs_static.py found BERT-base's Add on cuda.pointwise instead)."""
    from dataclasses import replace

    from polykit.compiler.builder.tuner import serves_corners
    from polykit.compiler.plan.profiles import at_corner, generic_corners, tensors_at
    from polykit.kernels.tactics import find_tactic

    graph = helper.make_graph([helper.make_node("Add", ["x", "pos"], ["y"], name="embeddings_add")], "emb",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16, 64])],
                              [numpy_helper.from_array(np.ones((1, 16, 64), np.float32), "pos")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    profile = Profile({"x": ((1, 16, 64), (8, 16, 64), (8, 16, 64))})
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0, profiles=[profile]))
    (add,) = plan.layers  # the Add with the fp16 build's casts at the edges: one Pointwise layer
    assert add.tactic == "cuda.pointwise.rows"
    rows = find_tactic("cuda", add.kind, "cuda.pointwise.rows")
    corners = [env for _, _, env in plan.profiles.corners()]
    exact = [tensors_at(plan.tensors, env) for env in corners]
    generic = [tensors_at(plan.tensors, env) for env in generic_corners(corners)]
    one = [t for t in exact if t[add.inputs[0]].shape[0] == 1]
    assert one and not rows.supports(at_corner(add, one[0]))
    assert serves_corners(rows, add, exact, generic)
    assert not serves_corners(replace(rows, serves=None), add, exact, generic)
