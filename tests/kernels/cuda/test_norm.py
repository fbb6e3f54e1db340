"""GPU: Layer/Group/Instance/RMS/Batch normalization kernels against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc

rng = np.random.default_rng(9)


def rand(*shape, dtype=np.float32):
    return (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)


def check(lay, feeds, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, **tol)


def test_norm_tactics_registered_for_every_kind():
    from polykit.kernels.tactics import candidates

    for kind in ("LayerNormalization", "GroupNormalization", "InstanceNormalization", "BatchNormalization"):
        assert candidates("cuda", kind, LayerDesc("n", kind, ("X",), ("Y",), {}))


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis", [((2, 7), -1), ((3, 5, 768), -1), ((2, 3, 4, 5), 2), ((4, 1), -1), ((2, 9, 33), 1)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_matches_reference(shape, axis, with_bias):
    norm = shape[axis:] if axis != -1 else shape[-1:]
    feeds = {"X": rand(*shape), "S": rand(*norm), "B": rand(*norm)}
    ins = ("X", "S", "B") if with_bias else ("X", "S")
    lay = LayerDesc("ln", "LayerNormalization", ins, ("Y",), {"axis": axis, "epsilon": 1e-5})
    check(lay, {k: feeds[k] for k in ins}, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_layer_norm_writes_mean_and_inv_std_outputs():
    lay = LayerDesc("ln", "LayerNormalization", ("X", "S", "B"), ("Y", "M", "R"), {"axis": -1})
    check(lay, {"X": rand(6, 50), "S": rand(50), "B": rand(50)}, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_layer_norm_fp16_storage():
    lay = LayerDesc("ln", "LayerNormalization", ("X", "S", "B"), ("Y",), {"axis": -1}, precision="fp16")
    feeds = {"X": rand(4, 768, dtype=np.float16), "S": rand(768, dtype=np.float16), "B": rand(768, dtype=np.float16)}
    check(lay, feeds, rtol=5e-3, atol=5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 5), 3), ((1, 4, 7), 2), ((3, 8, 2, 3, 2), 8), ((2, 32, 16, 16), 1)])
def test_group_norm_matches_reference(shape, groups):
    c = shape[1]
    lay = LayerDesc("gn", "GroupNormalization", ("X", "S", "B"), ("Y",), {"num_groups": groups, "epsilon": 1e-5})
    check(lay, {"X": rand(*shape), "S": rand(c), "B": rand(c)}, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 9), (3, 2, 1, 1, 4)])
def test_instance_norm_matches_reference(shape):
    c = shape[1]
    lay = LayerDesc("in", "InstanceNormalization", ("X", "S", "B"), ("Y",), {"epsilon": 1e-3})
    check(lay, {"X": rand(*shape), "S": rand(c), "B": rand(c)}, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (4, 6), (1, 5, 3), (2, 64, 7, 7)])
def test_batch_norm_inference_matches_reference(shape):
    c = shape[1]
    feeds = {"X": rand(*shape), "S": rand(c), "B": rand(c), "M": rand(c), "V": np.abs(rand(c)) + 0.1}
    lay = LayerDesc("bn", "BatchNormalization", ("X", "S", "B", "M", "V"), ("Y",), {"epsilon": 1e-5})
    check(lay, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_rms_norm_matches_reference():
    lay = LayerDesc("rms", "RMSNormalization", ("X", "S"), ("Y",), {"axis": -1})
    check(lay, {"X": rand(3, 5, 64), "S": rand(64)}, rtol=1e-4, atol=1e-5)
