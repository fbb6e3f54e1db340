"""Grouped channels-last convolution on Hopper tensor cores: conv_sm90.cu's `conv_sm90` with
CONV_GROUPED 1.

Tactics `cuda.conv_nhwc.sm90g_<BM>x<BN>` (kind ConvNHWC, compute capability 9.0) run an
ai.polykit ConvNHWC with group G > 1, float16 / bfloat16 storage, Cg = C / G and Mg = M / G
multiples of 8 (16-byte cp.async chunks of X, 16-byte TMA rows and stores) on conv_sm90's
tiles (conv_sm90.CONV_TILES): group g is a dense conv of X's channels [g*Cg, (g+1)*Cg) into Y's
channels [g*Mg, (g+1)*Mg) with the KRSC weight's rows [g*Mg, (g+1)*Mg), so each group is conv_sm90's
implicit GEMM of M = NB * OH * OW rows, N = Mg, K = KH * KW * Cg with X's pixels LDX = C apart and
Y's rows LDY = M apart (conv_sm90's runtime strides, which already let it read or write a slice).

Launch: one launch a layer, the group on grid z (a kernel change under CONV_GROUPED, the offsets
from the arguments it already has: X + g * C (C = Cg), Y + g * N and Bias + g * N (N = Mg), the
weight rows by TMA coordinate z = g of a map whose third dim is the groups, box (BK, BN, 1); a tile
past Mg reads TMA's zero fill, not the next group's rows). One launch per group would need no
kernel change but serialises small launches: wav2vec2_base's positional conv (Conv1d 768 -> 768,
k 128, pad 64, G 16: Cg = Mg = 48, K = 6144; at the zoo's 5 s input M = 250 output frames) is
4 tiles a group on the 64 x 64 tile the estimate prefers (2 on 128 x 64): 16 launches of 4 blocks,
128 of 132 SMs idle in every one, against one launch of 4 x 1 x 16 blocks. RegNet-Y-800MF (group
width 16, 3x3: K = 144; 4, 9, 20, 49 groups a stage) and ResNeXt-50 32x4d (32 groups, Cg 4 / 8 /
16 / 32 by stage: K = 36 / 72 / 144 / 288, Mg = Cg) would take 4..49 and 32 launches a layer per
group, one here - but neither is offered this tactic (below): every RegNet-Y-800MF group GEMM
(K 144) and ResNeXt-50's stages 1-3 are small (Cg 4 fails the multiple of 8 outright), and stage
4's K 288 with Mg 32 is grouped_mma's size.

Which layers: the builder times every candidate, so the tactic is offered only where it can
plausibly win (`offered`): a group's K >= 1024, or K >= 256 with Mg >= 64, or a layer no
grouped_mma variant can plan (its per-group weight window does not fit shared memory: the
wav2vec2 positional conv, which otherwise falls to cuda.conv_nhwc.igemm_simt on CUDA cores).
Tiles: those whose BN is the smallest of conv_sm90's widths (32, 64, 128, 256) holding Mg (past
256 the 128 and 256 ones): wider tiles only multiply zero columns. Priority 15: under the grouped
CUDA-core and mma.sync tactics (20), so a level-0 build keeps their choice where they run, and
over igemm_mma (10, group 1 only) and igemm_simt (5) where they refuse. The estimate is
gemm_sm90's predicted_us of G items of the group's GEMM (the grid covers all groups).
Epilogues: the bias and epilogues without extra operands (the activations conv_sm90 fuses: their
body reads only the accumulator); one with a residual or other extra operand is refused, since
its operands are indexed by the group's (row, column), not the layer's. No depth_to_space.
Alignment: X (and its pixel stride) and the weight (the TMA base) must be 16-byte aligned, as
each group's offset g * Cg, g * Mg * K elements keeps (Cg, Mg multiples of 8); Y and the bias
take conv_sm90's run-time store checks (pair / 16-byte stores fall back to narrower ones).
Untimed: no GPU has measured it yet (docs/CUDA_KERNELS.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ops.nn.channels_last import DEPTH_TO_SPACE
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import (DeviceTensor, KernelSource, TensorMapSpec, cuda_tactic, defines,
                                       places_last_axis)
from polykit.kernels.cuda.conv.conv_grouped_mma import VARIANTS as MMA_VARIANTS
from polykit.kernels.cuda.conv.conv_grouped_mma import plan_mma
from polykit.kernels.cuda.conv.conv_sm90 import CONV_TILES, ConvGemm, conv_operands, plan_conv, reads_aligned
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, extra_inputs, has_epilogue, supports_epilogue
from polykit.kernels.cuda.gemm.gemm_sm90 import ARCHS, BK, ELEMS, Sm90Tile, bk_of, kernel_for, predicted_us, storage_of

#: a group's GEMM depth from which the tactic is offered whatever Mg; from MIN_K with Mg >= MIN_MG
BIG_K, MIN_K, MIN_MG = 1024, 256, 64
#: grid z's limit (groups a launch)
MAX_GROUPS = 65535
#: the tile widths conv_sm90 has
WIDTHS = tuple(sorted({t.bn for t in CONV_TILES}))
STORAGE = ("float16", "bfloat16")
GROUPED = defines(CONV_GROUPED=1)


@dataclass(frozen=True)
class GroupedGemm:
    """A grouped ConvNHWC as conv_sm90 with CONV_GROUPED runs it: `geo` one group's implicit GEMM
    (C = Cg, N = Mg; ldx the layer's C, ldy its M), G groups on grid z."""

    geo: ConvGemm
    G: int


def plan_grouped(attrs: Mapping[str, Any], x: Sequence[int], w: Sequence[int],
                 y: Sequence[int]) -> GroupedGemm | None:
    """The per-group geometry of a grouped ConvNHWC (X [NB, H, W, G*Cg], W [G*Mg, KH, KW, Cg],
    Y [NB, OH, OW, G*Mg]), or None where the kernel cannot run it (group 1, Cg or Mg not a
    multiple of 8, depth_to_space, sizes past int32)."""
    G = int(attrs.get("group", 1))
    if G <= 1 or G > MAX_GROUPS or len(x) != 4 or len(w) != 4 or len(y) != 4 or DEPTH_TO_SPACE in attrs:
        return None
    NB, H, W, C = (int(d) for d in x)
    M, KH, KW, Cg = (int(d) for d in w)
    if C != G * Cg or M % G or int(y[3]) != M or Cg % 8 or (M // G) % 8:
        return None
    Mg = M // G
    group_attrs = {k: v for k, v in attrs.items() if k != "group"}
    geo = plan_conv(group_attrs, (NB, H, W, Cg), (Mg, KH, KW, Cg), (int(y[0]), int(y[1]), int(y[2]), Mg))
    if geo is None or NB * H * W * C >= 2**31 or geo.M * M >= 2**31 or M * geo.K >= 2**31:
        return None
    return GroupedGemm(replace(geo, ldx=C, ldy=M), G)


def _plan(layer: Any) -> GroupedGemm | None:
    shapes, outs = getattr(layer, "in_shapes", ()) or (), getattr(layer, "out_shapes", ()) or ()
    if len(shapes) < 2 or not outs:
        return None
    return plan_grouped(layer.attrs, tuple(shapes[0]), tuple(shapes[1]), tuple(outs[0]))


def tile_widths(mg: int) -> tuple[int, ...]:
    """BN of the tiles offered for `mg` output channels a group: the smallest width that holds
    them (past the widest: the two widest)."""
    fit = [b for b in WIDTHS if b >= mg]
    return (fit[0],) if fit else WIDTHS[-2:]


def offered(layer: Any, gg: GroupedGemm, storage: str) -> bool:
    """Whether the group's GEMM is large enough to plausibly beat the grouped tactics (BIG_K, or
    MIN_K with MIN_MG), or no grouped_mma variant can plan the layer."""
    if gg.geo.K >= BIG_K or (gg.geo.K >= MIN_K and gg.geo.N >= MIN_MG):
        return True
    x, w, y = layer.in_shapes[0], layer.in_shapes[1], layer.out_shapes[0]
    return all(plan_mma(layer.attrs, x, w, y, storage, v) is None for v in MMA_VARIANTS)


def _storage(layer: Any) -> str | None:
    storage = storage_of(layer, 3)
    return storage if storage in STORAGE else None


def _supports(tile: Sm90Tile):
    def supports(layer: Any) -> bool:
        storage, gg = _storage(layer), _plan(layer)
        if storage is None or gg is None or not tile.fits(storage, False, False):
            return False
        if has_epilogue(layer) and (extra_inputs(layer) or not supports_epilogue(layer)):
            return False  # extra operands are indexed by the layer's (row, column), the kernel's are a group's
        return tile.bn in tile_widths(gg.geo.N) and offered(layer, gg, storage)

    return supports


def grouped_kernel(layer: Any, tile: Sm90Tile, elem: str) -> KernelSource:
    """conv_sm90 with CONV_GROUPED for `layer` (its epilogue, if any) on `tile`."""
    source = kernel_for(layer, tile, elem, False, "conv_sm90")
    return replace(source, defines=source.defines + GROUPED)


def _kernels(tile: Sm90Tile):
    return lambda layer: [grouped_kernel(layer, tile, ELEMS[_storage(layer)])]


def _estimate(tile: Sm90Tile):
    def estimate(layer: Any, sm_count: int) -> float | None:
        gg = _plan(layer)
        if gg is None or not sm_count:
            return None
        return predicted_us(tile, gg.geo.M, gg.geo.N, gg.geo.K, gg.G, sm_count)

    return estimate


def grid_of(tile: Sm90Tile, gg: GroupedGemm, sm_count: int) -> tuple[int, int, int]:
    """(persistent blocks a group, 1, G): the SMs' block slots shared among the groups, each
    group's blocks looping over its tiles (at least one block a group, at most one a tile)."""
    tiles = -(-gg.geo.M // tile.bm) * -(-gg.geo.N // tile.bn)
    return (max(1, min(tiles, -(-tile.blocks * sm_count // gg.G))), 1, gg.G)


def weight_map(Wt: DeviceTensor, gg: GroupedGemm, tile: Sm90Tile) -> TensorMapSpec:
    """The KRSC weight as TMA reads it: (K, Mg, G) elements, a group's rows Mg * K apart, boxes
    of (BK, BN, 1) (a group's tile past Mg reads TMA's zero fill)."""
    es, K, N = np.dtype(Wt.dtype).itemsize, gg.geo.K, gg.geo.N
    return TensorMapSpec(Wt.ptr, Wt.dtype, (K, N, gg.G), (K * es, N * K * es), (bk_of(Wt.dtype), tile.bn, 1))


def check_aligned(layer: Any, X: DeviceTensor, Wt: DeviceTensor, gg: GroupedGemm) -> int:
    """X's pixel stride (LDX) after checking that every group's 16-byte reads stay aligned: X's
    base, its pixel stride and a group's Cg channels (cp.async chunks), the weight's base and a
    group's Mg * K rows (the TMA map's base and strides). DeviceError where not."""
    es = np.dtype(X.dtype).itemsize
    ldx = X.rows_apart(gg.geo.ldx)
    bad = [what for what, nbytes in (("X", X.ptr), ("X's pixel stride", ldx * es), ("a group's channels", gg.geo.C * es),
                                     ("W", Wt.ptr), ("a group's weight rows", gg.geo.N * gg.geo.K * es),
                                     ("a weight row", gg.geo.K * es)) if nbytes % 16]
    if bad:
        raise DeviceError(f"{', '.join(bad)} not 16-byte aligned: the grouped sm90 convolution reads 16 bytes at a time",
                          where=f"layer {layer.name!r}", hint="rebuild the plan (reads_placed refuses these)")
    return ldx


def _enqueue(tile: Sm90Tile):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        X, Wt, B, Y, gg = conv_operands(layer, tensors, plan_grouped, "the grouped sm90 convolution kernel")
        ldx = check_aligned(layer, X, Wt, gg)
        geo = replace(gg.geo, ldy=Y.rows_apart(Y.shape[-1]), ldx=ldx)
        storage = np.dtype(Y.dtype).name
        args = [weight_map(Wt, gg, tile), X, B if B is not None else 0, Y, *geo.args()] + epilogue_args(
            layer, tensors, Y.dtype)
        launcher.launch(grouped_kernel(layer, tile, ELEMS[storage]), grid_of(tile, gg, launcher.sm_count),
                        (tile.threads,), args, shared_mem=tile.smem_for(storage, False, False))

    return enqueue


def compile_variants() -> list[KernelSource]:
    """CONV_GROUPED for every tile (fp16) and for the first in bf16."""
    file = "conv_sm90.cu"
    out = [KernelSource("conv_sm90", file=file, defines=defines(ELEM="half_t") + t.defines(False) + GROUPED,
                        arch="sm_90a") for t in CONV_TILES]
    return out + [KernelSource("conv_sm90", file=file, defines=defines(ELEM="bf16_t") + CONV_TILES[0].defines(False)
                               + GROUPED, arch="sm_90a")]


for _tile in CONV_TILES:
    cuda_tactic("ConvNHWC", f"cuda.conv_nhwc.sm90g_{_tile.label}", kernels=_kernels(_tile), supports=_supports(_tile),
                priority=15, archs=ARCHS, estimate=_estimate(_tile), places=places_last_axis,
                reads_placed=reads_aligned(False),
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": BK, "msub": _tile.msub, "consumers": _tile.consumers,
                        "stages": _tile.stages, "grouped": 1})(_enqueue(_tile))
