"""CumSum, CumProd, TopK, Trilu, Einsum: importers (TopK's k attribute -> input) and shape rules."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Dim, Node, Shape
from polykit.compiler.ir.symbolic import SymInt
from polykit.compiler.ops.registry import ImportContext, InferContext, broadcast_shapes, importer, shape_rule

INT64 = np.dtype(np.int64)


@shape_rule("CumSum", "CumProd")
def _cumulative(ctx: InferContext):
    axis = ctx.const(1)
    if axis is not None and ctx.rank(0) is not None:
        if np.asarray(axis).size != 1:
            raise ctx.fail(f"{ctx.node.op_type} axis must be a scalar, got {np.asarray(axis).tolist()}")
        ctx.normalize_axis(int(np.asarray(axis).reshape(())), ctx.rank(0))
    return [(ctx.dtype(0), ctx.shape(0))]


# ---- TopK ---------------------------------------------------------------------------------------

@importer("TopK", since=1)
def _topk_k_attr_to_input(node: Node, ctx: ImportContext) -> None:
    """TopK-1: k attribute -> int64 [1] input (TopK-10 form)."""
    k = int(node.attrs.pop("k"))
    node.inputs = [node.inputs[0], ctx.add_constant(np.array([k], np.int64), prefix=f"{node.name}_k")]


@importer("TopK", since=10)
def _topk_canonical(node: Node, ctx: ImportContext) -> None:
    """K is an input from opset 10 on; largest/sorted (opset 11) default to TopK-10's behaviour."""


@shape_rule("TopK")
def _topk(ctx: InferContext):
    shape = ctx.shape(0)
    if shape is None:
        return [(ctx.dtype(0), None), (INT64, None)]
    axis = ctx.normalize_axis(int(ctx.attr("axis", -1)), len(shape))
    k_const = ctx.const(1)
    k: Dim = None
    if k_const is not None:
        k_arr = np.asarray(k_const).reshape(-1)
        if k_arr.size != 1 or int(k_arr[0]) < 0:
            raise ctx.fail(f"TopK K must be one non-negative value, got {k_arr.tolist()}")
        k = k_arr[0] if isinstance(k_arr[0], SymInt) else int(k_arr[0])  # a SymInt: k computed from dims
        if isinstance(shape[axis], int) and k > shape[axis]:
            raise ctx.fail(f"TopK K={k} exceeds the axis length {shape[axis]}")
    out = tuple(k if i == axis else d for i, d in enumerate(shape))
    return [(ctx.dtype(0), out), (INT64, out)]


@shape_rule("Trilu")
def _trilu(ctx: InferContext):
    rank = ctx.rank(0)
    if rank is not None and rank < 2:
        raise ctx.fail(f"Trilu needs an input of rank >= 2, got rank {rank}")
    return [(ctx.dtype(0), ctx.shape(0))]


# ---- Einsum ------------------------------------------------------------------------------------------

def parse_einsum(equation: str, n_inputs: int) -> tuple[list[str], str]:
    """Split an equation into input terms and an explicit output term (implicit mode:
    "..." if any input has it, then letters used exactly once in ASCII order)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_inputs:
        raise ValueError(f"equation {equation!r} has {len(terms)} input terms for {n_inputs} inputs")
    for t in terms + ([rhs] if arrow else []):
        letters = t.replace("...", "")
        if not all(c.isalpha() for c in letters) or t.count("...") > 1:
            raise ValueError(f"term {t!r} of equation {equation!r} is not letters with at most one '...'")
    if not arrow:
        counts: dict[str, int] = {}
        for t in terms:
            for c in t.replace("...", ""):
                counts[c] = counts.get(c, 0) + 1
        rhs = ("..." if any("..." in t for t in terms) else "") + "".join(sorted(c for c, n in counts.items() if n == 1))
    return terms, rhs


def _split_term(term: str, shape: tuple[Dim, ...]) -> tuple[dict[str, list[Dim]], tuple[Dim, ...]]:
    """Letter -> dims seen, and the ellipsis dims, for one operand."""
    head, ell, tail = term.partition("...")
    if not ell:
        if len(term) != len(shape):
            raise ValueError(f"term {term!r} has {len(term)} letters for an input of rank {len(shape)}")
        return {c: [d] for c, d in zip(term, shape)} | _repeats(term, shape), ()
    n_ell = len(shape) - len(head) - len(tail)
    if n_ell < 0:
        raise ValueError(f"term {term!r} needs rank >= {len(head) + len(tail)}, input has rank {len(shape)}")
    letters = head + tail
    dims = tuple(shape[: len(head)]) + tuple(shape[len(shape) - len(tail):])
    return _repeats(letters, dims), tuple(shape[len(head): len(head) + n_ell])


def _repeats(letters: str, dims) -> dict[str, list[Dim]]:
    seen: dict[str, list[Dim]] = {}
    for c, d in zip(letters, dims):
        seen.setdefault(c, []).append(d)
    return seen


@shape_rule("Einsum")
def _einsum(ctx: InferContext):
    equation = ctx.attr("equation")
    try:
        terms, rhs = parse_einsum(equation, ctx.n_inputs)
    except ValueError as exc:
        raise ctx.fail(str(exc), hint="see the ONNX Einsum spec for the equation syntax") from None
    shapes = [ctx.shape(i) for i in range(ctx.n_inputs)]
    if any(s is None for s in shapes):
        return [(ctx.dtype(0), None)]
    letter_dims: dict[str, Dim] = {}
    ellipses: list[Shape] = []
    for term, shape in zip(terms, shapes):
        try:
            seen, ell = _split_term(term, tuple(shape))
        except ValueError as exc:
            raise ctx.fail(str(exc)) from None
        ellipses.append(ell)
        for c, dims in seen.items():
            for d in dims:
                letter_dims[c] = _merge_dim(ctx, c, letter_dims.get(c, 1), d)
    ell_out = broadcast_shapes(ctx, *ellipses) if ellipses else ()
    out: list[Dim] = []
    head, ell, tail = rhs.partition("...")
    for c in head:
        out.append(letter_dims.get(c))
    if ell:
        out.extend(ell_out or ())
    for c in tail:
        out.append(letter_dims.get(c))
    missing = [c for c in rhs.replace("...", "") if c not in letter_dims]
    if missing:
        raise ctx.fail(f"output letters {missing} of equation {equation!r} appear in no input term")
    return [(ctx.dtype(0), tuple(out))]


def _merge_dim(ctx: InferContext, letter: str, known: Dim, d: Dim) -> Dim:
    if known == 1:
        return d
    if d == 1 or d == known:
        return known
    if isinstance(known, int) and isinstance(d, int):
        raise ctx.fail(f"einsum letter {letter!r} has sizes {known} and {d}")
    return known if isinstance(known, int) else d
