"""ai.polykit SqueezeExcite on cuda (squeeze_excite.cu): the reference kernel, which layers the tactic
takes, the launch it makes (host side, no GPU: one block a sample, or a split with its workspace),
a host emulation of the kernels' index math (every pixel and channel summed exactly once, the split's
partials inside the workspace; with `scale`, every element of y written once from its own x element,
16-byte runs inside their block's slice), and results against the reference (GPU)."""

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


def layer(arrs: dict, layout: str, act=SILU, gate=SIGMOID, scale: bool = False) -> LayerDesc:
    """The layer on these arrays: output s, or with `scale` y = x * s (s then internal, the gate's name)."""
    names = ("x", "w1", "b1", "w2", "b2", *(("lo", "hi") if "lo" in arrs else ()))
    attrs = {"layout": layout, "act": act, "gate": gate, **({"scale": 1} if scale else {})}
    out = "y" if scale else "s"
    (s,) = squeeze_excite(Node("SqueezeExcite", list(names), [out], attrs, domain=POLYKIT_DOMAIN),
                          [arrs[k] for k in names])
    return LayerDesc("se", "SqueezeExcite", names, (out,), attrs, domain=POLYKIT_DOMAIN,
                     in_dtypes=tuple(arrs[k].dtype.name for k in names),
                     in_shapes=tuple(arrs[k].shape for k in names), out_dtypes=(s.dtype.name,), out_shapes=(s.shape,))


def reference(lay: LayerDesc, arrs: dict) -> np.ndarray:
    node = Node("SqueezeExcite", list(lay.inputs), list(lay.outputs), dict(lay.attrs), domain=POLYKIT_DOMAIN)
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
    for name in (*lay.inputs, *lay.outputs):
        shape = arrs[name].shape if name in arrs else lay.out_shapes[0]
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
    assert len(names) == 36 and set(names) == {"se_pool_nhwc", "se_pool_nchw", "se_fc2", "se_fc2_scale_nhwc",
                                               "se_fc2_scale_nchw"}
    assert names.count("se_fc2_scale_nhwc") == names.count("se_fc2_scale_nchw") == 6  # 3 dtypes x 2 body pairs


def test_a_scaling_layer_launches_the_pool_then_the_scaling_fc2_over_pixel_chunks():
    a = arrays("nhwc", 1, (112, 112), 32, 8)
    lay = layer(a, "nhwc", scale=True)
    assert se._supports(lay) and lay.out_shapes[0] == (1, 112, 112, 32)
    assert [k.name for k in se._kernels(lay)] == ["se_pool_nhwc", "se_fc2_scale_nhwc"]
    rec = GeometryLauncher()
    tensors = _tensors(a, lay)
    se.enqueue_squeeze_excite(lay, rec, tensors)
    (pool, pool_args), (fc2, args) = rec.launches
    assert pool == "se_pool_nhwc" and fc2 == "se_fc2_scale_nhwc"
    p3, chunk = se.scale_geometry(12544, 32, 2)
    assert chunk % se.VEC_PIXELS == 0 and chunk * 32 * 2 >= se.SPLIT_BYTES and (p3 - 1) * chunk < 12544 <= p3 * chunk
    assert rec.geometry[1] == ((1, p3, 1), (256, 1, 1), 4 * (8 + se.CS2))
    assert args[4] == tensors["x"] and args[5] == tensors["y"] and args[0] == pool_args[2] == rec._ptr
    assert [int(v) for v in args[6:13]] == [32, 8, rec.geometry[0][0][0] * rec.geometry[0][0][1], 64,
                                            12544, chunk, 1]  # C Cr parts cs2 HW chunk vec
    # NCHW with HW = 15 (no 16-byte runs along a channel's pixels) and wide C: channel slices x chunks
    b = arrays("nchw", 2, (5, 3), 200, 13)
    lay = layer(b, "nchw", scale=True)
    plan = se.launch_plan(lay, _tensors(b, lay), 0x1000)
    assert plan[1][0] == "se_fc2_scale_nchw" and plan[1][1] == (4, 1, 2) and int(plan[1][4][12]) == 0
    scalar = layer(b, "nchw")
    assert se.launch_plan(scalar, _tensors(b, scalar), 0x1000)[1][1] == (4, 2, 1)  # se_fc2: (Q2, N)


def test_the_scaling_kernel_vectorizes_only_where_shapes_and_both_pointers_allow():
    a = arrays("nhwc", 1, (28, 28), 40, 8)
    lay = layer(a, "nhwc", scale=True)
    vec = lambda tensors: int(se.launch_plan(lay, tensors, 0x1000)[1][4][12])  # noqa: E731
    assert vec(_tensors(a, lay)) == 1
    assert vec(_tensors(a, lay, misalign=2)) == 0  # x misaligned
    moved = _tensors(a, lay)
    moved["y"] = DeviceTensor(moved["y"].ptr + 2, moved["y"].shape, moved["y"].dtype)
    assert vec(moved) == 0  # y misaligned
    odd = arrays("nhwc", 1, (28, 28), 36, 8)  # 72 bytes a pixel
    lay_odd = layer(odd, "nhwc", scale=True)
    assert int(se.launch_plan(lay_odd, _tensors(odd, lay_odd), 0x1000)[1][4][12]) == 0
    f32 = arrays("nchw", 1, (28, 28), 40, 8, np.float32)  # 784 pixels: 4-float runs along a channel
    lay32 = layer(f32, "nchw", scale=True)
    assert int(se.launch_plan(lay32, _tensors(f32, lay32), 0x1000)[1][4][12]) == 1


def test_a_scaling_layer_needs_room_for_its_gates_in_shared_memory():
    a = arrays("nhwc", 1, (7, 7), 16, 4)
    lay = layer(a, "nhwc", scale=True)
    cr = se.SHARED_LIMIT // 4 - se.CS2
    fits = replace(lay, in_shapes=((1, 7, 7, 16), (cr, 1, 1, 16), (cr,), (16, 1, 1, cr), (16,)))
    over = replace(lay, in_shapes=((1, 7, 7, 16), (cr + 1, 1, 1, 16), (cr + 1,), (16, 1, 1, cr + 1), (16,)))
    assert se._supports(fits) and not se._supports(over)
    assert se._supports(replace(over, attrs={k: v for k, v in over.attrs.items() if k != "scale"}))
    from polykit.compiler.ops.nn.squeeze_excite import MAX_HIDDEN
    assert MAX_HIDDEN == cr  # the pass makes no node the tactic cannot run
    assert not se._supports(replace(lay, attrs={**lay.attrs, "scale": 2}))


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
    k = 6 if se.scaled(lay) else 5  # se_fc2_scale reads x and writes y where se_fc2 writes s
    parts, cs2 = int(args2[k + 2]), int(args2[k + 3])
    assert parts == P * Q and shared2 == 4 * (cr + (cs2 if se.scaled(lay) else 0))
    assert grid2 == ((-(-c // cs2), grid2[1], n) if se.scaled(lay) else (-(-c // cs2), n, 1))
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


def emulate_scale(lay: LayerDesc, arrs: dict, tensors: dict) -> np.ndarray:
    """y as se_fc2_scale_<layout> writes it, following its loops: block (q2, p3, n)'s gate slice, its
    runs of V elements (e = i * V, the element offsets of both layouts' macros) or single elements;
    asserts every run lies in the block's pixels and channels, starts 16-byte aligned where vec, and
    every element of y is written exactly once, from the x element at the same offset."""
    x = arrs["x"]
    dt = x.dtype
    gate = reference(replace(lay, attrs={k: v for k, v in lay.attrs.items() if k != "scale"}, outputs=("s",)),
                     arrs).reshape(-1).astype(np.float32)  # [N * C], each gate rounded to dt
    (_, _, _, _, _), (name, grid, block, shared, args) = se.launch_plan(lay, tensors, 0)
    c, cr, parts, cs2, hw, chunk, vec = (int(v) for v in args[6:13])
    Q2, P3, n = grid
    assert block == (256, 1, 1) and shared == 4 * (cr + cs2) and Q2 == -(-c // cs2)
    v = 16 // dt.itemsize if vec else 1
    flat_x = x.reshape(-1)
    y = np.full(flat_x.size, np.nan, np.float32)
    writes = np.zeros(flat_x.size, np.int64)
    for s in range(n):
        for q2 in range(Q2):
            c0 = q2 * cs2
            width = min(cs2, c - c0)
            for p3 in range(P3):
                r0, r1 = p3 * chunk, min(hw, p3 * chunk + chunk)
                nhwc = name == "se_fc2_scale_nhwc"  # the kernel's inner / stride / base
                inner, items = (width if nhwc else r1 - r0), (r1 - r0) * width
                stride, base = (c, (s * hw + r0) * c + c0) if nhwc else (hw, (s * c + c0) * hw + r0)
                assert items % v == 0 and inner % v == 0
                for t in range(256):
                    for i in range(t, items // v, 256):
                        e = i * v
                        outer, within = e // inner, e % inner
                        o = base + outer * stride + within
                        assert o % v == 0  # 16-byte aligned where vec (x and y are)
                        for k in range(v):
                            ch = c0 + within + k if nhwc else c0 + outer  # gate[in + k] / gate[outer]
                            pix = (o + k) // c % hw if nhwc else (o + k) % hw
                            assert c0 <= ch < c0 + width and r0 <= pix < r1
                            assert (o + k) // (hw * c) == s and ((o + k) % c if nhwc else (o + k) // hw % c) == ch
                            writes[o + k] += 1
                            y[o + k] = np.float32(flat_x[o + k]) * gate[s * c + ch]
    assert np.all(writes == 1)
    return y.astype(dt).reshape(x.shape)


SCALE_CASES = [("nhwc", 1, (112, 112), 32, 8, 0), ("nhwc", 3, (7, 7), 24, 13, 0), ("nhwc", 2, (17, 9), 5, 1, 0),
               ("nhwc", 1, (28, 28), 40, 8, 2), ("nhwc", 1, (7, 7), 1152, 48, 0), ("nhwc", 1, (14, 14), 200, 30, 0),
               ("nchw", 1, (56, 56), 24, 6, 0), ("nchw", 3, (5, 3), 100, 13, 0), ("nchw", 2, (16, 16), 70, 5, 0)]


@pytest.mark.parametrize("layout,n,hw,c,cr,misalign", SCALE_CASES)
def test_the_emulated_scaling_kernel_writes_every_element_once_and_gives_the_reference(layout, n, hw, c, cr, misalign):
    a = arrays(layout, n, hw, c, cr)
    lay = layer(a, layout, scale=True)
    got = emulate_scale(lay, a, _tensors(a, lay, misalign))
    np.testing.assert_array_equal(got, reference(lay, a))  # the same roundings: bit for bit
    emulate(lay, a, misalign)  # the pool is the unscaled layer's


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


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [0, 2])
@pytest.mark.parametrize("layout,n,hw,c,cr,act,gate,dtype", GPU_CASES + [
    ("nchw", 2, (16, 16), 70, 5, RELU, SIGMOID, np.float16), ("nhwc", 1, (14, 14), 200, 30, CLIP, HARD, np.float32)])
def test_a_scaling_squeeze_excite_matches_the_reference_and_repeats_bit_for_bit(layout, n, hw, c, cr, act, gate, dtype,
                                                                                misalign):
    """y = x * gate on poisoned outputs, x and y misaligned by `misalign` elements (the scalar path), run
    twice: the same bits both times (the split is shape-only)."""
    from polykit.compiler.ir import dtypes
    from polykit.runtime.cuda.harness import relative_error, run_layer

    dt = dtypes.to_numpy(16, where="test") if dtype == "bfloat16" else np.dtype(dtype)
    a = arrays(layout, n, hw, c, cr, dt, extras=2 if act is CLIP else 0)
    lay = layer(a, layout, act, gate, scale=True)
    want = reference(lay, a)
    shift = {"x": misalign * dt.itemsize, "y": misalign * dt.itemsize}
    runs = [run_layer(lay, a, tactic="cuda.squeeze_excite", misalign=shift)["y"] for _ in range(2)]
    assert runs[0].shape == a["x"].shape and not np.any(np.isnan(runs[0].astype(np.float32)))
    assert relative_error(runs[0], want) < (2e-2 if dt.itemsize == 2 else 1e-5)
    np.testing.assert_array_equal(runs[0].view(np.uint8), runs[1].view(np.uint8))
