"""Layer/RMS normalization writing its rows through a row map (ops/nn/norm_row_map.py) on both cuda
tactics: cuda.norm.warp (norm_warp.cu) and cuda.norm.rows (norm.cu), the map as runtime arguments
(norm_row_map.cuh). Host side (no GPU): which layers take it, its arguments, and both kernels run on
the host (block_emulation.py) against the reference, Swin's window partitions (shifted or not) and
odd maps. GPU: the same against the reference, poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.norm_row_map import IN_MAP, ROW_MAP, input_index, row_destinations
from polykit.compiler.plan.records import LayerDesc
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.reduce.norm import ROW_MAP_ARGS, in_map_args, row_map_args, warp_launch
from polykit.kernels.tactics import candidates, find_tactic
from tests.kernels.cuda.block_emulation import host_launcher
from tests.kernels.cuda.test_norm_warp import feeds_for, host_buffers, reference

WARP, ROWS = "cuda.norm.warp", "cuda.norm.rows"

#: (x shape, row map): Swin's shifted window partition of [2, 6, 9] rows (windows 3x3, roll 1), its
#: plain one (fitted to split dims), a one-dim reversal-free rotation, and a map of six dims
MAPS = [
    ((2, 6, 9, 12), {"dims": [{"shift": 0, "pieces": [[2, 54]]}, {"shift": 5, "pieces": [[2, 27], [3, 3]]},
                              {"shift": 8, "pieces": [[3, 9], [3, 1]]}], "shape": [2, 2, 3, 3, 3, 12]}),
    ((2, 6, 9, 96), {"dims": [{"shift": 0, "pieces": [[4, 27]]}, {"shift": 0, "pieces": [[3, 3]]},
                              {"shift": 0, "pieces": [[3, 9]]}, {"shift": 0, "pieces": [[3, 1]]}],
                     "shape": [2, 2, 3, 3, 3, 96]}),
    ((7, 5, 40), {"dims": [{"shift": 3, "pieces": [[7, 1]]}, {"shift": 2, "pieces": [[5, 7]]}], "shape": [35, 40]}),
    ((2, 2, 3, 2, 2, 3, 8), {"dims": [{"shift": 0, "pieces": [[2, 1]]}, {"shift": 1, "pieces": [[2, 2]]},
                                      {"shift": 2, "pieces": [[3, 4]]}, {"shift": 0, "pieces": [[2, 12]]},
                                      {"shift": 1, "pieces": [[2, 24]]}, {"shift": 0, "pieces": [[3, 48]]}],
                             "shape": [144, 8]}),
]


def mapped_layer(shape, row_map, dtype=np.float16, kind="LayerNormalization", stats=False, in_map=None):
    """A stamped mapped norm of X `shape` (through `in_map` when given: X is then its source)."""
    name = np.dtype(dtype).name
    ins = ("X", "S", "B") if kind == "LayerNormalization" else ("X", "S")
    outs = ("Y", "M", "R") if stats else ("Y",)
    logical = tuple(in_map["shape"]) if in_map else tuple(shape)
    maps = {ROW_MAP: row_map} if row_map else {}
    maps |= {IN_MAP: in_map} if in_map else {}
    return LayerDesc("ln", kind, ins, outs, {"axis": -1, "epsilon": 1e-5, **maps}, domain=POLYKIT_DOMAIN,
                     in_dtypes=(name,) * len(ins), out_dtypes=(name,) + ("float32",) * (len(outs) - 1),
                     in_shapes=(tuple(shape),) + ((logical[-1],),) * (len(ins) - 1),
                     out_shapes=(tuple(row_map["shape"] if row_map else logical),) + ((1,),) * (len(outs) - 1))


def merging_map(B, H, W, C):
    """Swin's patch merging as an input map: [B, H, W, C] read as [B, H/2, W/2, 4C] in runs of C
    (logical segment (b, i, j, p, q) is X's (b, 2i + q, 2j + p))."""
    return {"segment": C, "offset": 0, "shape": [B, H // 2, W // 2, 4 * C],
            "dims": [{"shift": 0, "pieces": [[B, H * W]]}, {"shift": 0, "pieces": [[H // 2, 2 * W]]},
                     {"shift": 0, "pieces": [[W // 2, 2]]}, {"shift": 0, "pieces": [[2, 1]]},
                     {"shift": 0, "pieces": [[2, W]]}]}


#: (X shape, in_map, row map or None): a patch merging in whole vectors, one of odd C (the element
#: path), one whose output rows are also permuted
IN_MAPS = [((2, 6, 10, 16), merging_map(2, 6, 10, 16), None),
           ((1, 4, 6, 5), merging_map(1, 4, 6, 5), None),
           ((2, 4, 4, 8), merging_map(2, 4, 4, 8),
            {"dims": [{"shift": 1, "pieces": [[2, 4]]}, {"shift": 0, "pieces": [[2, 1], [2, 2]]}], "shape": [8, 32]})]


def rm_dest_as_the_kernel_computes(args, rows):
    """norm_row_map.cuh's rm_dest over row_map_args' arguments."""
    dims, out = int(args[0]), []
    for row in range(rows):
        rem, dest = row, 0
        for d in range(dims):
            n, s, q, a, b = (int(v) for v in args[1 + 5 * d:6 + 5 * d])
            i = rem % n
            rem //= n
            j = i + s - (n if i + s >= n else 0)
            dest += (j % q) * a + (j // q) * b
        out.append(dest if dims else row)
    return np.array(out)


@pytest.mark.parametrize("shape,row_map", MAPS)
def test_the_arguments_give_the_maps_destinations(shape, row_map):
    rows = int(np.prod(shape[:-1]))
    args = row_map_args(mapped_layer(shape, row_map), rows)
    assert len(args) == ROW_MAP_ARGS and all(isinstance(a, np.int32) for a in args)
    assert np.array_equal(rm_dest_as_the_kernel_computes(args, rows), row_destinations(row_map))


def test_a_layer_without_a_map_passes_the_identity_and_a_map_of_other_rows_is_a_device_error():
    plain = LayerDesc("ln", "LayerNormalization", ("X", "S"), ("Y",), {"axis": -1})
    assert row_map_args(plain, 10) == [0] * ROW_MAP_ARGS
    shape, row_map = MAPS[2]
    with pytest.raises(DeviceError, match="rows"):
        row_map_args(mapped_layer(shape, row_map), 36)


def launch_tensors(layer, dtype=np.float16):
    return {n: DeviceTensor(0x10000 * (k + 1), shp, np.dtype(dtype)) for k, (n, shp) in enumerate(
        zip(("X", "S", "B", "Y"), (*layer.in_shapes, layer.out_shapes[0])))}


def test_a_map_that_reaches_past_its_tensors_is_a_device_error_before_any_launch():
    """A plan is untrusted: an edited row map whose strides write past Y, or an input map whose offset reads
    past X, is refused on the host (the kernel would write or read out of bounds), naming the layer."""
    shape, row_map = MAPS[2]
    layer = mapped_layer(shape, row_map)
    assert warp_launch(layer, launch_tensors(layer)) is not None  # the map as the pass makes it
    wide = {**row_map, "dims": [{"shift": 3, "pieces": [[7, 2]]}, {"shift": 2, "pieces": [[5, 7]]}]}
    for tactic in (WARP, ROWS):
        bad = mapped_layer(shape, wide)
        with pytest.raises(DeviceError, match="row map writes past") as info:
            find_tactic("cuda", bad.kind, tactic).enqueue(bad, None, launch_tensors(bad))
        assert "'ln'" in str(info.value)
    x_shape, in_map, _ = IN_MAPS[0]
    shifted = mapped_layer(x_shape, None, in_map={**in_map, "offset": 1})
    with pytest.raises(DeviceError, match="input map reads past"):
        warp_launch(shifted, launch_tensors(shifted))


def test_both_tactics_take_a_mapped_norm_and_refuse_one_with_statistics():
    shape, row_map = MAPS[0]
    for kind in ("LayerNormalization", "RMSNormalization"):
        names = [t.name for t in candidates("cuda", kind, mapped_layer(shape, row_map, kind=kind))]
        assert names[:2] == [WARP, ROWS]
    assert not [t.name for t in candidates("cuda", "LayerNormalization", mapped_layer(shape, row_map, stats=True))]


def test_only_a_mapped_norm_compiles_the_map_code():
    """The maps' arguments and index math are compiled into mapped layers' kernels alone (NW_MAPS,
    norm_rows_map_<code>): an unmapped LayerNorm's kernel is the one it had before row maps."""
    shape, row_map = MAPS[0]
    mapped, plain = mapped_layer(shape, row_map), mapped_layer(shape, None)
    warp, rows = find_tactic("cuda", mapped.kind, WARP), find_tactic("cuda", mapped.kind, ROWS)
    assert dict(warp.kernels(mapped)[0].defines).get("NW_MAPS") == "1"
    assert "NW_MAPS" not in dict(warp.kernels(plain)[0].defines)
    assert {k.name for k in rows.kernels(mapped)} == {"norm_rows_map_f32", "norm_rows_map_f16", "norm_rows_map_f64"}
    assert {k.name for k in rows.kernels(plain)} == {"norm_rows_f32", "norm_rows_f16", "norm_rows_f64"}


# ---- the kernels on the host ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def warp_emulated(tmp_path_factory):
    return host_launcher(tmp_path_factory, "NW_PARAMS", "NW_ARGS")


ROWS_PARAMS = ("const {T}* x, const {T}* scale, const {T}* bias, {T}* y, float* mean_out, float* rstd_out, i64 rows, "
               "i64 L, i64 G, i64 D, i64 n_scale, i64 n_bias, double eps, i64 rms, RM_PARAMS, IM_PARAMS")
ROWS_ARGS = "x, scale, bias, y, mean_out, rstd_out, rows, L, G, D, n_scale, n_bias, eps, rms, RM_ARGS, IM_ARGS"


@pytest.fixture(scope="module")
def rows_emulated(tmp_path_factory):
    return {dtype: host_launcher(tmp_path_factory, ROWS_PARAMS.format(T=t),
                                 ROWS_ARGS) for dtype, t in ((np.float32, "float"), (np.float16, "half_t"))}


def run_emulated(launcher, tactic, layer, dtype):
    feeds = feeds_for(layer, dtype)
    tensors, views, _keep = host_buffers(layer, feeds, {})
    launcher.launches.clear()
    find_tactic("cuda", layer.kind, tactic).enqueue(layer, launcher, tensors)
    assert launcher.launches, "nothing launched"
    for name, want in reference(layer, feeds).items():
        tol = 2e-3 if dtype == np.float16 else 1e-5
        np.testing.assert_allclose(views[name].astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("shape,row_map", MAPS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_emulated_warp_kernel_writes_the_mapped_rows_of_the_reference(warp_emulated, shape, row_map, dtype):
    run_emulated(warp_emulated, WARP, mapped_layer(shape, row_map, dtype), dtype)


@pytest.mark.parametrize("shape,row_map", MAPS[:3])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_emulated_rows_kernel_writes_the_mapped_rows_of_the_reference(rows_emulated, shape, row_map, dtype):
    run_emulated(rows_emulated[dtype], ROWS, mapped_layer(shape, row_map, dtype), dtype)


def test_the_emulated_kernels_run_a_mapped_rms_norm(warp_emulated, rows_emulated):
    shape, row_map = MAPS[2]
    layer = mapped_layer(shape, row_map, np.float32, kind="RMSNormalization")
    run_emulated(warp_emulated, WARP, layer, np.float32)
    run_emulated(rows_emulated[np.float32], ROWS, layer, np.float32)


def test_the_merging_map_reads_what_the_slices_and_concat_read():
    x = np.arange(2 * 6 * 10 * 16).reshape(2, 6, 10, 16)
    want = np.concatenate([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
    assert np.array_equal(input_index(merging_map(2, 6, 10, 16), x.shape), want)


def test_the_input_map_arguments_and_its_vectors():
    shape, in_map, _ = IN_MAPS[0]
    layer = mapped_layer(shape, None, in_map=in_map)
    args = in_map_args(layer, 30, 64)
    assert len(args) == ROW_MAP_ARGS + 2 and args[:3] == [16, 0, 5]
    rows = 2 * 3 * 5 * 4  # segments
    assert np.array_equal(rm_dest_as_the_kernel_computes(args[2:], rows),
                          input_index(in_map, shape)[..., ::16].reshape(-1) // 16)
    tensors = {n: DeviceTensor(0x10000 * (k + 1), s, np.dtype(np.float16)) for k, (n, s) in enumerate(
        zip(("X", "S", "B", "Y"), (*layer.in_shapes, layer.out_shapes[0])))}
    _, grid, _, launch = warp_launch(layer, tensors)
    assert launch[6:8] == [30, 64] and launch[12] == 1  # 16 halves a run: 16-byte loads
    odd = mapped_layer(IN_MAPS[1][0], None, in_map=IN_MAPS[1][1])
    tensors = {n: DeviceTensor(0x10000 * (k + 1), s, np.dtype(np.float16)) for k, (n, s) in enumerate(
        zip(("X", "S", "B", "Y"), (*odd.in_shapes, odd.out_shapes[0])))}
    assert warp_launch(odd, tensors)[3][12] == 0  # runs of 5: element by element


@pytest.mark.parametrize("shape,in_map,row_map", IN_MAPS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_emulated_kernels_read_through_the_input_map(warp_emulated, rows_emulated, shape, in_map, row_map, dtype):
    layer = mapped_layer(shape, row_map, dtype, in_map=in_map)
    run_emulated(warp_emulated, WARP, layer, dtype)
    run_emulated(rows_emulated[dtype], ROWS, layer, dtype)


# ---- GPU -------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("tactic", [WARP, ROWS])
@pytest.mark.parametrize("shape,row_map", MAPS + [
    ((8, 56, 56, 96), {"dims": [{"shift": 0, "pieces": [[8, 3136]]}, {"shift": 3, "pieces": [[8, 392], [7, 7]]},
                                {"shift": 3, "pieces": [[8, 49], [7, 1]]}], "shape": [8, 8, 8, 7, 7, 96]})])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_mapped_rows_on_the_gpu_match_the_reference(tactic, shape, row_map, dtype):
    gpu_matches_reference(mapped_layer(shape, row_map, dtype), tactic, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", [WARP, ROWS])
@pytest.mark.parametrize("shape,in_map,row_map", IN_MAPS + [((8, 56, 56, 96), merging_map(8, 56, 56, 96), None)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_input_maps_on_the_gpu_match_the_reference(tactic, shape, in_map, row_map, dtype):
    gpu_matches_reference(mapped_layer(shape, row_map, dtype, in_map=in_map), tactic, dtype)


def gpu_matches_reference(layer, tactic, dtype):
    from polykit.runtime.cuda.harness import run_layer

    feeds = feeds_for(layer, dtype)
    got = run_layer(layer, feeds, tactic=tactic)
    for name, want in reference(layer, feeds).items():
        tol = 5e-3 if dtype == np.float16 else 1e-4
        assert not np.isnan(got[name].astype(np.float64)).any(), f"{name}: unwritten (NaN) elements"
        np.testing.assert_allclose(got[name].astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
