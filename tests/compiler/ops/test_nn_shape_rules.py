"""Shape rules of the nn family: symbolic batch dims, static spatial math, errors naming the node,
and agreement with the reference kernels' real output shapes (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.errors import NodeAttributeError, ShapeError
from polykit.compiler.ops.references import run_reference

F32 = np.dtype(np.float32)


def infer(op, shapes, consts=None, n_out=1, dtype=F32, **attrs):
    """Output Values of a one-node graph whose inputs have `shapes` (None: omitted input)."""
    consts = consts or {}
    names = [f"x{i}" if (s is not None or i in consts) else "" for i, s in enumerate(shapes)]
    values = {n: Value(n, dtype, tuple(s)) for n, s in zip(names, shapes) if n and s is not None}
    inits = {f"x{i}": np.asarray(v) for i, v in consts.items()}
    node = Node(op, names, [f"y{i}" for i in range(n_out)], attrs, "node0")
    graph = Graph([node], [n for n in values if n not in inits], node.outputs, inits, values)
    infer_shapes(graph)
    return [graph.value(o) for o in node.outputs]


def test_conv_keeps_a_symbolic_batch_and_computes_strided_padded_spatial_dims():
    (y,) = infer("Conv", [("N", 3, 224, 224), (64, 3, 7, 7)], strides=[2, 2], pads=[3, 3, 3, 3])
    assert y.shape == ("N", 64, 112, 112) and y.dtype == F32


def test_conv_leaves_a_symbolic_spatial_dim_unknown():
    (y,) = infer("Conv", [(1, 3, "H", 32), (8, 3, 3, 3)])
    assert y.shape == (1, 8, None, 30)


def test_conv_same_upper_gives_ceil_of_input_over_stride():
    (y,) = infer("Conv", [(1, 3, 11, 10), (4, 3, 3, 3)], auto_pad="SAME_UPPER", strides=[2, 3])
    assert y.shape == (1, 4, 6, 4)


def test_conv_with_channels_that_do_not_match_the_weight_names_the_node():
    with pytest.raises(ShapeError, match="node0"):
        infer("Conv", [(1, 4, 8, 8), (2, 3, 3, 3)])


def test_conv_kernel_larger_than_the_input_is_a_shape_error():
    with pytest.raises(ShapeError, match="empty"):
        infer("Conv", [(1, 1, 2, 2), (1, 1, 3, 3)])


def test_conv_with_pads_of_the_wrong_length_is_an_attribute_error():
    with pytest.raises(NodeAttributeError, match="pads"):
        infer("Conv", [(1, 1, 5, 5), (1, 1, 3, 3)], pads=[1, 1])


def test_conv_integer_outputs_int32():
    (y,) = infer("ConvInteger", [(1, 2, 5, 5), (3, 2, 3, 3)], dtype=np.dtype(np.uint8))
    assert y.dtype == np.int32 and y.shape == (1, 3, 3, 3)


def test_conv_transpose_with_output_shape_uses_it():
    (y,) = infer("ConvTranspose", [("B", 2, 3, 3), (2, 5, 3, 3)], strides=[3, 2], output_shape=[10, 8])
    assert y.shape == ("B", 5, 10, 8)


def test_conv_transpose_multiplies_channels_by_group():
    (y,) = infer("ConvTranspose", [(1, 4, 3, 3), (4, 3, 2, 2)], group=2, strides=[2, 2], output_padding=[1, 0])
    assert y.shape == (1, 6, 7, 6)


def test_max_pool_has_an_int64_indices_output_of_the_same_shape():
    y, idx = infer("MaxPool", [("N", 3, 7, 7)], n_out=2, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    assert y.shape == idx.shape == ("N", 3, 3, 3) and idx.dtype == np.int64


def test_average_pool_ceil_mode_drops_a_window_starting_in_the_end_pad():
    (y,) = infer("AveragePool", [(1, 1, 2, 2)], kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1)
    assert y.shape == (1, 1, 1, 1)


def test_global_pools_keep_batch_and_channels_and_set_spatial_dims_to_one():
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        (y,) = infer(op, [("N", 16, "H", "W")])
        assert y.shape == ("N", 16, 1, 1)


def test_max_unpool_defaults_to_the_unpooled_size():
    (y,) = infer("MaxUnpool", [(1, 2, 3, 3), (1, 2, 3, 3)], kernel_shape=[2, 2], strides=[2, 2])
    assert y.shape == (1, 2, 6, 6)


def test_gemm_applies_transposes():
    (y,) = infer("Gemm", [(4, "M"), (5, 4), (5,)], transA=1, transB=1)
    assert y.shape == ("M", 5)


def test_gemm_with_mismatched_k_names_the_node():
    with pytest.raises(ShapeError, match="node0"):
        infer("Gemm", [(3, 4), (5, 6)])


def test_gemm_with_a_c_that_does_not_broadcast_is_a_shape_error():
    with pytest.raises(ShapeError):
        infer("Gemm", [(3, 4), (4, 5), (3, 4)])


@pytest.mark.parametrize("a, b, want", [
    ((4,), (4,), ()),
    ((4,), ("B", 4, 3), ("B", 3)),
    (("B", 2, 4), (4,), ("B", 2)),
    (("B", 1, 2, 4), (7, 4, 3), ("B", 7, 2, 3)),
])
def test_matmul_follows_numpy_promotion_and_batch_broadcasting(a, b, want):
    (y,) = infer("MatMul", [a, b])
    assert y.shape == want


def test_matmul_integer_outputs_int32():
    (y,) = infer("MatMulInteger", [(2, 3), (3, 4)], dtype=np.dtype(np.int8))
    assert y.dtype == np.int32 and y.shape == (2, 4)


def test_resize_by_constant_scales_floors_each_dim():
    (y,) = infer("Resize", [("N", 3, 10, 7), None, (4,)], consts={2: np.array([1, 1, 0.7, 2.5], np.float32)})
    assert y.shape == ("N", 3, 7, 17)


def test_resize_by_sizes_on_selected_axes_keeping_the_aspect_ratio():
    (y,) = infer("Resize", [(1, 2, 6, 9), None, None, (2,)], consts={3: np.array([4, 12], np.int64)},
                 axes=[3, 2], keep_aspect_ratio_policy="not_larger")
    assert y.shape == (1, 2, 3, 4)  # scale min(4/9, 12/6) on both axes


def test_resize_with_runtime_scales_keeps_only_the_rank():
    (y,) = infer("Resize", [("N", 3, 8, 8), None, (4,)])
    assert y.shape == (None, None, None, None)


def test_resize_with_runtime_scales_on_selected_axes_keeps_the_other_dims():
    (y,) = infer("Resize", [("N", 3, 8, 8), None, (2,)], axes=[2, 3])
    assert y.shape == ("N", 3, None, None)


def test_resize_with_an_unknown_mode_is_an_attribute_error():
    with pytest.raises(NodeAttributeError, match="mode"):
        infer("Resize", [(1, 1, 2, 2), None, (4,)], consts={2: np.ones(4, np.float32)}, mode="bicubic")


def test_resize_with_both_scales_and_sizes_names_the_node():
    with pytest.raises(ShapeError, match="node0"):
        infer("Resize", [(1, 1, 2, 2), None, (4,), (4,)],
              consts={2: np.ones(4, np.float32), 3: np.array([1, 1, 4, 4], np.int64)})


def test_depth_to_space_and_space_to_depth_keep_the_batch_symbolic():
    (y,) = infer("DepthToSpace", [("N", 8, 3, 4)], blocksize=2)
    assert y.shape == ("N", 2, 6, 8)
    (z,) = infer("SpaceToDepth", [("N", 2, 6, 8)], blocksize=2)
    assert z.shape == ("N", 8, 3, 4)


def test_space_to_depth_with_a_height_not_divisible_by_the_block_is_a_shape_error():
    with pytest.raises(ShapeError, match="height"):
        infer("SpaceToDepth", [(1, 2, 5, 8)], blocksize=2)


windows = st.fixed_dictionaries({
    "size": st.integers(4, 12), "k": st.integers(1, 4), "s": st.integers(1, 3), "d": st.integers(1, 2),
    "pb": st.integers(0, 2), "pe": st.integers(0, 2),
    "auto_pad": st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]),
})


def _attrs(w):
    attrs = {"strides": [w["s"]], "dilations": [w["d"]], "auto_pad": w["auto_pad"]}
    if w["auto_pad"] == "NOTSET":
        attrs["pads"] = [w["pb"], w["pe"]]
    return attrs


def _fits(w):
    return w["size"] + w["pb"] + w["pe"] >= (w["k"] - 1) * w["d"] + 1 and w["size"] >= (w["k"] - 1) * w["d"] + 1


@settings(max_examples=40, deadline=None)
@given(windows)
def test_conv_shape_rule_agrees_with_the_kernel(w):
    if not _fits(w):
        return
    attrs = _attrs(w)
    x, wt = np.ones((1, 2, w["size"]), np.float32), np.ones((3, 2, w["k"]), np.float32)
    (y,) = infer("Conv", [x.shape, wt.shape], **attrs)
    real = run_reference(Node("Conv", ["x", "w"], ["y"], attrs), [x, wt])[0]
    assert y.shape == real.shape


@settings(max_examples=40, deadline=None)
@given(windows, st.booleans())
def test_max_pool_shape_rule_agrees_with_the_kernel(w, ceil_mode):
    if not _fits(w) or w["pb"] >= w["k"] or w["pe"] >= w["k"]:
        return
    attrs = {**_attrs(w), "kernel_shape": [w["k"]], "ceil_mode": int(ceil_mode and w["auto_pad"] == "NOTSET")}
    x = np.arange(2 * w["size"], dtype=np.float32).reshape(1, 2, w["size"])
    y, _ = infer("MaxPool", [x.shape], n_out=2, **attrs)
    real = run_reference(Node("MaxPool", ["x"], ["y", "i"], attrs), [x])
    assert y.shape == real[0].shape == real[1].shape
