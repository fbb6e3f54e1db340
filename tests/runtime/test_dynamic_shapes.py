"""One plan built for an optimization profile serves every shape in it (cpu target): bit for
bit what a static plan of that shape computes, within fp32 tolerance of onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.profiles import Profile
from polykit.errors import RuntimeInputError, UsageError
from polykit.runtime.engine import Runtime
from tests.dynamic_models import convnet, embedding, encoder, mlp, tiny_bert, window_pad

ENCODER_PROFILE = Profile({"x": ((1, 1, 32), (2, 16, 32), (4, 40, 32)), "mask": ((1, 1), (2, 16), (4, 40))})
CONV_PROFILE = Profile({"image": ((1, 3, 16, 16), (2, 3, 32, 32), (4, 3, 64, 64))})
MLP_PROFILE = Profile({"x": ((1, 1, 16), (4, 8, 16), (8, 32, 16))})
#: even corners: the Pad of window_pad pads nothing at any of them
WINDOW_PROFILE = Profile({"x": ((1, 4, 4, 8), (2, 6, 6, 8), (4, 8, 8, 8))})
EMBEDDING_PROFILE = Profile({"ids": ((1, 1), (2, 8), (4, 64))})
BERT_RANGE = ((1, 16), (4, 64), (8, 512))
BERT_PROFILE = Profile({"input_ids": BERT_RANGE, "attention_mask": BERT_RANGE})


def _encoder_feeds(rng, b, s):
    return {"x": rng.standard_normal((b, s, 32)).astype(np.float32),
            "mask": np.where(rng.random((b, s)) < 0.2, -1e4, 0).astype(np.float32)}


def _bert_feeds(rng, b, s):
    mask = np.ones((b, s), dtype=np.int64)
    mask[:, s - s // 4:] = 0  # padded tails
    return {"input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64), "attention_mask": mask}


CASES = {
    "tiny_bert": (tiny_bert, BERT_PROFILE, [(1, 16), (3, 77), (8, 512), (2, 129)], _bert_feeds),
    "encoder": (encoder, ENCODER_PROFILE, [(1, 7), (2, 13), (3, 33), (4, 40), (1, 1)], _encoder_feeds),
    "convnet": (convnet, CONV_PROFILE, [(1, 16, 16), (3, 40, 24), (4, 64, 64), (2, 17, 33)],
                lambda rng, b, h, w: {"image": rng.standard_normal((b, 3, h, w)).astype(np.float32)}),
    "embedding": (embedding, EMBEDDING_PROFILE, [(1, 1), (3, 17), (4, 64)],
                  lambda rng, b, s: {"ids": rng.integers(0, 100, (b, s)).astype(np.int64)}),
    "window_pad": (window_pad, WINDOW_PROFILE, [(1, 4, 4), (3, 5, 7), (2, 7, 6), (4, 8, 8), (1, 5, 5)],
                   lambda rng, b, h, w: {"x": rng.standard_normal((b, h, w, 8)).astype(np.float32)}),
    "mlp": (mlp, MLP_PROFILE, [(1, 1), (3, 7), (8, 32), (5, 13)],
            lambda rng, b, t: {"x": rng.standard_normal((b, t, 16)).astype(np.float32)}),
}


#: level 0 takes the first tactic by priority (nothing timed), so both builds pick alike
LEVEL = 0


def _run_static(model, feeds):
    cfg = BuilderConfig(target="cpu", input_shapes={n: v.shape for n, v in feeds.items()},
                        builder_optimization_level=LEVEL)
    with Runtime().deserialize_engine(build_plan(model, cfg)) as engine:
        with engine.create_execution_context() as ctx:
            return ctx.execute(feeds)


@pytest.mark.parametrize("case", sorted(CASES))
def test_profile_plan_serves_every_shape_like_a_static_plan_and_onnxruntime(case):
    make, profile, shapes, feeds_of = CASES[case]
    model = make()
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[profile], builder_optimization_level=LEVEL))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for dims in shapes:
            feeds = feeds_of(rng, *dims)
            got = ctx.execute(feeds)
            static = _run_static(model, feeds)
            expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
            for name, value in got.items():
                assert np.array_equal(value, static[name]), (case, dims, name)
                np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-4)


def test_shape_outside_the_profile_names_the_input_the_dim_and_the_range():
    plan = build_plan(encoder(layers=1), BuilderConfig(target="cpu", profiles=[ENCODER_PROFILE]))
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        with pytest.raises(RuntimeInputError, match=r"input 'x' has dim 1 = 41, outside optimization profile 0's "
                                                    r"range \[1, 40\]"):
            ctx.execute(_encoder_feeds(np.random.default_rng(0), 2, 41))


def test_inputs_that_share_a_model_dim_must_agree():
    plan = build_plan(encoder(layers=1), BuilderConfig(target="cpu", profiles=[ENCODER_PROFILE]))
    feeds = _encoder_feeds(np.random.default_rng(0), 2, 9)
    feeds["mask"] = feeds["mask"][:, :8]
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        with pytest.raises(RuntimeInputError, match="input 'mask' has dim 1 = 8, but input 'x' gives 9"):
            ctx.execute(feeds)


def test_static_dim_of_a_dynamic_input_is_checked():
    plan = build_plan(mlp(), BuilderConfig(target="cpu", profiles=[MLP_PROFILE]))
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        with pytest.raises(RuntimeInputError, match="dim 2 = 15; the engine's input has static dim 16"):
            ctx.execute({"x": np.ones((2, 2, 15), np.float32)})


def test_context_reports_the_shapes_of_the_bound_input_shapes():
    plan = build_plan(mlp(), BuilderConfig(target="cpu", profiles=[MLP_PROFILE]))
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        assert ctx.get_tensor_shape("y") == (4, 8, 8)
        ctx.set_input_shape("x", (3, 5, 16))
        assert ctx.get_tensor_shape("y") == (3, 5, 8)
        assert engine.get_tensor_dims("y") == ("batch", "tokens", "8")
        assert engine.get_profile_shape(0, "x") == ((1, 1, 16), (4, 8, 16), (8, 32, 16))


def test_each_context_serves_its_own_optimization_profile():
    small = Profile({"x": ((1, 1, 16), (2, 2, 16), (2, 4, 16))})
    large = Profile({"x": ((4, 4, 16), (8, 8, 16), (8, 64, 16))})
    model = mlp()
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[small, large], builder_optimization_level=LEVEL))
    x = np.random.default_rng(0).standard_normal((6, 50, 16)).astype(np.float32)
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        assert engine.num_optimization_profiles == 2
        with pytest.raises(RuntimeInputError, match="outside optimization profile 0's range"):
            ctx.execute({"x": x})
        ctx.set_optimization_profile(1)
        assert np.array_equal(ctx.execute({"x": x})["y"], _run_static(model, {"x": x})["y"])
        with pytest.raises(UsageError, match="profile 2 does not exist"):
            ctx.set_optimization_profile(2)


def _reshape_by_input():
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1, name="softmax")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
                                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


VALUES_PROFILE = Profile(shapes={"x": ((1,), (32,), (256,))}, values={"shape": ((1, 1), (4, 8), (16, 16))})


def test_shape_tensor_input_values_set_the_shapes_of_one_plan():
    model = _reshape_by_input()
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[VALUES_PROFILE]))
    assert [str(d) for d in plan.tensors["y"].dims] == ["value(shape)[0]", "value(shape)[1]"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for rows, cols in ((5, 6), (1, 1), (16, 16), (3, 10)):
            feeds = {"x": np.random.default_rng(rows).standard_normal(rows * cols).astype(np.float32),
                     "shape": np.array([rows, cols])}
            got = ctx.execute(feeds)["y"]
            assert got.shape == (rows, cols)
            np.testing.assert_allclose(got, session.run(None, feeds)[0], rtol=1e-5, atol=1e-6)


def test_shape_tensor_value_outside_the_profile_names_the_input_and_element():
    plan = build_plan(_reshape_by_input(), BuilderConfig(target="cpu", profiles=[VALUES_PROFILE]))
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        with pytest.raises(RuntimeInputError, match=r"input 'shape' has element 1 = 17, outside optimization "
                                                    r"profile 0's range \[1, 16\]"):
            ctx.execute({"x": np.zeros(34, np.float32), "shape": np.array([2, 17])})
        with pytest.raises(UsageError, match="not a shape-tensor input"):
            ctx.set_input_values("x", [1])


def test_shape_values_get_one_region_slot_each_and_their_views_follow_them():
    """polykit.runtime.cuda.staging's layout (no GPU needed): every host-computed value tensor
    of a profile plan has a 16-byte aligned slot sized for its largest shape; a view of one reads
    its source's slot."""
    from polykit.runtime.cuda.staging import placed_root, value_layout

    make, profile, _, _ = CASES["encoder"]
    plan = build_plan(make(), BuilderConfig(target="cpu", profiles=[profile]))
    values = [n for n, t in plan.tensors.items() if t.value]
    assert values, "the encoder case must have host-computed shape values"
    layout, nbytes = value_layout(plan.tensors, plan.memory.aliases)
    assert set(layout) <= set(values) and all(off % 16 == 0 for off in layout.values())
    slots = sorted((off, plan.tensors[n].nbytes) for n, off in layout.items())
    assert all(a + size <= b for (a, size), (b, _) in zip(slots, slots[1:])) and slots[-1][0] + slots[-1][1] <= nbytes
    for name in values:
        assert placed_root(name, plan.memory.aliases, layout) in layout
    aliases = {"v": values[0], "w": "v", "x": "not-a-value"}
    assert placed_root("w", aliases, layout) == placed_root(values[0], aliases, layout)
    assert placed_root("x", aliases, layout) is None


def test_a_tactic_that_does_not_serve_a_runs_shapes_is_a_plan_error_not_wrong_outputs(monkeypatch):
    """The cuda plan of window_pad (built here, no GPU needed) runs its Pad with cuda.movement.pad_last, chosen
    at the profile's even corners, where nothing is padded; at an odd side it pads H and W. pad_last serves that
    through its fallback (its `serves`); a tactic without one is refused when the shapes are bound."""
    from dataclasses import replace

    import polykit.runtime.shapes as shapes_module
    from polykit.errors import PlanError
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.shapes import ShapeBinder

    plan = build_plan(window_pad(), BuilderConfig(target="cuda", profiles=[WINDOW_PROFILE], builder_optimization_level=0))
    (pad,) = [layer for layer in plan.layers if layer.kind == "Pad"]
    assert pad.tactic == "cuda.movement.pad_last"
    ShapeBinder(plan).bind({"x": (3, 5, 7, 8)})  # served by the fallback
    without = replace(find_tactic("cuda", "Pad", "cuda.movement.pad_last"), serves=None)
    monkeypatch.setattr(shapes_module, "find_tactic", lambda target, kind, name: without if kind == "Pad" else
                        find_tactic(target, kind, name))
    binder = ShapeBinder(plan)
    binder.bind({"x": (2, 6, 8, 8)})  # even sides: nothing padded, pad_last's own kernel
    with pytest.raises(PlanError, match=r"tactic cuda.movement.pad_last does not serve .*outputs \[\(3, 6, 8, 8\)\]") as err:
        binder.bind({"x": (3, 5, 7, 8)})
    assert err.value.where == f"layer {pad.name!r}" and "corner" in err.value.hint


def test_evaluate_gives_binds_shapes_and_unserved_lists_what_bind_refuses(monkeypatch):
    """`ShapeBinder.evaluate` is `bind`'s ShapeSet without the tactics' check; `unserved` names the layers
    that check refuses (benchmarks/dynamic_screen.py lists them all where `bind` raises at the first)."""
    from dataclasses import replace

    import polykit.runtime.shapes as shapes_module
    from polykit.errors import PlanError
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.shapes import ShapeBinder

    plan = build_plan(window_pad(), BuilderConfig(target="cuda", profiles=[WINDOW_PROFILE], builder_optimization_level=0))
    odd = {"x": (3, 5, 7, 8)}
    evaluated, bound = ShapeBinder(plan).evaluate(odd), ShapeBinder(plan).bind(odd)
    assert (evaluated.key, evaluated.shapes, evaluated.dims) == (bound.key, bound.shapes, bound.dims)
    without = replace(find_tactic("cuda", "Pad", "cuda.movement.pad_last"), serves=None)
    monkeypatch.setattr(shapes_module, "find_tactic", lambda target, kind, name: without if kind == "Pad" else
                        find_tactic(target, kind, name))
    binder = ShapeBinder(plan)
    found = binder.evaluate(odd)  # no PlanError: nothing checked
    assert found.shapes == evaluated.shapes
    ((layer, stamped),) = binder.unserved(found)
    assert layer.kind == "Pad" and stamped.out_shapes == ((3, 6, 8, 8),)
    with pytest.raises(PlanError, match=layer.tactic):
        binder.bind(odd)
