"""Models with If, Loop and Scan built with onnx.helper (real bodies, outer-scope reads)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
VOCAB, DIM, STEPS = 11, 8, 4


def _model(graph, opset: int = 17) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


def greedy_decode(seed: int = 0, steps: int = STEPS) -> onnx.ModelProto:
    """A Loop of `steps` greedy decode steps: embed the last token, project to logits with a
    MatMul (weights read from the outer scope), ArgMax the next token, collect it as a scan
    output; the tokens are the start token Concat'ed with the collected ones."""
    rng = np.random.default_rng(seed)
    emb = numpy_helper.from_array(rng.standard_normal((VOCAB, DIM)).astype(np.float32), "emb")
    proj = numpy_helper.from_array(rng.standard_normal((DIM, VOCAB)).astype(np.float32), "proj")
    trip = numpy_helper.from_array(np.array(steps, np.int64), "trip")
    body = helper.make_graph(
        [helper.make_node("Gather", ["emb", "tok_in"], ["e"], axis=0),
         helper.make_node("Add", ["e", "state_in"], ["h0"]),
         helper.make_node("Tanh", ["h0"], ["h"]),
         helper.make_node("MatMul", ["h", "proj"], ["logits"]),
         helper.make_node("ArgMax", ["logits"], ["tok_out"], axis=1, keepdims=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["tok_out"], ["tok_scan"])],
        "step",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("tok_in", I64, [1]), helper.make_tensor_value_info("state_in", F, [1, DIM])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("tok_out", I64, [1]),
         helper.make_tensor_value_info("h", F, [1, DIM]), helper.make_tensor_value_info("tok_scan", I64, [1])])
    nodes = [helper.make_node("Loop", ["trip", "", "start", "state"], ["last", "final_state", "gen"], body=body),
             helper.make_node("Reshape", ["gen", "flat"], ["gen_flat"]),
             helper.make_node("Concat", ["start", "gen_flat"], ["tokens"], axis=0)]
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    graph = helper.make_graph(nodes, "greedy_decode",
                              [helper.make_tensor_value_info("start", I64, [1]),
                               helper.make_tensor_value_info("state", F, [1, DIM])],
                              [helper.make_tensor_value_info("tokens", I64, [steps + 1]),
                               helper.make_tensor_value_info("final_state", F, [1, DIM])],
                              [emb, proj, trip, flat])
    return _model(graph)


def branchy(opset: int = 17) -> onnx.ModelProto:
    """y = If(sum(x) > 0, x * w, x - w): both branches read x and w from the outer scope."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "w")
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    out = [helper.make_tensor_value_info("r", F, [2, 3])]
    then = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["r"])], "then", [], out)
    other = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["r"])], "else", [], out)
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "branchy", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, [2, 3])], [w, zero])
    return _model(graph, opset)


def cumulative(axis: int = 0, reverse: int = 0) -> onnx.ModelProto:
    """Scan: running sum and running max over `axis` of x (4 x 5 x 3), scan output on `axis`
    too, with a scale read from the outer scope."""
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    body = helper.make_graph(
        [helper.make_node("Mul", ["xi", "scale"], ["xs"]),
         helper.make_node("Add", ["acc_in", "xs"], ["acc_out"]),
         helper.make_node("Max", ["mx_in", "xi"], ["mx_out"]),
         helper.make_node("Identity", ["acc_out"], ["y"])],
        "cum", [helper.make_tensor_value_info(n, F, None) for n in ("acc_in", "mx_in", "xi")],
        [helper.make_tensor_value_info(n, F, None) for n in ("acc_out", "mx_out", "y")])
    shape = [4, 5, 3]
    slice_shape = shape[:axis] + shape[axis + 1:]
    nodes = [helper.make_node("Scan", ["acc0", "mx0", "x"], ["acc", "mx", "ys"], body=body, num_scan_inputs=1,
                              scan_input_axes=[axis], scan_output_axes=[axis],
                              scan_input_directions=[reverse], scan_output_directions=[reverse])]
    graph = helper.make_graph(nodes, "cumulative",
                              [helper.make_tensor_value_info("acc0", F, slice_shape),
                               helper.make_tensor_value_info("mx0", F, slice_shape),
                               helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info("acc", F, slice_shape),
                               helper.make_tensor_value_info("mx", F, slice_shape),
                               helper.make_tensor_value_info("ys", F, shape)], [scale])
    return _model(graph)


def outer_axes_scan(seed: int = 0) -> onnx.ModelProto:
    """Scan over rows of k and v (6 x 4 each) accumulating outer products, as the expansion of
    LinearAttention does: the body's Unsqueeze reads its axes from outer-scope constants."""
    rng = np.random.default_rng(seed)
    col = numpy_helper.from_array(np.array([-1], np.int64), "col_axis")
    row = numpy_helper.from_array(np.array([-2], np.int64), "row_axis")
    scale = numpy_helper.from_array(rng.uniform(0.5, 1.5, (4, 4)).astype(np.float32), "scale")
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["k_t", "col_axis"], ["k_col"]),
         helper.make_node("Unsqueeze", ["v_t", "row_axis"], ["v_row"]),
         helper.make_node("MatMul", ["k_col", "v_row"], ["outer"]),
         helper.make_node("Mul", ["outer", "scale"], ["scaled"]),
         helper.make_node("Add", ["s_in", "scaled"], ["s_out"]),
         helper.make_node("ReduceSum", ["s_out", "col_axis"], ["y_t"], keepdims=0)],
        "step", [helper.make_tensor_value_info(n, F, None) for n in ("s_in", "k_t", "v_t")],
        [helper.make_tensor_value_info(n, F, None) for n in ("s_out", "y_t")])
    nodes = [helper.make_node("Scan", ["s0", "k", "v"], ["s", "ys"], body=body, num_scan_inputs=2)]
    graph = helper.make_graph(nodes, "outer_axes_scan",
                              [helper.make_tensor_value_info("s0", F, [4, 4]),
                               helper.make_tensor_value_info("k", F, [6, 4]),
                               helper.make_tensor_value_info("v", F, [6, 4])],
                              [helper.make_tensor_value_info("s", F, [4, 4]),
                               helper.make_tensor_value_info("ys", F, [6, 4])], [col, row, scale])
    return _model(graph)


def rank_guarded(rank: int = 4) -> onnx.ModelProto:
    """An If on Size(dims) == 4, as AffineGrid's expansion guards on the rank it is given: the
    then-branch splits dims (int64[rank]) into 4 parts, which only makes sense for rank 4; both
    branches give the last two dims, whose Range(0, W) (a one-element W) scales x."""
    four = numpy_helper.from_array(np.array(4, np.int64), "four")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    outs = [helper.make_tensor_value_info(n, I64, None) for n in ("h", "w")]
    then = helper.make_graph([helper.make_node("Split", ["dims"], ["n4", "c4", "h", "w"], num_outputs=4)],
                             "then", [], outs)
    other = helper.make_graph([helper.make_node("Split", ["dims"], ["n5", "c5", "d5", "h", "w"], num_outputs=5)],
                              "else", [], outs)
    nodes = [helper.make_node("Size", ["dims"], ["rank"]),
             helper.make_node("Equal", ["rank", "four"], ["is4"]),
             helper.make_node("If", ["is4"], ["H", "W"], then_branch=then, else_branch=other),
             helper.make_node("Range", ["zero", "W", "one"], ["steps"]),
             helper.make_node("Cast", ["steps"], ["steps_f"], to=F),
             helper.make_node("Mul", ["x", "steps_f"], ["y"])]
    graph = helper.make_graph(nodes, "rank_guarded",
                              [helper.make_tensor_value_info("dims", I64, [rank]),
                               helper.make_tensor_value_info("x", F, [3, 5])],
                              [helper.make_tensor_value_info("y", F, [3, 5])], [four, zero, one])
    return _model(graph, 18)


def growing_decode(seed: int = 0, steps: int = STEPS, trip_as_input: bool = False) -> onnx.ModelProto:
    """A greedy decode whose Loop carries the whole token history: each step embeds the last
    token (Gather of the history's last element), mixes in the mean of the history's
    embeddings, ArgMaxes the next token and Concats it, so the carried tokens grow [1] -> [2]
    -> ... The trip count is a constant, or the graph input `n` with `trip_as_input`."""
    rng = np.random.default_rng(seed)
    emb = numpy_helper.from_array(rng.standard_normal((VOCAB, DIM)).astype(np.float32), "emb")
    proj = numpy_helper.from_array(rng.standard_normal((DIM, VOCAB)).astype(np.float32), "proj")
    last = numpy_helper.from_array(np.array([-1], np.int64), "last")
    body = helper.make_graph(
        [helper.make_node("Gather", ["emb", "toks_in"], ["all_e"], axis=0),
         helper.make_node("ReduceMean", ["all_e"], ["mean_e"], axes=[0], keepdims=1),
         helper.make_node("Gather", ["toks_in", "last"], ["tok"], axis=0),
         helper.make_node("Gather", ["emb", "tok"], ["e"], axis=0),
         helper.make_node("Add", ["e", "mean_e"], ["e2"]),
         helper.make_node("Add", ["e2", "state_in"], ["h0"]),
         helper.make_node("Tanh", ["h0"], ["h"]),
         helper.make_node("MatMul", ["h", "proj"], ["logits"]),
         helper.make_node("ArgMax", ["logits"], ["next"], axis=1, keepdims=0),
         helper.make_node("Concat", ["toks_in", "next"], ["toks_out"], axis=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "grow_step",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("toks_in", I64, ["t"]), helper.make_tensor_value_info("state_in", F, [1, DIM])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("toks_out", I64, ["t1"]),
         helper.make_tensor_value_info("h", F, [1, DIM])], [last])
    inits = [emb, proj]
    inputs = [helper.make_tensor_value_info("start", I64, [1]), helper.make_tensor_value_info("state", F, [1, DIM])]
    if trip_as_input:
        inputs.append(helper.make_tensor_value_info("n", I64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(steps, np.int64), "n"))
    graph = helper.make_graph([helper.make_node("Loop", ["n", "", "start", "state"], ["tokens", "final_state"],
                                                body=body, name="decoder")], "growing_decode", inputs,
                              [helper.make_tensor_value_info("tokens", I64, ["T"]),
                               helper.make_tensor_value_info("final_state", F, [1, DIM])], inits)
    return _model(graph)
