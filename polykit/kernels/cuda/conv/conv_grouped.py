"""Grouped convolution channels last: ai.polykit ConvNHWC with 1 < group < C and at least two input
channels a group (ResNeXt, RegNet) on conv_grouped.cu, which stages an input tile (outputs + halo)
of the groups a block computes and their weights in shared memory as fp32 and computes GC_P output
columns x GC_V output channels of one group a thread in fp32; float32 / float16 / bfloat16
storage, the bias and the layer's epilogue fused.

Tactics, kind "ConvNHWC" (the builder times them against each other and the implicit GEMMs):
  cuda.conv_nhwc.grouped_p4  4 output columns a thread, blocks of up to 256 threads
  cuda.conv_nhwc.grouped_p2  2 output columns a thread, blocks of up to 128 threads
GC_V, the output channels a thread, is the largest of 8, 4, 2, 1 that divides the channels a
group writes (Mg = M / group), so a thread's channels share their inputs. `plan_grouped` picks the
block's tile from the layer's shapes at enqueue time, so one plan serves any input size; its cost
model is conv_depthwise's (FMA lanes of the launched tiles plus staging, over lane use, times the
latency not hidden).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor, KernelSource, defines
from polykit.kernels.cuda.conv.conv_depthwise import (ELEMS, MAX_GRID_YZ, SMEM_LIMIT, STAGE_COST, TilePlan,
                                                      TileVariant, _storage, epilogue_layers, latency_factor,
                                                      register, tile_cols, tile_enqueue, tile_estimate, tile_kernel,
                                                      tile_rows, tile_sizes, tile_supports)

FILE = "conv_grouped.cu"
KERNEL = "conv_grouped_nhwc"
#: output channels a thread (compile time): the largest that divides a group's output channels
THREAD_CHANNELS = (8, 4, 2, 1)
#: the most output channels a block's slice holds
MAX_SLICE = 128


GroupedVariant = TileVariant


VARIANTS = (TileVariant(4, 256, 2, "grouped"), TileVariant(2, 128, 4, "grouped"))


@dataclass(frozen=True)
class GroupedWindow:
    """The size-independent part of a grouped ConvNHWC: channels, groups and window."""

    C: int
    M: int
    G: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]

    @property
    def cpg(self) -> int:
        return self.C // self.G

    @property
    def mg(self) -> int:
        return self.M // self.G

    @property
    def v(self) -> int:
        return thread_channels(self.mg)


def thread_channels(mg: int) -> int:
    """GC_V for a group of `mg` output channels: the largest of THREAD_CHANNELS dividing it."""
    return next(v for v in THREAD_CHANNELS if mg % v == 0)


def grouped_window(attrs: Mapping[str, Any], x: Sequence[Any], w: Sequence[Any]) -> GroupedWindow | None:
    """The window of a ConvNHWC (X [N, H, W, C], W [M, KH, KW, C/group]) when it is grouped
    (1 < group, at least two input channels a group, C and M multiples of group), else None."""
    win = conv_window(attrs, x, w)
    return win if win is not None and win.G > 1 and win.cpg >= 2 else None


def conv_window(attrs: Mapping[str, Any], x: Sequence[Any], w: Sequence[Any]) -> GroupedWindow | None:
    """The window of any 2-D ConvNHWC (X [N, H, W, C], W [M, KH, KW, C/group]; group 1 too) whose
    channels, group and window are known and consistent, else None."""
    if len(x) != 4 or len(w) != 4 or not all(isinstance(d, int) for d in (x[3], *w)):
        return None
    C, (M, KH, KW, Cg) = int(x[3]), (int(d) for d in w)
    try:
        G = int(attrs.get("group", 1))
        strides = tuple(int(s) for s in attrs.get("strides") or (1, 1))
        dilations = tuple(int(d) for d in attrs.get("dilations") or (1, 1))
    except (TypeError, ValueError):
        return None
    if G < 1 or Cg < 1 or C != G * Cg or M <= 0 or M % G or min(KH, KW) <= 0:
        return None
    if len(strides) != 2 or len(dilations) != 2 or min(strides + dilations) <= 0:
        return None
    return GroupedWindow(C, M, G, (KH, KW), strides, dilations)


@dataclass(frozen=True)
class GroupedPlan(TilePlan):
    """A grouped ConvNHWC layer as conv_grouped.cu runs it: geometry and the block's tile (its
    TWT threads along a row take columns TWT apart)."""

    G: int     # groups
    v: int     # output channels a thread
    CB: int    # output channels a block
    CINP: int  # floats a staged pixel
    smem: int  # dynamic shared memory bytes

    @property
    def grid(self) -> tuple[int, int, int]:
        return (-(-self.OH // self.TH) * self.tiles_w, -(-self.M // self.CB), self.NB)

    @property
    def block(self) -> tuple[int]:
        return (self.CB // self.v * self.TWT * self.TH,)

    def args(self, vec_in: bool, vec_out: bool) -> list[Any]:
        i32 = np.int32
        return [i32(a) for a in (self.H, self.W, self.C, self.M, self.G, self.OH, self.OW, self.KH, self.KW, self.SH,
                                 self.SW, self.PH, self.PW, self.DH, self.DW, self.TH, self.TWT, self.CB, self.tiles_w,
                                 self.CINP, vec_in, vec_out)]


def quads(cpg: int) -> int:
    """Quads (4 input channels, zeros past cpg) a group's channels take in shared memory."""
    return -(-cpg // 4)


def slice_groups(cb: int, mg: int) -> int:
    """Groups whose inputs a slice of `cb` output channels reads (a slice is whole groups or part of one)."""
    return max(1, cb // mg)


def slices(win: GroupedWindow, threads: int) -> list[int]:
    """Output channels a block may take: multiples of GC_V up to MAX_SLICE and the block's threads
    that are whole groups (a multiple of Mg) or part of one (a divisor of Mg)."""
    v, mg = win.v, win.mg
    out, cb = [], v
    while cb <= min(MAX_SLICE, threads * v):
        if cb % mg == 0 or mg % cb == 0:
            out.append(cb)
        cb *= 2
    if mg <= MAX_SLICE and mg // v <= threads and mg not in out:
        out.append(mg)
    return out


def pixel_slots(cb: int, twt: int, th: int, v: int, mg: int, cpg: int, sh: int, sw: int, iw: int) -> int:
    """Floats a staged pixel takes: at least its groups' quads, and of the 8 counts from there (a
    multiple of 4 each) the one whose first warp's first input load hits the fewest 16-byte
    addresses on one bank group (the wavefronts it takes)."""
    gs = quads(cpg) * 4
    need = slice_groups(cb, mg) * gs
    vb = cb // v
    best = None
    for cinp in range(need, need + 32, 4):
        banks: dict[int, set[int]] = {}
        for t in range(min(32, vb * twt * th)):
            vv, q = t % vb, t // vb
            tw, row = q % twt, q // twt
            addr = ((row * sh * iw + tw * sw) * cinp + (vv * v // mg) * gs) // 4
            banks.setdefault(addr % 8, set()).add(addr)
        waves = max(len(a) for a in banks.values())
        if best is None or waves < best[0]:
            best = (waves, cinp)
    return best[1]


def smem_bytes(khw: int, nq: int, cb: int, ih: int, iw: int, cinp: int) -> int:
    """fp32 weights [tap][quad][CB][4], then the input tile [IH * IW][CINP]."""
    return 16 * khw * nq * cb + 4 * ih * iw * cinp


def plan_grouped(attrs: Mapping[str, Any], x: Sequence[int], w: Sequence[int], y: Sequence[int],
                 variant: GroupedVariant, smem_limit: int = SMEM_LIMIT) -> GroupedPlan | None:
    """The launch of a grouped ConvNHWC (X [NB, H, W, C], W [M, KH, KW, C/group], Y [NB, OH, OW, M])
    on `variant`, or None when conv_grouped.cu cannot run it (the tile: choose_tile)."""
    win = grouped_window(attrs, x, w)
    sizes = tile_sizes(attrs, win, x, y, win.cpg if win else 1)
    if win is None or sizes is None:
        return None
    tile = choose_tile(sizes[4], sizes[5], win, variant, smem_limit)
    if tile is None:
        return None
    th, twt, cb, cinp, smem = tile
    out = GroupedPlan(*sizes[:4], win.M, *sizes[4:6], *win.kernel, *win.strides, *sizes[6:], *win.dilations,
                      variant.p, th, twt, win.G, win.v, cb, cinp, smem)
    return out if out.grid[1] <= MAX_GRID_YZ and out.grid[0] < 2**31 else None


@functools.lru_cache(maxsize=4096)
def choose_tile(OH: int, OW: int, win: GroupedWindow, variant: GroupedVariant,
                smem_limit: int = SMEM_LIMIT) -> tuple[int, int, int, int, int] | None:
    """(TH, TWT, CB, CINP, smem bytes) of the cheapest tile that fits `smem_limit`, or None.

    Candidates: every slice (slices); as many threads along a row as it needs (up to the block's
    threads), half and a quarter of that; the most rows that fit, that many spread evenly over
    the image, half and a quarter of them (smaller blocks, more of them an SM). Cost: tile_cost."""
    p, threads, v = variant.p, variant.threads, win.v
    best: tuple[float, tuple[int, int, int, int, int]] | None = None
    for cb in slices(win, threads):
        vb = cb // v
        full = max(1, min(-(-OW // p), threads // vb))
        for twt in sorted({full, -(-full // 2), -(-full // 4)}):
            most = max(1, min(OH, threads // (vb * twt)))
            while most > 1 and _smem(most, twt, cb, p, win)[1] > smem_limit:
                most -= 1
            for th in {most, -(-OH // -(-OH // most)), -(-most // 2), -(-most // 4)}:
                cinp, smem = _smem(th, twt, cb, p, win)
                if smem > smem_limit:
                    continue
                cost = tile_cost(OH, OW, win, th, twt, cb, smem, variant)
                if best is None or cost < best[0]:
                    best = (cost, (th, twt, cb, cinp, smem))
    return None if best is None else best[1]


def _smem(th: int, twt: int, cb: int, p: int, win: GroupedWindow) -> tuple[int, int]:
    (KH, KW), (SH, SW), (DH, DW) = win.kernel, win.strides, win.dilations
    ih, iw = tile_rows(th, SH, KH, DH), tile_cols(twt, p, SW, KW, DW)
    cinp = pixel_slots(cb, twt, th, win.v, win.mg, win.cpg, SH, SW, iw)
    return cinp, smem_bytes(KH * KW, quads(win.cpg), cb, ih, iw, cinp)


def tile_cost(OH: int, OW: int, win: GroupedWindow, th: int, twt: int, cb: int, smem: int,
              variant: GroupedVariant) -> float:
    """choose_tile's cost of one image's launch on a tile (arbitrary units, lower is better): FMA
    lanes of the launched tiles (padding rows, columns, channels and quads included) plus
    STAGE_COST a staged input or weight element, over the warps' lane use, times the latency not
    hidden below WARPS_HIDING warps an SM."""
    (KH, KW), (SH, SW), (DH, DW) = win.kernel, win.strides, win.dilations
    p, gs = variant.p, quads(win.cpg) * 4
    t = cb // win.v * twt * th
    blocks = -(-OH // th) * -(-OW // (twt * p)) * -(-win.M // cb)
    work = blocks * t * p * win.v * KH * KW * gs
    staged = blocks * (tile_rows(th, SH, KH, DH) * tile_cols(twt, p, SW, KW, DW) * slice_groups(cb, win.mg) * gs
                       + KH * KW * gs * cb)
    return (work + STAGE_COST * staged) * latency_factor(t, smem, variant)


def _smallest_smem(win: GroupedWindow, variant: TileVariant, itemsize: int) -> int:
    """One row, one thread along it, the smallest slice (at most SMEM_LIMIT + 1 without a slice)."""
    (kh, kw), (sh, sw), (dh, dw) = win.kernel, win.strides, win.dilations
    cb = min(slices(win, variant.threads), default=0)
    if not cb:
        return SMEM_LIMIT + 1
    return smem_bytes(kh * kw, quads(win.cpg), cb, tile_rows(1, sh, kh, dh), tile_cols(1, variant.p, sw, kw, dw),
                      slice_groups(cb, win.mg) * quads(win.cpg) * 4)


def kernel_source(layer: Any, elem: str, variant: GroupedVariant, v: int) -> KernelSource:
    """conv_grouped_nhwc for `elem` storage, the variant's shape and `v` output channels a thread,
    with the layer's epilogue when it has one."""
    return tile_kernel(layer, elem, KERNEL, FILE, defines(GC_P=variant.p, GC_THREADS=variant.threads,
                                                         GC_MIN_BLOCKS=variant.min_blocks, GC_V=v))


def _thread_channels_of(layer: Any) -> list[int]:
    """GC_V of a layer from its weight shape [M, KH, KW, cpg] and group (every one when unknown)."""
    shapes = tuple(getattr(layer, "in_shapes", ()) or ())
    try:
        m, g = int(shapes[1][0]), int(layer.attrs.get("group", 1))
    except (IndexError, TypeError, ValueError):
        return list(THREAD_CHANNELS)
    return [thread_channels(m // g)] if g > 0 and m > 0 and m % g == 0 else list(THREAD_CHANNELS)


def _kernels(variant: GroupedVariant):
    def kernels(layer: Any) -> list[KernelSource]:
        storage = _storage(layer)
        elems = [ELEMS[storage][0]] if storage else [e for e, _ in ELEMS.values()]
        return [kernel_source(layer, e, variant, v) for e in elems for v in _thread_channels_of(layer)]

    return kernels


def _grouped_fmas(plan: GroupedPlan) -> int:
    return (plan.NB * -(-plan.OH // plan.TH) * plan.TH * plan.tiles_w * plan.TWT * plan.p * plan.grid[1] * plan.CB
            * plan.KH * plan.KW * quads(plan.C // plan.G) * 4)


def _grouped_launch(variant: GroupedVariant):
    def launch_of(layer: Any, plan: GroupedPlan, elem: str, X: DeviceTensor, Wt: DeviceTensor,
                  Y: DeviceTensor) -> tuple[KernelSource, bool, bool]:
        return kernel_source(layer, elem, variant, plan.v), plan.C % 8 == 0 and X.ptr % 16 == 0, Y.ptr % 16 == 0

    return launch_of


def _plan_of(variant: GroupedVariant):
    return lambda attrs, x, w, y, storage: plan_grouped(attrs, x, w, y, variant)


def compile_variants() -> list[KernelSource]:
    """Every channels-a-thread count for each tactic in half storage; float and bfloat16 with 8
    and 1 channels a thread (the storage type changes only the loads and stores)."""
    out = []
    for variant in VARIANTS:
        out += [kernel_source(None, "half_t", variant, v) for v in THREAD_CHANNELS]
        out += [kernel_source(None, e, variant, v) for e in ("float", "bf16_t") for v in (8, 1)]
    return out + _epilogue_variants()


def _epilogue_variants() -> list[KernelSource]:
    """The epilogue layers (conv_depthwise.epilogue_layers: 2 groups of 8 channels) in half with 8
    channels a thread (16-byte epilogue loads) and float with 4 (strided)."""
    shaped, unshaped = epilogue_layers(2, (1, 8, 8, 16), (16, 3, 3, 8))
    return [kernel_source(shaped, "half_t", VARIANTS[0], 8), kernel_source(unshaped, "float", VARIANTS[0], 4)]


# estimates at a third of the FMA rate (the depthwise kernel's quarter, less staging a FMA)
register(VARIANTS, _kernels, tile_supports(grouped_window, _smallest_smem),
         lambda v: tile_estimate(lambda layer, storage: _plan_of(v)(layer.attrs, layer.in_shapes[0], layer.in_shapes[1],
                                                                    layer.out_shapes[0], storage), _grouped_fmas, 3),
         lambda v: tile_enqueue("grouped", _plan_of(v), _grouped_launch(v)))
