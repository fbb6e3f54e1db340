"""Shape rules of the recurrent layers: both layouts, symbolic batch and sequence dims, errors naming the node."""

from __future__ import annotations

import pytest

from polykit.errors import NodeAttributeError, ShapeError
from tests.compiler.ops.test_nn_shape_rules import infer


def test_lstm_layout0_keeps_symbolic_dims_and_gives_three_states():
    y, yh, yc = infer("LSTM", [("T", "N", 8), (2, 64, 8), (2, 64, 16)], n_out=3, direction="bidirectional",
                      hidden_size=16)
    assert y.shape == ("T", 2, "N", 16) and yh.shape == (2, "N", 16) and yc.shape == (2, "N", 16)


def test_gru_layout1_puts_batch_first():
    y, yh = infer("GRU", [(3, 7, 5), (1, 12, 5), (1, 12, 4)], n_out=2, hidden_size=4, layout=1)
    assert y.shape == (3, 7, 1, 4) and yh.shape == (3, 1, 4)


def test_rnn_hidden_size_defaults_to_r():
    (y,) = infer("RNN", [(2, 3, 5), (1, 6, 5), (1, 6, 6)])
    assert y.shape == (2, 1, 3, 6)


def test_direction_count_must_match_w():
    with pytest.raises(ShapeError, match="directions") as err:
        infer("RNN", [(2, 3, 5), (2, 6, 5), (2, 6, 6)], hidden_size=6)
    assert "node0" in str(err.value)


def test_unknown_direction_is_an_attribute_error():
    with pytest.raises(NodeAttributeError, match="direction"):
        infer("GRU", [(2, 3, 5), (1, 18, 5), (1, 18, 6)], direction="sideways")
