"""convert_to_fp16: float32 -> float16 with float32 I/O, pinned layers, fixed inputs, fused nodes."""

from __future__ import annotations

import numpy as np

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph
from polykit.compiler.passes import (convert_precision, convert_to_fp16, fuse_bias_activation, fuse_pointwise, optimize,
                                     run_passes)
from polykit.compiler.passes.precision import BF16, to_half

from .passes_testkit import feeds_for, graph, node

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
rng = np.random.default_rng(7)


def _w(*shape):
    return (rng.standard_normal(shape) * 0.5).astype(np.float32)


def _mlp() -> Graph:
    return graph([node("MatMul", ["x", "w"], "m"), node("Add", ["m", "b"], "a"), node("Relu", ["a"], "r"),
                  node("Softmax", ["r"], "y", axis=-1)],
                 {"x": (4, 8)}, ["y"], {"w": _w(8, 6), "b": _w(6)})


def _converted(g: Graph, **kw) -> tuple[Graph, bool]:
    h = g.copy()
    changed = run_passes(h, [lambda gr: convert_to_fp16(gr, **kw)])
    return h, changed


def _assert_close_to_fp32(g: Graph, h: Graph, tol: float = 3e-3) -> None:
    feeds = feeds_for(g, seed=3)
    want, got = evaluate_graph(g, feeds), evaluate_graph(h, feeds)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol, err_msg=name)


def _producer(g: Graph, name: str):
    return g.producers()[name]


def test_weights_and_activations_become_half_and_io_stays_float32():
    g = _mlp()
    h, changed = _converted(g)
    assert changed
    assert {arr.dtype for arr in h.initializers.values()} == {F16}
    assert h.value("x").dtype == F32 and h.value("y").dtype == F32
    assert h.value("m").dtype == F16 and h.value("a").dtype == F16
    _assert_close_to_fp32(g, h)


def test_a_cast_follows_each_float_input_and_precedes_each_float_output():
    h, _ = _converted(_mlp())
    first_reader = h.consumers()["x"]
    assert [(n.op_type, n.attrs["to"]) for n in first_reader] == [("Cast", 10)]
    last = _producer(h, "y")
    assert (last.op_type, last.attrs["to"]) == ("Cast", 1) and h.value(last.inputs[0]).dtype == F16


def test_io_casts_fuse_into_pointwise_groups_under_optimize():
    g = graph([node("Add", ["x", "c"], "a"), node("Tanh", ["a"], "t"), node("Mul", ["t", "x"], "y")],
              {"x": (3, 5)}, ["y"], {"c": _w(5)})
    out = optimize(g, fp16=True)
    assert [(n.domain, n.op_type) for n in out.nodes] == [(POLYKIT_DOMAIN, "Pointwise")]
    ops = [step["op"] for step in out.nodes[0].attrs["body"]]
    assert ops[0] == "Cast" and ops[-1] == "Cast"
    _assert_close_to_fp32(g, out)


def test_layers_named_by_op_type_stay_float32_with_casts_around():
    g = _mlp()
    h, _ = _converted(g, keep_fp32={"Softmax"})
    soft = next(n for n in h.nodes if n.op_type == "Softmax")
    assert h.value(soft.inputs[0]).dtype == F32 and h.value(soft.outputs[0]).dtype == F32
    assert _producer(h, soft.inputs[0]).op_type == "Cast"
    assert h.value("a").dtype == F16
    _assert_close_to_fp32(g, h)


def test_layers_named_by_node_name_stay_float32():
    g = _mlp()
    h, _ = _converted(g, keep_fp32={"matmul_m"})
    mm = next(n for n in h.nodes if n.op_type == "MatMul")
    assert [h.value(i).dtype for i in mm.inputs] == [F32, F32] and h.value("m").dtype == F32
    assert h.value("a").dtype == F16
    _assert_close_to_fp32(g, h)


def test_a_weight_read_in_both_precisions_is_kept_and_copied_to_half():
    g = graph([node("Add", ["x", "c"], "a"), node("Mul", ["x", "c"], "m", name="mul32"), node("Sub", ["a", "m"], "y")],
              {"x": (2, 4)}, ["y"], {"c": _w(4)})
    h, _ = _converted(g, keep_fp32={"mul32"})
    add = next(n for n in h.nodes if n.op_type == "Add")
    mul = next(n for n in h.nodes if n.op_type == "Mul")
    assert h.initializers[mul.inputs[1]].dtype == F32 and h.initializers[add.inputs[1]].dtype == F16
    _assert_close_to_fp32(g, h)


def test_resize_scales_and_roi_stay_float32():
    scales = np.array([1, 1, 2, 2], np.float32)
    g = graph([node("Resize", ["x", "", "s"], "r", mode="nearest"), node("Relu", ["r"], "y")],
              {"x": (1, 2, 3, 3)}, ["y"], {"s": scales})
    h, _ = _converted(g)
    resize = next(n for n in h.nodes if n.op_type == "Resize")
    assert h.initializers[resize.inputs[2]].dtype == F32
    assert h.value(resize.inputs[0]).dtype == F16 and h.value("r").dtype == F16
    _assert_close_to_fp32(g, h)


def test_a_quantize_reads_its_half_input_without_a_cast_and_quantizes_it_exactly_as_the_cast():
    """QuantizeLinear stays float32 (its float32 scale divides in float32), but reads a half producer's
    tensor itself: the half value is exact in float32, so the Cast it would read through changes nothing."""
    import ml_dtypes

    e4m3 = np.dtype(ml_dtypes.float8_e4m3fn)
    consts = {"s": np.array(0.013, np.float32), "z": np.zeros((), e4m3), "s8": np.array(0.02, np.float32),
              "z8": np.zeros((), np.int8)}
    g = graph([node("Relu", ["x"], "r"), node("QuantizeLinear", ["r", "s", "z"], "q"),
               node("DequantizeLinear", ["q", "s", "z"], "y"), node("QuantizeLinear", ["r", "s8", "z8"], "q8"),
               node("DequantizeLinear", ["q8", "s8", "z8"], "y8")], {"x": (4, 8)}, ["y", "y8"], consts)
    h, _ = _converted(g)
    quantizes = [n for n in h.nodes if n.op_type == "QuantizeLinear"]
    assert [n.inputs[0] for n in quantizes] == ["r", "r"] and h.value("r").dtype == F16
    assert all(h.initializers[n.inputs[1]].dtype == F32 for n in quantizes)
    assert not any(n.op_type == "Cast" and n.inputs[0] == "r" for n in h.nodes)
    feeds = feeds_for(g, seed=3)
    got = evaluate_graph(h, feeds)
    r = np.maximum(feeds["x"], 0).astype(np.float16).astype(np.float32)  # the half Relu, cast exactly
    np.testing.assert_array_equal(got["y"], (r / np.float32(0.013)).astype(e4m3).astype(np.float32) * np.float32(0.013))
    want8 = np.clip(np.rint(r / np.float32(0.02)), -128, 127) * np.float32(0.02)
    np.testing.assert_array_equal(got["y8"], want8.astype(np.float32))
    # bfloat16 builds keep the Cast (the cuda quantize kernel reads no bfloat16)
    b = g.copy()
    run_passes(b, [lambda gr: convert_precision(gr, BF16)])
    assert all(b.value(n.inputs[0]).dtype == F32 for n in b.nodes if n.op_type == "QuantizeLinear")


def test_range_stays_float32_and_its_result_is_cast_for_half_readers():
    consts = {"start": np.array(0.5, np.float32), "limit": np.array(4.5, np.float32), "delta": np.array(1, np.float32)}
    g = graph([node("Range", ["start", "limit", "delta"], "r"), node("Mul", ["x", "r"], "y")],
              {"x": (3, 4)}, ["y"], consts)
    h, _ = _converted(g)
    assert all(h.initializers[n].dtype == F32 for n in ("start", "limit", "delta"))
    assert h.value("r").dtype == F32
    mul = next(n for n in h.nodes if n.op_type == "Mul")
    assert h.value(mul.inputs[1]).dtype == F16
    _assert_close_to_fp32(g, h)


def test_cast_to_float_and_constant_of_shape_fill_become_half():
    g = graph([node("Cast", ["ids"], "f", to=1), node("Shape", ["ids"], "s"),
               node("ConstantOfShape", ["s"], "c", value=np.array([0.25], np.float32)),
               node("Add", ["f", "c"], "a"), node("Mul", ["a", "x"], "y")],
              {"ids": ((2, 3), np.int64), "x": (2, 3)}, ["y"])
    h, _ = _converted(g)
    assert _producer(h, "f").attrs["to"] == 10 and h.value("f").dtype == F16
    assert _producer(h, "c").attrs["value"].dtype == F16 and h.value("c").dtype == F16
    _assert_close_to_fp32(g, h)


def test_integer_and_float64_tensors_are_untouched():
    table = _w(5, 3)
    g = graph([node("Gather", ["t", "ids"], "e", axis=0), node("Cast", ["d"], "df", to=1),
               node("Add", ["e", "df"], "y"), node("Mul", ["d", "d"], "d2")],
              {"ids": ((2,), np.int64), "d": ((2, 3), np.float64)}, ["y", "d2"], {"t": table})
    h, _ = _converted(g)
    assert h.value("ids").dtype == np.int64 and h.value("d2").dtype == np.float64
    assert h.value("e").dtype == F16 and h.value("y").dtype == F32
    feeds = {"ids": np.array([4, 1]), "d": rng.standard_normal((2, 3))}
    want, got = evaluate_graph(g, feeds), evaluate_graph(h, feeds)
    np.testing.assert_array_equal(got["d2"], want["d2"])
    np.testing.assert_allclose(got["y"], want["y"], rtol=3e-3, atol=3e-3)


def test_out_of_range_weights_clamp_so_masks_stay_finite():
    lowest = np.float32(np.finfo(np.float32).min)
    np.testing.assert_array_equal(to_half(np.array([lowest, 1e6, np.inf, 0.5], np.float32)),
                                  np.array([-65504, 65504, np.inf, 0.5], np.float16))
    g = graph([node("Sub", ["one", "keep"], "inv"), node("Mul", ["inv", "low"], "bias"),
               node("Add", ["x", "bias"], "s"), node("Softmax", ["s"], "y", axis=-1)],
              {"x": (2, 4), "keep": (2, 4)}, ["y"], {"one": np.array(1, np.float32), "low": np.array(lowest)})
    h, _ = _converted(g)
    feeds = {"x": _w(2, 4), "keep": np.array([[1, 1, 0, 1], [0, 1, 1, 1]], np.float32)}
    got, want = evaluate_graph(h, feeds)["y"], evaluate_graph(g, feeds)["y"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=3e-3, atol=3e-3)


def test_a_graph_output_read_inside_stays_float32_and_readers_get_half():
    g = graph([node("Relu", ["x"], "r"), node("Exp", ["r"], "y")], {"x": (3, 3)}, ["r", "y"])
    h, _ = _converted(g)
    assert h.value("r").dtype == F32 and h.value("y").dtype == F32
    exp = next(n for n in h.nodes if n.op_type == "Exp")
    assert h.value(exp.inputs[0]).dtype == F16 and exp.inputs[0] != "r"
    _assert_close_to_fp32(g, h)


def test_kept_tensors_keep_their_name_and_float32():
    g = _mlp()
    h, _ = _converted(g, keep={"a"})
    assert h.value("a").dtype == F32 and "a" in h.producers()
    feeds = feeds_for(g, seed=3)
    np.testing.assert_allclose(evaluate_graph(h, feeds, keep_all=True)["a"], evaluate_graph(g, feeds, keep_all=True)["a"],
                               rtol=3e-3, atol=3e-3)


def test_pointwise_body_casts_follow():
    g = graph([node("Cast", ["ids"], "f", to=1), node("Mul", ["f", "x"], "m"), node("Sigmoid", ["m"], "y")],
              {"ids": ((2, 3), np.int64), "x": (2, 3)}, ["y"])
    fused = g.copy()
    run_passes(fused, [fuse_pointwise])
    h, _ = _converted(fused)
    pw = next(n for n in h.nodes if n.op_type == "Pointwise")
    cast = next(step for step in pw.attrs["body"] if step["op"] == "Cast")
    assert cast["attrs"]["to"] == 10 and h.value(pw.outputs[0]).dtype == F16
    _assert_close_to_fp32(g, h)


def test_epilogue_nodes_convert_with_their_weights():
    g = graph([node("Gemm", ["x", "w", "b"], "g"), node("Relu", ["g"], "y")],
              {"x": (4, 8)}, ["y"], {"w": _w(8, 5), "b": _w(5)})
    fused = g.copy()
    run_passes(fused, [fuse_bias_activation])
    h, _ = _converted(fused)
    gemm = next(n for n in h.nodes if n.op_type == "Gemm")
    assert gemm.domain == POLYKIT_DOMAIN and h.initializers["w"].dtype == F16
    _assert_close_to_fp32(g, h)


def test_a_second_run_changes_nothing():
    h, _ = _converted(_mlp())
    before = [(n.op_type, list(n.inputs), list(n.outputs)) for n in h.nodes]
    assert convert_to_fp16(h) is False
    assert [(n.op_type, list(n.inputs), list(n.outputs)) for n in h.nodes] == before


def test_optimize_with_fp32_layers_keeps_them_float32():
    g = _mlp()
    out = optimize(g, fp16=True, fp32_layers=("Softmax",))
    soft = next(n for n in out.nodes if n.op_type == "Softmax")
    infer_shapes(out, strict=False)
    assert out.value(soft.inputs[0]).dtype == F32
    _assert_close_to_fp32(g, out)


def test_a_copy_between_float32_input_and_output_stays_float32_and_exact():
    g = graph([node("Identity", ["x"], "y")], {"x": (2, 8)}, ["y"])
    h, _ = _converted(g)
    assert all(n.op_type != "Cast" for n in h.nodes)
    x = np.array([[0.961234567] * 8, [1e-7] * 8], np.float32)
    np.testing.assert_array_equal(evaluate_graph(h, {"x": x})["y"], x)


def test_a_reshape_of_a_half_activation_stays_half():
    g = graph([node("Relu", ["x"], "r"), node("Reshape", ["r", "s"], "t"), node("Softmax", ["t"], "y", axis=-1)],
              {"x": (2, 8)}, ["y"], {"s": np.array([4, 4], np.int64)})
    h, _ = _converted(g)
    assert h.value("r").dtype == F16 and h.value("t").dtype == F16
    _assert_close_to_fp32(g, h)


def test_a_reshape_chain_between_float32_input_and_output_stays_float32():
    g = graph([node("Transpose", ["x"], "t", perm=[1, 0]), node("Reshape", ["t", "s"], "y")],
              {"x": (2, 8)}, ["y"], {"s": np.array([4, 4], np.int64)})
    h, _ = _converted(g)
    assert all(n.op_type != "Cast" for n in h.nodes) and h.value("t").dtype == F32


def test_a_transpose_feeding_a_half_layer_moves_half_values():
    g = graph([node("Transpose", ["x"], "t", perm=[1, 0]), node("Relu", ["t"], "y")], {"x": (2, 8)}, ["y"])
    h, _ = _converted(g)
    assert h.value("t").dtype == F16


def test_a_gathered_weight_still_becomes_half():
    g = graph([node("Gather", ["w", "i"], "e"), node("Relu", ["e"], "y")],
              {"i": ((3,), np.int64)}, ["y"], {"w": _w(10, 4)})
    h, _ = _converted(g)
    assert h.initializers["w"].dtype == F16 and h.value("e").dtype == F16
