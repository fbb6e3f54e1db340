"""The block shapes of flash_attention.cu (FlashShape: cuda.attention.flash, _q128 with two 16-row
m-tiles a warp, _kv128 with key tiles of 128): registration and launch (CPU), the kernel's row
ownership emulated on the host (which query rows each warp and lane load and store, CPU), and the
new shapes against the float64 reference at the sequence lengths around their tile edges (GPU)."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from polykit.kernels.cuda.attention.flash_attention import SHAPES, FlashShape, _enqueue_of, _kernels_of, flash_launch
from polykit.kernels.cuda.base import CUDA_DIR
from polykit.kernels.tactics import candidates
from tests.kernels.cuda.test_attention_gqa import _tensors
from tests.kernels.cuda.test_flash_attention import _arrays, check, layer_for, rng

FP16 = np.dtype(np.float16)
BY_NAME = {s.name: s for s in SHAPES}
NEW = [s for s in SHAPES if s.name != "cuda.attention.flash"]
#: sequence lengths around the 64- and 128-row tiles, and Whisper's encoder
EDGES = (1, 63, 64, 65, 127, 128, 129, 1500)
#: the most dynamic shared memory a block may take on every sm_80+ GPU (sm_86 / sm_89: 99 KiB)
SMEM_LIMIT = 99 * 1024


class GridRecorder:
    """A Launcher that records each launch's kernel, grid, block and shared memory."""

    sm_count = 132

    def __init__(self):
        self.launches: list[tuple] = []

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.launches.append((kernel, tuple(grid), tuple(block), shared_mem))


# ---- CPU: registration and launch ----------------------------------------------------------------

def test_the_new_shapes_rank_below_cuda_attention_flash_and_take_heads_32_and_64_only():
    layer64 = layer_for(_arrays((2, 3, 70, 64), (2, 3, 90, 64), FP16), (2, 3, 70, 64))
    layer128 = layer_for(_arrays((2, 3, 70, 128), (2, 3, 90, 128), FP16), (2, 3, 70, 128))
    names64 = [t.name for t in candidates("cuda", "Attention", layer64, arch="sm_80")]
    names128 = [t.name for t in candidates("cuda", "Attention", layer128, arch="sm_80")]
    # a plan built without timing (level 0) takes the first candidate: today's tactic
    assert names64[0] == "cuda.attention.flash" and {s.name for s in NEW} <= set(names64)
    assert names128[0] == "cuda.attention.flash" and not {s.name for s in NEW} & set(names128)
    assert all(s.priority < BY_NAME["cuda.attention.flash"].priority for s in NEW)


def test_every_shape_fits_the_shared_memory_of_every_sm80_gpu():
    for shape in SHAPES:
        for head in shape.heads:
            assert shape.smem(head) == (shape.block_q + 4 * shape.block_kv(head)) * head * 2 <= SMEM_LIMIT


def test_one_m_tile_kernels_keep_their_defines_and_the_new_shapes_compile_theirs_in():
    flash, q128, kv128 = (BY_NAME[n] for n in ("cuda.attention.flash", "cuda.attention.flash_q128",
                                               "cuda.attention.flash_kv128"))
    assert dict(flash.kernel("half_t", 64).defines) == {"BKV": "64", "ELEM": "half_t", "HD": "64"}
    assert dict(flash.kernel("half_t", 256).defines)["BKV"] == "32"
    assert dict(q128.kernel("bf16_t", 64).defines) == {"BKV": "64", "ELEM": "bf16_t", "HD": "64", "ROWS": "2"}
    assert dict(kv128.kernel("half_t", 32).defines) == {"BKV": "128", "ELEM": "half_t", "HD": "32"}


def test_the_kernel_source_defaults_to_one_m_tile_and_sizes_its_query_tile_from_rows():
    src = (CUDA_DIR / "flash_attention.cu").read_text()
    assert re.search(r"#ifndef ROWS\n#define ROWS 1\n#endif\n#define BQ \(64 \* ROWS\)", src)


@pytest.mark.parametrize("name", [s.name for s in SHAPES])
@pytest.mark.parametrize("S", EDGES)
def test_launch_covers_the_queries_in_blocks_of_the_shapes_rows_with_its_shared_memory(name, S):
    shape = BY_NAME[name]
    head = 64
    layer = layer_for(_arrays((2, 3, S, head), (2, 3, 77, head), FP16), (2, 3, S, head))
    rec = GridRecorder()
    _enqueue_of(shape)(layer, rec, _tensors(layer, FP16))
    ((kernel, grid, block, smem),) = rec.launches
    assert kernel == shape.kernel("half_t", head, masked=False)  # no mask input: the mask pass compiled out
    assert kernel in _kernels_of(shape)(layer)  # what the build compiles for the layer is what runs
    assert grid == (-(-S // shape.block_q), 3, 2) and block == (128,) and smem == shape.smem(head)
    assert flash_launch(layer, _tensors(layer, FP16)).grid == (-(-S // 64), 3, 2)  # the default block_q


# ---- CPU: the kernel's row ownership, emulated --------------------------------------------------

def stored_rows(shape: FlashShape, bx: int, warp: int, lane: int) -> list[int]:
    """The query rows thread (warp, lane) of block bx stores (flash_attention.cu: row_a = q0 + warp ROWS 16
    + g, then rows row_a + 16 m and row_a + 16 m + 8 of m-tile m, g = lane / 4)."""
    row_a = bx * shape.block_q + warp * shape.rows * 16 + lane // 4
    return [row_a + 16 * m + 8 * i for m in range(shape.rows) for i in (0, 1)]


def fragment_rows(shape: FlashShape, bx: int, warp: int, lane: int) -> list[int]:
    """The query rows whose Q fragments thread (warp, lane) holds: for m-tile m each lane gives ldmatrix.x4
    the Q tile row (warp ROWS + m) 16 + lane % 16; matrix j takes the rows of lanes 8j .. 8j + 7 and hands
    lane its row lane / 4, so registers a0..a3 (m16n8k16's A: rows g, g + 8, g, g + 8) hold those rows."""
    out = []
    for m in range(shape.rows):
        addressed = [(warp * shape.rows + m) * 16 + (x % 16) for x in range(32)]
        a = [addressed[8 * j + lane // 4] for j in range(4)]
        assert a[0] == a[2] and a[1] == a[3] == a[0] + 8, "the A fragment's rows g and g + 8"
        assert 0 <= a[0] and a[1] < shape.block_q, "ldmatrix reads inside the Q tile"
        out += [bx * shape.block_q + a[0], bx * shape.block_q + a[1]]
    return out


@pytest.mark.parametrize("name", [s.name for s in SHAPES])
@pytest.mark.parametrize("S", EDGES)
@pytest.mark.parametrize("head", [32, 64])
def test_every_query_row_and_column_is_stored_once_by_the_thread_that_holds_its_q_fragments(name, S, head):
    shape = BY_NAME[name]
    blocks = -(-S // shape.block_q)
    written = np.zeros((blocks * shape.block_q, head), np.int64)
    for bx in range(blocks):
        for warp in range(4):
            for lane in range(32):
                rows = stored_rows(shape, bx, warp, lane)
                assert rows == fragment_rows(shape, bx, warp, lane)
                assert all(bx * shape.block_q <= r < (bx + 1) * shape.block_q for r in rows)
                t4 = lane % 4
                cols = [8 * j + 2 * t4 + e for j in range(head // 8) for e in (0, 1)]  # flash_store_pairs
                for r in rows:
                    if r < S:  # rows past S are not stored
                        written[r, cols] += 1
    assert (written[:S] == 1).all() and not written[S:].any()


# ---- GPU: the new shapes against the reference ---------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", [s.name for s in NEW])
@pytest.mark.parametrize("S", EDGES)
@pytest.mark.parametrize("head", [32, 64])
def test_new_shapes_match_the_reference_at_the_tile_edges(name, S, head):
    Skv = {1: 1, 63: 129, 64: 64, 65: 200, 127: 63, 128: 128, 129: 65, 1500: 1500}[S]
    inputs = _arrays((1, 2, S, head), (1, 2, Skv, head), FP16)
    check(layer_for(inputs, (1, 2, S, head)), inputs, 3e-3, name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [s.name for s in NEW])
@pytest.mark.parametrize("kind", ["add", "bool", "causal"])
def test_new_shapes_with_masks_and_rows_past_the_sequence(name, kind):
    S, Skv = 150, 203
    inputs = _arrays((2, 3, S, 64), (2, 3, Skv, 64), FP16)
    if kind == "add":
        inputs["mask"] = (rng.standard_normal((2, 1, S, Skv)) * 3).astype(np.float16)
    elif kind == "bool":
        inputs["mask"] = rng.random((1, 3, S, Skv)) > 0.4
        inputs["mask"][0, 1, 77] = False  # one undefined row: NaN like the reference
    else:
        inputs["mask"] = np.tril(np.ones((S, Skv), bool), Skv - S)
    check(layer_for(inputs, (2, 3, S, 64)), inputs, 3e-3, name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [s.name for s in NEW])
def test_new_shapes_read_and_write_bshd_with_undefined_rows_zeroed(name):
    B, S, H, D = 2, 131, 4, 64
    inputs = _arrays((B, S, H, D), (B, S, H, D), FP16)
    mask = rng.random((B, 1, S, S)) > 0.3
    mask[1, 0, 129] = False
    inputs["mask"] = mask
    layer = layer_for(inputs, (B, S, H, D), layout="bshd", scale=0.1)
    check(replace(layer, attrs=dict(layer.attrs, nan_probs_to_zero=1)), inputs, 3e-3, name)


def test_a_layer_without_a_mask_compiles_the_mask_pass_out_and_a_masked_one_keeps_it():
    """FLASH_MASKED=0 only where the layer has no mask input, in every flash family (mma.sync, fp32, sm90):
    the build compiles and the enqueue launches the same variant."""
    from polykit.kernels.cuda.attention import flash_attention_f32, flash_attention_sm90

    q = _arrays((2, 3, 40, 64), (2, 3, 40, 64), FP16)
    plain = layer_for(q, (2, 3, 40, 64))
    masked = layer_for({**q, "M": np.zeros((2, 1, 40, 40), np.float16)}, (2, 3, 40, 64))
    assert masked.inputs[3] and not (len(plain.inputs) > 3 and plain.inputs[3])
    kernels = [_kernels_of(SHAPES[0]), flash_attention_sm90._kernels(flash_attention_sm90.SHAPES[0])]
    for fn in kernels:
        assert dict(fn(plain)[0].defines)["FLASH_MASKED"] == "0"
        assert "FLASH_MASKED" not in dict(fn(masked)[0].defines)
    f32 = {"FLASH_MASKED": "0"}.items() <= dict(flash_attention_f32.kernel_for(64, 3, masked=False).defines).items()
    assert f32 and "FLASH_MASKED" not in dict(flash_attention_f32.kernel_for(64, 3).defines)
    src = (CUDA_DIR / "flash_common.cuh").read_text()  # the macro gates the shared softmax's mask pass
    assert re.search(r"#if FLASH_MASKED\n  if \(mask\.kind != 0\) flash_mask_tile", src)
