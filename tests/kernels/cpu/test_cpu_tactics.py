"""cpu tactics agree with the reference kernels on random data (odd shapes, pads, strides,
groups, fp16, fused epilogues) and decline the layers they cannot run."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.plan.records import LayerDesc
from polykit.compiler.ops.references import run_reference
from polykit.kernels.tactics import candidates, find_tactic

rng = np.random.default_rng(7)


def _run(tactic: str, kind: str, node: Node, inputs):
    return find_tactic("cpu", kind, tactic).run(node, inputs)


def _assert_matches(tactic: str, node: Node, inputs, rtol=1e-6, atol=1e-6):
    want = run_reference(node, inputs)
    got = _run(tactic, node.op_type, node, inputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def _layer(kind, shapes, dtype="float32", attrs=None, domain="", n_out=1):
    ins = tuple(f"x{i}" for i in range(len(shapes)))
    return LayerDesc("l", kind, ins, tuple(f"y{i}" for i in range(n_out)), dict(attrs or {}), domain=domain,
                     in_dtypes=(dtype,) * len(shapes), out_dtypes=(dtype,) * n_out,
                     in_shapes=tuple(tuple(s) for s in shapes))


CONVS = [  # (x shape, w shape, attrs)
    ((1, 8, 9, 11), (5, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 12, 7, 6), (6, 4, 3, 3), {"pads": [1, 0, 2, 1], "group": 3}),
    ((1, 16, 10, 13), (4, 16, 3, 3), {"auto_pad": "SAME_UPPER"}),
    ((1, 3, 17, 15), (7, 3, 5, 3), {"strides": [2, 3], "dilations": [1, 2], "pads": [2, 1, 2, 1]}),
    ((2, 6, 9, 9), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 10, 8, 7), (9, 10, 1, 1), {}),
    ((2, 5, 19), (4, 5, 4), {"pads": [1, 2], "strides": [2]}),
    ((1, 4, 5, 6, 7), (3, 4, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
]


@pytest.mark.parametrize("tactic", ["cpu.conv.direct", "cpu.conv.im2col"])
@pytest.mark.parametrize("x_shape,w_shape,attrs", CONVS)
def test_general_conv_tactics_match_the_reference(tactic, x_shape, w_shape, attrs):
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    _assert_matches(tactic, Node("Conv", ["x", "w", "b"], ["y"], attrs, "c"), [x, w, b])


@pytest.mark.parametrize("x_shape,w_shape,attrs", [c for c in CONVS if len(c[0]) == 4 and c[1][2:] == (3, 3)
                                                   and "strides" not in c[2] and c[1][1] >= 8]
                         + [((2, 16, 1, 5), (3, 16, 3, 3), {"pads": [1, 1, 1, 1]})])
def test_winograd_matches_the_reference(x_shape, w_shape, attrs):
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    _assert_matches("cpu.conv.winograd", Node("Conv", ["x", "w"], ["y"], attrs, "c"), [x, w], rtol=1e-5, atol=1e-5)


def test_pointwise_conv_matches_the_reference_in_float16():
    x = rng.standard_normal((3, 10, 5, 7)).astype(np.float16)
    w = rng.standard_normal((6, 10, 1, 1)).astype(np.float16)
    _assert_matches("cpu.conv.pointwise", Node("Conv", ["x", "w"], ["y"], {}, "c"), [x, w], rtol=1e-3, atol=1e-3)


def test_fused_conv_runs_its_epilogue_after_the_tactic():
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
    skip = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    body = [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
            {"op": "Relu", "inputs": ["s"], "outputs": ["y"], "attrs": {}}]
    node = Node("Conv", ["x", "w", "", "skip"], ["y"], {"pads": [1, 1, 1, 1], "epilogue": {"input": "raw", "body": body}},
                "c", POLYKIT_DOMAIN)
    for tactic in ("cpu.conv.direct", "cpu.conv.im2col", "cpu.conv.winograd"):
        _assert_matches(tactic, node, [x, w, None, skip], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a_shape,b_shape", [((130, 7), (7, 9)), ((2, 3, 65, 4), (3, 4, 5)), ((1, 70, 33), (2, 33, 1))])
def test_blocked_matmul_matches_the_reference(a_shape, b_shape):
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    _assert_matches("cpu.gemm.blocked", Node("MatMul", ["a", "b"], ["y"], {}, "m"), [a, b])


@pytest.mark.parametrize("attrs", [{}, {"transA": 1, "alpha": 0.5}, {"transB": 1, "beta": 2.0}])
def test_blocked_gemm_matches_the_reference(attrs):
    a = rng.standard_normal((11, 97) if attrs.get("transA") else (97, 11)).astype(np.float32)
    b = rng.standard_normal((5, 11) if attrs.get("transB") else (11, 5)).astype(np.float32)
    c = rng.standard_normal(5).astype(np.float32)
    _assert_matches("cpu.gemm.blocked", Node("Gemm", ["a", "b", "c"], ["y"], attrs, "g"), [a, b, c])


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 3], "dilations": [2, 1], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
])
def test_strided_pool_matches_the_reference(op, attrs):
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    _assert_matches("cpu.pool.strided", Node(op, ["x"], ["y"], attrs, "p"), [x])


def test_every_layer_has_the_reference_as_its_first_candidate():
    names = [t.name for t in candidates("cpu", "Conv", _layer("Conv", [(1, 16, 8, 8), (8, 16, 3, 3)], attrs={"pads": [1] * 4}))]
    assert names[0] == "cpu.reference"
    assert set(names) == {"cpu.reference", "cpu.conv.winograd", "cpu.conv.im2col", "cpu.conv.direct"}


@pytest.mark.parametrize("w_shape,attrs", [((8, 16, 5, 5), {}), ((8, 16, 3, 3), {"strides": [2, 2]}),
                                           ((8, 4, 3, 3), {}), ((8, 16, 3, 3), {"dilations": [2, 2]})])
def test_winograd_declines_what_it_cannot_run(w_shape, attrs):
    layer = _layer("Conv", [(1, w_shape[1], 12, 12), w_shape], attrs=attrs)
    assert "cpu.conv.winograd" not in [t.name for t in candidates("cpu", "Conv", layer)]


def test_pointwise_declines_padded_or_strided_convs():
    for attrs in ({"pads": [1, 1, 1, 1]}, {"strides": [2, 2]}):
        layer = _layer("Conv", [(1, 4, 6, 6), (3, 4, 1, 1)], attrs=attrs)
        assert "cpu.conv.pointwise" not in [t.name for t in candidates("cpu", "Conv", layer)]


def test_cpu_tactics_run_in_their_storage_precision_or_as_fp32():
    layer = _layer("MatMul", [(4, 5), (5, 6)], dtype="float16")
    for precision, names in (("fp16", ["cpu.reference", "cpu.gemm.blocked"]), ("fp32", ["cpu.reference", "cpu.gemm.blocked"]),
                             ("bf16", []), ("tf32", [])):
        variant = LayerDesc(**{**layer.__dict__, "precision": precision})
        assert [t.name for t in candidates("cpu", "MatMul", variant)] == names, precision


def test_maxpool_with_indices_keeps_the_reference_only():
    layer = _layer("MaxPool", [(1, 2, 4, 4)], attrs={"kernel_shape": [2, 2]}, n_out=2)
    assert [t.name for t in candidates("cpu", "MaxPool", layer)] == ["cpu.reference"]
