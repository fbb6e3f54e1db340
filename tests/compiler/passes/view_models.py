"""ONNX models whose movement ends in elementwise readers (pass absorb_views): Swin's window merge
(with and without the roll of a shifted block) read by the residual Add, LLaMA's RoPE over a
transposed query and its rotate_half, and two that must keep their copy."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conv_models import ModelBuilder


def _model(b: ModelBuilder, inputs: dict[str, tuple], out: str, shape: tuple, extra: list[str] = ()) -> onnx.ModelProto:
    outs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)]
    outs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in extra]
    g = helper.make_graph(b.nodes, "views", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
                          outs, b.inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ints(b: ModelBuilder, values) -> str:
    name = b.name("c")
    b.inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
    return name


def _roll(b: ModelBuilder, x: str, shift: int, axis: int, n: int) -> str:
    """torch.roll's export: two Slices and a Concat."""
    cut = (n - shift) % n
    tail = b.node("Slice", [x, _ints(b, [cut]), _ints(b, [n]), _ints(b, [axis])])
    head = b.node("Slice", [x, _ints(b, [0]), _ints(b, [cut]), _ints(b, [axis])])
    return b.node("Concat", [tail, head], axis=axis)


def transpose_add(shape=(2, 3, 5, 4), perm=(0, 2, 1, 3)) -> onnx.ModelProto:
    """Transpose(x) + r: the Add reads x through a view."""
    b = ModelBuilder(41)
    out = tuple(shape[p] for p in perm)
    y = b.node("Add", [b.node("Transpose", ["x"], perm=list(perm)), "r"])
    return _model(b, {"x": shape, "r": out}, y, out)


def window_merge(nh=2, nw=3, win=(3, 5), c=6, shift=0) -> onnx.ModelProto:
    """Swin's window merge: windows [nh*nw, wh, ww, C] -> [1, nh, nw, wh, ww, C] -> transpose ->
    [1, H, W, C], rolled back by `shift` on H and W in a shifted block, + the residual."""
    b = ModelBuilder(42)
    wh, ww = win
    h, w = nh * wh, nw * ww
    merged = b.node("Reshape", [b.node("Transpose", [b.node("Reshape", ["win", _ints(b, [1, nh, nw, wh, ww, c])])],
                                       perm=[0, 1, 3, 2, 4, 5]), _ints(b, [1, h, w, c])])
    if shift:
        merged = _roll(b, _roll(b, merged, shift, 1, h), shift, 2, w)
    y = b.node("Add", ["res", merged])
    return _model(b, {"win": (nh * nw, wh, ww, c), "res": (1, h, w, c)}, y, (1, h, w, c))


def rope(s=6, heads=3, d=8) -> onnx.ModelProto:
    """LLaMA's RoPE on a query [1, S, H, D] -> [1, H, S, D]: q * cos + rotate_half(q) * sin, with
    rotate_half(q) = Concat(-q[..., D/2:], q[..., :D/2])."""
    b = ModelBuilder(43)
    q = b.node("Transpose", ["x"], perm=[0, 2, 1, 3])
    half = d // 2
    x1 = b.node("Slice", [q, _ints(b, [0]), _ints(b, [half]), _ints(b, [3])])
    x2 = b.node("Slice", [q, _ints(b, [half]), _ints(b, [d]), _ints(b, [3])])
    rot = b.node("Concat", [b.node("Neg", [x2]), x1], axis=3)
    y = b.node("Add", [b.node("Mul", [q, "cos"]), b.node("Mul", [rot, "sin"])])
    return _model(b, {"x": (1, s, heads, d), "cos": (1, 1, s, d), "sin": (1, 1, s, d)}, y, (1, heads, s, d))


def transpose_with_a_reduction(shape=(2, 3, 5, 4)) -> onnx.ModelProto:
    """A Transpose read by an Add and by a ReduceSum: the copy stays."""
    b = ModelBuilder(44)
    t = b.node("Transpose", ["x"], perm=[0, 2, 1, 3])
    y = b.node("Add", [b.node("Sigmoid", [t]), b.node("ReduceSum", [t, _ints(b, [3])], keepdims=1)])
    return _model(b, {"x": shape}, y, (2, 5, 3, 4))


def strided_inner_transpose(shape=(2, 3, 5)) -> onnx.ModelProto:
    """Transpose(x, (0, 2, 1)) + r: the innermost output dim reads x at stride 5, so the copy stays."""
    b = ModelBuilder(45)
    y = b.node("Add", [b.node("Transpose", ["x"], perm=[0, 2, 1]), "r"])
    return _model(b, {"x": shape, "r": (2, 5, 3)}, y, (2, 5, 3))


MODELS = {"transpose_add": transpose_add, "window_merge": window_merge,
          "window_merge_rolled": lambda: window_merge(shift=1), "window_merge_square": lambda: window_merge(2, 2, (7, 7), 5, 3),
          "rope": rope, "rope_odd": lambda: rope(5, 3, 6)}
STAYS = {"transpose_with_a_reduction": transpose_with_a_reduction, "strided_inner_transpose": strided_inner_transpose}
