"""RNN / GRU / LSTM reference kernels against onnxruntime: every direction, layouts, activations with
alpha/beta, clip, sequence_lens, initial states, peepholes, linear_before_reset."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import NodeAttributeError, ShapeError
from tests.kernels.reference.oracle import ort_run, ours

RNG = np.random.default_rng(21)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def recurrent_inputs(op, T=5, N=3, I=4, H=6, dirs=1, layout=0, lens=None, states=True, peep=False, bias=True):
    """Random non-zero X, W, R, B, sequence_lens, initial_h (and initial_c, P for LSTM)."""
    G = GATES[op]
    f = lambda *s: RNG.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    x = f(T, N, I) if layout == 0 else f(N, T, I)
    state = (lambda: f(dirs, N, H)) if layout == 0 else (lambda: f(N, dirs, H))
    ins = [x, f(dirs, G * H, I), f(dirs, G * H, H), f(dirs, 2 * G * H) if bias else None,
           None if lens is None else np.array(lens, np.int32), state() if states else None]
    if op == "LSTM":
        ins += [state() if states else None, f(dirs, 3 * H) if peep else None]
    while ins[-1] is None:
        ins.pop()
    return ins


def n_outputs(op):
    return 3 if op == "LSTM" else 2


def assert_matches_ort(op, ins, attrs, rtol=1e-4, atol=1e-5):
    got = ours(op, ins, attrs, n_out=n_outputs(op))
    if attrs.get("layout"):  # onnxruntime runs layout 0 only: swap batch and time around it
        swapped = [a.swapaxes(0, 1) if a is not None and i in (0, 5, 6) else a for i, a in enumerate(ins)]
        want = ort_run(op, swapped, {**attrs, "layout": 0}, opset=22, n_out=n_outputs(op))
        want = [want[0].transpose(2, 0, 1, 3)] + [w.swapaxes(0, 1) for w in want[1:]]
    else:
        want = ort_run(op, ins, attrs, opset=22, n_out=n_outputs(op))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_matches_onnxruntime_per_direction_and_layout(op, direction, layout):
    dirs = 2 if direction == "bidirectional" else 1
    ins = recurrent_inputs(op, dirs=dirs, layout=layout, peep=op == "LSTM")
    assert_matches_ort(op, ins, {"direction": direction, "hidden_size": 6, "layout": layout})


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens_hold_state_and_zero_the_tail(op, direction):
    dirs = 2 if direction == "bidirectional" else 1
    ins = recurrent_inputs(op, T=6, N=4, dirs=dirs, lens=[6, 3, 1, 5])
    got = ours(op, ins, {"direction": direction, "hidden_size": 6}, n_out=n_outputs(op))
    assert np.all(got[0][3:, :, 1] == 0) and np.all(got[0][1:, :, 2] == 0) and np.any(got[0][:3, :, 1] != 0)
    assert_matches_ort(op, ins, {"direction": direction, "hidden_size": 6})


@pytest.mark.parametrize("op,acts,alpha,beta", [
    ("RNN", ["Relu", "LeakyRelu"], [0.3], []),
    ("RNN", ["Affine", "ScaledTanh"], [0.7, 1.3], [0.1, 0.6]),
    ("GRU", ["HardSigmoid", "Softsign", "Sigmoid", "Elu"], [0.3, 0.9], [0.4]),
    ("LSTM", ["Sigmoid", "Tanh", "Softplus", "HardSigmoid", "ThresholdedRelu", "Tanh"], [0.25, 0.2], [0.45]),
])
def test_activations_consume_alpha_and_beta_in_order(op, acts, alpha, beta):
    ins = recurrent_inputs(op, dirs=2)
    attrs = {"direction": "bidirectional", "hidden_size": 6, "activations": acts, "activation_alpha": alpha}
    if beta:
        attrs["activation_beta"] = beta
    assert_matches_ort(op, ins, attrs)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_clip_bounds_gate_inputs(op):
    ins = [a * 4 if a is not None and a.dtype == np.float32 else a for a in recurrent_inputs(op)]
    assert_matches_ort(op, ins, {"hidden_size": 6, "clip": 0.5})


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr):
    ins = recurrent_inputs("GRU", dirs=2)
    assert_matches_ort("GRU", ins, {"direction": "bidirectional", "hidden_size": 6, "linear_before_reset": lbr})


def test_lstm_input_forget_couples_the_forget_gate():
    ins = recurrent_inputs("LSTM", peep=True)
    assert_matches_ort("LSTM", ins, {"hidden_size": 6, "input_forget": 1})


def test_defaults_without_bias_or_states():
    ins = recurrent_inputs("LSTM", states=False, bias=False)
    assert_matches_ort("LSTM", ins, {"hidden_size": 6})


def test_wrong_activation_count_is_an_attribute_error():
    with pytest.raises(NodeAttributeError, match="activations"):
        ours("LSTM", recurrent_inputs("LSTM"), {"hidden_size": 6, "activations": ["Sigmoid", "Tanh"]}, n_out=3)


def test_weights_of_the_wrong_size_are_a_shape_error():
    ins = recurrent_inputs("GRU")
    ins[2] = ins[2][:, :12]
    with pytest.raises(ShapeError, match="gates"):
        ours("GRU", ins, {"hidden_size": 6}, n_out=2)
