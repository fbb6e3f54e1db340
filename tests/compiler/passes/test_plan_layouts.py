"""plan_layouts: regions of layout-free ops between NHWC ops run NHWC when that moves fewer reformat bytes."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import cancel_transposes, eliminate_dead_code, optimize, plan_layouts, run_passes

from tests.compiler.layout_models import MODELS, TRANSPOSES_KEPT

from .passes_testkit import feeds_for, graph, node, op_counts, run_and_compare

RNG = np.random.default_rng(8)
NCHW, NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


def _transposes(g) -> list:
    """Transposes, and Reformats (an entry's Transpose with its Cast and channel Pad: compose_reformats)."""
    return [n for n in g.nodes if n.op_type in ("Transpose", "Reformat")]


def _plan_then_cancel(g) -> bool:
    """plan_layouts, then what the pipeline runs after it (cancel_transposes, dead-code removal)."""
    changed = run_passes(g, [plan_layouts])
    run_passes(g, [cancel_transposes, eliminate_dead_code])
    return changed


@pytest.mark.parametrize("model", sorted(MODELS))
def test_channels_last_graphs_keep_transposes_only_at_entry_and_exit_and_compute_the_same(model):
    g = load_onnx(MODELS[model]())
    out = optimize(g, keep=g.outputs, channels_last=True)
    assert len(_transposes(out)) == TRANSPOSES_KEPT.get(model, 1)
    assert _transposes(out)[0].inputs == ["image"]
    counts = op_counts(out)
    assert not {"Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool"} & set(counts)
    feeds = feeds_for(g)
    np.testing.assert_allclose(evaluate_graph(out, feeds)["y"], evaluate_graph(g, feeds)["y"], rtol=1e-4, atol=1e-5)


def _nhwc_source(c=5, h=7, w=4):
    """x [2, h, w, c] (an NHWC op's output) -> Transpose to NCHW, as to_channels_last leaves it."""
    return node("Transpose", ["x"], "t", perm=NCHW), {"x": (2, h, w, c)}


def test_silu_reading_its_input_twice_runs_nhwc_and_both_transposes_go():
    to_nchw, inputs = _nhwc_source()
    g = graph([to_nchw, node("Sigmoid", ["t"], "s"), node("Mul", ["t", "s"], "a"),
               node("Transpose", ["a"], "y", perm=NHWC)], inputs, ["y"])
    out, changed = run_and_compare(g, _plan_then_cancel)
    assert changed and op_counts(out) == {"Sigmoid": 1, "Mul": 1}


def test_squeeze_excitation_scale_broadcasts_the_pooled_gate_over_nhwc():
    """mean over H, W (keepdims) -> Sigmoid -> Mul with the block's activation: all NHWC."""
    to_nchw, inputs = _nhwc_source(c=17, h=5, w=9)
    axes = np.array([2, 3], np.int64)
    g = graph([to_nchw, node("ReduceMean", ["t", "axes"], "m", keepdims=1), node("Sigmoid", ["m"], "g"),
               node("Mul", ["t", "g"], "a"), node("Transpose", ["a"], "y", perm=NHWC)], inputs, ["y"], {"axes": axes})
    out, changed = run_and_compare(g, _plan_then_cancel)
    assert changed and not _transposes(out)
    (mean,) = [n for n in out.nodes if n.op_type == "ReduceMean"]
    assert out.initializers[mean.inputs[1]].tolist() == [1, 2] and out.value(mean.outputs[0]).shape == (2, 1, 1, 17)


def test_unfolded_batchnorm_becomes_a_per_channel_scale_and_shift_on_the_last_axis():
    to_nchw, inputs = _nhwc_source(c=3, h=5, w=6)
    params = {"scale": RNG.uniform(0.5, 1.5, 3), "bias": RNG.standard_normal(3), "mean": RNG.standard_normal(3),
              "var": RNG.uniform(0.5, 1.5, 3)}
    g = graph([to_nchw, node("BatchNormalization", ["t", *params], "b", epsilon=1e-3), node("Relu", ["b"], "r"),
               node("Transpose", ["r"], "y", perm=NHWC)], inputs, ["y"],
              {k: v.astype(np.float32) for k, v in params.items()})
    out, changed = run_and_compare(g, _plan_then_cancel, rtol=1e-5, atol=1e-5)
    assert changed and op_counts(out) == {"Mul": 1, "Add": 1, "Relu": 1}
    assert all(out.initializers[n.inputs[1]].shape == (3,) for n in out.nodes if n.op_type in ("Mul", "Add"))


def test_concat_of_nhwc_tensors_joins_them_on_the_last_axis():
    g = graph([node("Transpose", ["x"], "t", perm=NCHW), node("Transpose", ["z"], "u", perm=NCHW),
               node("Concat", ["t", "u"], "c", axis=1), node("Transpose", ["c"], "y", perm=NHWC)],
              {"x": (2, 3, 4, 5), "z": (2, 3, 4, 17)}, ["y"])
    out, changed = run_and_compare(g, _plan_then_cancel)
    (concat,) = out.nodes
    assert changed and concat.attrs["axis"] == 3 and concat.inputs == ["x", "z"]


@pytest.mark.parametrize("mode,inputs", [("nearest", ("roi", "scales")), ("linear", ("", "", "sizes"))])
def test_resize_reads_its_scales_and_sizes_in_nhwc_order(mode, inputs):
    to_nchw, shapes = _nhwc_source(c=5, h=3, w=4)
    consts = {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 3], np.float32),
              "sizes": np.array([2, 5, 7, 6], np.int64)}
    g = graph([to_nchw, node("Resize", ["t", *inputs], "r", mode=mode), node("Transpose", ["r"], "y", perm=NHWC)],
              shapes, ["y"], {k: consts[k] for k in inputs if k})
    out, changed = run_and_compare(g, _plan_then_cancel)
    (resize,) = out.nodes
    given = out.initializers[resize.inputs[-1]].tolist()
    assert changed and given == ([1, 2, 3, 1] if mode == "nearest" else [2, 7, 6, 5])


def test_pad_and_channel_slice_relabel_their_axes():
    to_nchw, shapes = _nhwc_source(c=6, h=5, w=3)
    consts = {"pads": np.array([0, 1, 2, 0, 0, 2, 1, 0], np.int64), "starts": np.array([1], np.int64),
              "ends": np.array([4], np.int64), "axes": np.array([1], np.int64)}
    g = graph([to_nchw, node("Pad", ["t", "pads"], "p", mode="edge"), node("Slice", ["p", "starts", "ends", "axes"], "s"),
               node("Transpose", ["s"], "y", perm=NHWC)], shapes, ["y"], consts)
    out, changed = run_and_compare(g, _plan_then_cancel)
    pad, cut = out.nodes
    assert changed and out.initializers[pad.inputs[1]].tolist() == [0, 2, 0, 1, 0, 1, 0, 2]
    assert out.initializers[cut.inputs[3]].tolist() == [3]


def test_keepdims_free_spatial_mean_leaves_the_region_without_a_transpose():
    to_nchw, shapes = _nhwc_source(c=5, h=3, w=7)
    g = graph([to_nchw, node("Relu", ["t"], "r"), node("ReduceMean", ["r", "axes"], "y", keepdims=0)], shapes, ["y"],
              {"axes": np.array([-1, 2], np.int64)})
    out, changed = run_and_compare(g, _plan_then_cancel)
    assert changed and op_counts(out) == {"Relu": 1, "ReduceMean": 1} and out.value("y").shape == (2, 5)


def test_a_flip_that_would_move_more_bytes_than_it_saves_is_not_taken():
    """The free NHWC input is small ([2, 5, 1, 1]); the other input and the output are large NCHW
    tensors, which would each need a Transpose."""
    g = graph([node("Transpose", ["x"], "t", perm=NCHW), node("Mul", ["t", "big"], "y")],
              {"x": (2, 1, 1, 5), "big": (2, 5, 8, 9)}, ["y"])
    before = [(n.op_type, n.inputs) for n in g.nodes]
    assert not plan_layouts(g)
    assert [(n.op_type, n.inputs) for n in g.nodes] == before


def test_ops_between_nchw_neighbours_stay_nchw():
    g = graph([node("Relu", ["x"], "r"), node("Concat", ["r", "x"], "c", axis=1), node("Neg", ["c"], "y")],
              {"x": (2, 3, 4, 5)}, ["y"])
    assert not plan_layouts(g)


def test_a_tensor_others_read_in_nchw_gets_one_transpose_back_under_its_name():
    """Both reformats go from the SiLU's input, one comes back for the NCHW reader of its output:
    still fewer bytes."""
    to_nchw, shapes = _nhwc_source(c=4, h=6, w=5)
    g = graph([to_nchw, node("Sigmoid", ["t"], "s"), node("Mul", ["t", "s"], "a"), node("Transpose", ["a"], "y", perm=NHWC),
               node("Softmax", ["a"], "z", axis=1)], shapes, ["y", "z"])
    out, changed = run_and_compare(g, _plan_then_cancel)
    (back,) = _transposes(out)
    assert changed and back.outputs == ["a"] and back.attrs["perm"] == NCHW
    assert out.consumers()["a"][0].op_type == "Softmax"


def test_pools_after_a_concat_run_as_their_nhwc_forms():
    g = graph([node("Transpose", ["x"], "t", perm=NCHW), node("Transpose", ["z"], "u", perm=NCHW),
               node("Concat", ["t", "u"], "c", axis=1),
               node("MaxPool", ["c"], "p", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
               node("GlobalAveragePool", ["p"], "g"), node("Flatten", ["g"], "y")],
              {"x": (2, 7, 5, 3), "z": (2, 7, 5, 2)}, ["y"])
    out, changed = run_and_compare(g, _plan_then_cancel)
    counts = op_counts(out)
    assert changed and not _transposes(out) and counts[f"{POLYKIT_DOMAIN}:MaxPoolNHWC"] == 1 and counts["ReduceMean"] == 1


def test_on_a_tie_ops_whose_inputs_are_nhwc_move_next_to_their_producer():
    """NHWC source -> Relu -> an NCHW reader: one Transpose either way; the Relu flips, so it can
    join the NHWC producer's epilogue, and the Transpose moves after it."""
    to_nchw, shapes = _nhwc_source(c=6, h=4, w=3)
    g = graph([to_nchw, node("Relu", ["t"], "r"), node("Softmax", ["r"], "y", axis=1)], shapes, ["y"])
    out, changed = run_and_compare(g, _plan_then_cancel)
    (back,) = _transposes(out)
    assert changed and out.producers()[back.inputs[0]].op_type == "Relu" and out.producers()["r"] is back


def test_on_a_tie_ops_reading_nchw_stay_by_their_nchw_producer():
    """An NCHW input -> Relu -> Transpose to NHWC: the Relu stays where an NCHW conv's epilogue may take it."""
    g = graph([node("Relu", ["x"], "r"), node("Transpose", ["r"], "y", perm=NHWC)], {"x": (2, 6, 4, 3)}, ["y"])
    assert not plan_layouts(g)


def test_channel_shuffle_between_nhwc_ops_gathers_along_the_last_axis():
    """ShuffleNet: Concat of two branches, channel shuffle (a Gather once fold_axis_permutations ran),
    channel Slice; all NHWC."""
    g = graph([node("Transpose", ["x"], "t", perm=NCHW), node("Transpose", ["z"], "u", perm=NCHW),
               node("Concat", ["t", "u"], "c", axis=1), node("Gather", ["c", "order"], "s", axis=1),
               node("Slice", ["s", "starts", "ends", "axes"], "h"), node("Transpose", ["h"], "y", perm=NHWC)],
              {"x": (2, 5, 3, 4), "z": (2, 5, 3, 4)}, ["y"],
              {"order": np.array([0, 4, 1, 5, 2, 6, 3, 7], np.int64), "starts": np.array([4], np.int64),
               "ends": np.array([8], np.int64), "axes": np.array([1], np.int64)})
    out, changed = run_and_compare(g, _plan_then_cancel)
    assert changed and not _transposes(out)
    assert [n.attrs["axis"] for n in out.nodes if n.op_type == "Gather"] == [3]


@pytest.mark.parametrize("model", ["squeeze_excitation", "dense_block", "inception"])
def test_a_dynamic_batch_keeps_only_the_entry_transpose(model):
    """The pooled [N, 1, 1, C] feeds Flatten directly with N symbolic too (cancel_transposes' rule 4)."""
    proto = MODELS[model]()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    g = load_onnx(proto)
    out = optimize(g, keep=g.outputs, channels_last=True)
    assert [t.inputs for t in _transposes(out)] == [["image"]]
    feeds = {"image": RNG.standard_normal((3, 3, 13, 10)).astype(np.float32)}
    np.testing.assert_allclose(evaluate_graph(out, feeds)["y"], evaluate_graph(g, feeds)["y"], rtol=1e-4, atol=1e-5)
