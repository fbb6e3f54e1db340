"""Grouped convolution channels last on tensor cores: ai.polykit ConvNHWC with group > 1 and
multiples of 8 input and output channels a group (ResNeXt stages 2-4, RegNet), float16 / bfloat16
storage: per group an implicit GEMM (pixels x output channels x KH*KW*cpg) on mma.sync m16n8k16
with fp32 accumulation, a block covering a spatial tile x CB output channels of several groups (or
part of one), the input window and the weights staged in shared memory once; the bias and the
layer's epilogue fused.

Tactics, kind "ConvNHWC" (the builder times them against each other and cuda.conv_nhwc.grouped_p4 / _p2):
  cuda.conv_nhwc.grouped_mma_p32      conv_grouped_mma.cu: 32-bit fragment loads from shared memory,
                                      the whole window staged (16-byte loads) before the MMAs
  cuda.conv_nhwc.grouped_mma_pipe_p32 conv_grouped_mma_pipe.cu: ldmatrix fragments from a
                                      conflict-free layout (a row's columns split by W-stride
                                      phase: a stride-2 tile reads consecutive slots), 16-byte
                                      cp.async staging in commit groups by kernel row (row 0's
                                      MMAs run while the later rows land), channel slices of a
                                      tile in consecutive blocks (their reads of a pixel meet in L2)
  cuda.conv_nhwc.grouped_mma_persist_p32  the same kernel (GM_PERSIST) with blocks looping over every
                                      image's tiles: weights staged once a block, the next window
                                      cp.async'd into a second buffer while the block computes
Each warp computes 32 output pixels (two m16 tiles) x GM_NB n8 tiles of one group (the largest of
4, 3, 2, 1 dividing Mg / 8); blocks of up to 8 warps. `plan_mma` picks the tile (channels, pixel
warps, tile width: powers of two or the output's width, rows up to the block's pixels, the rest
masked) at enqueue time by tile_cost (tensor-core MACs at MMA_SPEEDUP lanes, staged elements with
sectors under 32 bytes priced whole, the SMs the blocks fill, resident warps); PERSIST's blocks a
slice by persist_ctas (enough to fill every SM). Every variant writes its output a pixel row at a
time with a runtime row stride (conv_grouped_mma.cuh's gm_store, LDY), so it places a channels-last
Concat's input (places_last_axis); pair stores only where the rows stay 4-byte aligned.

conv_halo_mma.py runs dense (group 1) convs of few channels on the PIPE and PERSIST kernels under
tactic names of its own: plan_mma and the tactic hooks (kernels_of, plan_of, estimate_of,
launch_of) take the window helper; mma_slices, tile_cost and predict handle a group of M channels.

`predict` gives each launch's roofline. ResNeXt-50's tensor-core layers at batch 32, fp16 (H200
constants HBM 4.0 TB/s, L2 -> SM 10 TB/s, mma.sync 600 TFLOP/s; tile TH x TW x CB, threads, blocks,
shared memory; GFLOP of the launched MMAs, DRAM MB, MB staged from L2; us the larger at those
rates; cuDNN channels_last and the old grouped_mma as measured 2026-12-05):
  layer                    variant  tile       thr blocks  smem | GFLOP DRAM staged   us | cuDNN  old
  1x 3x3/2 C256/8  56->28  mma      28x4x16    256  3584  26.8K |  1.17 64.3   67.1 16.1 |  49.9 97.1
                           pipe     28x4x16    256  3584  29.5K |  1.17 64.3   67.1 16.1 |
                           persist  28x4x16    256   256  56.2K |  1.17 64.3   59.4 16.1 |
  3x 3x3/1 C256/8  28->28  mma      28x4x16    256  3584  11.2K |  1.17 25.7   28.9  6.4 |  47.1 63.2
                           pipe     28x4x16    256  3584  11.2K |  1.17 25.7   28.9  6.4 |
                           persist  28x4x16    256   256  19.6K |  1.17 25.7   21.2  6.4 |
  1x 3x3/2 C512/16 28->14  mma      14x7x16    128  2048  25.1K |  1.21 32.3   37.9  8.1 |  29.9 44.0
                           pipe     14x14x16   256  1024  45.5K |  1.21 32.3   32.3  8.1 |
                           persist  14x14x16   256   256  86.3K |  1.21 32.3   28.7  8.1 |
  5x 3x3/1 C512/16 14->14  mma      14x7x16    128  2048  11.5K |  1.21 13.0   18.9  3.2 |  28.0 33.9
                           pipe     14x14x16   256  1024  16.8K |  1.21 13.0   13.1  3.2 |
                           persist  14x14x16   256   256  28.8K |  1.21 13.0    9.6  3.2 |
  1x 3x3/2 C1024/32 14->7  mma      7x7x32      64  1024  36.1K |  1.21 16.6   33.6  4.2 |  20.0 41.1
                           pipe     7x7x32      64  1024  37.2K |  1.21 16.6   33.6  4.2 |
                           persist  7x7x32      64   352  56.0K |  1.21 16.6   21.2  4.2 |
  2x 3x3/1 C1024/32 7->7   mma      7x7x32      64  1024  24.8K |  1.21  7.0   24.2  2.4 |  18.6 22.2
                           pipe     7x7x32      64  1024  24.8K |  1.21  7.0   24.2  2.4 |
                           persist  7x7x32      64   512  31.2K |  1.21  7.0   14.7  2.0 |
  13 layers: roofline ~68 us (DRAM-bound: every layer's MMAs take under 2 us), cuDNN 418 us, the
  old grouped_mma 586 us: the measured times are latency (staging round trips, block launches),
  which the pipelined and persistent variants attack; the GPU measures which wins.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor, KernelSource, defines, places_last_axis
from polykit.kernels.cuda.conv.conv_depthwise import (MAX_GRID_YZ, SM_SMEM, STAGE_COST, WARPS_HIDING, TilePlan,
                                                      TileVariant, epilogue_layers, register, tile_enqueue,
                                                      tile_estimate, tile_kernel, tile_rows, tile_sizes,
                                                      tile_supports)
from polykit.kernels.cuda.conv.conv_grouped import GroupedWindow, grouped_window, slice_groups

#: storage dtype -> ELEM (16-bit storage only: the mma operands)
ELEMS = {"float16": "half_t", "bfloat16": "bf16_t"}
#: m16 tiles a warp (compile time)
WARP_TILES = 2
#: n8 tiles a warp (compile time): the largest dividing Mg / 8
WARP_N8 = (4, 3, 2, 1)
MAX_WARPS = 8
#: dynamic shared memory a block may use (opted in above 48 KiB; two blocks an SM still fit)
MMA_SMEM_LIMIT = 99 * 1024
#: tensor-core MACs a lane-cycle of FMA issue (what tile_cost divides the MMA work by)
MMA_SPEEDUP = 8

#: the first kernel: 32-bit fragment loads, the whole window staged before the MMAs
MMA = TileVariant(16 * WARP_TILES, 32 * MAX_WARPS, 1, "grouped_mma")
#: ldmatrix fragments, cp.async staging by kernel row, the stride-phase column layout
PIPE = TileVariant(16 * WARP_TILES, 32 * MAX_WARPS, 3, "grouped_mma_pipe")
#: PIPE's kernel with blocks looping over tiles: weights staged once a block, each next window
#: copied into a second buffer while the block computes the current one
PERSIST = TileVariant(16 * WARP_TILES, 32 * MAX_WARPS, 2, "grouped_mma_persist")
VARIANTS = (MMA, PIPE, PERSIST)
#: variant -> (source file, kernel, GM_PERSIST)
SOURCES = {MMA: ("conv_grouped_mma.cu", "conv_grouped_mma_nhwc", None),
           PIPE: ("conv_grouped_mma_pipe.cu", "conv_grouped_mma_pipe_nhwc", 0),
           PERSIST: ("conv_grouped_mma_pipe.cu", "conv_grouped_mma_pipe_nhwc", 1)}


#: a window helper: (attrs, X shape, W shape) -> the GroupedWindow a tactic takes, or None
WindowOf = Callable[[Mapping[str, Any], Sequence[Any], Sequence[Any]], "GroupedWindow | None"]


def mma_window(attrs: Mapping[str, Any], x: Sequence[Any], w: Sequence[Any]) -> GroupedWindow | None:
    """grouped_window, when a group has a multiple of 8 input and of 8 output channels."""
    win = grouped_window(attrs, x, w)
    return win if win is not None and win.cpg % 8 == 0 and win.mg % 8 == 0 else None


def warp_n8(mg: int) -> int:
    """GM_NB for a group of `mg` output channels (a multiple of 8)."""
    return next(nb for nb in WARP_N8 if (mg // 8) % nb == 0)


def k_slots(win: GroupedWindow) -> int:
    """Elements a staged weight row takes: K = KH*KW*cpg rounded up to 16, plus 8 (an odd number
    of 16-byte chunks: ldmatrix rows of 8 channels on 8 bank groups)."""
    k = win.kernel[0] * win.kernel[1] * win.cpg
    return -(-k // 16) * 16 + 8


def cin_slots(win: GroupedWindow, cb: int) -> int:
    """Elements a staged pixel takes: the slice's groups' channels, plus 8 where that makes an odd
    number of 16-byte chunks (8 consecutive pixels on 8 bank groups)."""
    c = slice_groups(cb, win.mg) * win.cpg
    return c if (c // 8) % 2 else c + 8


def row_slots(win: GroupedWindow, tw: int) -> int:
    """Pixel slots a staged input row of a `tw`-wide tile takes: its columns split by W-stride
    phase, each phase ceil(IW / SW) slots."""
    (_, KW), (_, SW), (_, DW) = win.kernel, win.strides, win.dilations
    return SW * -(-((tw - 1) * SW + (KW - 1) * DW + 1) // SW)


def mma_smem(win: GroupedWindow, cb: int, th: int, tw: int, variant: TileVariant) -> int:
    """Bytes of the input tile (PERSIST: two) and the CB weight rows: PIPE's rows row_slots x
    cin_slots, MMA's IW pixels of the slice's channels + 8."""
    (KH, KW), (SH, SW), (DH, DW) = win.kernel, win.strides, win.dilations
    if variant == MMA:
        pixels = tile_rows(th, SH, KH, DH) * ((tw - 1) * SW + (KW - 1) * DW + 1)
        return 2 * (pixels * (slice_groups(cb, win.mg) * win.cpg + 8) + cb * k_slots(win))
    windows = 2 if variant == PERSIST else 1
    return 2 * (windows * tile_rows(th, SH, KH, DH) * row_slots(win, tw) * cin_slots(win, cb) + cb * k_slots(win))


@dataclass(frozen=True)
class MmaPlan(TilePlan):
    """A grouped ConvNHWC as conv_grouped_mma.cu runs it (TilePlan's p 1, TWT the tile width)."""

    G: int       # groups
    nb: int      # n8 tiles a warp
    CB: int      # output channels a block
    CW: int      # channel warps (CB / (8 nb))
    PWARPS: int  # pixel warps (16 * WARP_TILES pixels each, TH * TWT of them in the tile)
    smem: int
    slices_first: bool = False   # grid x the channel slices, y the tiles (PIPE, PERSIST), else the reverse
    ctas: int = 0                # PERSIST: blocks a slice, looping over the images' tiles

    @property
    def grid(self) -> tuple[int, int, int]:
        tiles, slices = -(-self.OH // self.TH) * self.tiles_w, -(-self.M // self.CB)
        if self.ctas:
            return (slices, self.ctas, 1)
        return (slices, tiles, self.NB) if self.slices_first else (tiles, slices, self.NB)

    @property
    def block(self) -> tuple[int]:
        return (32 * self.CW * self.PWARPS,)

    def args(self, vec_in: bool, vec_out: bool) -> list[Any]:
        i32 = np.int32
        return [i32(a) for a in (self.H, self.W, self.C, self.M, self.G, self.OH, self.OW, self.KH, self.KW, self.SH,
                                 self.SW, self.PH, self.PW, self.DH, self.DW, self.TH, self.TWT, self.CB, self.CW,
                                 self.tiles_w, self.NB, vec_in, vec_out)]


def mma_slices(win: GroupedWindow) -> list[int]:
    """Output channels a block may take: multiples of a warp's 8 nb channels, at most MAX_WARPS
    warps of them, whole groups or part of one (group 1: M or a divisor of it, never past M)."""
    step = 8 * warp_n8(win.mg)
    whole = (lambda cb: False) if win.G == 1 else (lambda cb: cb % win.mg == 0)
    return [cb for cb in range(step, step * MAX_WARPS + 1, step) if whole(cb) or win.mg % cb == 0]


def sector_factor(G: int, cin: int, itemsize: int = 2) -> float:
    """L2 bytes read a staged input byte: a grouped slice's `cin` channels are part of each pixel,
    so under 32 bytes a pixel its sector is read whole; a dense (group 1) slice reads every channel
    of consecutive pixels, whole sectors."""
    return 1.0 if G == 1 else max(1.0, 32 / (itemsize * cin))


#: SMs the tile choice spreads a launch over (H200: 132); fewer blocks leave SMs idle
SMS = 132


def tile_widths(OW: int, tp: int) -> list[int]:
    """Tile widths for a block of `tp` pixels: powers of two from 4 and the output's width (and
    half of it, rounded up) where a row fits, so 7- and 14-wide outputs waste no columns."""
    return sorted({tw for tw in (4, 8, 16, 32, 64, OW, -(-OW // 2)) if 1 <= tw <= tp})


def tile_cost(win: GroupedWindow, OH: int, OW: int, images: int, th: int, tw: int, cb: int, pw: int,
              smem: int, variant: TileVariant) -> float:
    """choose_mma_tile's cost of a launch (arbitrary units, lower is better): tensor-core MACs of
    the launched tiles (masked pixels and K padding included) over MMA_SPEEDUP plus STAGE_COST a
    staged input element (times 32 bytes over the slice's bytes a pixel where that is under a
    sector, sector_factor; group 1 reads whole pixels), spread over the SMs the blocks fill, times
    the latency not hidden below WARPS_HIDING resident warps an SM (warps with pixels to compute;
    PERSIST, its next window in flight while it computes, half as many). PERSIST stages the
    weights once a block (persist_ctas blocks a slice), the others once a tile."""
    (KH, KW), (SH, SW), (DH, DW) = win.kernel, win.strides, win.dilations
    nb, kp = warp_n8(win.mg), k_slots(win) - 8
    warps, tp, cin = cb // (8 * nb) * pw, pw * 16 * WARP_TILES, slice_groups(cb, win.mg) * win.cpg
    slices, tiles = -(-win.M // cb), -(-OH // th) * -(-OW // tw) * images
    resident = resident_blocks(smem, warps, variant)
    ctas = persist_ctas(tiles, slices, resident) if variant == PERSIST else tiles
    blocks = slices * ctas
    pixels = tile_rows(th, SH, KH, DH) * ((tw - 1) * SW + (KW - 1) * DW + 1)
    staged = slices * (tiles * pixels * cin * sector_factor(win.G, cin) + ctas * cb * kp)
    work = slices * tiles * tp * cb * kp / MMA_SPEEDUP
    per_sm = min(resident, max(1.0, blocks / SMS))
    busy = cb // (8 * nb) * -(-min(th, OH) * min(tw, OW) // (16 * WARP_TILES))   # warps with pixels
    hiding = WARPS_HIDING / (2 if variant == PERSIST else 1)
    return (work + STAGE_COST * staged) / min(SMS, blocks) * max(1.0, hiding / (per_sm * busy))


def resident_blocks(smem: int, warps: int, variant: TileVariant) -> int:
    """Blocks of `warps` warps and `smem` bytes an SM holds (registers a thread from the variant's
    __launch_bounds__)."""
    regs = 65536 // (variant.threads * variant.min_blocks)
    return max(1, min(32, SM_SMEM // (smem + 1024), 64 // warps, 65536 // (regs * 32 * warps)))


def persist_ctas(tiles: int, slices: int, resident: int) -> int:
    """PERSIST's blocks a channel slice for `tiles` tiles (all images'): enough for `resident`
    blocks on each of SMS SMs, at most one a tile, the tiles spread evenly over them."""
    ctas = max(1, min(tiles, -(-SMS * resident // slices)))
    return -(-tiles // -(-tiles // ctas))


@functools.lru_cache(maxsize=4096)
def choose_mma_tile(OH: int, OW: int, win: GroupedWindow, images: int = 1, variant: TileVariant = PIPE,
                    smem_limit: int = MMA_SMEM_LIMIT) -> tuple[int, int, int, int, int] | None:
    """(TH, TW, CB, pixel warps, smem bytes) of the cheapest tile (tile_cost) that fits, or None.
    Candidates: every slice (mma_slices), 1 to MAX_WARPS / channel warps pixel warps, the
    tile_widths of the block's pixels, as many rows as the pixels fill (at most OH)."""
    nb = warp_n8(win.mg)
    best: tuple[float, tuple[int, int, int, int, int]] | None = None
    for cb in mma_slices(win):
        cw = cb // (8 * nb)
        pw = 1
        while cw * pw <= MAX_WARPS:
            tp = pw * 16 * WARP_TILES
            for tw in tile_widths(OW, tp):
                th = min(tp // tw, OH)
                smem = mma_smem(win, cb, th, tw, variant)
                if smem > smem_limit:
                    continue
                cost = tile_cost(win, OH, OW, images, th, tw, cb, pw, smem, variant)
                if best is None or cost < best[0]:
                    best = (cost, (th, tw, cb, pw, smem))
            pw *= 2
    return None if best is None else best[1]


def plan_mma(attrs: Mapping[str, Any], x: Sequence[int], w: Sequence[int], y: Sequence[int],
             storage: str, variant: TileVariant = PIPE, smem_limit: int = MMA_SMEM_LIMIT,
             window_of: WindowOf = mma_window) -> MmaPlan | None:
    """The launch of a ConvNHWC whose window `window_of` takes (mma_window: grouped;
    conv_halo_mma.halo_window: dense) on `variant`'s kernel, or None when it cannot run it."""
    win = window_of(attrs, x, w)
    sizes = tile_sizes(attrs, win, x, y, win.cpg if win else 1)
    if win is None or sizes is None or storage not in ELEMS:
        return None
    tile = choose_mma_tile(sizes[4], sizes[5], win, sizes[0], variant, smem_limit)
    if tile is None:
        return None
    th, tw, cb, pw, smem = tile
    nb = warp_n8(win.mg)
    ctas = 0
    if variant == PERSIST:
        tiles = -(-sizes[4] // th) * -(-sizes[5] // tw) * sizes[0]
        ctas = persist_ctas(tiles, -(-win.M // cb), resident_blocks(smem, cb // (8 * nb) * pw, variant))
    out = MmaPlan(*sizes[:4], win.M, *sizes[4:6], *win.kernel, *win.strides, *sizes[6:], *win.dilations, 1, th, tw,
                  win.G, nb, cb, cb // (8 * nb), pw, smem, variant != MMA, ctas)
    return out if out.grid[1] <= MAX_GRID_YZ and out.grid[0] < 2**31 else None


#: roofline constants of predict (H200, sustained rather than peak): HBM, L2 -> SM staging reads,
#: mma.sync m16n8k16 fp16 / bf16 with fp32 accumulation
HBM_BPS, L2_BPS, MMA_FLOPS = 4.0e12, 10.0e12, 600e12


def predict(plan: MmaPlan, itemsize: int = 2, hbm_bps: float = HBM_BPS) -> dict[str, float]:
    """A launch's roofline: `flops` of the launched MMAs (masked pixels, K padding and channel
    tails included), `dram` bytes (X, W, Y once), `staged` bytes read from L2 into shared memory
    (every block's input window, a sector at least a pixel where groups split it, and its weight
    rows), and `us`, the largest of the three at `hbm_bps`, L2_BPS and MMA_FLOPS (latency not
    modelled). PERSIST stages the weights once a block, the others once a tile."""
    slices, tiles = -(-plan.M // plan.CB), -(-plan.OH // plan.TH) * plan.tiles_w * plan.NB
    K = plan.KH * plan.KW * (plan.C // plan.G)
    flops = 2.0 * slices * tiles * plan.PWARPS * 32 * plan.CB * -(-K // 16) * 16
    cin = max(1, plan.CB // (plan.M // plan.G)) * (plan.C // plan.G)
    pixels = ((plan.TH - 1) * plan.SH + (plan.KH - 1) * plan.DH + 1) * ((plan.TWT - 1) * plan.SW
                                                                       + (plan.KW - 1) * plan.DW + 1)
    pixel = max(32, cin * itemsize) if plan.G > 1 else cin * itemsize   # sector_factor
    staged = slices * (tiles * pixels * pixel + (plan.ctas or tiles) * plan.CB * K * itemsize)
    dram = (plan.NB * (plan.H * plan.W * plan.C + plan.OH * plan.OW * plan.M) + plan.M * K) * itemsize
    return {"flops": flops, "dram": dram, "staged": staged,
            "us": 1e6 * max(dram / hbm_bps, staged / L2_BPS, flops / MMA_FLOPS)}


def smallest_smem(win: GroupedWindow, variant: TileVariant, itemsize: int) -> int:
    """The smallest slice and a 16 x 2 pixel tile (past the limit for 32-bit storage)."""
    if itemsize != 2:
        return MMA_SMEM_LIMIT + 1
    return mma_smem(win, min(mma_slices(win), default=0) or 1 << 20, 16, 2, variant)


def kernel_source(layer: Any, elem: str, nb: int, variant: TileVariant = PIPE) -> KernelSource:
    """`variant`'s kernel for `elem` (half_t / bf16_t) with `nb` n8 tiles a warp."""
    file, kernel, persist = SOURCES[variant]
    shape = {"GM_WM": WARP_TILES, "GM_NB": nb, "GM_BF16": int(elem == "bf16_t")}
    if persist is not None:
        shape["GM_PERSIST"] = persist
    return tile_kernel(layer, elem, kernel, file, defines(**shape))


def kernels_of(variant: TileVariant, window_of: WindowOf = mma_window):
    """kernels(layer) of a tactic on `variant`'s kernel: the layer's storage and n8 count where its
    shapes say (`window_of` its window), else every one."""

    def kernels(layer: Any) -> list[KernelSource]:
        shapes = tuple(getattr(layer, "in_shapes", ()) or ())
        win = window_of(layer.attrs, shapes[0], shapes[1]) if len(shapes) > 1 else None
        storage = (tuple(getattr(layer, "out_dtypes", ()) or ()) + ("",))[0]
        elems = [ELEMS[storage]] if storage in ELEMS else list(ELEMS.values())
        nbs = [warp_n8(win.mg)] if win else list(WARP_N8)
        return [kernel_source(layer, e, nb, variant) for e in elems for nb in nbs]

    return kernels


def _macs(plan: MmaPlan) -> int:
    """The launched MACs (predict's flops / 2) over MMA_SPEEDUP (tile_estimate's FMA count)."""
    return int(predict(plan)["flops"] // (2 * MMA_SPEEDUP))


def launch_of(variant: TileVariant):
    """launch_of(layer, plan, elem, X, W, Y) of tile_enqueue: `variant`'s kernel with the plan's n8
    count, 16-byte staging where X and W are 16-byte aligned, pair stores where Y is 4-byte aligned
    and its pixel rows (a Concat's slice where Y is placed there) an even number of elements apart."""

    def launch(layer: Any, plan: MmaPlan, elem: str, X: DeviceTensor, Wt: DeviceTensor,
               Y: DeviceTensor) -> tuple[KernelSource, bool, bool]:
        vec_out = Y.ptr % 4 == 0 and Y.rows_apart(plan.M) % 2 == 0
        return kernel_source(layer, elem, plan.nb, variant), X.ptr % 16 == 0 and Wt.ptr % 16 == 0, vec_out

    return launch


def plan_of(variant: TileVariant, window_of: WindowOf = mma_window):
    """plan(attrs, x, w, y, storage) of a tactic on `variant`'s kernel taking `window_of`'s layers."""
    return lambda attrs, x, w, y, storage: plan_mma(attrs, x, w, y, storage, variant, window_of=window_of)


def estimate_of(variant: TileVariant, window_of: WindowOf = mma_window):
    """estimate(layer, sm_count) of a tactic on `variant`'s kernel: tile_estimate of its plan, the
    launched MMAs at MMA_SPEEDUP times the FMA rate."""
    plan = plan_of(variant, window_of)
    return tile_estimate(lambda layer, storage: plan(layer.attrs, layer.in_shapes[0], layer.in_shapes[1],
                                                     layer.out_shapes[0], storage), _macs, 1)


def compile_variants() -> list[KernelSource]:
    """Each variant's every n8 count in half and bfloat16, and a residual + Relu epilogue in half."""
    shaped, _ = epilogue_layers(2, (1, 8, 8, 32), (32, 3, 3, 16))
    return [kernel_source(layer, e, nb, v) for v in VARIANTS
            for layer, e, nb in [(None, e, nb) for e in ELEMS.values() for nb in WARP_N8] + [(shaped, "half_t", 2)]]


register(VARIANTS, kernels_of, tile_supports(mma_window, smallest_smem, MMA_SMEM_LIMIT),
         estimate_of, lambda v: tile_enqueue("grouped tensor-core", plan_of(v), launch_of(v), row_stride=True),
         places_last_axis)
