"""The view-vector entry `_w` of Pointwise layers with view operands (pass absorb_views; kernels:
pointwise_views, pointwise_codegen): which launches take it and which fall back to the strided
entry (CPU, from the recorded launch), both entries' index math emulated on the host against the
reference (LLaMA's RoPE and a transpose + residual Add built by absorb_views, Swin's shifted window
merge at its real shape, broadcast operands, a split innermost dim), the modules compiled with
NVRTC, and the kernels against the reference with poisoned outputs and misaligned pointers (GPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.view_operands import view_operands
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.pointwise import pointwise as pw
from polykit.kernels.cuda.pointwise.pointwise_codegen import pointwise_kernels
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.launch_geometry import view_geometry
from polykit.kernels.cuda.pointwise.pointwise_views import ViewTensor, vector_view_flags, view_width
from tests.compiler.passes.view_models import rope, transpose_add, window_merge
from tests.kernels.cuda.test_pointwise_views import _run_emulated

rng = np.random.default_rng(53)


def _built(model, fp16: bool) -> LayerDesc:
    """The one view-reading Pointwise layer of a cuda level-0 plan of `model` (stamped shapes);
    `fp16`: the model's inputs and outputs made float16 first, so that every operand is fp16 (as
    inside a zoo model's fp16 plan), and the plan built with fp16."""
    if fp16:
        for vi in [*model.graph.input, *model.graph.output]:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=fp16, builder_optimization_level=0))
    (layer,) = [lay for lay in plan.layers if lay.kind == "Pointwise" and lay.attrs.get("view")]
    return layer


def _feeds(layer: LayerDesc) -> dict[str, np.ndarray]:
    return {n: rng.uniform(-2, 2, s).astype(d) for n, s, d in zip(layer.inputs, layer.in_shapes, layer.in_dtypes)}


def _reference(layer: LayerDesc, arrays: dict) -> np.ndarray:
    node = Node("Pointwise", list(layer.inputs), list(layer.outputs), dict(layer.attrs), name=layer.name,
                domain=layer.domain)
    return run_reference(node, [arrays[n] for n in layer.inputs])[0]


def _entry(layer: LayerDesc, misalign: dict | None = None) -> str:
    """The entry enqueue_pointwise launches ("_w" or "_s"), both entries emulated on the way."""
    arrays = _feeds(layer)
    name, _ = _run_emulated(layer, arrays, _reference(layer, arrays), misalign)
    return name[-2:]


def _stamped(body, names: tuple, views: list[dict], arrays: dict) -> LayerDesc:
    """A stamped Pointwise layer over `arrays` reading the `views` entries (validated)."""
    lay = LayerDesc("m", "Pointwise", names, ("y",), {"body": body, "view": views}, domain="ai.polykit")
    view_operands(lay.attrs, len(names), "m", [arrays[n].size for n in names])
    y = _reference(lay, arrays)
    return replace(lay, in_dtypes=tuple(arrays[n].dtype.name for n in names),
                   in_shapes=tuple(arrays[n].shape for n in names), out_dtypes=(y.dtype.name,), out_shapes=(y.shape,))


ADD = [{"op": "Add", "inputs": ["v", "r"], "outputs": ["y"], "attrs": {}}]


def _split_inner(inner: int, outer: int, shift: int, dtype, r_shape=None) -> LayerDesc:
    """v [3, outer * inner]: a source [outer, 3, inner] read with its innermost logical dim split
    into pieces [outer, 3 * inner] and [inner, 1], shifted by `shift`, + r."""
    x = rng.uniform(-2, 2, (outer, 3, inner)).astype(dtype)
    entry = {"name": "v", "input": 0, "offset": 0,
             "dims": [{"shift": 0, "pieces": [[3, inner]]},
                      {"shift": shift, "pieces": [[outer, 3 * inner], [inner, 1]]}]}
    r = rng.uniform(-2, 2, r_shape or (3, outer * inner)).astype(dtype)
    return _stamped(ADD, ("x", "r"), [entry], {"x": x, "r": r})


# ---- CPU: which entry a launch takes, both emulated against the reference --------------------------
@pytest.mark.parametrize("fp16", [True, False])
def test_llama_rope_takes_the_view_vector_entry(fp16):
    """LLaMA's RoPE (absorb_views: the transposed query and its rotate_half, two views of one
    source; cos / sin broadcast over heads): D = 16, the roll by 8 a multiple of V (8 and 4)."""
    layer = _built(rope(s=6, heads=3, d=16), fp16)
    assert len(layer.attrs["view"]) == 2
    assert _entry(layer) == "_w"


def test_rope_whose_roll_is_no_multiple_of_v_falls_back():
    """D = 8: rotate_half rolls by 4 -- a multiple of V = 4 (fp32), not of V = 8 (fp16)."""
    assert _entry(_built(rope(s=5, heads=2, d=8), fp16=False)) == "_w"
    assert _entry(_built(rope(s=5, heads=2, d=8), fp16=True)) == "_s"


@pytest.mark.parametrize("fp16", [True, False])
def test_a_transposed_residual_add_takes_the_view_vector_entry(fp16):
    """Transpose [B, S, H, D] -> [B, H, S, D] read by an Add: D contiguous."""
    assert _entry(_built(transpose_add((2, 5, 3, 16), (0, 2, 1, 3)), fp16)) == "_w"


@pytest.mark.parametrize("shape", [(2, 5, 3, 7), (2, 3, 4, 12)])
def test_an_innermost_dim_no_multiple_of_v_falls_back(shape):
    """Last dim 7 (no width divides it), and 12 in fp16 (V = 8)."""
    assert _entry(_built(transpose_add(shape, (0, 2, 1, 3)), fp16=True)) == "_s"


@pytest.mark.parametrize("name", ["x", "r", "y"])
def test_a_misaligned_pointer_falls_back(name):
    """One element off a 16-byte boundary: an input read as vectors, the view's source, the output."""
    layer = _built(transpose_add((2, 5, 3, 16), (0, 2, 1, 3)), fp16=True)
    assert _entry(layer, {name: 1}) == "_s"
    assert _entry(layer, {name: 8}) == "_w"  # 16 bytes off: aligned again


def test_swin_shifted_window_merge_at_its_real_shape():
    """Swin-T stage 1's shifted block (the zoo plan's layer): windows [64, 49, 96] read rolled by
    53 on H and W (two pieces each) into [1, 56, 56, 96] + the residual, fp16: V = 8 divides 96."""
    def merged(k: int, pieces: list) -> dict:
        return {"shift": 53, "pieces": pieces}

    entry = {"name": "m", "input": 1, "offset": 0,
             "dims": [{"shift": 0, "pieces": [[1, 0]]}, merged(1, [[8, 37632], [7, 672]]),
                      merged(2, [[8, 4704], [7, 96]]), {"shift": 0, "pieces": [[96, 1]]}]}
    arrays = {"res": rng.uniform(-2, 2, (1, 56, 56, 96)).astype(np.float16),
              "win": rng.uniform(-2, 2, (64, 49, 96)).astype(np.float16)}
    body = [{"op": "Add", "inputs": ["res", "m"], "outputs": ["y"], "attrs": {}}]
    layer = _stamped(body, ("res", "win"), [entry], arrays)
    name, _ = _run_emulated(layer, arrays, _reference(layer, arrays))
    assert name.endswith("_w")


def test_a_window_merge_built_by_absorb_views():
    """A shifted window merge of 8 channels (fp16, V = 8) from absorb_views."""
    assert _entry(_built(window_merge(2, 2, (3, 3), 8, 1), fp16=True)) == "_w"


@pytest.mark.parametrize("r_shape", [(3, 1), (1, 16), (1, 1)])
def test_operands_broadcast_along_or_across_the_innermost_dim(r_shape):
    """r one value along the innermost dim (loaded once a vector), or broadcast across rows."""
    assert _entry(_split_inner(8, 2, 0, np.float32, r_shape)) == "_w"


@pytest.mark.parametrize("inner, outer, shift, dtype, path", [
    (8, 2, 4, np.float32, "_w"),   # shifted, inner piece 8 and shift 4: multiples of V = 4
    (8, 3, 12, np.float32, "_w"),
    (8, 2, 4, np.float16, "_s"),   # V = 8: the shift is not a multiple
    (6, 2, 0, np.float32, "_s"),   # the inner piece 6 (and the source's row of 6)
    (4, 4, 2, np.float32, "_s"),   # a shift of 2
    (16, 2, 8, np.float16, "_w"),
])
def test_a_split_shifted_innermost_dim(inner, outer, shift, dtype, path):
    assert _entry(_split_inner(inner, outer, shift, dtype)) == path


def test_an_offset_no_multiple_of_v_falls_back():
    """A view starting one row of 4 into its source (fp32: offset 4 aligned; fp16 V = 8: not)."""
    for dtype, path in ((np.float32, "_w"), (np.float16, "_s")):
        x = rng.uniform(-2, 2, (3, 2, 8)).astype(dtype)
        entry = {"name": "v", "input": 0, "offset": 4,
                 "dims": [{"shift": 0, "pieces": [[2, 8]]}, {"shift": 0, "pieces": [[2, 16]]},
                          {"shift": 0, "pieces": [[8, 1]]}]}
        arrays = {"x": x, "r": rng.uniform(-2, 2, (2, 2, 8)).astype(dtype)}
        assert _entry(_stamped(ADD, ("x", "r"), [entry], arrays)) == path


def test_an_iteration_space_of_2_to_the_31_elements_falls_back():
    """The view-vector entry divides in 32 bits: the host refuses 2^31 elements (no memory needed:
    the flags come from the geometry and the pointers)."""
    for rows, want in ((2 ** 28 - 1, [1]), (2 ** 28, None)):  # rows of 8: 2^31 - 8 and 2^31 elements
        x = DeviceTensor(0x10000, (rows, 8), np.dtype(np.float16))
        view = ViewTensor(x, {"name": "v", "input": 0, "offset": 0,
                              "dims": [{"shift": 0, "pieces": [[rows, 8]]}, {"shift": 0, "pieces": [[8, 1]]}]})
        y = DeviceTensor(0x20000, (rows, 8), np.dtype(np.float16))
        geometry = view_geometry([(rows, 8), (rows, 8)], 1, {0: view.dims})[1:]
        assert vector_view_flags([view], [y], *geometry, 8) == want


def test_widths_by_storage_type():
    assert view_width(("float16", "float16")) == 8 and view_width(("float32",)) == 4
    assert view_width(("float16", "float32")) == 4 and view_width(("float64",)) == 2
    assert view_width(("bfloat16",)) == 8 and view_width(("float8_e4m3fn", "float16")) == 0


# ---- CPU: NVRTC ---------------------------------------------------------------------------------
def test_view_vector_modules_compile_with_nvrtc():
    """The stamped modules above (fp16 V = 8, fp32 V = 4) and the view variants (every float
    signature: V = 8, 4, 2) each hold their `_w` entries and compile."""
    from polykit.runtime.cuda.nvrtc import unique_units
    from tests.kernel_units import check_all  # the NVRTC test's check (NVRTC's fastest level)

    layers = [_built(rope(s=6, heads=3, d=16), True), _built(rope(s=6, heads=3, d=16), False),
              *pw.view_variant_layers()]
    units = []
    for lay in layers:
        kernels = pointwise_kernels(lay)
        assert any(k.name.endswith("_w") for k in kernels)
        units.append(kernels[0])
    for arch in ("sm_80", "sm_90"):
        assert check_all(units, arch) == len(unique_units(units))


# ---- GPU ----------------------------------------------------------------------------------------
#: case -> (layer, the entry its aligned launch takes)
GPU_CASES = {
    "rope_fp16": (lambda: _built(rope(s=6, heads=3, d=16), True), "_w"),
    "rope_fp32": (lambda: _built(rope(s=6, heads=3, d=16), False), "_w"),
    "rope_d8_fp16": (lambda: _built(rope(s=5, heads=2, d=8), True), "_s"),
    "transpose_add_fp16": (lambda: _built(transpose_add((2, 5, 3, 16), (0, 2, 1, 3)), True), "_w"),
    "window_merge_fp16": (lambda: _built(window_merge(2, 2, (3, 3), 8, 1), True), "_w"),
    "split_inner_fp32": (lambda: _split_inner(8, 3, 12, np.float32), "_w"),
    "split_inner_broadcast": (lambda: _split_inner(8, 2, 0, np.float32, (3, 1)), "_w"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_view_vector_layers_match_reference_and_the_strided_entry(case):
    """The aligned launch (the entry the CPU emulation picks) against the reference, poisoned
    outputs; then the view's source, and the output, one element off their alignment (the strided
    entry, bytes as run_layer shifts them) give the same values (fp16: bit for bit)."""
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    make, path = GPU_CASES[case]
    layer = make()
    arrays = _feeds(layer)
    out = layer.outputs[0]
    assert _entry(layer) == path
    got = run_layer(layer, arrays, tactic="cuda.pointwise")[out]
    want = reference_layer(layer, arrays)[out]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)
    source = layer.inputs[view_operands(layer.attrs, len(layer.inputs))[0]["input"]]
    for name, key in ((source, source), (out, "y")):  # Memory calls the output "y"
        assert _entry(layer, {key: 1}) == "_s"
        shift = {name: arrays[name].dtype.itemsize if name in arrays else got.dtype.itemsize}
        strided = run_layer(layer, arrays, tactic="cuda.pointwise", misalign=shift)[out]
        if got.dtype == np.float16:
            np.testing.assert_array_equal(strided, got)
        else:
            np.testing.assert_allclose(strided, got, rtol=1e-6, atol=1e-6)
