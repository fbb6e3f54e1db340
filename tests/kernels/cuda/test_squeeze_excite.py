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


class ZeroingLauncher(RecordingLauncher):
    def __init__(self):
        super().__init__()
        self.zeroed: list[tuple[int, int]] = []
        self.geometry: list[tuple] = []

    def zero(self, ptr: int, nbytes: int) -> None:
        self.zeroed.append((ptr, nbytes))

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


def test_small_blocks_run_one_block_a_sample_without_workspace_or_memset():
    a = arrays("nhwc", 3, (7, 7), 24, 13)
    lay = layer(a, "nhwc")
    assert se._supports(lay)
    rec = ZeroingLauncher()
    se.enqueue_squeeze_excite(lay, rec, _tensors(a, lay))
    ((name, args),) = rec.launches
    (grid, block, shared), = rec.geometry
    assert name == "se_nhwc" and grid == (1, 3, 1) and block == (256, 1, 1)
    assert rec.workspaces == [] and rec.zeroed == [] and args[6] == 0 and args[7] == 0
    assert [int(v) for v in args[8:15]] == [49, 24, 13, 49, 1, 1, 4]  # HW C Cr chunk splits vec tx (3 lanes of 8)
    assert shared == 4 * (24 + 13 + 64 * 24)


def test_large_pools_split_over_blocks_and_zero_their_counters_first():
    a = arrays("nhwc", 1, (112, 112), 32, 8)
    lay = layer(a, "nhwc")
    rec = ZeroingLauncher()
    tensors = _tensors(a, lay)
    assert se.split_workspace(lay, tensors, 132) > 0
    se.enqueue_squeeze_excite(lay, rec, tensors)
    ((name, args),) = rec.launches
    (grid, _, _), = rec.geometry
    splits, chunk = int(args[12]), int(args[11])
    assert grid == (splits, 1, 1) and 1 < splits <= se.MAX_BLOCKS and (splits - 1) * chunk < 12544 <= splits * chunk
    assert rec.workspaces == [se.split_workspace(lay, tensors, 132)] == [256 + 4 * splits * 32]
    assert rec.zeroed == [(rec._ptr, 4)] and int(args[7]) == rec._ptr and int(args[6]) == rec._ptr + 256


def test_the_split_depends_on_the_shapes_only():
    a = arrays("nhwc", 1, (56, 56), 24, 8)
    lay = layer(a, "nhwc")
    plans = [se.launch_plan(lay, _tensors(a, lay, m), 0x1000) for m in (0, 2)]
    assert plans[0][1] == plans[1][1]  # grid
    assert int(plans[0][4][13]) == 1 and int(plans[1][4][13]) == 0  # 16-byte loads only when aligned


def test_the_tactic_refuses_what_its_kernels_do_not_take():
    a = arrays("nhwc", 1, (7, 7), 16, 4)
    lay = layer(a, "nhwc")
    assert se._supports(lay)
    assert not se._supports(replace(lay, in_dtypes=("float16", "float32", "float16", "float16", "float16")))
    assert not se._supports(replace(lay, attrs={**lay.attrs, "layout": "nwhc"}))
    big = replace(lay, in_shapes=((1, 7, 7, 8192), (4096, 1, 1, 8192), (4096,), (8192, 1, 1, 4096), (8192,)))
    assert not se._supports(big)  # shared memory of C + Cr floats and the pool's rows
    wide = replace(lay, in_shapes=((1, 7, 7, 4096), (1024, 1, 1, 4096), (1024,), (4096, 1, 1, 1024), (4096,)))
    assert se._supports(wide)
    odd = replace(lay, attrs={**lay.attrs, "act": {"input": "a", "body": [
        {"op": "Cos", "inputs": ["a"], "outputs": ["h"], "attrs": {}}], "output": "h"}})
    assert se._supports(odd)  # any op with a CUDA expression


def test_every_kernel_variant_is_declared_for_nvrtc():
    names = [k.name for k in se.compile_variants()]
    assert len(names) == 12 and set(names) == {"se_nhwc", "se_nchw"}


# ---- host emulation of the kernels' index math -------------------------------------------------------
def emulate(lay: LayerDesc, arrs: dict, misalign: int = 0) -> np.ndarray:
    """s as the kernels compute it, following their loops thread by thread over the index space: each
    block's pixel range, se_nhwc's (row, lane) threads and `red` slots, the split's partial offsets in
    the workspace and the join in split order; asserts every (pixel, channel) is summed exactly once."""
    x = arrs["x"]
    tensors = _tensors(arrs, lay, misalign)
    ws_bytes = se.split_workspace(lay, tensors, 132)
    name, grid, block, shared, args, zero = se.launch_plan(lay, tensors, 0)
    hw, c, cr, chunk, splits, vec, tx = (int(v) for v in args[8:15])
    n = grid[1]
    v = 16 // x.dtype.itemsize if vec else 1
    flat = x.reshape(n, hw, c) if name == "se_nhwc" else x.reshape(n, c, hw).transpose(0, 2, 1)
    cover = np.zeros((n, hw, c), np.int64)
    part = np.full(ws_bytes // 4, np.nan, np.float64)
    offset = se.workspace_layout(n, splits, c)[1] // 4
    pooled = np.zeros((n, c))
    for s in range(n):
        for k in range(grid[0]):
            r0, r1 = k * chunk, min(hw, k * chunk + chunk)
            sums = np.zeros(c)
            if name == "se_nhwc":
                ty = 256 // tx
                assert shared >= 4 * (c + cr + ty * c)
                red = np.full((ty, c), np.nan)
                for t in range(256):
                    row, lane = t // tx, t % tx
                    for g in range(lane, -(-c // v), tx):
                        cols = slice(g * v, g * v + v)
                        assert g * v + v <= c  # 16-byte loads inside the row
                        cover[s, r0 + row:r1:ty, cols] += 1
                        assert np.all(np.isnan(red[row, cols]))
                        red[row, cols] = flat[s, r0 + row:r1:ty, cols].astype(np.float64).sum(axis=0)
                red = np.where(np.isnan(red), 0.0, red)  # rows past the pixels hold no lane (their loop is empty)
                sums = red.sum(axis=0)
            else:
                for cc in range(c):  # warp cc % 8, lanes r0 + lane :: 32
                    for lane in range(32):
                        cover[s, r0 + lane:r1:32, cc] += 1
                    sums[cc] = flat[s, r0:r1, cc].astype(np.float64).sum()
            if splits > 1:
                at = offset + (s * splits + k) * c
                assert at + c <= len(part)
                part[at:at + c] = sums
            else:
                pooled[s] = sums
        if splits > 1:
            block_parts = part[offset + s * splits * c: offset + (s + 1) * splits * c].reshape(splits, c)
            assert not np.any(np.isnan(block_parts))
            pooled[s] = block_parts.sum(axis=0)
    assert np.all(cover == 1)
    assert zero is None if splits == 1 else zero == (0, 4 * n)
    p = (pooled / hw).astype(x.dtype)
    # FC1's index math: row j of W1 at j * C (the KRSC / KCRS weights' flat order)
    w1 = arrs["w1"].reshape(-1)
    h = np.stack([[np.dot(w1[j * c:(j + 1) * c].astype(np.float32), p[s].astype(np.float32)) for j in range(cr)]
                  for s in range(n)])
    want = p.astype(np.float32) @ (arrs["w1"].reshape(cr, c) if name == "se_nhwc" else arrs["w1"][:, :, 0, 0]).astype(np.float32).T
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-5)
    return p


@pytest.mark.parametrize("layout,n,hw,c,cr,misalign", [
    ("nhwc", 1, (112, 112), 32, 8, 0), ("nhwc", 3, (7, 7), 24, 13, 0), ("nhwc", 1, (56, 56), 100, 2, 0),
    ("nhwc", 2, (17, 9), 5, 1, 0), ("nhwc", 1, (28, 28), 40, 8, 2), ("nhwc", 1, (7, 7), 2304, 96, 0),
    ("nhwc", 3, (1, 1), 3, 2, 0), ("nchw", 1, (56, 56), 24, 6, 0), ("nchw", 3, (5, 3), 100, 13, 0)])
def test_the_emulated_index_math_sums_every_pixel_once_and_matches_the_reference_mean(layout, n, hw, c, cr, misalign):
    a = arrays(layout, n, hw, c, cr)
    lay = layer(a, layout)
    p = emulate(lay, a, misalign)
    want = a["x"].astype(np.float32).mean(axis=(1, 2) if layout == "nhwc" else (2, 3)).astype(np.float16)
    np.testing.assert_allclose(p.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


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
