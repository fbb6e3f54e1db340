"""Pointwise layers with a concatenated operand (pass absorb_concat; kernels: pointwise_concat):
the launch arguments the host derives (CPU), every path's index math emulated on the host from
those arguments against the reference, the modules compiled with NVRTC, and the kernels against
the reference on the device (GPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.fused_reference import evaluate_body
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.pointwise import pointwise as pw
from polykit.kernels.cuda.pointwise import pointwise_rows as pr
from polykit.kernels.cuda.pointwise import row_geometry as rg
from polykit.kernels.cuda.pointwise.pointwise_codegen import MAXR, VEC, pointwise_kernels
from polykit.kernels.cuda.pointwise.pointwise_concat import ConcatTensor
from tests.kernels.cuda.recording_launcher import RecordingLauncher

rng = np.random.default_rng(31)

#: BatchNorm + ReLU over the concatenation (DenseNet's pre-activation), scale and shift broadcast
BN = [{"op": "Mul", "inputs": ["cat", "s"], "outputs": ["t0"], "attrs": {}},
      {"op": "Add", "inputs": ["t0", "b"], "outputs": ["t1"], "attrs": {}},
      {"op": "Relu", "inputs": ["t1"], "outputs": ["y"], "attrs": {}}]
#: the concatenation plus a full-size tensor: no broadcast
ADD = [{"op": "Add", "inputs": ["z", "cat"], "outputs": ["y"], "attrs": {}}]


def _layer(body, feeds: dict, sources: list[np.ndarray], axis: int, precision: str = "fp16") -> tuple[LayerDesc, dict]:
    """A stamped Pointwise layer: inputs `feeds` (by name) then the sources c0.. of operand "cat"."""
    names = tuple(feeds) + tuple(f"c{k}" for k in range(len(sources)))
    arrays = {**feeds, **{f"c{k}": a for k, a in enumerate(sources)}}
    entry = {"name": "cat", "axis": axis, "first": len(feeds), "count": len(sources),
             "extents": [int(a.shape[axis]) for a in sources]}
    lay = LayerDesc("m", "Pointwise", names, ("y",), {"body": body, "concat": [entry]}, domain="ai.polykit",
                    precision=precision)
    y = _reference(lay, arrays)
    lay = replace(lay, in_dtypes=tuple(arrays[n].dtype.name for n in names), in_shapes=tuple(arrays[n].shape for n in names),
                  out_dtypes=(y.dtype.name,), out_shapes=(y.shape,))
    return lay, arrays


def _reference(lay: LayerDesc, arrays: dict) -> np.ndarray:
    node = Node("Pointwise", list(lay.inputs), list(lay.outputs), dict(lay.attrs), name=lay.name, domain=lay.domain)
    return run_reference(node, [arrays[n] for n in lay.inputs])[0]


def _bn_case(shapes: list[tuple], axis: int, dtype=np.float16):
    sources = [rng.uniform(-2, 2, s).astype(dtype) for s in shapes]
    c = sum(s[axis] for s in shapes)
    bshape = (c,) + (1,) * (len(shapes[0]) - 1 - axis)  # [C] channels-last, [C, 1, 1] for NCHW
    feeds = {"s": rng.uniform(0.5, 1.5, bshape).astype(dtype), "b": rng.uniform(-0.5, 0.5, bshape).astype(dtype)}
    return _layer(BN, feeds, sources, axis)


def _add_case(shapes: list[tuple], axis: int, dtype=np.float16):
    sources = [rng.uniform(-2, 2, s).astype(dtype) for s in shapes]
    full = list(shapes[0])
    full[axis] = sum(s[axis] for s in shapes)
    return _layer(ADD, {"z": rng.uniform(-2, 2, full).astype(dtype)}, sources, axis)


# ---- host emulation of the three entry points, from the recorded launch ------------------------
class Memory:
    """Device tensors at fake aligned addresses (optionally shifted by `misalign` elements)."""

    def __init__(self, arrays: dict, out_shape, out_dtype, misalign: dict | None = None):
        self.by_ptr, self.tensors, ptr = {}, {}, 0x10000
        for name, a in list(arrays.items()) + [("y", np.zeros(out_shape, out_dtype))]:
            p = ptr + (misalign or {}).get(name, 0) * a.dtype.itemsize
            self.by_ptr[p] = a.reshape(-1).copy() if name != "y" else a.reshape(-1)
            self.tensors[name] = DeviceTensor(p, tuple(a.shape), a.dtype)
            ptr += (a.nbytes // 256 + 2) * 256
        self.y = self.by_ptr[self.tensors["y"].ptr]


def _cat_index(offsets: np.ndarray, ext: list[int], total: int) -> tuple[np.ndarray, np.ndarray]:
    """cat_ptr of the generated code: (source, element) of each concatenation offset."""
    q = offsets // total
    r = offsets - q * total
    src, elem = np.full(offsets.shape, len(ext) - 1), np.zeros_like(offsets)
    done = np.zeros(offsets.shape, bool)
    for s, e in enumerate(ext[:-1]):
        hit = ~done & (r < e)
        src[hit], elem[hit] = s, (q * e + r)[hit]
        done |= hit
        r = np.where(done, r, r - e)
    elem[~done] = (q * ext[-1] + r)[~done]
    return src, elem


def _load(mem: Memory, ptrs, table, offsets: np.ndarray) -> np.ndarray:
    """Values of one logical input at element offsets (a concatenation: through its table)."""
    if table is None:
        return mem.by_ptr[ptrs[0]][offsets]
    ext, total = table
    src, elem = _cat_index(offsets, ext, total)
    out = np.empty(offsets.shape, mem.by_ptr[ptrs[0]].dtype)
    for s, p in enumerate(ptrs):
        out[src == s] = mem.by_ptr[p][elem[src == s]]
    return out


def _vector_offsets(mem, ptrs, table, starts: np.ndarray, width: int) -> np.ndarray:
    """A vector load of `width` elements: the first element located, the next ones after it in
    the same source (what the reinterpret_cast load reads), as values."""
    if table is None:
        return mem.by_ptr[ptrs[0]][starts[:, None] + np.arange(width)]
    ext, total = table
    src, elem = _cat_index(starts, ext, total)
    out = np.empty((starts.size, width), mem.by_ptr[ptrs[0]].dtype)
    for s, p in enumerate(ptrs):
        sel = src == s
        if sel.any():
            idx = elem[sel][:, None] + np.arange(width)
            assert idx.max() < mem.by_ptr[p].size, "a vector load ran past its source"
            out[sel] = mem.by_ptr[p][idx]
    return out


def _split_args(lay: LayerDesc, args: list):
    """(per logical input: (pointers, table or None), output pointer, geometry args)."""
    counts = pw.operand_counts(lay)
    n_logical = len(lay.inputs) - sum(c - 1 for c in counts.values())
    ptrs, k = [], 0
    for i in range(n_logical):
        c = counts.get(i, 1)
        ptrs.append([a.ptr for a in args[k:k + c]])
        k += c
    y = args[k].ptr
    rest = args[k + 1:]
    ntab = sum(c + 1 for c in counts.values())
    geo, tab = rest[:len(rest) - ntab], rest[len(rest) - ntab:]
    tables, t = [], 0
    for i in range(n_logical):
        if i in counts:
            c = counts[i]
            tables.append((tab[t:t + c], tab[t + c]))
            t += c + 1
        else:
            tables.append(None)
    return list(zip(ptrs, tables)), y, geo


def _emulate(lay: LayerDesc, mem: Memory, name: str, args: list) -> None:
    body, ins, outs = pw.layer_body(lay)
    inputs, _, geo = _split_args(lay, args)
    path = name[-1]
    if path == "s":
        n, rank = geo[0], geo[1]
        dims = geo[2:2 + MAXR]
        nt = len(inputs) + 1
        strides = [geo[2 + MAXR + t * MAXR:2 + MAXR + (t + 1) * MAXR] for t in range(nt)]
        i = np.arange(n)
        offs = [np.zeros(n, np.int64) for _ in range(nt)]
        r = i.copy()
        for d in range(MAXR - 1, -1, -1):
            if d < rank:
                q = np.zeros_like(r) if rank == 1 else r // dims[d]
                c = r - q * dims[d]
                r = q
                for t in range(nt):
                    offs[t] += c * strides[t][d]
        env = {nm: _load(mem, p, tb, offs[t]) for t, (nm, (p, tb)) in enumerate(zip(ins, inputs))}
        mem.y[offs[-1]] = evaluate_body(body, env)[outs[0]]
    elif path == "v":
        n = geo[0]
        sc = geo[1:1 + len(inputs)]
        starts = np.arange(n // VEC) * VEC
        env = {}
        for nm, (p, tb), s in zip(ins, inputs, sc):
            env[nm] = np.broadcast_to(mem.by_ptr[p[0]][0], (starts.size, VEC)) if s else _vector_offsets(mem, p, tb, starts, VEC)
        mem.y[(starts[:, None] + np.arange(VEC)).reshape(-1)] = evaluate_body(body, env)[outs[0]].reshape(-1)
    else:
        a_, b_, i_ = geo[:3]
        per = [geo[3 + 3 * k:6 + 3 * k] for k in range(len(inputs))]
        v = 8 if geo[3 + 3 * len(inputs)] else 1
        ra, rb, ci = np.meshgrid(np.arange(a_), np.arange(b_), np.arange(0, i_, v), indexing="ij")
        ra, rb, ci = ra.reshape(-1), rb.reshape(-1), ci.reshape(-1)
        env = {}
        for nm, (p, tb), (sa, sb, si) in zip(ins, inputs, per):
            base = ra * sa + rb * sb
            if si:
                env[nm] = _vector_offsets(mem, p, tb, base + ci, v)
            else:
                env[nm] = np.repeat(_load(mem, p, tb, base)[:, None], v, axis=1)
        rows = ((ra * b_ + rb) * i_ + ci)[:, None] + np.arange(v)
        mem.y[rows.reshape(-1)] = evaluate_body(body, env)[outs[0]].reshape(-1)


def _run_emulated(lay, arrays, enqueue, misalign=None):
    want = _reference(lay, arrays)
    mem = Memory(arrays, want.shape, want.dtype, misalign)
    rec = RecordingLauncher()
    enqueue(lay, rec, mem.tensors)
    (name, args), = rec.launches
    _emulate(lay, mem, name, args)
    np.testing.assert_array_equal(mem.y.reshape(want.shape), want)
    return name, args


# ---- CPU: launch arguments ----------------------------------------------------------------------
def test_rows_launch_passes_every_source_pointer_and_its_extent_table():
    lay, arrays = _bn_case([(2, 3, 5, 24), (2, 3, 5, 32), (2, 3, 5, 32)], 3)
    name, args = _run_emulated(lay, arrays, pr.enqueue_rows)
    assert name.endswith("_r")
    mem_ptrs = [a for a in args if isinstance(a, DeviceTensor)]
    assert [t.shape for t in mem_ptrs] == [(88,), (88,), (2, 3, 5, 24), (2, 3, 5, 32), (2, 3, 5, 32), (2, 3, 5, 88)]
    ints = args[len(mem_ptrs):]
    # [A, B, I] = [1, 30, 88]; s, b broadcast along rows; the concatenation contiguous; vec; table
    assert ints == [1, 30, 88, 0, 0, 1, 0, 0, 1, 0, 88, 1, 1, 24, 32, 32, 88]


def test_nchw_concatenation_extents_count_the_inner_pixels():
    lay, arrays = _bn_case([(2, 3, 4, 5), (2, 5, 4, 5)], 1)
    _, args = _run_emulated(lay, arrays, pr.enqueue_rows)
    assert args[-3:] == [3 * 20, 5 * 20, 8 * 20]


def test_vectors_only_where_every_extent_and_pointer_allows():
    f16 = np.dtype(np.float16)
    whole = ConcatTensor((DeviceTensor(0x1000, (2, 3, 24), f16), DeviceTensor(0x2000, (2, 3, 32), f16)), 2)
    assert whole.aligned(8) and whole.shape == (2, 3, 56) and whole.extents() == [24, 32]
    odd = ConcatTensor((DeviceTensor(0x1000, (2, 3, 5), f16), DeviceTensor(0x2000, (2, 3, 3), f16)), 2)
    assert not odd.aligned(8) and not odd.aligned(4) and odd.aligned(1)
    shifted = ConcatTensor((DeviceTensor(0x1000, (2, 3, 24), f16), DeviceTensor(0x2002, (2, 3, 32), f16)), 2)
    assert not shifted.aligned(8) and not shifted.aligned(4)
    nchw = ConcatTensor((DeviceTensor(0x1000, (2, 3, 4, 2), f16), DeviceTensor(0x2000, (2, 1, 4, 2), f16)), 1)
    assert nchw.extents() == [24, 8] and nchw.aligned(8)  # 3 and 1 channels, 8 pixels each: whole vectors


# ---- CPU: every path emulated from its arguments, against the reference -------------------------
ROW_CASES = [  # (source shapes, axis): channels-last 24 + 32k, odd 3 / 5 channels, NCHW, a single-row case
    ([(2, 3, 5, 24), (2, 3, 5, 32), (2, 3, 5, 32)], 3),
    ([(2, 3, 5, 3), (2, 3, 5, 5)], 3),
    ([(1, 4, 4, 5)] * 7, 3),
    ([(2, 3, 4, 5), (2, 5, 4, 5)], 1),
    ([(2, 8, 2, 4), (2, 16, 2, 4)], 1),
    ([(1, 1, 1, 8), (1, 1, 1, 16)], 3),
]


@pytest.mark.parametrize("shapes,axis", ROW_CASES)
@pytest.mark.parametrize("enqueue", [pr.enqueue_rows, pw.enqueue_pointwise], ids=["rows", "pointwise"])
def test_batchnorm_relu_over_a_concatenation_emulated(shapes, axis, enqueue):
    lay, arrays = _bn_case(shapes, axis)
    name, _ = _run_emulated(lay, arrays, enqueue)
    assert name[-1] == ("r" if enqueue is pr.enqueue_rows else "s")


@pytest.mark.parametrize("misalign", [{}, {"c1": 1}, {"c0": 4}])
def test_misaligned_sources_take_the_scalar_row_loads(misalign):
    lay, arrays = _bn_case([(2, 3, 5, 24), (2, 3, 5, 32)], 3)
    _, args = _run_emulated(lay, arrays, pr.enqueue_rows, misalign)
    vec = args[-4]  # before the table of two sources: e0, e1, E
    assert vec == (0 if misalign else 1)


@pytest.mark.parametrize("shapes,axis,path", [
    ([(2, 3, 8), (2, 3, 16)], 2, "v"),           # whole vectors in every source
    ([(2, 3, 5), (2, 3, 3)], 2, "s"),            # odd extents: scalar loads
    ([(3, 4), (5, 4)], 0, "v"),                  # axis 0: one slice, extents 12 and 20
    ([(2, 5, 2), (2, 1, 2), (2, 2, 2)], 1, "s"),  # NCHW-like, extents 10, 2, 4 not whole vectors
])
def test_full_size_concatenation_takes_the_vector_path_where_it_can(shapes, axis, path):
    lay, arrays = _add_case(shapes, axis)
    name, _ = _run_emulated(lay, arrays, pw.enqueue_pointwise)
    assert name[-1] == path


def test_broadcast_concatenation_takes_the_strided_path():
    """The concatenation [2, 1, 5] broadcast against z [2, 4, 5]: its virtual strides are 0 along rows."""
    sources = [rng.uniform(-2, 2, (2, 1, s)).astype(np.float32) for s in (2, 3)]
    lay, arrays = _layer(ADD, {"z": rng.uniform(-2, 2, (2, 4, 5)).astype(np.float32)}, sources, 2, "fp32")
    name, _ = _run_emulated(lay, arrays, pw.enqueue_pointwise)
    assert name.endswith("_s")


def test_stamped_takes_sees_the_operand_shape_not_the_sources():
    lay, _ = _bn_case([(2, 3, 5, 24), (2, 3, 5, 32)], 3)
    assert rg.stamped_takes(lay)
    full, _ = _add_case([(2, 3, 8), (2, 3, 16)], 2)
    assert not rg.stamped_takes(full)  # same-shape operands: the vector kernel's case


# ---- CPU: module identity, NVRTC ----------------------------------------------------------------
def test_modules_depend_on_the_source_count_not_on_the_shapes():
    a, _ = _bn_case([(2, 3, 5, 24), (2, 3, 5, 32)], 3)
    b, _ = _bn_case([(1, 7, 7, 3), (1, 7, 7, 5)], 3)
    c, _ = _bn_case([(2, 3, 5, 24), (2, 3, 5, 32), (2, 3, 5, 8)], 3)
    plain = LayerDesc("m", "Pointwise", ("cat", "s", "b"), ("y",), {"body": BN}, domain="ai.polykit", precision="fp16")
    for rows in (False, True):
        ka, kb, kc, kp = (pointwise_kernels(lay, rows=rows) for lay in (a, b, c, plain))
        assert ka == kb and ka != kc and ka[0].name != kp[0].name
        assert "cat_ptr" in ka[0].code and "cat_ptr" not in kp[0].code


def test_concat_variants_compile_with_nvrtc():
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    layers = pw.concat_variant_layers()
    units = [pointwise_kernels(lay, rows=rows)[0] for lay in layers for rows in (False, True)]
    assert check_all(units, "sm_80") == len(unique_units(units)) > 0
    assert all(k.name in {v.name for v in pw.compile_variants()} for lay in layers for k in pointwise_kernels(lay)[:1])


# ---- GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("shapes,axis", ROW_CASES)
@pytest.mark.parametrize("tactic", ["cuda.pointwise.rows", "cuda.pointwise"])
def test_concatenated_batchnorm_relu_matches_reference(shapes, axis, tactic):
    from polykit.runtime.cuda.harness import assert_matches_reference

    lay, arrays = _bn_case(shapes, axis)
    assert_matches_reference(lay, arrays, tactic=tactic, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("shapes,axis", [([(2, 3, 8), (2, 3, 16)], 2), ([(2, 3, 5), (2, 3, 3)], 2), ([(3, 4), (5, 4)], 0)])
def test_concatenated_add_matches_reference(shapes, axis):
    from polykit.runtime.cuda.harness import assert_matches_reference

    lay, arrays = _add_case(shapes, axis)
    assert_matches_reference(lay, arrays, tactic="cuda.pointwise", rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [{"c1": 1}, {"c0": 4, "y": 2}])
def test_misaligned_sources_match_reference(misalign):
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    lay, arrays = _bn_case([(2, 3, 5, 24), (2, 3, 5, 32)], 3)
    # misalign counts elements (as the host emulation's Memory does); run_layer shifts by bytes
    shift = {name: n * np.dtype(np.float16).itemsize for name, n in misalign.items()}
    got = run_layer(lay, arrays, tactic="cuda.pointwise.rows", misalign=shift)["y"]
    np.testing.assert_array_equal(got, reference_layer(lay, arrays)["y"])
