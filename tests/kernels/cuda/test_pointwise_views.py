"""Pointwise layers with view operands (pass absorb_views; kernels: pointwise_views): the launch
arguments the host derives (CPU), the strided kernel's index math emulated on the host from those
arguments against the PermutedCopy reference (random shapes, transposes, window merges, rolls,
broadcasts), the modules compiled with NVRTC, and the kernels against the reference (GPU)."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.fused_reference import evaluate_body
from polykit.compiler.ops.nn.view_operands import fit_view
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.launch_geometry import view_geometry
from polykit.kernels.cuda.pointwise import pointwise as pw
from polykit.kernels.cuda.pointwise import pointwise_rows as pr
from polykit.kernels.cuda.pointwise import row_geometry as rg
from polykit.kernels.cuda.pointwise.pointwise_codegen import MAXR, pointwise_kernels
from tests.kernels.cuda.permuted_copy_cases import CASES
from tests.kernels.cuda.recording_launcher import RecordingLauncher
from tests.kernels.cuda.test_pointwise_concat import Memory

rng = np.random.default_rng(37)

ADD = [{"op": "Add", "inputs": ["v", "r"], "outputs": ["y"], "attrs": {}}]
ROPE = [{"op": "Mul", "inputs": ["v", "cos"], "outputs": ["t0"], "attrs": {}},
        {"op": "Mul", "inputs": ["w", "sin"], "outputs": ["t1"], "attrs": {}},
        {"op": "Add", "inputs": ["t0", "t1"], "outputs": ["y"], "attrs": {}}]


def _copy(x_shape, attrs) -> tuple[Node, np.ndarray]:
    """A PermutedCopy node (shape filled in as permuted_copy_cases does) and its index map."""
    attrs = dict(attrs)
    if "shape" not in attrs:
        view = attrs.get("view", attrs.get("window", x_shape))
        attrs["shape"] = [view[p] for p in attrs.get("perm", range(len(view)))]
    copy = Node("PermutedCopy", ["x"], ["c"], attrs, name="copy", domain=POLYKIT_DOMAIN)
    (index,) = run_reference(copy, [np.arange(int(np.prod(x_shape)), dtype=np.int64).reshape(x_shape)])
    return copy, index


def _layer(body, names: tuple, views: list[dict], arrays: dict, precision="fp32") -> LayerDesc:
    lay = LayerDesc("m", "Pointwise", names, ("y",), {"body": body, "view": views}, domain="ai.polykit",
                    precision=precision)
    node = Node("Pointwise", list(names), ["y"], dict(lay.attrs), name="m", domain="ai.polykit")
    (y,) = run_reference(node, [arrays[n] for n in names])
    return replace(lay, in_dtypes=tuple(arrays[n].dtype.name for n in names),
                   in_shapes=tuple(arrays[n].shape for n in names), out_dtypes=(y.dtype.name,), out_shapes=(y.shape,))


def _geometry(lay: LayerDesc, args: list):
    """The strided entry's arguments (a view-vector entry's start with them) parsed: (pointers,
    n, rank, dims, strides per tensor, {view input: (base offset, shifts, inner sizes, outer
    strides)}, the arguments after them)."""
    nt = len(pw.layer_body(lay)[1]) + 1
    ptrs, geo = [a.ptr for a in args[:nt]], args[nt:]
    n, rank, dims = geo[0], geo[1], geo[2:2 + MAXR]
    k = 2 + MAXR
    strides = [geo[k + t * MAXR:k + (t + 1) * MAXR] for t in range(nt)]
    k += nt * MAXR + 1  # the zero mask of the one output
    extra = {}
    for i in sorted(pw.view_inputs(lay)):
        extra[i] = (geo[k], *(geo[k + 1 + m * MAXR:k + 1 + (m + 1) * MAXR] for m in range(3)))
        k += 1 + 3 * MAXR
    return ptrs, n, rank, dims, strides, extra, geo[k:]


def _offsets(r: np.ndarray, rank: int, dims, strides, extra) -> list[np.ndarray]:
    """Each tensor's element offset at flat indices `r` (the generated offset loop: per dim the
    coordinate, the plain strides, and for a view operand its shift, inner piece size and outer
    piece stride; a view's base offset added)."""
    offs = [np.zeros(r.shape, np.int64) for _ in strides]
    for d in range(rank - 1, -1, -1):
        q = np.zeros_like(r) if rank == 1 else r // dims[d]
        c, r = r - q * dims[d], q
        for t in range(len(strides)):
            if t in extra and (extra[t][1][d] or extra[t][2][d]):
                _, vh, vq, vo = extra[t]
                j = c + vh[d]
                j = np.where(j >= dims[d], j - dims[d], j)
                h = j // vq[d] if vq[d] else np.zeros_like(j)
                offs[t] += h * vo[d] + (j - h * vq[d]) * strides[t][d]
            else:
                offs[t] += c * strides[t][d]
    return [o + (extra[t][0] if t in extra else 0) for t, o in enumerate(offs)]


def _emulate(lay: LayerDesc, mem: Memory, args: list) -> None:
    """The strided entry of a view module, from its recorded arguments."""
    body, ins, outs = pw.layer_body(lay)
    ptrs, n, rank, dims, strides, extra, rest = _geometry(lay, args)
    assert rest == []
    offs = _offsets(np.arange(n), rank, dims, strides, extra)
    env = {nm: mem.by_ptr[ptrs[t]][offs[t]] for t, nm in enumerate(ins)}
    mem.y[offs[-1]] = evaluate_body(body, env)[outs[0]]


def _entry_width(lay: LayerDesc, name: str) -> int:
    """V of a view-vector entry, read from the generated module (its extern "C" line)."""
    (code,) = {k.code for k in pointwise_kernels(lay) if k.name == name}
    return int(re.search(rf"void __launch_bounds__\(\d+\) {name}\(.*?_w<(\d+),", code).group(1))


def _emulate_vector(lay: LayerDesc, mem: Memory, name: str, args: list) -> None:
    """The view-vector entry `_w` from its recorded arguments: offsets at each vector's first
    element, then V-element loads (flag 1: contiguous, the address aligned to V elements, as the
    reinterpret_cast load needs) or one value broadcast (flag 0), V-element aligned stores, each
    output element written once."""
    body, ins, outs = pw.layer_body(lay)
    ptrs, n, rank, dims, strides, extra, flags = _geometry(lay, args)
    width = _entry_width(lay, name)
    assert len(flags) == len(ins) and n % width == 0 and dims[rank - 1] % width == 0
    offs = _offsets(np.arange(0, n, width), rank, dims, strides, extra)
    lanes = np.arange(width)
    env = {}
    for t, nm in enumerate(ins):
        a = mem.by_ptr[ptrs[t]]
        if flags[t]:
            assert np.all((ptrs[t] + offs[t] * a.itemsize) % (width * a.itemsize) == 0), f"misaligned load of {nm}"
            env[nm] = a[offs[t][:, None] + lanes]
        else:
            env[nm] = np.repeat(a[offs[t]][:, None], width, axis=1)
    assert np.all((ptrs[-1] + offs[-1] * mem.y.itemsize) % (width * mem.y.itemsize) == 0), "misaligned store"
    at = (offs[-1][:, None] + lanes).reshape(-1)
    assert np.array_equal(np.sort(at), np.arange(n))  # every output element once
    mem.y[at] = evaluate_body(body, env)[outs[0]].reshape(-1)


def _run_emulated(lay: LayerDesc, arrays: dict, want: np.ndarray, misalign: dict | None = None):
    """Emulate the strided entry (always) and the entry enqueue_pointwise picks (the view-vector
    one where the launch allows it) against `want`; that entry's (name, arguments)."""
    mem = Memory(arrays, want.shape, want.dtype, misalign)
    mem.tensors[lay.outputs[0]] = mem.tensors["y"]  # Memory's output "y" under the layer's name
    x, y, (k_s, _, _) = pw.layer_tensors(lay, mem.tensors)
    rec = RecordingLauncher()
    pw.launch_strided_or_vector(lay, rec, x, y, k_s, None)
    pw.enqueue_pointwise(lay, rec, mem.tensors)
    ((strided, s_args), (name, args)) = rec.launches
    assert strided == k_s.name and strided.endswith("_s")
    _emulate(lay, mem, s_args)
    np.testing.assert_array_equal(mem.y.reshape(want.shape), want)
    if name.endswith("_w"):
        mem.y[:] = np.nan
        _emulate_vector(lay, mem, name, args)
        np.testing.assert_array_equal(mem.y.reshape(want.shape), want)
    else:
        assert name == strided and args == s_args
    return name, args


def _add_case(x_shape, attrs, r_shape=None, dtype=np.float32):
    """Add(PermutedCopy(x), r) as a layer reading x through the fitted view, and the sum computed
    from the PermutedCopy reference (None when the copy fits no view)."""
    copy, index = _copy(x_shape, attrs)
    entry = fit_view(index, "v", 0)
    if entry is None:
        return None
    x = rng.uniform(-2, 2, x_shape).astype(dtype)
    r = rng.uniform(-2, 2, r_shape or index.shape).astype(dtype)
    (copied,) = run_reference(copy, [x])
    want = evaluate_body(ADD, {"v": copied, "r": r})["y"]
    lay = _layer(ADD, ("x", "r"), [entry], {"x": x, "r": r})
    return lay, {"x": x, "r": r}, want


# ---- CPU: the index math, emulated from the launch arguments -------------------------------------
#: the permuted_copy_cases that are views (a roll wraps an output dim; the wrapping window's rows
#: 5, 6, 0, 1 of 7 are rows 0, 1, 5, 6 shifted by 2: pieces [2, 25 elements] and [2, 5]); the others
#: wrap inside a piece or read the innermost dim strided: their copies stay
VIEW_CASES = ["roll_one_axis", "roll_two_axes_odd", "window_merge", "qkv_selection", "roll_innermost",
              "wrapping_window"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_permuted_copy_cases_emulated_against_the_copy_reference(case):
    made = _add_case(*CASES[case])
    assert (made is not None) == (case in VIEW_CASES)
    if made is not None:
        _run_emulated(*made)


def _random_spec(seed: int):
    """A random reshape-transpose-reshape with rolls before and after: x [a*b, c, d] viewed as
    [a, b, c, d], permuted with d last, merged to [a*c?, ...], rolled on the output."""
    g = np.random.default_rng(seed)
    a, b, c, d = (int(v) for v in g.integers(1, 6, 4))
    x_shape = (a * b, c, d)
    view = [a, b, c, d]
    outer = [int(p) for p in g.permutation(3)]
    perm = outer + [3]
    permuted = [view[p] for p in perm]
    shape = [permuted[0] * permuted[1], permuted[2], d] if g.random() < 0.5 else permuted
    shifts = [int(g.integers(-4, 5)) if g.random() < 0.6 else 0 for _ in shape]
    starts = [0, int(g.integers(0, c)) if c > 1 else 0, 0]
    return x_shape, {"starts": starts, "view": view, "perm": perm, "shape": shape, "out_shifts": shifts}


def test_random_reshape_transpose_reshape_rolls_emulated_against_the_copy_reference():
    fitted = 0
    for seed in range(60):
        made = _add_case(*_random_spec(seed))
        if made is not None:
            _run_emulated(*made)
            fitted += 1
    assert fitted >= 30  # most of them are views (a roll inside a merged dim is not)


@pytest.mark.parametrize("r_shape", [(1, 6, 15, 4), (1, 1, 15, 1), (6, 1, 4), (4,)])
def test_a_window_merge_against_broadcast_operands(r_shape):
    """The view's split dims meet operands broadcast along them (stride 0 in both pieces)."""
    attrs = {"view": [1, 2, 3, 3, 5, 4], "perm": [0, 1, 3, 2, 4, 5], "shape": [1, 6, 15, 4], "out_shifts": [0, 1, 2, 0]}
    lay, arrays, want = _add_case((6, 3, 5, 4), attrs, r_shape)
    _run_emulated(lay, arrays, want)


def test_rope_reads_two_views_of_one_source():
    """x [1, S, H, D] read transposed and transposed-and-rolled by one node, cos/sin broadcast."""
    s, h, d = 7, 3, 8
    x = rng.uniform(-2, 2, (1, s, h, d)).astype(np.float32)
    trans, ti = _copy(x.shape, {"perm": [0, 2, 1, 3]})
    rolled = np.roll(ti, -(d // 2), axis=3)  # rotate_half's roll of the transposed value
    cos, sin = (rng.uniform(-1, 1, (1, 1, s, d)).astype(np.float32) for _ in range(2))
    views = [fit_view(ti, "v", 0), fit_view(rolled, "w", 2)]
    lay = _layer(ROPE, ("x", "cos", "x", "sin"), views, {"x": x, "cos": cos, "sin": sin})
    flat = x.reshape(-1)
    want = evaluate_body(ROPE, {"v": flat[ti], "w": flat[rolled], "cos": cos, "sin": sin})["y"]
    _, args = _run_emulated(lay, {"x": x, "cos": cos, "sin": sin}, want)
    assert args[0] is args[2]  # both views read the one source


# ---- CPU: launch arguments, geometry ------------------------------------------------------------
def test_a_transpose_merges_nothing_and_a_merge_splits_into_its_pieces():
    # x [2, 3, 4] read as its (1, 0, 2) transpose [3, 2, 4] + r: no shift, one piece per dim
    n, dims, strides, zm, extra = view_geometry([(3, 2, 4), (3, 2, 4), (3, 2, 4)], 1,
                                                {0: [(0, [[3, 4]]), (0, [[2, 12]]), (0, [[4, 1]])]})
    assert (n, dims, strides[0], strides[1]) == (24, [3, 2, 4], [4, 12, 1], [8, 4, 1]) and zm == [0]
    assert extra[0] == ([0, 0, 0], [0, 0, 0], [0, 0, 0])
    # a window merge [6, 15] = [(2, 3), (3, 5)] unshifted: four iteration dims, plain strides
    merge = [(0, [[2, 45], [3, 5]]), (0, [[3, 15], [5, 1]])]
    _, dims, strides, _, extra = view_geometry([(6, 15), (6, 15), (6, 15)], 1, {0: merge})
    assert dims == [2, 3, 3, 5] and strides[0] == [45, 5, 15, 1] and strides[1] == [45, 15, 5, 1]
    # shifted: two dims, each with its shift, inner piece size and outer piece stride
    rolled = [(1, [[2, 45], [3, 5]]), (2, [[3, 15], [5, 1]])]
    _, dims, strides, _, extra = view_geometry([(6, 15), (6, 15), (6, 15)], 1, {0: rolled})
    assert dims == [6, 15] and strides[0] == [5, 1] and extra[0] == ([1, 2], [3, 5], [45, 15])


def test_views_that_split_a_dim_differently_iterate_its_common_refinement():
    a = [(0, [[2, 100], [6, 1]])]  # 12 = 2 x 6
    b = [(0, [[4, 50], [3, 1]])]  # 12 = 4 x 3
    _, dims, strides, _, _ = view_geometry([(12,), (12,), (12,)], 1, {0: a, 1: b})
    assert dims == [2, 2, 3] and strides == [[100, 3, 1], [100, 50, 1], [6, 3, 1]]
    with pytest.raises(ValueError, match="do not nest"):
        view_geometry([(12,), (12,), (12,)], 1, {0: [(0, [[3, 100], [4, 1]])], 1: b})  # 4 and 3 do not nest


def test_a_view_layer_has_only_the_strided_and_view_vector_entries_and_the_row_tactic_refuses_it():
    lay, arrays, want = _add_case((2, 3, 4), {"perm": [1, 0, 2]})
    names = [k.name for k in pointwise_kernels(lay)]
    assert [n[-2:] for n in names] == ["_s", "_w"]  # the one stamped signature
    assert [k.name for k in pointwise_kernels(lay, rows=True)] == names  # no row module for views
    assert not rg.stamped_takes(lay)
    mem = Memory(arrays, want.shape, want.dtype)
    rec = RecordingLauncher()
    pr.enqueue_rows(lay, rec, mem.tensors)  # a dynamic plan's corner: the view module's entries still
    assert rec.launches[0][0] == names[1]


def test_modules_depend_on_which_inputs_are_views_not_on_the_views():
    a, _, _ = _add_case((2, 3, 4), {"perm": [1, 0, 2]})
    b, _, _ = _add_case((5, 7, 3), {"starts": [0, 2, 0], "perm": [1, 0, 2]})
    plain = LayerDesc("m", "Pointwise", ("v", "r"), ("y",), {"body": ADD}, domain="ai.polykit")
    ka, kb, kp = (pointwise_kernels(lay) for lay in (a, b, plain))
    assert ka == kb and ka[0].name != kp[0].name
    assert "vh0" in ka[0].code and "vh0" not in kp[0].code


# ---- CPU: NVRTC -----------------------------------------------------------------------------------
def test_view_variants_compile_with_nvrtc():
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    layers = pw.view_variant_layers()
    units = [pointwise_kernels(lay)[0] for lay in layers]
    for arch in ("sm_80", "sm_90"):
        assert check_all(units, arch) == len(unique_units(units)) > 0
    assert all(pointwise_kernels(lay)[0].name in {v.name for v in pw.compile_variants()} for lay in layers)


# ---- GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", VIEW_CASES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_view_add_matches_reference(case, dtype):
    from polykit.runtime.cuda.harness import assert_matches_reference

    lay, arrays, _ = _add_case(*CASES[case], dtype=dtype)
    assert_matches_reference(lay, arrays, tactic="cuda.pointwise", rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_random_views_match_reference():
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    for seed in range(0, 60, 4):
        made = _add_case(*_random_spec(seed))
        if made is not None:
            lay, arrays, _ = made
            np.testing.assert_array_equal(run_layer(lay, arrays, tactic="cuda.pointwise")["y"],
                                          reference_layer(lay, arrays)["y"])
