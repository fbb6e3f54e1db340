"""Einsum tactic: the contraction plan (checked on the host by running it with numpy), supports(),
and on the GPU the equation forms exporters emit against the reference (outputs poisoned)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.gemm import einsum as es

rng = np.random.default_rng(53)

CASES = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 7, 8), (2, 3, 5, 8)]),
    ("bhqk,bhkd->bhqd", [(2, 3, 7, 5), (2, 3, 5, 8)]),
    ("ij,jk", [(3, 70), (70, 65)]),
    ("ij,kj->ik", [(66, 9), (67, 9)]),
    ("bi,bi->b", [(5, 33), (5, 33)]),
    ("i,j->ij", [(7,), (9,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)]),
    ("nct,ncs->nts", [(2, 4, 6), (2, 4, 3)]),
    ("ii->i", [(6, 6)]),
    ("ij->ji", [(5, 130)]),
    ("bij->b", [(4, 5, 6)]),
    ("ii", [(4, 4)]),
    ("abc,cd->abd", [(3, 4, 17), (17, 2)]),
]


def emulate(plan: es.Contraction, a: np.ndarray, b: np.ndarray | None, out_shape) -> np.ndarray:
    """Run the contraction plan with numpy (flat arrays, strided offsets) to check the plan itself."""

    def offsets(group):
        dims = list(group) or [(1, 0, 0, 0)]
        idx = np.indices([d[0] for d in reversed(dims)]).reshape(len(dims), -1)[::-1]
        return [sum(idx[i] * dims[i][t] for i in range(len(dims))) for t in (1, 2, 3)]

    (ba, bb, by), (ma, _, my), (_, nb_, ny), (ka, kb, _) = (offsets(g) for g in (plan.batch, plan.m, plan.n, plan.k))
    av = a.reshape(-1)[ba[:, None, None, None] + ma[None, :, None, None] + ka[None, None, None, :]]
    bv = 1.0 if b is None else b.reshape(-1)[bb[:, None, None, None] + nb_[None, None, :, None] + kb[None, None, None, :]]
    y = np.zeros(int(np.prod(out_shape)), np.float64)
    y[by[:, None, None] + my[None, :, None] + ny[None, None, :]] = (av * bv).sum(axis=-1)
    return y.reshape(out_shape)


@pytest.mark.parametrize("equation,shapes", CASES)
def test_contraction_plan_computes_the_equation(equation, shapes):
    ops = [rng.standard_normal(s) for s in shapes]
    want = np.einsum(equation, *ops)
    plan = es.plan_contraction(equation, shapes, want.shape)
    got = emulate(plan, ops[0], ops[1] if len(ops) > 1 else None, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_contraction_plan_merges_nested_dims_into_one():
    plan = es.plan_contraction("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)], (2, 3, 4, 5))
    assert plan.batch == ((6, 32, 40, 20),) and plan.k == ((8, 1, 1, 0),)


def test_supports_one_or_two_operands_with_a_valid_equation():
    assert es._supports(LayerDesc("e", "Einsum", ("A", "B"), ("Y",), {"equation": "ij,jk->ik"}))
    assert not es._supports(LayerDesc("e", "Einsum", ("A", "B", "C"), ("Y",), {"equation": "ij,jk,kl->il"}))
    assert not es._supports(LayerDesc("e", "Einsum", ("A",), ("Y",), {"equation": "ij,jk->ik"}))


@pytest.mark.gpu
@pytest.mark.parametrize("equation,shapes", CASES)
def test_einsum_float32_matches_reference(equation, shapes):
    from polykit.runtime.cuda.harness import assert_matches_reference

    names = tuple("AB"[: len(shapes)])
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)}
    assert_matches_reference(LayerDesc("einsum", "Einsum", names, ("Y",), {"equation": equation}), inputs,
                             rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(np.float16, {"rel": 2e-3}), (np.float64, {"rtol": 1e-12, "atol": 1e-12}),
                                       (np.int32, {"rtol": 0, "atol": 0}), (np.int64, {"rtol": 0, "atol": 0})])
def test_einsum_other_dtypes_match_reference(dtype, tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    inputs = {"A": rng.integers(-5, 6, size=(2, 33, 20)).astype(dtype),
              "B": rng.integers(-5, 6, size=(2, 20, 70)).astype(dtype)}
    if dtype in (np.float16, np.float64):
        inputs = {k: (v + rng.uniform(0.1, 0.9, v.shape)).astype(dtype) for k, v in inputs.items()}
    assert_matches_reference(LayerDesc("einsum", "Einsum", ("A", "B"), ("Y",), {"equation": "bij,bjk->bik"}),
                             inputs, **tol)


def test_bfloat16_has_a_kernel_entry_point():
    assert "bf16" in es.DTYPES and "einsum_bf16" in [k.name for k in es.compile_variants()]


@pytest.mark.gpu
@pytest.mark.parametrize("equation,shapes", [("bij,bjk->bik", [(2, 33, 20), (2, 20, 70)]), ("ij->ji", [(5, 130)]),
                                             ("ij->i", [(7, 65)]), ("ii->i", [(3, 3)])])
def test_einsum_bfloat16_storage_with_float_accumulation(equation, shapes):
    from polykit.runtime.cuda.harness import assert_matches_reference

    names = tuple("AB"[: len(shapes)])
    inputs = {n: rng.uniform(-2, 2, s).astype(ml_dtypes.bfloat16) for n, s in zip(names, shapes)}
    assert_matches_reference(LayerDesc("einsum", "Einsum", names, ("Y",), {"equation": equation}), inputs, rel=1e-2)
