"""move_row_transposes: row-permuting Transposes travel through row-wise ops and views to a partner.

Models are torchvision-MultiheadAttention-like blocks (batch_first=True: transposes to and from
[S, B, E]) at small odd dims; each runs on the cpu target against onnxruntime, and the Transposes
left in the plan are counted."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.passes import move_row_transposes
from polykit.compiler.passes.row_transposes import commute_reshape
from polykit.runtime.engine import Engine

from .passes_testkit import graph, node, op_counts, run_and_compare

B, S, H, D = 3, 13, 2, 4
E = H * D
RNG = np.random.default_rng(7)


# ---- commute_reshape on random shapes -----------------------------------------------------------
def _random_reshape(rng):
    """Two groupings of the same random atoms (a reshape), sometimes with a size-1 axis added."""
    atoms = [int(d) for d in rng.choice([1, 2, 3, 4], size=int(rng.integers(2, 6)))]

    def grouped():
        cuts = sorted(rng.choice(range(1, len(atoms)), size=int(rng.integers(0, len(atoms))), replace=False))
        bounds = [0, *cuts, len(atoms)]
        return tuple(int(np.prod(atoms[a:b])) for a, b in zip(bounds, bounds[1:]))

    old_in, old_out = grouped(), grouped()
    if rng.random() < 0.5:
        old_out = old_out[:1] + (1,) + old_out[1:]
    return old_in, old_out


def test_commute_reshape_matches_numpy_whenever_it_answers():
    rng = np.random.default_rng(3)
    answered = refused = 0
    for _ in range(60):
        old_in, old_out = _random_reshape(rng)
        for perm in itertools.permutations(range(len(old_in))):
            got = commute_reshape(old_in, old_out, list(perm))
            if got is None:
                refused += 1
                continue
            answered += 1
            new_out, perm_out = got
            new_in = tuple(old_in[a] for a in np.argsort(perm))
            x = np.arange(int(np.prod(new_in))).reshape(new_in)
            want = np.transpose(x, perm).reshape(old_out)
            np.testing.assert_array_equal(np.transpose(x.reshape(new_out), perm_out), want)
    assert answered > 100 and refused > 100  # both sides exercised


def test_commute_reshape_answers_splits_of_kept_axes_and_refuses_merges_of_moved_ones():
    assert commute_reshape((13, 3, 24), (13, 3, 3, 8), [1, 0, 2]) == ((3, 13, 3, 8), [1, 0, 2, 3])
    assert commute_reshape((13, 3, 3, 8), (1, 13, 3, 3, 8), [1, 0, 2, 3]) is not None
    assert commute_reshape((13, 3, 24), (39, 24), [1, 0, 2]) is None  # rows the transpose swapped
    assert commute_reshape((13, 3, 2, 4), (13, 3, 8), [1, 0, 2, 3]) == ((3, 13, 8), [1, 0, 2])
    assert commute_reshape((13, 3, 2, 4), (13, 3, 8), [2, 0, 1, 3]) is None  # heads apart from head dims


# ---- models --------------------------------------------------------------------------------------
def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


W_IN, B_IN = _w(E, 3 * E), _w(3 * E)
W_OUT, B_OUT = _w(E, E), _w(E)
LN_S, LN_B = _w(E) + 1.0, _w(E)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "rows", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _in_path(x: str, prefix: str = ""):
    """torchvision MHA's packed in-projection of x [B, S, E]: q, k, v as [B, H, S, D]."""
    p = prefix
    nodes = [helper.make_node("Transpose", [x], [f"{p}xt"], perm=[1, 0, 2]),
             helper.make_node("MatMul", [f"{p}xt", "w_in"], [f"{p}mm"]),
             helper.make_node("Add", ["b_in", f"{p}mm"], [f"{p}qkv"]),
             helper.make_node("Reshape", [f"{p}qkv", "s_split3"], [f"{p}qkv4"]),
             helper.make_node("Unsqueeze", [f"{p}qkv4", "ax0"], [f"{p}qkv5"]),
             helper.make_node("Transpose", [f"{p}qkv5"], [f"{p}qkvt"], perm=[3, 1, 2, 0, 4]),
             helper.make_node("Squeeze", [f"{p}qkvt", "ax3"], [f"{p}qkvs"])]
    for i, t in enumerate("qkv"):
        nodes += [helper.make_node("Gather", [f"{p}qkvs", f"i{i}"], [f"{p}{t}0"], axis=0),
                  helper.make_node("Reshape", [f"{p}{t}0", "s_heads"], [f"{p}{t}1"]),
                  helper.make_node("Transpose", [f"{p}{t}1"], [f"{p}{t}2"], perm=[1, 0, 2]),
                  helper.make_node("Reshape", [f"{p}{t}2", "s_bhsd"], [f"{p}{t}"])]
    return nodes


def _attention(q, k, v, out):
    return [helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [q, "kt"], ["sc0"]),
            helper.make_node("Mul", ["sc0", "scale"], ["sc"]),
            helper.make_node("Softmax", ["sc"], ["pr"], axis=-1),
            helper.make_node("MatMul", ["pr", v], [out])]


def _out_path(a: str, residual: str, y: str, alpha=1.0, beta=1.0):
    """torchvision MHA's out-projection of a [B, H, S, D] back to [B, S, E], plus the residual."""
    return [helper.make_node("Transpose", [a], ["at"], perm=[2, 0, 1, 3]),
            helper.make_node("Reshape", ["at", "s_rows"], ["a2"]),
            helper.make_node("Gemm", ["a2", "w_out_t", "b_out"], ["o2"], transB=1, alpha=alpha, beta=beta),
            helper.make_node("Reshape", ["o2", "s_sbe"], ["o3"]),
            helper.make_node("Transpose", ["o3"], ["o"], perm=[1, 0, 2]),
            helper.make_node("Add", ["o", residual], [y])]


def _inits(dims=(B, S, H, D)):
    b, s, h, d = dims
    e = h * d
    weights = (W_IN, B_IN, W_OUT, B_OUT, LN_S, LN_B) if e == E else \
        (_w(e, 3 * e, scale=e ** -0.5), _w(3 * e), _w(e, e, scale=e ** -0.5), _w(e), _w(e) + 1.0, _w(e))
    w_in, b_in, w_out, b_out, ln_s, ln_b = weights
    return [numpy_helper.from_array(w_in, "w_in"), numpy_helper.from_array(b_in, "b_in"),
            numpy_helper.from_array(np.ascontiguousarray(w_out.T), "w_out_t"), numpy_helper.from_array(b_out, "b_out"),
            numpy_helper.from_array(ln_s, "ln_s"), numpy_helper.from_array(ln_b, "ln_b"),
            numpy_helper.from_array(np.array(d ** -0.5, np.float32), "scale"),
            _i64("s_split3", [s, b, 3, e]), _i64("ax0", [0]), _i64("ax3", [3]),
            _i64("s_heads", [s, b * h, d]), _i64("s_bhsd", [b, h, s, d]), _i64("s_rows", [s * b, e]),
            _i64("s_sbe", [s, b, e]), _i64("i0", 0), _i64("i1", 1), _i64("i2", 2)]


def _block_model(alpha=1.0, beta=1.0, dims=(B, S, H, D)):
    """LayerNorm -> MHA (in path, attention, out path) -> residual Add, x [B, S, E]."""
    nodes = [helper.make_node("LayerNormalization", ["x", "ln_s", "ln_b"], ["ln"], axis=-1)]
    nodes += _in_path("ln") + _attention("q", "k", "v", "a") + _out_path("a", "x", "y", alpha, beta)
    b, s, h, d = dims
    return _model(nodes, [("x", [b, s, h * d])], ["y"], _inits(dims))


def _check(model, feeds, kinds=("Transpose",)):
    """Build on cpu, compare with onnxruntime; the number of plan layers of `kinds`."""
    plan = build_plan(model, BuilderConfig(target="cpu"))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute(feeds)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for out, want in zip(sess.get_outputs(), sess.run(None, feeds)):
        np.testing.assert_allclose(got[out.name], want, rtol=1e-4, atol=1e-5, err_msg=out.name)
    return sum(layer.kind in kinds for layer in plan.layers)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("dims", [(B, S, H, D), (2, 37, 2, 64)])
def test_mha_block_keeps_no_transpose(dims):
    # the out path's two Transposes compose into [0, 2, 1, 3], which the Attention writes as "bshd";
    # the in path's sinks through the packed projection into the Attention's q / k / v views
    b, s, h, d = dims
    assert _check(_block_model(dims=dims), {"x": _x(b, s, h * d)}) == 0


def test_mha_block_reads_q_k_v_as_views_of_the_untransposed_projection():
    plan = build_plan(_block_model(), BuilderConfig(target="cpu"))
    producers = {out: layer for layer in plan.layers for out in layer.outputs}
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    projection = producers[att.inputs[0]]
    assert att.inputs[:3] == (att.inputs[0],) * 3 and projection.kind == "MatMul"
    assert producers[projection.inputs[0]].kind == "LayerNormalization"
    assert plan.tensors[att.inputs[0]].shape == (B, S, 3 * E)  # [B, S, 3E]: the batch leads, as x's
    assert att.attrs["q_view"] == [0, B, H, S, D, S * 3 * E, D, 3 * E, 1]


def test_cuda_fp16_plan_of_the_mha_block_moves_no_bytes():
    """The cuda level-0 plan (no GPU needed): no movement layer but views (Reshapes sharing their
    input's memory) and the fp16 conversions of the graph's input and output."""
    plan = build_plan(_block_model(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    views = [layer for layer in plan.layers if layer.kind in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")]
    assert views and all(layer.outputs[0] in plan.memory.aliases for layer in views)
    casts = [layer for layer in plan.layers if layer.kind == "Cast"]
    assert {n for layer in casts for n in (*layer.inputs, *layer.outputs)} >= {"x", "y"} and len(casts) == 2
    assert sorted(layer.kind for layer in plan.layers if layer not in views and layer not in casts) \
        == ["Attention", "LayerNormalization", "MatMul", "MatMul"]
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert att.attrs["out_layout"] == "bshd" and all(att.attrs[a] for a in ("q_view", "k_view", "v_view"))


def test_a_projection_read_by_another_op_keeps_its_layout_which_the_layer_norm_writes():
    """The packed projection is a graph output too: its [S, B, 3E] layout must stay, so the in-path
    Transpose does not sink; fold_norm_row_maps then has the LayerNorm before it write its rows in
    [S, B] order (a row map), so no Transpose layer is left."""
    model = _block_model()
    model.graph.output.append(helper.make_tensor_value_info("qkv", TensorProto.FLOAT, None))
    assert _check(model, {"x": _x(B, S, E)}) == 0
    plan = build_plan(model, BuilderConfig(target="cpu"))
    (norm,) = [layer for layer in plan.layers if layer.kind == "LayerNormalization" and "row_map" in layer.attrs]
    assert norm.out_shapes[0] == (S, B, E)


@pytest.mark.gpu
def test_cuda_fp16_plan_of_the_mha_block_matches_onnxruntime_with_every_attention_tactic():
    """At a head size the flash kernels take, each Attention tactic eligible on this GPU (the sm_90
    TMA kernel among them: the [B, S, 3E] projection's views nest) reads the moved views right."""
    from polykit.kernels.tactics import candidates

    dims = (2, 37, 2, 64)
    model, feeds = _block_model(dims=dims), {"x": _x(2, 37, 128)}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    first = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    (att,) = [layer for layer in first.layers if layer.kind == "Attention"]
    assert not [layer for layer in first.layers if layer.kind == "Transpose"] and att.attrs.get("q_view")
    tactics = [t.name for t in candidates("cuda", "Attention", att, arch=first.gpu_arch)]
    assert "cuda.attention.flash" in tactics
    for tactic in tactics:
        plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, tactic_replay={att.name: tactic}))
        assert [layer.tactic for layer in plan.layers if layer.kind == "Attention"] == [tactic]
        with Engine(plan) as engine, engine.create_execution_context() as ctx:
            got = ctx.execute(feeds)["y"].astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2, err_msg=tactic)


def test_gemm_with_alpha_beta_bias_runs_as_matmul_over_the_rows():
    model = _model(_out_path("a", "r", "y", alpha=0.5, beta=2.0), [("a", [B, H, S, D]), ("r", [B, S, E])], ["y"],
                   _inits())
    # no Attention: the two Transposes compose into one
    assert _check(model, {"a": _x(B, H, S, D), "r": _x(B, S, E)}) == 1


def _sink_model(last_moves=False, extra_reader=False):
    """x [B, S, E] -> Transpose -> LayerNorm -> MatMul + bias -> Reshape [., ., H, D] -> Transpose.
    The first Transpose swaps B and S ([S, B, E]), or with `last_moves` S and E ([B, E, S])."""
    perm, split, last = ([0, 2, 1], [B, E, H, D], S) if last_moves else ([1, 0, 2], [S, B, H, D], E)
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=perm),
             helper.make_node("LayerNormalization", ["xt", "ln_s2", "ln_b2"], ["ln"], axis=-1),
             helper.make_node("MatMul", ["ln", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "bias"], ["pj"]),
             helper.make_node("Reshape", ["pj", "split"], ["p4"]),
             helper.make_node("Transpose", ["p4"], ["y"], perm=[1, 2, 0, 3])]
    inits = [numpy_helper.from_array(_w(last, E), "w"), numpy_helper.from_array(_w(E), "bias"),
             numpy_helper.from_array(_w(last) + 1, "ln_s2"), numpy_helper.from_array(_w(last), "ln_b2"),
             _i64("split", split)]
    outputs = ["y"]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["x"], ["x_relu"]))
        outputs.append("x_relu")
    return _model(nodes, [("x", [B, S, E])], outputs, inits)


def test_transpose_sinks_through_layernorm_matmul_and_split_to_compose():
    assert _check(_sink_model(), {"x": _x(B, S, E)}) == 1


def test_a_moved_input_keeps_its_other_readers():
    assert _check(_sink_model(extra_reader=True), {"x": _x(B, S, E)}) == 1


def test_a_transpose_that_moves_the_last_axis_does_not_sink():
    assert _check(_sink_model(last_moves=True), {"x": _x(B, S, E)}) == 2


def test_sink_into_attention_inputs_and_hoist_from_its_output_leave_no_transpose():
    """Separate q/k/v projections of one transposed x (a tree of chains) reach the Attention as
    [0, 2, 1, 3]; the output path composes into its "bshd" output."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2])]
    inits = _inits()
    for i, t in enumerate("qkv"):
        nodes += [helper.make_node("MatMul", ["xt", f"w{t}"], [f"{t}0"]),
                  helper.make_node("Reshape", [f"{t}0", "s_sbhd"], [f"{t}1"]),
                  helper.make_node("Transpose", [f"{t}1"], [t], perm=[1, 2, 0, 3])]
        inits.append(numpy_helper.from_array(_w(E, E), f"w{t}"))
    inits.append(_i64("s_sbhd", [S, B, H, D]))
    nodes += _attention("q", "k", "v", "a") + _out_path("a", "x", "y")
    assert _check(_model(nodes, [("x", [B, S, E])], ["y"], inits), {"x": _x(B, S, E)}) == 0


def test_a_transposed_tensor_read_by_a_graph_output_stays():
    nodes = [node("Transpose", ["x"], "t", perm=[1, 0, 2]), node("MatMul", ["t", "w"], "m"),
             node("Transpose", ["m"], "y", perm=[1, 0, 2])]
    g = graph(nodes, {"x": (B, S, E)}, ["y", "t"], {"w": _w(E, E)})
    out, changed = run_and_compare(g, move_row_transposes)
    assert not changed and op_counts(out)["Transpose"] == 2
    g = graph(nodes, {"x": (B, S, E)}, ["y"], {"w": _w(E, E)})
    out, changed = run_and_compare(g, move_row_transposes)
    assert changed and op_counts(out) == {"MatMul": 1}


def test_softmax_and_elementwise_constants_follow_the_permutation():
    c = _w(S, 1, E)
    nodes = [node("Transpose", ["x"], "t", perm=[1, 0, 2]), node("Mul", ["t", "c"], "m"),
             node("Softmax", ["m"], "s", axis=-1), node("Transpose", ["s"], "y", perm=[1, 0, 2])]
    out, changed = run_and_compare(graph(nodes, {"x": (B, S, E)}, ["y"], {"c": c}), move_row_transposes)
    assert changed and op_counts(out) == {"Mul": 1, "Softmax": 1}
