"""NonZero / Compress / Unique tactics (select.cu): host logic, a numpy model of every kernel run
through the real enqueue functions (argument packing, workspace carving), cuda plans picking the
tactics, and on the GPU every output against the reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from polykit.compiler.plan.records import LayerDesc
from polykit.errors import DeviceError
from polykit.kernels.cuda.movement import select
from polykit.kernels.cuda.base import DeviceTensor, count_slot
from polykit.runtime.cuda.harness import infer_output_specs, reference_layer

rng = np.random.default_rng(61)
BF16 = np.dtype(ml_dtypes.bfloat16)
TYPED = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": BF16, "i8": np.int8, "u8": np.uint8,
         "i16": np.int16, "u16": np.uint16, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64}


def nonzero_layer():
    return LayerDesc("nz", "NonZero", ("X",), ("Y",), {})


def compress_layer(**attrs):
    return LayerDesc("cmp", "Compress", ("X", "C"), ("Y",), dict(attrs))


def unique_layer(outputs=("Y", "I", "V", "N"), **attrs):
    return LayerDesc("uq", "Unique", ("X",), tuple(outputs), dict(attrs))


# ---- a numpy model of select.cu's kernels, launched through the real enqueue functions ----

class Memory:
    """Device memory as one byte arena; pointers are offsets from a non-zero base (0 = null)."""

    BASE = 1 << 20

    def __init__(self, nbytes: int = 1 << 22):
        self.arena = np.zeros(nbytes, np.uint8)
        self.top = 0

    def alloc(self, nbytes: int) -> int:
        ptr = self.BASE + self.top
        self.top += -(-max(nbytes, 1) // 16) * 16
        return ptr

    def view(self, ptr: int, dtype, count: int) -> np.ndarray:
        off = ptr - self.BASE
        return self.arena[off:off + count * np.dtype(dtype).itemsize].view(dtype)


def _cmp(a, b) -> int:
    an, bn = a != a, b != b
    if an or bn:
        return 0 if an == bn else (1 if an else -1)
    return -1 if a < b else (1 if b < a else 0)


class ModelLauncher:
    """Runs each launch with a numpy model of the named select.cu kernel (same argument list)."""

    def __init__(self, memory: Memory):
        self.mem, self.launched, self.workspaces = memory, [], 0

    def workspace(self, nbytes: int) -> int:
        self.workspaces += 1
        return self.mem.alloc(nbytes)

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.launched.append(kernel.name)
        args = [a.ptr if isinstance(a, DeviceTensor) else a for a in args]
        stem, code = kernel.name.rsplit("_", 1)
        getattr(self, stem)(code, *args)

    def _live(self, size, live):
        return int(self.mem.view(live, np.int64, 1)[0]) if live else size

    def select_flags(self, r, x, n, keep, pos, total):
        bits = self.mem.view(x, r.replace("u", "uint"), n)
        flags = (bits.astype(np.uint64) & np.uint64(keep)) != 0
        self.mem.view(pos, np.int64, n)[:] = np.where(flags, np.cumsum(flags) - 1, -1)
        if total:
            self.mem.view(total, np.int64, 1)[0] = int(flags.sum())

    def select_compress(self, r, x, y, pos, total, n, c, inner, m, live):
        m = self._live(m, live)
        xs = self.mem.view(x, r.replace("u", "uint"), total).reshape(-1, n, inner)
        p = self.mem.view(pos, np.int64, c)
        ys = self.mem.view(y, r.replace("u", "uint"), xs.shape[0] * m * inner).reshape(xs.shape[0], m, inner)
        for j in range(c):
            if p[j] >= 0:
                ys[:, p[j], :] = xs[:, j, :]

    def select_nonzero(self, _emit, pos, n, nnz, live, rank, *rest):
        dims, out = rest[:8], rest[8]
        nnz = self._live(nnz, live)
        p, o = self.mem.view(pos, np.int64, n), self.mem.view(out, np.int64, rank * nnz).reshape(rank, nnz)
        for e in range(n):
            if p[e] >= 0:
                o[:, p[e]] = np.unravel_index(e, dims[:rank])

    def _items(self, code, x, n, outer, inner):
        xs = self.mem.view(x, TYPED[code], outer * n * inner).reshape(outer, n, inner)
        return [[v.item() if code != "bf16" else float(v) for v in xs[:, i, :].reshape(-1)] for i in range(n)]

    @staticmethod
    def _lex(a, b, nan_equal) -> int:
        c = next((c for c in (_cmp(u, v) for u, v in zip(a, b)) if c), 0)
        return 2 if c == 0 and not nan_equal and any(u != u for u in a) else c

    def unique_match(self, code, x, n, outer, inner, nan_equal, first, count):
        items = self._items(code, x, n, outer, inner)
        f, c = self.mem.view(first, np.int64, n), self.mem.view(count, np.int64, n)
        for i in range(n):
            same = [j for j in range(n) if j == i or self._lex(items[i], items[j], nan_equal) == 0]
            f[i], c[i] = same[0], len(same)

    def unique_rank(self, code, x, n, outer, inner, nan_equal, sorted_, first, rank):
        items = self._items(code, x, n, outer, inner)
        f, rk = self.mem.view(first, np.int64, n), self.mem.view(rank, np.int64, n)
        distinct = [j for j in range(n) if f[j] == j]
        for i in distinct:
            if sorted_:
                ties = [self._lex(items[j], items[i], nan_equal) for j in distinct]
                rk[i] = sum(t < 0 or (t == 2 and j < i) for t, j in zip(ties, distinct))
            else:
                rk[i] = sum(j < i for j in distinct)

    def unique(self, _count, first, n, total):
        f = self.mem.view(first, np.int64, n)
        self.mem.view(total, np.int64, 1)[0] = int(sum(f[i] == i for i in range(n)))

    def unique_emit(self, r, x, y, first, count, rank, n, inner, total, u, live, indices, inverse, counts):
        dt = r.replace("u", "uint")
        u = self._live(u, live)
        f, c, rk = (self.mem.view(p, np.int64, n) for p in (first, count, rank))
        if y:
            xs = self.mem.view(x, dt, total).reshape(-1, n, inner)
            ys = self.mem.view(y, dt, xs.shape[0] * u * inner).reshape(xs.shape[0], u, inner)
            for j in range(n):
                if f[j] == j:
                    ys[:, rk[j], :] = xs[:, j, :]
        for j in range(n):
            if inverse:
                self.mem.view(inverse, np.int64, n)[j] = rk[f[j]]
            if f[j] == j:
                if indices:
                    self.mem.view(indices, np.int64, u)[rk[j]] = j
                if counts:
                    self.mem.view(counts, np.int64, u)[rk[j]] = c[j]


def run_model(layer, inputs, reserved=None):
    """Enqueue `layer` with the model launcher on poisoned outputs; returns (outputs, launcher).
    With `reserved` (output -> (stale shape, data axis)), a run time plan's way: the outputs have
    the stale shape and room for it, the layer gets a count word, and the outputs come back in
    the shape the count word gives."""
    mem = Memory()
    launcher = ModelLauncher(mem)
    tensors = {}
    for name, arr in inputs.items():
        arr = np.ascontiguousarray(arr)
        ptr = mem.alloc(arr.nbytes)
        mem.view(ptr, np.uint8, arr.nbytes)[:] = arr.reshape(-1).view(np.uint8)
        tensors[name] = DeviceTensor(ptr, arr.shape, arr.dtype)
    for name, (shape, dtype) in infer_output_specs(layer, inputs).items():
        shape = reserved[name][0] if reserved and name in reserved else shape
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        ptr = mem.alloc(nbytes)
        mem.view(ptr, np.uint8, nbytes)[:] = 0xFF
        tensors[name] = DeviceTensor(ptr, shape, dtype)
    if reserved:
        word = mem.alloc(8)
        mem.view(word, np.int64, 1)[0] = -7  # the context clears it before the launch; a kernel must set it
        tensors[count_slot(layer.name)] = DeviceTensor(word, (1,), np.dtype(np.int64))
    {"NonZero": select.enqueue_nonzero, "Compress": select.enqueue_compress,
     "Unique": select.enqueue_unique}[layer.kind](layer, launcher, tensors)
    if reserved:
        count = int(mem.view(word, np.int64, 1)[0])
        for name, (shape, axis) in reserved.items():
            t = tensors[name]
            tensors[name] = DeviceTensor(t.ptr, shape[:axis] + (count,) + shape[axis + 1:], t.dtype)
    outs = {n: mem.view(t.ptr, t.dtype, t.size).reshape(t.shape).copy()
            for n, t in tensors.items() if n in layer.outputs}
    return outs, launcher


def assert_model_matches_reference(layer, inputs, reserved=None):
    got, launcher = run_model(layer, inputs, reserved)
    want = reference_layer(layer, inputs)
    for name, ref in want.items():
        assert got[name].dtype == ref.dtype and got[name].shape == ref.shape, name
        np.testing.assert_array_equal(got[name].view(np.uint8), np.ascontiguousarray(ref).view(np.uint8),
                                      err_msg=f"output {name}")
    assert launcher.workspaces <= 1  # the cuda target hands out one workspace per layer
    return launcher


# ---- host helpers ----

def test_nonzero_mask_clears_only_the_sign_bit_of_float_types():
    assert select.nonzero_mask(np.float32) == 0x7FFFFFFF and select.nonzero_mask(BF16) == 0x7FFF
    assert select.nonzero_mask(np.int16) == 0xFFFF and select.nonzero_mask(np.bool_) == 0xFF


def test_axis_view_splits_around_the_axis_and_flattens_without_one():
    assert select.axis_view((2, 3, 4), None) == (1, 24, 1)
    assert select.axis_view((2, 3, 4), -2) == (2, 3, 4)
    assert select.axis_view((2, 3, 4), 0) == (1, 2, 12)


def test_kernels_cover_every_raw_width_and_ordered_dtype():
    names = {k.name for k in select.compile_variants()}
    assert {f"select_flags_{r}" for r in ("u8", "u16", "u32", "u64")} <= names
    assert {f"unique_rank_{c}" for c in ("f32", "f16", "bf16", "f64", "i8", "u64")} <= names


def test_tactics_refuse_a_string_input_when_the_builder_stamped_dtypes():
    layer = LayerDesc("nz", "NonZero", ("X",), ("Y",), {}, in_dtypes=("object",))
    assert not select._supports(layer) and select._supports(nonzero_layer())


def test_unique_of_an_unsupported_dtype_is_a_device_error():
    x = DeviceTensor(4096, (3,), np.dtype(np.complex64))
    with pytest.raises(DeviceError, match="Unique"):
        select.enqueue_unique(unique_layer(("Y",)), ModelLauncher(Memory()), {"X": x, "Y": x})


# ---- the kernel model through the real enqueue functions ----

@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 1, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_nonzero_model_matches_reference(shape, dtype):
    x = (rng.integers(-2, 3, size=shape) * (rng.random(shape) > 0.4)).astype(dtype)
    assert_model_matches_reference(nonzero_layer(), {"X": x})


def test_nonzero_model_counts_negative_zero_as_zero_and_nan_as_non_zero():
    x = np.array([[-0.0, np.nan, 1.5], [0.0, -2.0, -0.0]], np.float32)
    assert_model_matches_reference(nonzero_layer(), {"X": x})


def test_nonzero_of_a_rank_nine_tensor_is_a_device_error():
    x = DeviceTensor(4096, (1,) * 9, np.dtype(np.float32))
    out = DeviceTensor(8192, (9, 1), np.dtype(np.int64))
    with pytest.raises(DeviceError, match="rank-9"):
        select.enqueue_nonzero(nonzero_layer(), ModelLauncher(Memory()), {"X": x, "Y": out})


def test_nonzero_of_all_zeros_launches_nothing():
    assert run_model(nonzero_layer(), {"X": np.zeros((3, 2), np.float32)})[1].launched == []


@pytest.mark.parametrize("axis", [None, 0, 1, -1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float64, BF16])
def test_compress_model_matches_reference(axis, dtype):
    x = rng.standard_normal((3, 4, 5)).astype(dtype)
    length = x.size if axis is None else x.shape[axis]
    cond = rng.random(length) > 0.5
    cond[0] = True
    assert_model_matches_reference(compress_layer(**({} if axis is None else {"axis": axis})), {"X": x, "C": cond})


def test_compress_model_takes_a_condition_shorter_than_the_axis():
    x = rng.standard_normal((3, 6)).astype(np.float32)
    assert_model_matches_reference(compress_layer(axis=1), {"X": x, "C": np.array([False, True, True])})


def test_compress_with_a_condition_longer_than_the_axis_is_a_device_error():
    x = DeviceTensor(4096, (3, 2), np.dtype(np.float32))
    c = DeviceTensor(8192, (3,), np.dtype(np.bool_))
    y = DeviceTensor(9000, (3, 1), np.dtype(np.float32))
    with pytest.raises(DeviceError, match="condition"):
        select.enqueue_compress(compress_layer(axis=1), ModelLauncher(Memory()), {"X": x, "C": c, "Y": y})


@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.float16, BF16, np.int64])
def test_unique_model_matches_reference_without_axis(sorted_, dtype):
    x = rng.integers(0, 9, size=(4, 5)).astype(dtype)
    assert_model_matches_reference(unique_layer(sorted=sorted_), {"X": x})


@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_unique_model_matches_reference_with_axis(sorted_, axis):
    x = rng.integers(0, 2, size=(4, 3, 4)).astype(np.float32)
    x[2] = x[0]  # repeated slices along every axis choice's neighbour
    x[:, 2] = x[:, 0]
    x[:, :, 3] = x[:, :, 1]
    assert_model_matches_reference(unique_layer(sorted=sorted_, axis=axis), {"X": x})


def test_unique_model_keeps_nan_slices_of_a_matrix_distinct_like_numpy():
    x = np.array([[np.nan, 2], [1, 1], [np.nan, 1], [np.nan, 1], [-0.0, 1], [0, 1], [np.nan, np.nan]], np.float32)
    assert_model_matches_reference(unique_layer(axis=0), {"X": x})


def test_unique_model_merges_nans_along_the_axis_of_a_vector():
    assert_model_matches_reference(unique_layer(axis=0), {"X": np.array([np.nan, 1.0, np.nan, 1.0], np.float64)})


def test_unique_model_treats_nans_as_one_value_and_negative_zero_as_zero():
    x = np.array([np.nan, 1.0, np.nan, -0.0, 0.0, 1.0, -3.0], np.float32)
    assert_model_matches_reference(unique_layer(), {"X": x})


@pytest.mark.parametrize("outputs", [("Y",), ("", "I"), ("Y", "", "V"), ("", "", "", "N")])
def test_unique_model_writes_only_the_outputs_that_are_there(outputs):
    x = rng.integers(-3, 3, size=(11,)).astype(np.int64)
    assert_model_matches_reference(unique_layer(outputs, sorted=0), {"X": x})


def test_unique_of_one_element_gives_one_of_everything():
    assert_model_matches_reference(unique_layer(), {"X": np.array([2.5], np.float32)})


#: the ONNX backend node cases of these ops (the cuda conformance gap this family closes)
ONNX_CASES = ("test_nonzero_example", "test_compress_0", "test_compress_1", "test_compress_default_axis",
              "test_compress_negative_axis", "test_compress_bfloat16", "test_unique_sorted_without_axis",
              "test_unique_not_sorted_without_axis", "test_unique_sorted_with_axis", "test_unique_sorted_with_axis_3d",
              "test_unique_sorted_with_negative_axis", "test_unique_length_1",
              "test_unique_bfloat16_sorted_without_axis")


def load_case(name):
    """(layer, inputs, expected outputs) of one ONNX backend node case (importing only its op's case module)."""
    import importlib
    import warnings

    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod in ("nonzero", "compress", "unique"):
            importlib.import_module(f"onnx.backend.test.case.node.{mod}")
    case = next(tc for tc in node_cases._NodeTestCases if tc.name == name)
    node = case.model.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    layer = LayerDesc(node.name or "n", node.op_type, tuple(node.input), tuple(node.output), attrs)
    inputs, outputs = case.data_sets[0]
    return (layer, {i.name: np.asarray(v) for i, v in zip(case.model.graph.input, inputs)},
            {o.name: np.asarray(v) for o, v in zip(case.model.graph.output, outputs)})


@pytest.mark.parametrize("name", ONNX_CASES)
def test_model_matches_the_onnx_backend_case(name):
    layer, inputs, expected = load_case(name)
    got, _ = run_model(layer, inputs)
    for out, want in expected.items():
        np.testing.assert_array_equal(np.asarray(got[out], np.float64), np.asarray(want, np.float64),
                                      err_msg=f"{name} output {out}")


# ---- run time sizes: the kernels write the count word and lay outputs out for that count ----

@pytest.mark.parametrize("kept", [0.0, 0.3, 1.0])
def test_nonzero_model_writes_its_count_and_lays_out_by_it(kept):
    x = (rng.standard_normal((3, 5)) * (rng.random((3, 5)) < kept)).astype(np.float32)
    assert_model_matches_reference(nonzero_layer(), {"X": x}, {"Y": ((2, x.size), 1)})


@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize("kept", [0.0, 0.5, 1.0])
def test_compress_model_writes_its_count_and_lays_out_by_it(axis, kept):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    length = x.size if axis is None else 4
    cond = rng.random(length) < kept
    reserved = {"Y": ((length,), 0)} if axis is None else {"Y": ((3, 4), 1)}
    assert_model_matches_reference(compress_layer(**({} if axis is None else {"axis": axis})), {"X": x, "C": cond},
                                   reserved)


@pytest.mark.parametrize("values", [1, 3, 9])
def test_unique_model_writes_its_count_and_lays_out_by_it(values):
    x = rng.integers(0, values, size=(12,)).astype(np.float32)
    reserved = {"Y": ((12,), 0), "I": ((12,), 0), "N": ((12,), 0)}
    assert_model_matches_reference(unique_layer(("Y", "I", "V", "N")), {"X": x}, reserved)


# ---- cuda plans pick these tactics (no GPU needed to build one) ----

def _model(node, inputs, outputs):
    from polykit.compiler.graph.onnx_import import load_onnx

    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))


@pytest.mark.parametrize("op,tactic", [("NonZero", "cuda.select.nonzero"), ("Compress", "cuda.select.compress"),
                                       ("Unique", "cuda.select.unique")])
def test_a_cuda_plan_with_bound_values_picks_the_select_tactic(op, tactic):
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    f, b = TensorProto.FLOAT, TensorProto.BOOL
    x = np.array([[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]], np.float32)
    if op == "Compress":
        graph = _model(helper.make_node(op, ["x", "c"], ["y"], axis=1), [("x", f, [2, 3]), ("c", b, [3])], [("y", f)])
        values = {"c": np.array([True, False, True])}
    else:
        out_type = TensorProto.INT64 if op == "NonZero" else f
        graph = _model(helper.make_node(op, ["x"], ["y"]), [("x", f, [2, 3])], [("y", out_type)])
        values = {"x": x}
    plan = build_plan(graph, BuilderConfig(target="cuda", input_values=values))
    assert [layer.tactic for layer in plan.layers] == [tactic]


@pytest.mark.parametrize("op,tactic", [("NonZero", "cuda.select.nonzero"), ("Compress", "cuda.select.compress"),
                                       ("Unique", "cuda.select.unique")])
def test_a_cuda_plan_without_values_picks_the_select_tactic_for_a_run_time_size(op, tactic):
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    f, b = TensorProto.FLOAT, TensorProto.BOOL
    if op == "Compress":
        graph = _model(helper.make_node(op, ["x", "c"], ["y"], axis=1), [("x", f, [2, 3]), ("c", b, [3])], [("y", f)])
    else:
        out_type = TensorProto.INT64 if op == "NonZero" else f
        graph = _model(helper.make_node(op, ["x"], ["y"]), [("x", f, [2, 3])], [("y", out_type)])
    plan = build_plan(graph, BuilderConfig(target="cuda"))
    assert [layer.tactic for layer in plan.layers] == [tactic]
    axis = 1 if op != "Unique" else 0
    assert plan.profiles.data == {f"data(y)[{axis}]": 6 if op != "Compress" else 3}


# ---- on the GPU: every output against the reference ----

def check(layer, inputs):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 7), (2, 3, 4), (2, 1, 3, 1, 2), (70, 33)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16, np.uint8])
def test_nonzero_matches_reference(shape, dtype):
    x = (rng.integers(-2, 3, size=shape) * (rng.random(shape) > 0.4)).astype(dtype)
    x.reshape(-1)[0] = 1
    check(nonzero_layer(), {"X": x})


@pytest.mark.gpu
def test_nonzero_counts_negative_zero_as_zero_and_nan_as_non_zero():
    check(nonzero_layer(), {"X": np.array([[-0.0, np.nan, 1.5], [0.0, -2.0, -0.0]], np.float32)})


@pytest.mark.gpu
def test_nonzero_of_a_long_input_spans_every_scan_chunk():
    x = (rng.random(50_001) > 0.7).astype(np.float32)
    check(nonzero_layer(), {"X": x})


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float64, BF16, np.int16])
def test_compress_matches_reference(axis, dtype):
    x = rng.standard_normal((3, 4, 5)).astype(dtype)
    length = x.size if axis is None else x.shape[axis]
    cond = rng.random(length) > 0.5
    cond[-1] = True
    check(compress_layer(**({} if axis is None else {"axis": axis})), {"X": x, "C": cond})


@pytest.mark.gpu
def test_compress_takes_a_condition_shorter_than_the_axis():
    x = rng.standard_normal((3, 6)).astype(np.float32)
    check(compress_layer(axis=1), {"X": x, "C": np.array([False, True, True])})


@pytest.mark.gpu
def test_compress_of_a_long_flattened_input():
    x = rng.standard_normal((300, 71)).astype(np.float32)
    check(compress_layer(), {"X": x, "C": rng.random(x.size - 5) > 0.3})


@pytest.mark.gpu
@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.float16, BF16, np.int64, np.float64, np.int8])
def test_unique_matches_reference_without_axis(sorted_, dtype):
    x = rng.integers(0, 9, size=(4, 5)).astype(dtype)
    check(unique_layer(sorted=sorted_), {"X": x})


@pytest.mark.gpu
@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_unique_matches_reference_with_axis(sorted_, axis):
    x = rng.integers(0, 2, size=(4, 3, 4)).astype(np.float32)
    x[2] = x[0]
    x[:, 2] = x[:, 0]
    x[:, :, 3] = x[:, :, 1]
    check(unique_layer(sorted=sorted_, axis=axis), {"X": x})


@pytest.mark.gpu
@pytest.mark.parametrize("sorted_", [1, 0])
def test_unique_keeps_nan_slices_of_a_matrix_distinct(sorted_):
    x = np.array([[np.nan, 2], [1, 1], [np.nan, 1], [np.nan, 1], [-0.0, 1], [0, 1], [np.nan, np.nan]], np.float32)
    check(unique_layer(axis=0, sorted=sorted_), {"X": x})


@pytest.mark.gpu
def test_unique_treats_nans_as_one_value():
    check(unique_layer(), {"X": np.array([np.nan, 1.0, np.nan, -0.0, 0.0, 1.0, -3.0], np.float32)})


@pytest.mark.gpu
@pytest.mark.parametrize("outputs", [("Y",), ("", "I"), ("Y", "", "V"), ("", "", "", "N")])
def test_unique_writes_only_the_outputs_that_are_there(outputs):
    check(unique_layer(outputs, sorted=0), {"X": rng.integers(-3, 3, size=(11,)).astype(np.int64)})


@pytest.mark.gpu
def test_unique_of_many_elements_with_few_values():
    check(unique_layer(), {"X": rng.integers(-50, 50, size=(3000,)).astype(np.float32)})


@pytest.mark.gpu
def test_unique_of_one_element():
    check(unique_layer(), {"X": np.array([2.5], np.float32)})
