"""fold_index_ranges: Gathers by aranges become views or slices, compares of aranges are decided, and a
profile build of the patterns Hugging Face exports runs no Range / Gather for them (outputs match
onnxruntime at the profile's min, an odd shape and max)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from polykit.compiler.builder.builder import build_plan, live_layers
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.profiles import Profile
from polykit.compiler.plan.records import LayerDesc
from tests.compiler.test_dynamic_shape_chains import _ints, _model, _op, serves

MASK_PROFILE = ((1, 2), (3, 7), (4, 9))
MASK_SHAPES = [(1, 2), (2, 5), (4, 9)]


def _kinds(model, profile, target="cpu") -> Counter:
    plan = build_plan(model, BuilderConfig(target=target, profiles=[Profile({"x": profile})], fp16=target == "cuda",
                                           builder_optimization_level=0))
    return Counter(layer.kind for layer in plan.layers)


def _mask_gather(step: int = 1, start: int = 0):
    """transformers 5's sdpa_mask padding term: mask.flatten()[batch_idx * kv_len + kv_idx] over broadcast
    aranges, viewed [b, 1, 1, kv], then a query-index term `q_idx >= 0` And-ed in (always true)."""
    nodes = [
        _op("Shape", ["x"], "shape"), _op("Gather", ["shape", "zero"], "b", axis=0),
        _op("Gather", ["shape", "one"], "kv", axis=0),
        _op("Range", ["r0", "b", "r1"], "bi"), _op("Unsqueeze", ["bi", "ax123"], "bi4"),
        _op("Range", ["start", "kv", "step"], "ki"), _op("Unsqueeze", ["ki", "ax012"], "ki4"),
        _op("Mul", ["bi4", "kv"], "row"), _op("Add", ["row", "ki4"], "idx"),
        _op("Flatten", ["x"], "flat", axis=2), _op("Gather", ["flat", "idx"], "picked", axis=0),
        _op("Shape", ["idx"], "idx_shape"), _op("Reshape", ["picked", "idx_shape"], "m"),
        _op("Greater", ["m", "half"], "keep"),
        _op("Range", ["r0", "kv", "r1"], "qi"), _op("Unsqueeze", ["qi", "ax013"], "qi4"),
        _op("GreaterOrEqual", ["qi4", "r0"], "q_ok"), _op("And", ["keep", "q_ok"], "both"),
        _op("Where", ["both", "fzero", "fneg"], "y"),
    ]
    consts = _ints(zero=0, one=1, r0=0, r1=1, start=start, step=step, ax123=[1, 2, 3], ax012=[0, 1, 2],
                   ax013=[0, 1, 3])
    consts.update(half=np.float32(0.0), fzero=np.float32(0.0), fneg=np.float32(-1e4))
    return _model(nodes, consts, x_dims=["b", "kv"])


def test_the_padding_mask_gather_is_a_view_and_matches_onnxruntime():
    model = _mask_gather()
    kinds = _kinds(model, MASK_PROFILE)
    assert kinds["Gather"] == 0 and kinds["Range"] == 1, kinds  # the index Ranges go; the query one feeds the shape
    cuda = _kinds(model, MASK_PROFILE, target="cuda")  # level 0: no GPU needed
    assert cuda["Gather"] == 0 and cuda["Range"] == 1, cuda
    serves(model, MASK_PROFILE, MASK_SHAPES)


def test_an_always_true_query_term_goes_where_the_scores_broadcast_the_mask_anyway():
    """The mask feeds Add(scores [b, 1, kv, kv], bias): the [1, 1, kv, 1] query term `q_idx >= 0` (all
    true) adds only a broadcast the Add makes anyway, so the bias stays [b, 1, 1, kv] and no Range runs."""
    model = _mask_gather()
    model.graph.node[-1].output[0] = "bias"
    extra = [_op("Unsqueeze", ["x", "ax1"], "xq"), _op("Unsqueeze", ["xq", "ax3"], "col"),
             _op("Unsqueeze", ["xq", "ax2"], "qrow"), _op("MatMul", ["col", "qrow"], "scores"),
             _op("Add", ["scores", "bias"], "y")]
    model.graph.node.extend(extra)
    for name, value in _ints(ax1=[1], ax2=[2], ax3=[3]).items():
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[Profile({"x": MASK_PROFILE})]))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["Range"] == 0 and kinds["Gather"] == 0, kinds
    assert [str(d) for d in plan.tensors["bias"].dims][2] == "1"  # [b, 1, 1, kv]: never broadcast over queries
    serves(model, MASK_PROFILE, MASK_SHAPES)


@pytest.mark.parametrize("step, start", [(2, 0), (1, 1)])
def test_an_index_that_skips_or_shifts_stays_a_gather_and_matches_onnxruntime(step, start):
    model = _mask_gather(step=step, start=start)
    assert _kinds(model, MASK_PROFILE)["Gather"] == 1  # Range(0, kv, 2) / Range(1, kv): not every row in order
    serves(model, MASK_PROFILE, MASK_SHAPES)


def _embeddings():
    """BERT's embeddings: word Gather + token-type Gather by a Slice / Expand / GatherElements of a zero
    buffer + position Gather by an arange buffer's prefix."""
    nodes = [
        _op("Shape", ["x"], "shape"), _op("Gather", ["shape", "one"], "seq", axis=0),
        _op("Unsqueeze", ["seq", "ax0"], "end"),
        _op("Slice", ["pos_buf", "z1", "end", "one1"], "pos"),
        _op("Slice", ["tt_buf", "z1", "end", "one1"], "tt"),
        _op("GatherElements", ["tt_full", "pos"], "tt_sel", axis=1),
        _op("Expand", ["tt_sel", "shape"], "tt_ids"),
        _op("Gather", ["word", "x"], "w"), _op("Gather", ["types", "tt_ids"], "t"),
        _op("Gather", ["positions", "pos"], "p"),
        _op("Add", ["w", "t"], "wt"), _op("Add", ["wt", "p"], "y"),
    ]
    rng = np.random.default_rng(1)
    consts = _ints(one=1, ax0=[0], z1=[0], one1=[1], pos_buf=np.arange(32)[None], tt_buf=np.zeros((1, 32)),
                   tt_full=np.zeros((1, 32)))
    consts.update(word=rng.standard_normal((20, 8)).astype(np.float32),
                  types=rng.standard_normal((2, 8)).astype(np.float32),
                  positions=rng.standard_normal((32, 8)).astype(np.float32))
    return _model(nodes, consts, x_dims=["b", "s"], x_type=TensorProto.INT64)


def test_position_and_token_type_embeddings_fold_and_match_onnxruntime():
    model, profile = _embeddings(), ((1, 1), (2, 16), (3, 32))
    kinds = _kinds(model, profile)
    assert kinds["Gather"] == 1 and kinds["GatherElements"] == 0 and kinds["Expand"] == 0, kinds  # words only
    assert kinds["Slice"] == 1  # the position rows: a slice of the table, no index tensor
    serves(model, profile, [(1, 1), (2, 7), (3, 32)], dtype=np.int64)


def test_static_build_turns_the_constant_arange_gather_into_a_view():
    model = _mask_gather()
    plan = build_plan(model, BuilderConfig(target="cpu", input_shapes={"x": (2, 5)}))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["Gather"] == 0 and kinds["Range"] == 0, kinds
    serves(model, ((2, 5), (2, 5), (2, 5)), [(2, 5)])


def test_live_layers_drops_what_only_host_computed_shapes_read():
    layers = [LayerDesc("r", "Range", ("a", "b", "c"), ("idx",)), LayerDesc("u", "Unsqueeze", ("idx", "ax"), ("idx4",)),
              LayerDesc("m", "Mul", ("x", "two"), ("y",))]
    assert [l.name for l in live_layers(layers, ["y"])] == ["m"]
    assert [l.name for l in live_layers(layers, ["y", "idx4"])] == ["r", "u", "m"]
