"""Models with sequences and optionals built with onnx.helper (real ops, random non-zero data)."""

from __future__ import annotations

import numpy as np
import onnx  # noqa: F401  (the ModelProto annotations)
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "seq", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return model


def seq_type(elem: int, shape=None) -> onnx.TypeProto:
    return helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, shape))


def edit_sequence() -> onnx.ModelProto:
    """x, y, z -> SequenceConstruct(x, y), insert z at the front, erase the last, then the
    length, the element at 1 and the concat along axis 1 of what is left."""
    nodes = [helper.make_node("SequenceConstruct", ["x", "y"], ["s0"]),
             helper.make_node("SequenceInsert", ["s0", "z", "zero"], ["s1"]),
             helper.make_node("SequenceErase", ["s1", "minus_one"], ["s2"]),
             helper.make_node("SequenceLength", ["s2"], ["n"]),
             helper.make_node("SequenceAt", ["s2", "one"], ["second"]),
             helper.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=1)]
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
             (("zero", 0), ("minus_one", -1), ("one", 1))]
    return _model(nodes, [helper.make_tensor_value_info(k, F, [2, w]) for k, w in (("x", 3), ("y", 4), ("z", 5))],
                  [helper.make_tensor_value_info("n", I64, []), helper.make_tensor_value_info("second", F, None),
                   helper.make_tensor_value_info("cat", F, None)], inits)


def split_and_stack() -> onnx.ModelProto:
    """SplitToSequence of x [6, 4] into rows of 3 and 3 (split [3, 3]) and into single columns
    without the axis, the columns stacked on a new axis 0 and returned as a sequence too."""
    nodes = [helper.make_node("SplitToSequence", ["x", "halves"], ["rows"], axis=0),
             helper.make_node("SplitToSequence", ["x"], ["cols"], axis=1, keepdims=0),
             helper.make_node("ConcatFromSequence", ["cols"], ["stacked"], axis=0, new_axis=1),
             helper.make_node("SequenceAt", ["rows", "one"], ["lower"])]
    inits = [numpy_helper.from_array(np.array([2, 4], np.int64), "halves"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [6, 4])],
                  [helper.make_tensor_value_info("stacked", F, None), helper.make_tensor_value_info("lower", F, None),
                   helper.make_value_info("cols", seq_type(F))], inits)


def map_with_capture() -> onnx.ModelProto:
    """SequenceMap over a sequence input: each element times the outer tensor w, plus its shape."""
    body = helper.make_graph([helper.make_node("Mul", ["e", "w"], ["scaled"]),
                              helper.make_node("Shape", ["e"], ["shape"])], "map_body",
                             [helper.make_tensor_value_info("e", F, ["N"])],
                             [helper.make_tensor_value_info("scaled", F, ["N"]),
                              helper.make_tensor_value_info("shape", I64, [1])])
    nodes = [helper.make_node("SequenceMap", ["xs"], ["ys", "shapes"], body=body)]
    w = numpy_helper.from_array(np.array(1.5, np.float32), "w")
    return _model(nodes, [helper.make_value_info("xs", seq_type(F, ["N"]))],
                  [helper.make_value_info("ys", seq_type(F)), helper.make_value_info("shapes", seq_type(I64))], [w])


def loop_grows_sequence(steps: int = 4) -> onnx.ModelProto:
    """A Loop that carries a sequence and appends x * (i + 1) each iteration; the result is
    concatenated (ConcatFromSequence) and also returned as a sequence."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["i", "one"], ["i1"]),
         helper.make_node("Cast", ["i1"], ["f"], to=F),
         helper.make_node("Mul", ["x", "f"], ["item"]),
         helper.make_node("SequenceInsert", ["seq_in", "item"], ["seq_out"])],
        "grow", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
                 helper.make_value_info("seq_in", seq_type(F))],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_value_info("seq_out", seq_type(F))])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["trip", "", "empty"], ["grown"], body=body),
             helper.make_node("ConcatFromSequence", ["grown"], ["cat"], axis=0)]
    inits = [numpy_helper.from_array(np.array(steps, np.int64), "trip"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])],
                  [helper.make_tensor_value_info("cat", F, None), helper.make_value_info("grown", seq_type(F))], inits)


def sequence_at_input_position() -> onnx.ModelProto:
    """SequenceAt at a position fed as an input: a plan checks and selects it at run time."""
    nodes = [helper.make_node("SequenceAt", ["xs", "pos"], ["y"])]
    return _model(nodes, [helper.make_value_info("xs", seq_type(F, [3])), helper.make_tensor_value_info("pos", I64, [])],
                  [helper.make_tensor_value_info("y", F, [3])])


def optional_tensor(get: bool = True) -> onnx.ModelProto:
    """An optional input: whether it has an element, and (get) the element added to itself."""
    opt = helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [4]))
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"])]
    outputs = [helper.make_tensor_value_info("has", B, [])]
    if get:
        nodes += [helper.make_node("OptionalGetElement", ["o"], ["e"]), helper.make_node("Add", ["e", "e"], ["twice"])]
        outputs.append(helper.make_tensor_value_info("twice", F, [4]))
    return _model(nodes, [helper.make_value_info("o", opt)], outputs, opset=18)


def feeds_of(seed: int = 0) -> dict[str, dict]:
    rng = np.random.default_rng(seed)

    def r(*shape):
        return (rng.standard_normal(shape) + 2).astype(np.float32)

    return {
        "edit_sequence": {"x": r(2, 3), "y": r(2, 4), "z": r(2, 5)},
        "split_and_stack": {"x": r(6, 4)},
        "map_with_capture": {"xs": [r(3), r(5), r(2)]},
        "loop_grows_sequence": {"x": r(2, 3)},
        "optional_tensor": {"o": r(4)},
    }


MODELS = {"edit_sequence": edit_sequence, "split_and_stack": split_and_stack, "map_with_capture": map_with_capture,
          "loop_grows_sequence": loop_grows_sequence, "optional_tensor": optional_tensor}
