"""cuda.norm.warp (norm_warp.cu): Layer/RMS normalization with a row in the registers of 4..32 lanes.

Host side (no GPU): the geometry a row length gets, which layers the tactic takes, its launch
(16-byte vectors only where aligned), and the kernel itself run on the host (block_emulation.py,
its warp shuffles a rendezvous of the warp's threads) against the reference. GPU: results against
the reference with poisoned outputs, odd lengths, misaligned tensors, bias or not, statistics."""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.reduce.norm import WarpGeometry, compile_variants, warp_geometry, warp_launch
from polykit.kernels.tactics import candidates, find_tactic
from tests.kernels.cuda.block_emulation import host_launcher

rng = np.random.default_rng(29)
WARP = "cuda.norm.warp"


def norm_layer(shape, dtype=np.float16, *, kind="LayerNormalization", bias=True, stats=False, axis=-1, eps=1e-5):
    """A LayerDesc stamped with shapes and dtypes as the builder stamps them."""
    norm = tuple(shape[axis % len(shape):])
    length = int(np.prod(norm))
    ins = ("X", "S", "B") if bias and kind == "LayerNormalization" else ("X", "S")
    outs = ("Y", "M", "R") if stats else ("Y",)
    name = np.dtype(dtype).name
    stat = tuple(shape[:len(shape) - len(norm)]) + (1,) * len(norm)  # Mean / InvStdDev keep the axes
    return LayerDesc("ln", kind, ins, outs, {"axis": axis, "epsilon": eps},
                     in_dtypes=(name,) * len(ins), out_dtypes=(name,) + ("float32",) * (len(outs) - 1),
                     in_shapes=(tuple(shape),) + (norm,) * (len(ins) - 1),
                     out_shapes=(tuple(shape),) + (stat,) * (len(outs) - 1))


def feeds_for(layer, dtype=np.float16):
    shape = layer.in_shapes[0]
    out = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)}
    for name, s in zip(layer.inputs[1:], layer.in_shapes[1:]):
        out[name] = (rng.standard_normal(s) + 1).astype(dtype)
    return out


def test_rows_get_the_power_of_two_lanes_that_leave_fewest_vector_slots_idle():
    assert warp_geometry(96, 2) == WarpGeometry(4, 3)     # Swin stage 1: 12 vectors, 4 lanes x 3
    assert warp_geometry(768, 2) == WarpGeometry(32, 3)   # BERT / Swin stage 4
    assert warp_geometry(2048, 2) == WarpGeometry(32, 8)  # LLaMA-style
    assert warp_geometry(96, 4) == WarpGeometry(8, 3)     # fp32: 4 elements a vector
    assert warp_geometry(100, 2) == WarpGeometry(16, 1)   # 13 vectors: 16 slots at 4, 8 or 16 lanes
    assert warp_geometry(1, 2) == WarpGeometry(4, 1) and warp_geometry(7, 4) == WarpGeometry(4, 1)


def test_rows_past_the_register_budget_are_refused():
    assert warp_geometry(4096, 2) == WarpGeometry(32, 16) and warp_geometry(4097, 2) is None
    assert warp_geometry(4096, 4) == WarpGeometry(32, 32) and warp_geometry(4097, 4) is None
    assert warp_geometry(0, 2) is None and warp_geometry(64, 8) is None


@pytest.mark.parametrize("length,itemsize", [(1, 2), (7, 2), (96, 2), (100, 4), (768, 2), (4095, 2), (4096, 4)])
def test_the_lanes_of_a_row_hold_each_element_exactly_once(length, itemsize):
    """norm_warp.cu's mapping: element (c * LANES + lane) * VEC + e of the row sits in chunk c,
    slot e of lane `lane`; every element below L once, slots past L are zeros that no sum reads."""
    g, vec = warp_geometry(length, itemsize), 16 // itemsize
    c, lane, e = np.meshgrid(np.arange(g.chunks), np.arange(g.lanes), np.arange(vec), indexing="ij")
    j = ((c * g.lanes + lane) * vec + e).ravel()
    assert np.array_equal(np.sort(j[j < length]), np.arange(length))


def test_the_warp_tactic_leads_cuda_norm_rows_for_the_layers_it_takes():
    for kind in ("LayerNormalization", "RMSNormalization"):
        names = [t.name for t in candidates("cuda", kind, norm_layer((8, 196, 96), kind=kind))]
        assert names[:2] == [WARP, "cuda.norm.rows"]


@pytest.mark.parametrize("layer", [
    norm_layer((4, 4097)),                                       # past the budget
    norm_layer((4, 64), np.float64),                             # no fp64 kernel
    LayerDesc("ln", "LayerNormalization", ("X", "S"), ("Y",), {"axis": -1}),  # shapes not stamped
    LayerDesc("ln", "LayerNormalization", ("X", "S"), ("Y",), {"axis": -1}, in_dtypes=("float16", "float16"),
              out_dtypes=("float16",), in_shapes=((4, 64), (32,)), out_shapes=((4, 64),)),  # scale of 32 for 64
    LayerDesc("ln", "LayerNormalization", ("X", "S"), ("Y",), {"axis": -1}, in_dtypes=("float16", "float32"),
              out_dtypes=("float16",), in_shapes=((4, 64), (64,)), out_shapes=((4, 64),)),  # mixed storage
])
def test_layers_outside_the_warp_kernel_go_to_cuda_norm_rows(layer):
    names = [t.name for t in candidates("cuda", layer.kind, layer)]
    assert WARP not in names and find_tactic("cuda", layer.kind, WARP).kernels(layer) == []


def test_a_group_norm_never_takes_the_warp_tactic():
    layer = LayerDesc("gn", "GroupNormalization", ("X", "S", "B"), ("Y",), {"num_groups": 2},
                      in_dtypes=("float16",) * 3, out_dtypes=("float16",), in_shapes=((2, 4, 8), (4,), (4,)))
    assert WARP not in [t.name for t in candidates("cuda", "GroupNormalization", layer)]


def tensors_at(layer, base=0x10000, shift=None):
    """DeviceTensors of `layer` at 256-byte aligned addresses, `shift` bytes past them per name."""
    shift = shift or {}
    shapes = dict(zip(layer.inputs, layer.in_shapes)) | dict(zip(layer.outputs, layer.out_shapes))
    dtypes = dict(zip(layer.inputs, layer.in_dtypes)) | dict(zip(layer.outputs, layer.out_dtypes))
    return {n: DeviceTensor(base + 0x100000 * k + shift.get(n, 0), shapes[n], np.dtype(dtypes[n]))
            for k, n in enumerate(shapes)}


def test_the_launch_takes_16_byte_vectors_only_where_every_row_and_pointer_allows():
    layer = norm_layer((2, 3, 768), stats=True)
    kernel, grid, block, args = warp_launch(layer, tensors_at(layer))
    assert kernel == find_tactic("cuda", layer.kind, WARP).kernels(layer)[0]
    assert dict(kernel.defines) == {"ELEM": "half_t", "NW_LANES": "32", "NW_CHUNKS": "3"}
    assert grid == (2, 1, 1) and block == (128, 1, 1)  # 6 rows, 4 a block
    assert args[6:13] == [6, 768, 768, 768, pytest.approx(1e-5), 0, 1]
    assert args[13:] == []  # no row map, no input map: the plain kernel (no NW_MAPS) takes no map arguments
    assert isinstance(args[7], np.int32) and isinstance(args[10], np.float32)
    for shift in ({"X": 2}, {"Y": 8}, {"S": 2}, {"B": 4}):
        assert warp_launch(layer, tensors_at(layer, shift=shift))[3][12] == 0, shift
    tail = norm_layer((5, 100))
    assert warp_launch(tail, tensors_at(tail))[3][12] == 0  # 100 halves: not whole vectors


def test_rms_norm_and_a_scalar_scale_launch_without_bias_loads():
    layer = norm_layer((7, 512), np.float32, kind="RMSNormalization")
    layer = LayerDesc(layer.name, layer.kind, layer.inputs, layer.outputs, layer.attrs, in_dtypes=layer.in_dtypes,
                      out_dtypes=layer.out_dtypes, in_shapes=(layer.in_shapes[0], (1,)), out_shapes=layer.out_shapes)
    tensors = tensors_at(layer, shift={"S": 4})  # a scalar scale is read as one element: alignment moot
    kernel, grid, _, args = warp_launch(layer, tensors)
    assert args[2] == 0 and args[8:10] == [1, 1] and args[11] == 1 and args[12] == 1
    assert grid == (2, 1, 1) and dict(kernel.defines)["NW_LANES"] == "32"


def test_a_row_longer_than_the_plan_was_built_for_is_a_device_error():
    layer = norm_layer((2, 64))
    tensors = tensors_at(layer) | {"X": DeviceTensor(0x10000, (2, 5000), np.dtype(np.float16)),
                                   "S": DeviceTensor(0x20000, (5000,), np.dtype(np.float16)),
                                   "B": DeviceTensor(0x30000, (5000,), np.dtype(np.float16)),
                                   "Y": DeviceTensor(0x40000, (2, 5000), np.dtype(np.float16))}
    with pytest.raises(DeviceError):
        warp_launch(layer, tensors)


def test_every_dtype_and_the_register_heaviest_variants_compile_in_ci():
    warp = [k for k in compile_variants() if k.file == "norm_warp.cu"]
    got = {(dict(k.defines)["ELEM"], int(dict(k.defines)["NW_LANES"]), int(dict(k.defines)["NW_CHUNKS"])) for k in warp}
    assert {("float", 32, 32), ("half_t", 32, 16), ("bf16_t", 32, 16)} <= got
    assert {lanes for elem, lanes, _ in got if elem == "half_t"} == {4, 8, 16, 32}


# ---- the kernel on the host ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return host_launcher(tmp_path_factory, "NW_PARAMS", "NW_ARGS")


def host_buffers(layer, feeds, shift):
    """Host arrays for `layer`'s tensors (inputs copied in, outputs 0xFF-poisoned), each `shift`
    bytes past a 64-byte aligned start; their DeviceTensors; the arrays to keep alive."""
    shapes = dict(zip(layer.outputs, layer.out_shapes))
    dtypes = dict(zip(layer.outputs, layer.out_dtypes))
    tensors, views, keep = {}, {}, []
    for name in [n for n in list(layer.inputs) + list(layer.outputs) if n]:  # "": an omitted input
        src = feeds.get(name)
        dt = np.dtype(src.dtype if src is not None else dtypes[name])
        shape = src.shape if src is not None else shapes[name]
        nbytes = int(np.prod(shape)) * dt.itemsize
        raw = np.full(nbytes + 128, 0xFF, np.uint8)
        start = (-raw.ctypes.data) % 64 + shift.get(name, 0)
        view = raw[start:start + nbytes].view(dt).reshape(shape)
        if src is not None:
            view[...] = src
        keep.append(raw)
        views[name] = view
        tensors[name] = DeviceTensor(view.ctypes.data, tuple(shape), dt)
    return tensors, views, keep


def reference(layer, feeds):
    from polykit.runtime.cuda.harness import reference_layer

    return reference_layer(layer, feeds)


@pytest.mark.parametrize("shape,dtype,kind,bias,stats,shift", [
    ((3, 96), np.float16, "LayerNormalization", True, True, {}),       # 4 lanes x 3 vectors, 16-byte path
    ((5, 100), np.float16, "LayerNormalization", True, False, {}),     # tail: element path
    ((2, 7), np.float32, "LayerNormalization", False, True, {}),       # one partial vector a row
    ((9, 64), np.float32, "RMSNormalization", False, False, {}),       # several blocks' rows
    ((2, 3, 40), np.float16, "LayerNormalization", True, False, {"X": 2, "Y": 6}),  # misaligned
    ((4, 1), np.float32, "LayerNormalization", True, True, {}),        # L = 1: mean = x, var = 0
    ((3, 768), np.float16, "LayerNormalization", True, True, {}),      # 32 lanes x 3 vectors
    ((2, 4096), np.float32, "RMSNormalization", False, False, {}),     # the longest fp32 row: 32 x 32
    ((6, 64), ml_dtypes.bfloat16, "LayerNormalization", True, False, {"S": 2}),  # bf16, misaligned scale
])
def test_the_emulated_kernel_equals_the_reference(emulated, shape, dtype, kind, bias, stats, shift):
    layer = norm_layer(shape, dtype, kind=kind, bias=bias, stats=stats)
    feeds = feeds_for(layer, dtype)
    tensors, views, _keep = host_buffers(layer, feeds, shift)
    emulated.launches.clear()
    find_tactic("cuda", kind, WARP).enqueue(layer, emulated, tensors)
    assert emulated.launches, "nothing launched"
    for name, want in reference(layer, feeds).items():
        tol = {np.float16: 2e-3, ml_dtypes.bfloat16: 2e-2}.get(dtype, 1e-5) if name == "Y" else 1e-5
        np.testing.assert_allclose(views[name].astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol,
                                   err_msg=name)


# ---- GPU -------------------------------------------------------------------------------------------
def run_on_gpu(layer, feeds, misalign=None):
    from polykit.runtime.cuda.harness import run_layer

    return run_layer(layer, feeds, tactic=WARP, misalign=misalign)


def assert_close(layer, got, feeds, dtype):
    for name, want in reference(layer, feeds).items():
        tol = {np.float32: 1e-4, np.float16: 5e-3}.get(dtype, 3e-2) if name == "Y" else 1e-4
        assert not np.isnan(got[name].astype(np.float64)).any(), f"{name}: unwritten (NaN) elements"
        np.testing.assert_allclose(got[name].astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol,
                                   err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1, 7, 96, 100, 768, 2048, 4095, 4096])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_on_the_gpu_matches_the_reference(length, dtype, bias):
    layer = norm_layer((3, 11, length), dtype, bias=bias, stats=True)
    feeds = feeds_for(layer, dtype)
    assert_close(layer, run_on_gpu(layer, feeds), feeds, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [{"X": 2}, {"Y": 2}, {"S": 4, "B": 8}, {"X": 4, "Y": 12}])
@pytest.mark.parametrize("length", [96, 768])
def test_misaligned_tensors_take_the_element_path_on_the_gpu(misalign, length):
    layer = norm_layer((37, length), np.float16)
    feeds = feeds_for(layer)
    assert_close(layer, run_on_gpu(layer, feeds, misalign), feeds, np.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("length", [64, 512, 2048, 4096])
def test_rms_norm_on_the_gpu_matches_the_reference(length):
    layer = norm_layer((8, 17, length), np.float16, kind="RMSNormalization")
    feeds = feeds_for(layer)
    assert_close(layer, run_on_gpu(layer, feeds), feeds, np.float16)


@pytest.mark.gpu
def test_bfloat16_storage_on_the_gpu():
    layer = norm_layer((25088 // 64, 96), ml_dtypes.bfloat16)
    feeds = feeds_for(layer, ml_dtypes.bfloat16)
    assert_close(layer, run_on_gpu(layer, feeds), feeds, ml_dtypes.bfloat16)


@pytest.mark.gpu
def test_many_short_rows_of_a_swin_stage_and_a_three_axis_norm():
    layer = norm_layer((8, 56 * 56, 96), np.float16)  # 25 088 rows: the grid steps over row groups
    feeds = feeds_for(layer)
    assert_close(layer, run_on_gpu(layer, feeds), feeds, np.float16)
    layer = norm_layer((2, 3, 4, 5), np.float32, axis=1, stats=True)  # L = 60 over three axes
    feeds = feeds_for(layer, np.float32)
    assert_close(layer, run_on_gpu(layer, feeds), feeds, np.float32)
