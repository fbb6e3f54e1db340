"""fold_depth_to_space: ConvNHWC -> depth-to-space chains become ConvNHWC(depth_to_space) (the
outputs checked against the unfolded graph on the reference kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import fold_depth_to_space, optimize, run_passes, to_channels_last
from polykit.compiler.passes.fold_depth_to_space import SHUFFLE_PERM

from .passes_testkit import feeds_for, graph, node, op_counts, run_and_compare
from polykit.compiler.graph.evaluator import evaluate_graph

RNG = np.random.default_rng(29)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _lowered_then_folded(g):
    """to_channels_last, then the fold (shapes re-inferred between them); whether the fold changed it."""
    run_passes(g, [to_channels_last])
    return run_passes(g, [fold_depth_to_space])


def _d2s_convs(g):
    return [n for n in g.nodes if n.op_type == "ConvNHWC" and "depth_to_space" in n.attrs]


@pytest.mark.parametrize("kernel,bias,image", [((2, 2), True, (2, 5, 4, 3)), ((3, 3), False, (1, 5, 3, 5)),
                                               ((2, 3), True, (3, 5, 5, 2))])
def test_up_convolution_stores_its_pixel_shuffle(kernel, bias, image):
    w = _w(image[1], 3, *kernel)  # ConvTranspose weight [C, M, kH, kW]
    g = graph([node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), "u", name="up0", kernel_shape=list(kernel),
                    strides=list(kernel)), node("Relu", ["u"], "y")], {"x": image}, ["y"],
              {"w": w, **({"b": _w(3)} if bias else {})})
    out, changed = run_and_compare(g, _lowered_then_folded, rtol=1e-4, atol=1e-5)
    (conv,) = _d2s_convs(out)
    assert changed and conv.attrs["depth_to_space"] == list(kernel) and conv.name == "up0"
    assert out.value(conv.outputs[0]).shape == (image[0], image[2] * kernel[0], image[3] * kernel[1], 3)
    # the pixel shuffle's Reshape / Transpose / Reshape are gone: the Transposes left are the entry and exit
    assert op_counts(out)["Reshape"] == 0 and op_counts(out)["Transpose"] == 2


def _nhwc_chain(perm=SHUFFLE_PERM, extra_reader: str = "", blocks=(2, 2), c=4):
    """ConvNHWC (1x1, 6 -> bH * bW * c channels) -> Reshape -> Transpose(perm) -> Reshape, built
    directly in NHWC; `extra_reader`: a Relu also reading that chain tensor ("conv", "blocks",
    "shuffled")."""
    bh, bw = blocks
    n, h, w = 2, 3, 5
    m = bh * bw * c
    shuffled = [(n, h, w, bh, bw, c)[p] for p in perm]
    nodes = [node("ConvNHWC", ["x", "w", "b"], "conv", name="c0", domain=POLYKIT_DOMAIN, kernel_shape=[1, 1],
                  strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1),
             node("Reshape", ["conv", "s6"], "blocks"), node("Transpose", ["blocks"], "shuffled", perm=list(perm)),
             node("Reshape", ["shuffled", "s4"], "y")]
    outputs = ["y"]
    if extra_reader:
        nodes.append(node("Relu", [extra_reader], "other"))
        outputs.append("other")
    inits = {"w": _w(m, 1, 1, 6), "b": _w(m), "s6": np.array((n, h, w, bh, bw, c), np.int64),
             "s4": np.array((n, shuffled[1] * shuffled[2], shuffled[3] * shuffled[4], shuffled[5]), np.int64)}
    return graph(nodes, {"x": (n, h, w, 6)}, outputs, inits)


def test_the_nhwc_chain_folds_and_computes_the_same():
    out, changed = run_and_compare(_nhwc_chain(blocks=(3, 2)), fold_depth_to_space)
    assert changed and [n.op_type for n in out.nodes] == ["ConvNHWC"]
    assert out.nodes[0].outputs == ["y"] and out.nodes[0].attrs["depth_to_space"] == [3, 2]


@pytest.mark.parametrize("reader", ["conv", "blocks", "shuffled"])
def test_a_chain_tensor_with_another_reader_stays(reader):
    g = _nhwc_chain(extra_reader=reader)
    assert not fold_depth_to_space(g)


def test_a_chain_tensor_that_is_kept_stays():
    assert not fold_depth_to_space(_nhwc_chain(), keep=["blocks"])


@pytest.mark.parametrize("perm", [[0, 3, 1, 4, 2, 5], [0, 1, 3, 2, 5, 4], [0, 1, 2, 3, 4, 5]])
def test_another_permutation_stays(perm):
    g = _nhwc_chain(perm=perm)
    _, changed = run_and_compare(g, fold_depth_to_space)
    assert not changed


def test_a_conv_that_already_stores_depth_to_space_or_reads_an_epilogue_input_stays():
    g = _nhwc_chain()
    g.nodes[0].attrs["depth_to_space"] = [1, 1]
    assert not fold_depth_to_space(g)
    g = _nhwc_chain()
    g.nodes[0].inputs.append("x")  # an epilogue input past X, W, B
    assert not fold_depth_to_space(g)


@pytest.mark.parametrize("attrs", [{"strides": [2, 2], "pads": [1, 1, 0, 0]}, {"strides": [1, 1]},
                                   {"strides": [2, 2], "output_padding": [1, 1]}])
def test_up_convolutions_whose_stride_differs_from_their_kernel_get_no_depth_to_space(attrs):
    g = graph([node("ConvTranspose", ["x", "w"], "y", kernel_shape=[2, 2], **attrs)], {"x": (1, 8, 4, 4)}, ["y"],
              {"w": _w(8, 8, 2, 2)})
    out = optimize(g, channels_last=True)
    assert not _d2s_convs(out) and op_counts(out)["ConvTranspose"] == 1


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("block,k", [(2, 3), (3, 1)])
def test_depth_to_space_after_a_conv_is_folded_in_either_mode(mode, block, k):
    m = 4 * block * block
    g = graph([node("Conv", ["x", "w", "b"], "c", kernel_shape=[k, k], pads=[k // 2] * 4),
               node("DepthToSpace", ["c"], "y", blocksize=block, mode=mode)], {"x": (2, 8, 5, 3)}, ["y"],
              {"w": _w(m, 8, k, k), "b": _w(m)})
    out = optimize(g, channels_last=True)
    (conv,) = _d2s_convs(out)
    assert conv.attrs["depth_to_space"] == [block, block] and op_counts(out)["DepthToSpace"] == 0
    feeds = feeds_for(g)
    np.testing.assert_allclose(evaluate_graph(out, feeds)["y"], evaluate_graph(g, feeds)["y"], rtol=1e-4, atol=1e-5)


def test_crd_with_a_shared_weight_leaves_the_other_reader_its_own_order():
    """The CRD fold permutes copies of W and B: another conv reading the same initializers keeps them."""
    g = graph([node("Conv", ["x", "w", "b"], "c", kernel_shape=[1, 1]),
               node("DepthToSpace", ["c"], "y", blocksize=2, mode="CRD"),
               node("Conv", ["x", "w", "b"], "z", kernel_shape=[1, 1])], {"x": (1, 8, 3, 3)}, ["y", "z"],
              {"w": _w(8, 8, 1, 1), "b": _w(8)})
    out = optimize(g, channels_last=True)
    assert len(_d2s_convs(out)) == 1
    feeds = feeds_for(g)
    want, got = evaluate_graph(g, feeds), evaluate_graph(out, feeds)
    for name in ("y", "z"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("blocks,why", [([3, 3], "do not split into 3 x 3"), ([2], "not two block sizes"),
                                        ([0, 2], "not positive")])
def test_a_malformed_depth_to_space_is_a_shape_error(blocks, why):
    from polykit.compiler.graph.infer import infer_shapes
    from polykit.errors import ShapeError

    g = _nhwc_chain()
    g.nodes[0].attrs["depth_to_space"] = blocks  # 16 output channels
    with pytest.raises(ShapeError, match=why):
        infer_shapes(g)
