"""ai.polykit SqueezeExcite on cuda (squeeze_excite.cu): the reference kernel, which layers the tactic
takes, the launch it makes (host side, no GPU: one block a sample, or a split with its workspace and
the counters' memset), a host emulation of the kernels' index math (every pixel and channel summed
exactly once, the split's partials inside the workspace), and results against the reference (GPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.squeeze_excite_reference import squeeze_excite
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.reduce import squeeze_excite as se
from tests.kernels.cuda.recording_launcher import RecordingLauncher

rng = np.random.default_rng(31)

SILU = {"input": "a", "body": [{"op": "Sigmoid", "inputs": ["a"], "outputs": ["b"], "attrs": {}},
                               {"op": "Mul", "inputs": ["a", "b"], "outputs": ["h"], "attrs": {}}], "output": "h"}
CLIP = {"input": "a", "body": [{"op": "Clip", "inputs": ["a", "lo", "hi"], "outputs": ["h"], "attrs": {}}],
        "output": "h"}
RELU = {"input": "a", "body": [{"op": "Relu", "inputs": ["a"], "outputs": ["h"], "attrs": {}}], "output": "h"}
SIGMOID = {"input": "z", "body": [{"op": "Sigmoid", "inputs": ["z"], "outputs": ["s"], "attrs": {}}], "output": "s"}
HARD = {"input": "z", "body": [{"op": "HardSigmoid", "inputs": ["z"], "outputs": ["s"],
                                "attrs": {"alpha": 1 / 6, "beta": 0.5}}], "output": "s"}
NONE = {"input": "s", "body": [], "output": "s"}


def arrays(layout: str, n: int, hw: tuple[int, int], c: int, cr: int, dtype=np.float16, extras: int = 0):
    shape = (n, *hw, c) if layout == "nhwc" else (n, c, *hw)
    out = {"x": (rng.standard_normal(shape) * 2).astype(dtype),
           "w1": (rng.standard_normal((cr, 1, 1, c) if layout == "nhwc" else (cr, c, 1, 1)) / np.sqrt(c)).astype(dtype),
           "b1": rng.standard_normal(cr).astype(dtype),
           "w2": (rng.standard_normal((c, 1, 1, cr) if layout == "nhwc" else (c, cr, 1, 1)) / np.sqrt(cr)).astype(dtype),
           "b2": rng.standard_normal(c).astype(dtype)}
    if extras:
        out["lo"], out["hi"] = np.array(-0.25, dtype), np.array(1.0, dtype)
    return out


def layer(arrs: dict, layout: str, act=SILU, gate=SIGMOID) -> LayerDesc:
    names = ("x", "w1", "b1", "w2", "b2", *(("lo", "hi") if "lo" in arrs else ()))
    attrs = {"layout": layout, "act": act, "gate": gate}
    (s,) = squeeze_excite(Node("SqueezeExcite", list(names), ["s"], attrs, domain=POLYKIT_DOMAIN),
                          [arrs[k] for k in names])
    return LayerDesc("se", "SqueezeExcite", names, ("s",), attrs, domain=POLYKIT_DOMAIN,
                     in_dtypes=tuple(arrs[k].dtype.name for k in names),
                     in_shapes=tuple(arrs[k].shape for k in names), out_dtypes=(s.dtype.name,), out_shapes=(s.shape,))


def reference(lay: LayerDesc, arrs: dict) -> np.ndarray:
    node = Node("SqueezeExcite", list(lay.inputs), ["s"], dict(lay.attrs), domain=POLYKIT_DOMAIN)
    return squeeze_excite(node, [arrs[k] for k in lay.inputs])[0]


def test_the_reference_is_the_unfused_chain():
    a = arrays("nchw", 2, (3, 5), 6, 4, np.float32)
    got = reference(layer(a, "nchw", RELU, HARD), a)
    p = a["x"].mean(axis=(2, 3))
    h = np.maximum(p @ a["w1"].reshape(4, 6).T + a["b1"], 0)
    z = h @ a["w2"].reshape(6, 4).T + a["b2"]
    np.testing.assert_allclose(got.reshape(2, 6), np.clip(z / 6 + 0.5, 0, 1), rtol=1e-5, atol=1e-6)
    assert got.shape == (2, 6, 1, 1)


class GeometryLauncher(RecordingLauncher):
    """Records each launch's grid, block and shared memory too; has no memset (the tactic needs none)."""

    def __init__(self):
        super().__init__()
        self.geometry: list[tuple] = []

    def launch(self, kernel, grid, block, args, shared_mem=0):
        super().launch(kernel, grid, block, args, shared_mem)
        self.geometry.append((tuple(grid), tuple(block), shared_mem))


def _tensors(arrs: dict, lay: LayerDesc, misalign: int = 0) -> dict:
    out, ptr = {}, 0x10000
    for name in (*lay.inputs, "s"):
        shape = arrs[name].shape if name != "s" else lay.out_shapes[0]
        out[name] = DeviceTensor(ptr + (misalign if name == "x" else 0), tuple(shape), np.dtype(lay.in_dtypes[0]))
        ptr += 1 << 24
    return out


def test_a_small_block_is_one_pool_block_a_sample_then_fc2():
    a = arrays("nhwc", 3, (7, 7), 24, 13)
    lay = layer(a, "nhwc")
    assert se._supports(lay)
    rec = GeometryLauncher()
    se.enqueue_squeeze_excite(lay, rec, _tensors(a, lay))
    (pool, pool_args), (fc2, fc2_args) = rec.launches
    assert (pool, fc2) == ("se_pool_nhwc", "se_fc2")
    assert rec.geometry == [((1, 1, 3), (256, 1, 1), 4 * (24 + 64 * 24)), ((1, 3, 1), (256, 1, 1), 4 * 13)]
    assert [int(v) for v in pool_args[3:]] == [49, 24, 13, 49, 24, 1, 4]  # HW C Cr chunk cs vec tx (3 lanes)
    assert rec.workspaces == [4 * 3 * 13] and pool_args[2] == fc2_args[0] == rec._ptr
    assert [int(v) for v in fc2_args[5:9]] == [24, 13, 1, 64]  # C Cr parts cs2


def test_large_pools_split_over_pixels_and_wide_ones_over_channels():
    a = arrays("nhwc", 1, (112, 112), 32, 8)
    lay = layer(a, "nhwc")
    rec = GeometryLauncher()
    tensors = _tensors(a, lay)
    se.enqueue_squeeze_excite(lay, rec, tensors)
    (grid, _, _), _ = rec.geometry
    chunk = int(rec.launches[0][1][6])
    assert grid[1:] == (1, 1) and 1 < grid[0] and (grid[0] - 1) * chunk < 12544 <= grid[0] * chunk
    assert rec.workspaces == [se.fc1_workspace(lay, tensors, 132)] == [4 * grid[0] * 8]
    b = arrays("nhwc", 2, (7, 7), 960, 240)
    lay = layer(b, "nhwc")
    rec = GeometryLauncher()
    se.enqueue_squeeze_excite(lay, rec, _tensors(b, lay))
    assert [g for g, _, _ in rec.geometry] == [(1, 15, 2), (15, 2, 1)]  # 64 channels a block, both FCs
    assert rec.workspaces == [4 * 2 * 15 * 240]


def test_the_grid_depends_on_the_shapes_only():
    a = arrays("nhwc", 1, (56, 56), 24, 8)
    lay = layer(a, "nhwc")
    plans = [se.launch_plan(lay, _tensors(a, lay, m), 0x1000) for m in (0, 2)]
    assert [p[1] for p in plans[0]] == [p[1] for p in plans[1]]  # grids
    assert int(plans[0][0][4][8]) == 1 and int(plans[1][0][4][8]) == 0  # 16-byte loads only when aligned


def test_the_tactic_refuses_what_its_kernels_do_not_take():
    a = arrays("nhwc", 1, (7, 7), 16, 4)
    lay = layer(a, "nhwc")
    assert se._supports(lay)
    assert not se._supports(replace(lay, in_dtypes=("float16", "float32", "float16", "float16", "float16")))
    assert not se._supports(replace(lay, attrs={**lay.attrs, "layout": "nwhc"}))
    big = replace(lay, in_shapes=((1, 7, 7, 16), (16384, 1, 1, 16), (16384,), (16, 1, 1, 16384), (16,)))
    assert not se._supports(big)  # the hidden units live in shared memory
    wide = replace(lay, in_shapes=((1, 7, 7, 4096), (1024, 1, 1, 4096), (1024,), (4096, 1, 1, 1024), (4096,)))
    assert se._supports(wide)
    odd = replace(lay, attrs={**lay.attrs, "act": {"input": "a", "body": [
        {"op": "Cos", "inputs": ["a"], "outputs": ["h"], "attrs": {}}], "output": "h"}})
    assert se._supports(odd)  # any op with a CUDA expression
    five = replace(lay, inputs=lay.inputs + ("e0", "e1", "e2", "e3", "e4"),
                   in_dtypes=lay.in_dtypes + ("float16",) * 5, in_shapes=lay.in_shapes + ((),) * 5)
    assert not se._supports(five)


def test_every_kernel_variant_is_declared_for_nvrtc():
    names = [k.name for k in se.compile_variants()]
    assert len(names) == 24 and set(names) == {"se_pool_nhwc", "se_pool_nchw", "se_fc2"}


# ---- host emulation of the kernels' index math -------------------------------------------------------
def emulate(lay: LayerDesc, arrs: dict, misalign: int = 0) -> np.ndarray:
    """s as the two kernels compute it, following their loops over the index space: each pool block's
    pixels and channel slice, se_pool_nhwc's (row, lane) threads and `red` slots, the FC1 partials'
    workspace slots (each written once, before se_fc2 reads it), se_fc2's join in (p, q) order and its
    rows; asserts every (pixel, channel) is summed exactly once and every output channel written once."""
    x, dt = arrs["x"], arrs["x"].dtype
    tensors = _tensors(arrs, lay, misalign)
    ws = se.fc1_workspace(lay, tensors, 132) // 4
    (pool, grid, _, shared, args), (_, grid2, _, shared2, args2) = se.launch_plan(lay, tensors, 0)
    hw, c, cr, chunk, cs, vec, tx = (int(v) for v in args[3:])
    P, Q, n = grid
    v = 16 // dt.itemsize if vec else 1
    flat = x.reshape(n, hw, c) if pool == "se_pool_nhwc" else x.reshape(n, c, hw).transpose(0, 2, 1)
    w1 = arrs["w1"].reshape(-1).astype(np.float32)
    cover = np.zeros((n, hw, c), np.int64)
    part = np.full(ws, np.nan, np.float32)
    for s in range(n):
        for p in range(P):
            for q in range(Q):
                r0, r1, c0 = p * chunk, min(hw, p * chunk + chunk), q * cs
                width = min(cs, c - c0)
                sums = np.zeros(width, np.float32)
                if pool == "se_pool_nhwc":
                    ty = 256 // tx
                    assert shared >= 4 * (cs + ty * cs)
                    red = np.full((ty, cs), np.nan, np.float32)
                    for t in range(256):
                        row, lane = t // tx, t % tx
                        for g in range(lane, -(-width // v), tx):
                            cols = slice(g * v, g * v + v)
                            assert g * v + v <= width  # 16-byte loads inside the slice
                            cover[s, r0 + row:r1:ty, c0 + g * v:c0 + g * v + v] += 1
                            assert np.all(np.isnan(red[row, cols]))
                            red[row, cols] = flat[s, r0 + row:r1:ty, c0 + g * v:c0 + g * v + v].astype(np.float32).sum(0)
                    sums = red[:, :width].sum(axis=0)
                else:
                    for cc in range(width):  # a warp a channel, lanes r0 + lane :: 32
                        for lane in range(32):
                            cover[s, r0 + lane:r1:32, c0 + cc] += 1
                        sums[cc] = flat[s, r0:r1, c0 + cc].astype(np.float32).sum()
                mean = sums / np.float32(hw)
                if P == 1:
                    mean = mean.astype(dt).astype(np.float32)
                slot = (s * P + p) * Q + q
                assert (slot + 1) * cr <= ws and np.all(np.isnan(part[slot * cr:(slot + 1) * cr]))
                for j in range(cr):
                    part[slot * cr + j] = np.dot(w1[j * c + c0:j * c + c0 + width], mean)
    assert np.all(cover == 1) and not np.any(np.isnan(part))
    # se_fc2: parts = P * Q, rows [q2 * cs2, ...) of block q2
    parts, cs2 = int(args2[7]), int(args2[8])
    assert parts == P * Q and grid2 == (-(-c // cs2), n, 1) and shared2 == 4 * cr
    written = np.zeros((n, c), np.int64)
    hidden = np.zeros((n, cr), np.float32)
    for s in range(n):
        hidden[s] = part[s * parts * cr:(s + 1) * parts * cr].reshape(parts, cr).sum(axis=0)
        for q2 in range(grid2[0]):
            written[s, q2 * cs2:min(c, (q2 + 1) * cs2)] += 1
    assert np.all(written == 1)
    return hidden + arrs["b1"].astype(np.float32)


@pytest.mark.parametrize("layout,n,hw,c,cr,misalign", [
    ("nhwc", 1, (112, 112), 32, 8, 0), ("nhwc", 3, (7, 7), 24, 13, 0), ("nhwc", 1, (56, 56), 100, 2, 0),
    ("nhwc", 2, (17, 9), 5, 1, 0), ("nhwc", 1, (28, 28), 40, 8, 2), ("nhwc", 1, (7, 7), 1152, 48, 0),
    ("nhwc", 3, (1, 1), 3, 2, 0), ("nhwc", 1, (14, 14), 200, 30, 0), ("nchw", 1, (56, 56), 24, 6, 0),
    ("nchw", 3, (5, 3), 100, 13, 0)])
def test_the_emulated_index_math_sums_every_pixel_once_and_gives_the_reference_fc1(layout, n, hw, c, cr, misalign):
    a = arrays(layout, n, hw, c, cr)
    lay = layer(a, layout)
    got = emulate(lay, a, misalign)
    p = a["x"].astype(np.float32).mean(axis=(1, 2) if layout == "nhwc" else (2, 3)).astype(np.float16)
    want = p.astype(np.float32) @ a["w1"].reshape(cr, c).astype(np.float32).T + a["b1"].astype(np.float32) \
        if layout == "nhwc" else p.astype(np.float32) @ a["w1"][:, :, 0, 0].astype(np.float32).T + a["b1"].astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


# ---- GPU (the lead runs these) -------------------------------------------------------------------------
GPU_CASES = [("nhwc", 1, (112, 112), 32, 8, SILU, SIGMOID, np.float16), ("nhwc", 3, (7, 7), 24, 13, RELU, HARD, np.float16),
             ("nhwc", 1, (56, 56), 100, 2, CLIP, SIGMOID, np.float16), ("nhwc", 2, (17, 9), 5, 1, SILU, HARD, np.float32),
             ("nhwc", 1, (7, 7), 1152, 48, SILU, SIGMOID, np.float16), ("nhwc", 3, (1, 1), 3, 2, RELU, NONE, np.float16),
             ("nchw", 1, (56, 56), 24, 6, SILU, SIGMOID, np.float32), ("nchw", 3, (5, 3), 100, 13, CLIP, HARD, np.float16),
             ("nhwc", 1, (28, 28), 40, 8, SILU, SIGMOID, "bfloat16")]


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [0, 2])
@pytest.mark.parametrize("layout,n,hw,c,cr,act,gate,dtype", GPU_CASES)
def test_squeeze_excite_matches_the_reference(layout, n, hw, c, cr, act, gate, dtype, misalign):
    from polykit.compiler.ir import dtypes
    from polykit.runtime.cuda.harness import relative_error, run_layer

    dt = dtypes.to_numpy(16, where="test") if dtype == "bfloat16" else np.dtype(dtype)
    a = arrays(layout, n, hw, c, cr, dt, extras=2 if act is CLIP else 0)
    lay = layer(a, layout, act, gate)
    want = reference(lay, a)
    out = run_layer(lay, a, tactic="cuda.squeeze_excite", misalign={"x": misalign * dt.itemsize})["s"]
    assert relative_error(out, want) < (2e-2 if dt.itemsize == 2 else 1e-5)
