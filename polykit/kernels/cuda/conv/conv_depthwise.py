"""Depthwise convolution channels last: ai.polykit ConvNHWC with group == C (any channel
multiplier M / C) on conv_depthwise.cu, which stages an input tile (outputs + halo) x a slice of
channels in shared memory with 16-byte cp.async copies and computes DW_P output pixels x 8 channels a
thread in fp32; float32 / float16 / bfloat16 storage, the bias and the layer's epilogue fused.

Tactics, kind "ConvNHWC" (the builder times them against each other and the implicit GEMMs):
  cuda.conv_nhwc.depthwise_p8  8 output columns a thread, blocks of up to 128 threads
  cuda.conv_nhwc.depthwise_p4  4 output columns a thread, blocks of up to 256 threads
Kernel widths FAST_WIDTHS with W stride 1 or 2 and W dilation 1 run a variant specialized for
that width and stride (each input column loaded once per kernel row); any other window runs the
run-time variant (DW_KW 0). `plan_depthwise` picks the block's tile from the layer's shapes at
enqueue time, so one plan serves any input size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from polykit.compiler.ops.nn.conv import window_geometry
from polykit.errors import DeviceError, PolykitError
from polykit.kernels.cuda.base import CUDA_DIR, DeviceTensor, KernelSource, cuda_tactic, defines, places_last_axis
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, epilogue_prelude, has_epilogue, supports_epilogue

FILE = "conv_depthwise.cu"
KERNEL = "conv_depthwise_nhwc"
#: storage dtype (numpy name) -> (ELEM, bytes an element)
ELEMS = {"float32": ("float", 4), "float16": ("half_t", 2), "bfloat16": ("bf16_t", 2)}
#: kernel widths with a compile-time variant (each with W stride 1 and 2, W dilation 1)
FAST_WIDTHS = (3, 5, 7)
FAST_STRIDES = (1, 2)
#: dynamic shared memory a block may use (the default limit: no opt-in, several blocks an SM)
SMEM_LIMIT = 48 * 1024
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class TileVariant:
    """One tactic's kernel shape: output columns a thread, the most threads a block, the blocks an
    SM that __launch_bounds__ plans registers for; `family` names it (conv_grouped's too)."""

    p: int
    threads: int
    min_blocks: int
    family: str = "depthwise"

    @property
    def name(self) -> str:
        return f"cuda.conv_nhwc.{self.family}_p{self.p}"


DepthwiseVariant = TileVariant
VARIANTS = (DepthwiseVariant(8, 128, 3), DepthwiseVariant(4, 256, 2))


@dataclass(frozen=True)
class TilePlan:
    """A 2-D ConvNHWC's geometry and the rows and columns of a block's output tile (conv_grouped's too)."""

    NB: int
    H: int
    W: int
    C: int
    M: int
    OH: int
    OW: int
    KH: int
    KW: int
    SH: int
    SW: int
    PH: int
    PW: int
    DH: int
    DW: int
    p: int     # output columns a thread
    TH: int    # output rows a block
    TWT: int   # threads along a tile row (p output columns each)

    @property
    def tiles_w(self) -> int:
        return -(-self.OW // (self.TWT * self.p))


@dataclass(frozen=True)
class DepthwisePlan(TilePlan):
    """A ConvNHWC depthwise layer as conv_depthwise.cu runs it: geometry and the block's tile."""

    VB: int    # channel vectors (8 channels each) a block
    IWP: int   # shared-memory slots a tile row
    smem: int  # dynamic shared memory bytes

    @property
    def grid(self) -> tuple[int, int, int]:
        return (-(-self.OH // self.TH) * self.tiles_w, -(-self.M // (8 * self.VB)), self.NB)

    @property
    def block(self) -> tuple[int]:
        return (self.VB * self.TWT * self.TH,)

    def args(self, vec_in: int, vec_out: bool) -> list[Any]:
        i32 = np.int32
        return [i32(a) for a in (self.H, self.W, self.C, self.M, self.OH, self.OW, self.KH, self.KW, self.SH, self.SW,
                                 self.PH, self.PW, self.DH, self.DW, self.TH, self.TWT, self.VB, self.tiles_w,
                                 self.IWP, vec_in, vec_out)]


@dataclass(frozen=True)
class DepthwiseWindow:
    """The size-independent part of a depthwise ConvNHWC: channels and window."""

    C: int
    M: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]


def depthwise_window(attrs: Mapping[str, Any], x: Sequence[Any], w: Sequence[Any]) -> DepthwiseWindow | None:
    """The window of a ConvNHWC (X [N, H, W, C], W [M, KH, KW, C/group]) when it is depthwise
    (group == C, one input channel a group, M a multiple of C), else None."""
    if len(x) != 4 or len(w) != 4 or not all(isinstance(d, int) for d in (x[3], *w)):
        return None
    C, (M, KH, KW, Cg) = int(x[3]), (int(d) for d in w)
    if int(attrs.get("group", 1)) != C or Cg != 1 or C <= 0 or M <= 0 or M % C or min(KH, KW) <= 0:
        return None
    try:
        strides = tuple(int(s) for s in attrs.get("strides") or (1, 1))
        dilations = tuple(int(d) for d in attrs.get("dilations") or (1, 1))
    except (TypeError, ValueError):
        return None
    if len(strides) != 2 or len(dilations) != 2 or min(strides + dilations) <= 0:
        return None
    return DepthwiseWindow(C, M, (KH, KW), strides, dilations)


def fast_width(attrs: Mapping[str, Any], w: Sequence[Any]) -> tuple[int, int]:
    """(DW_KW, DW_SW) of a layer's kernel: the compile-time variant for its width, W stride and W
    dilation, or (0, 1): the run-time one. From the attributes (kernel_shape, else W's shape
    [M, KH, KW, 1]), so the plan's kernels and the enqueue agree whatever shapes each sees."""
    try:
        kernel = attrs.get("kernel_shape") or list(w[1:3])
        kw, sw, dw = int(kernel[1]), int((attrs.get("strides") or (1, 1))[1]), int((attrs.get("dilations") or (1, 1))[1])
    except (TypeError, ValueError, IndexError):
        return 0, 1
    return (kw, sw) if kw in FAST_WIDTHS and sw in FAST_STRIDES and dw == 1 else (0, 1)


def tile_rows(th: int, sh: int, kh: int, dh: int) -> int:
    """Input rows a tile of `th` output rows reads."""
    return (th - 1) * sh + (kh - 1) * dh + 1


def tile_cols(twt: int, p: int, sw: int, kw: int, dw: int) -> int:
    """Input columns a tile of `twt` groups of `p` output columns reads."""
    return (twt * p - 1) * sw + (kw - 1) * dw + 1


def row_slots(iw: int, g: int, sh: int, twt: int) -> int:
    """Shared-memory slots of a tile row of `iw` columns skewed by one slot every `g` (the skew
    unit DW_P * SW): at least iw + (iw - 1) // g, and where possible a count that puts the first
    columns of consecutive column groups, across rows too, on consecutive 16-byte bank groups:
    SH * IWP == TWT * (g + 1) mod 8."""
    need = iw + (iw - 1) // g
    for iwp in range(need, need + 8):
        if (sh * iwp - twt * (g + 1)) % 8 == 0:
            return iwp
    return need


def smem_bytes(kh: int, kw: int, vb: int, ih: int, iwp: int, itemsize: int) -> int:
    """fp32 weights of the slice, then the input tile (itemsize // 2 planes of 16-byte chunks)."""
    return kh * kw * vb * 32 + (itemsize // 2) * ih * iwp * vb * 16


def tile_sizes(attrs: Mapping[str, Any], win: Any, x: Sequence[Any], y: Sequence[Any],
               cpg: int) -> tuple[int, int, int, int, int, int, int, int] | None:
    """(NB, H, W, C, OH, OW, PH, PW) of a ConvNHWC X `x` -> Y `y` with window `win` (kernel,
    strides, M; `cpg` input channels a group), or None when a tiled kernel cannot index it (sizes
    unknown or not positive, too many images for the grid, 32-bit offsets overflowing) or when
    the shape rules reject its window (theirs to report)."""
    if win is None or len(x) != 4 or len(y) != 4 or not all(isinstance(d, int) for d in (*x, *y)):
        return None
    NB, H, W, C = (int(d) for d in x)
    OH, OW = int(y[1]), int(y[2])
    if y[0] != NB or y[3] != win.M or min(NB, H, W, OH, OW) <= 0 or NB > MAX_GRID_YZ:
        return None
    if max(NB * H * W * C, NB * OH * OW * win.M, win.M * win.kernel[0] * win.kernel[1] * cpg) >= 2**31:
        return None
    try:
        geo = window_geometry(attrs, (H, W), win.kernel, where="ConvNHWC")
    except PolykitError:
        return None
    return NB, H, W, C, OH, OW, int(geo.pads_begin[0]), int(geo.pads_begin[1])


def plan_depthwise(attrs: Mapping[str, Any], x: Sequence[int], w: Sequence[int], y: Sequence[int], itemsize: int,
                   variant: DepthwiseVariant, smem_limit: int = SMEM_LIMIT) -> DepthwisePlan | None:
    """The launch of a depthwise ConvNHWC (X [NB, H, W, C], W [M, KH, KW, 1], Y [NB, OH, OW, M]) with
    `itemsize`-byte storage on `variant`, or None when conv_depthwise.cu cannot run it (the tile:
    choose_tile)."""
    win = depthwise_window(attrs, x, w)
    sizes = tile_sizes(attrs, win, x, y, 1)
    if win is None or sizes is None:
        return None
    tile = choose_tile(sizes[4], sizes[5], win.M, win.kernel, win.strides, win.dilations, itemsize, variant, smem_limit)
    if tile is None:
        return None
    th, twt, vb, iwp, smem = tile
    out = DepthwisePlan(*sizes[:4], win.M, *sizes[4:6], *win.kernel, *win.strides, *sizes[6:], *win.dilations,
                        variant.p, th, twt, vb, iwp, smem)
    return out if out.grid[1] <= MAX_GRID_YZ and out.grid[0] < 2**31 else None


#: what staging one input element costs, in FMA lanes (a share of a 16-byte load, store and index math)
STAGE_COST = 2.0
#: resident warps an SM needs before latency stops costing (fewer: proportionally slower)
WARPS_HIDING = 8
SM_SMEM = 227 * 1024


@functools.lru_cache(maxsize=4096)
def choose_tile(OH: int, OW: int, M: int, kernel: tuple[int, int], strides: tuple[int, int],
                dilations: tuple[int, int], itemsize: int, variant: DepthwiseVariant,
                smem_limit: int = SMEM_LIMIT) -> tuple[int, int, int, int, int] | None:
    """(TH, TWT, VB, IWP, smem bytes) of the cheapest tile that fits `smem_limit`, or None.

    Candidates: VB 1, 2, 4, 8 channel vectors; as many column groups as the output row needs (up
    to the block's threads), half and a quarter of that; the most rows that fit, and that many
    spread evenly over the image. Cost (tile_cost): FMA lanes of the launched tiles (padding
    included) plus STAGE_COST a staged input element (twice for 16-byte pixel slices: half
    sectors), over the warps' lane use, times the latency not hidden below WARPS_HIDING warps an SM."""
    (KH, KW), (SH, SW), (DH, DW) = kernel, strides, dilations
    p, threads = variant.p, variant.threads
    nv = -(-M // 8)
    best: tuple[float, tuple[int, int, int, int, int]] | None = None
    for vb in (1, 2, 4, 8):
        if vb > max(1, nv) or vb > threads:
            continue
        full = max(1, min(-(-OW // p), threads // vb))
        for twt in sorted({full, -(-full // 2), -(-full // 4)}):
            most = max(1, min(OH, threads // (vb * twt)))
            while most > 1 and _smem(most, twt, vb, p, kernel, strides, dilations, itemsize)[1] > smem_limit:
                most -= 1
            for th in {most, -(-OH // -(-OH // most))}:
                iwp, smem = _smem(th, twt, vb, p, kernel, strides, dilations, itemsize)
                if smem > smem_limit:
                    continue
                cost = tile_cost(OH, OW, M, kernel, th, twt, vb, p, iwp, smem, strides, dilations, itemsize, variant)
                if best is None or cost < best[0]:
                    best = (cost, (th, twt, vb, iwp, smem))
    return None if best is None else best[1]


def _smem(th: int, twt: int, vb: int, p: int, kernel: tuple[int, int], strides: tuple[int, int],
          dilations: tuple[int, int], itemsize: int) -> tuple[int, int]:
    (KH, KW), (SH, SW), (DH, DW) = kernel, strides, dilations
    iwp = row_slots(tile_cols(twt, p, SW, KW, DW), p * SW, SH, twt)
    return iwp, smem_bytes(KH, KW, vb, tile_rows(th, SH, KH, DH), iwp, itemsize)


def tile_cost(OH: int, OW: int, M: int, kernel: tuple[int, int], th: int, twt: int, vb: int, p: int, iwp: int,
              smem: int, strides: tuple[int, int], dilations: tuple[int, int], itemsize: int,
              variant: DepthwiseVariant) -> float:
    """choose_tile's cost of one image's launch on a tile (arbitrary units, lower is better)."""
    (KH, KW), (SH, SW), (DH, DW) = kernel, strides, dilations
    t = vb * twt * th
    blocks = -(-OH // th) * -(-OW // (twt * p)) * -(-M // (8 * vb))
    work = blocks * t * p * 8 * KH * KW
    staged = blocks * tile_rows(th, SH, KH, DH) * tile_cols(twt, p, SW, KW, DW) * vb * 8
    if vb * 8 * itemsize < 32:
        staged *= 2
    return (work + STAGE_COST * staged) * latency_factor(t, smem, variant)


def _storage(layer: Any) -> str | None:
    """The one storage dtype of X, W, (B,) Y, or None (a mix, or one the kernel does not take)."""
    ins, outs = tuple(getattr(layer, "in_dtypes", ()) or ()), tuple(getattr(layer, "out_dtypes", ()) or ())
    names = {d for d in ins[:3] + outs[:1] if d}
    return names.pop() if len(names) == 1 and next(iter(names)) in ELEMS else None


def tile_supports(window_of: Callable[[Mapping[str, Any], Sequence[Any], Sequence[Any]], Any],
                  smallest_smem: Callable[[Any, TileVariant, int], int], limit: int = SMEM_LIMIT):
    """supports(variant) -> supports(layer) of a tiled ConvNHWC tactic: one storage type, an
    epilogue it compiles, a window `window_of(attrs, x, w)` takes, and a smallest tile whose
    shared memory `smallest_smem(window, variant, itemsize)` fits `limit`."""

    def for_variant(variant: TileVariant):
        def supports(layer: Any) -> bool:
            shapes, storage = tuple(getattr(layer, "in_shapes", ()) or ()), _storage(layer)
            if storage is None or len(shapes) < 2 or not supports_epilogue(layer):
                return False
            win = window_of(layer.attrs, shapes[0], shapes[1])
            return win is not None and smallest_smem(win, variant, ELEMS[storage][1]) <= limit

        return supports

    return for_variant


def _smallest_smem(win: DepthwiseWindow, variant: TileVariant, itemsize: int) -> int:
    """One row, one column group, one channel vector."""
    (kh, kw), (sh, sw), (dh, dw) = win.kernel, win.strides, win.dilations
    iwp = row_slots(tile_cols(1, variant.p, sw, kw, dw), variant.p * sw, sh, 1)
    return smem_bytes(kh, kw, 1, tile_rows(1, sh, kh, dh), iwp, itemsize)


def latency_factor(t: int, smem: int, variant: TileVariant) -> float:
    """(lanes launched / lanes used) times the latency not hidden below WARPS_HIDING resident warps
    an SM, for blocks of `t` threads and `smem` bytes on `variant` (its registers a thread)."""
    warps = -(-t // 32)
    regs = 65536 // (variant.threads * variant.min_blocks)
    resident = min(32, SM_SMEM // (smem + 1024), 64 // warps, 65536 // (regs * 32 * warps))
    return (warps * 32 / t) * max(1.0, WARPS_HIDING / max(1, resident * warps))


def tile_kernel(layer: Any, elem: str, kernel: str, file: str, shape: tuple) -> KernelSource:
    """Kernel `kernel` of `file` for `elem` storage with the `shape` defines, and the layer's
    epilogue when it has one."""
    if layer is not None and has_epilogue(layer):
        return KernelSource(kernel, code=epilogue_prelude(layer, elem) + (CUDA_DIR / file).read_text(), defines=shape)
    return KernelSource(kernel, file=file, defines=defines(ELEM=elem) + shape)


def kernel_source(layer: Any, elem: str, variant: DepthwiseVariant, kw: int, sw: int) -> KernelSource:
    """conv_depthwise_nhwc for `elem` storage, the variant's shape and compile-time width `kw`
    (0: run-time) and W stride `sw`, with the layer's epilogue when it has one."""
    return tile_kernel(layer, elem, KERNEL, FILE, defines(DW_P=variant.p, DW_THREADS=variant.threads,
                                                         DW_MIN_BLOCKS=variant.min_blocks, DW_KW=kw,
                                                         DW_SW=sw if kw else 1))


def _kernels(variant: DepthwiseVariant):
    def kernels(layer: Any) -> list[KernelSource]:
        shapes = tuple(getattr(layer, "in_shapes", ()) or ())
        kw, sw = fast_width(layer.attrs, shapes[1] if len(shapes) > 1 else ())
        storage = _storage(layer)
        elems = [ELEMS[storage][0]] if storage else [e for e, _ in ELEMS.values()]
        return [kernel_source(layer, e, variant, kw, sw) for e in elems]

    return kernels


def tile_estimate(plan_of: Callable[[Any, str], Any], fmas_of: Callable[[Any], int], rate: int):
    """estimate(layer, sm_count) of a tiled ConvNHWC tactic: predicted microseconds, the larger of
    the bytes (X, Y once at 3 TB/s) and the fp32 FMAs of the launched tile `fmas_of(plan)` at
    1 / `rate` of the chip's FMA rate per SM clock (128 at 1.7 GHz); `plan_of(layer, storage)`."""

    def estimate(layer: Any, sm_count: int) -> float | None:
        shapes, outs, storage = getattr(layer, "in_shapes", ()), getattr(layer, "out_shapes", ()), _storage(layer)
        if len(shapes) < 2 or not outs or storage is None or not sm_count:
            return None
        plan = plan_of(layer, storage)
        if plan is None:
            return None
        moved = (plan.NB * plan.H * plan.W * plan.C + plan.NB * plan.OH * plan.OW * plan.M) * ELEMS[storage][1]
        return max(moved / 3.0e6, fmas_of(plan) / (sm_count * 128 * 1.7e3 / rate))

    return estimate


def _depthwise_fmas(plan: DepthwisePlan) -> int:
    cols = plan.tiles_w * plan.TWT * plan.p
    rows = -(-plan.OH // plan.TH) * plan.TH
    return plan.NB * rows * cols * plan.grid[1] * plan.VB * 8 * plan.KH * plan.KW


def tile_enqueue(what: str, plan_of: Callable[[Any, Any, Any, Any, str], Any],
                 launch_of: Callable[[Any, Any, str, Any, Any, Any], tuple[KernelSource, bool, bool]],
                 row_stride: bool = False):
    """enqueue(layer, launcher, tensors) of a tiled ConvNHWC tactic (`what`: its kind of conv):
    one storage type for X, W, B, Y; `plan_of(attrs, X, W, Y, storage)` the launch plan (None: a
    DeviceError); `launch_of(layer, plan, elem, X, W, Y)` its (kernel, vec_in, vec_out); with
    `row_stride` its kernel takes Y's pixel row stride after vec_out (conv_depthwise.cu's LDY)."""

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        X, Wt, Y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
        B = tensors.get(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] else None
        where = f"layer {layer.name!r}"
        storage = np.dtype(Y.dtype).name
        if storage not in ELEMS or any(np.dtype(t.dtype) != np.dtype(Y.dtype) for t in (X, Wt) + ((B,) if B is not None else ())):
            raise DeviceError(f"{what} ConvNHWC takes one storage type of {', '.join(ELEMS)} for X, W, B and Y",
                              where=where, hint="run this layer on --target cpu")
        plan = plan_of(layer.attrs, X.shape, Wt.shape, Y.shape, storage)
        if plan is None:
            raise DeviceError(f"shapes {X.shape} * {Wt.shape} -> {Y.shape} do not fit the {what} kernel",
                              where=where, hint="run this layer with another ConvNHWC tactic")
        kernel, vec_in, vec_out = launch_of(layer, plan, ELEMS[storage][0], X, Wt, Y)
        args = [X, Wt, B if B is not None else 0, Y, *plan.args(vec_in, vec_out)]
        args += [Y.rows_apart(Y.shape[-1])] if row_stride else []
        launcher.launch(kernel, plan.grid, plan.block, args + epilogue_args(layer, tensors, Y.dtype),
                        shared_mem=plan.smem)

    return enqueue


#: conv_depthwise.cu's vec_in bits (DW_VEC_X, DW_VEC_W): 16-byte input copies, 16-byte weight loads
VEC_X, VEC_W = 1, 2


def vec_flags(vec_x: bool, vec_w: bool) -> int:
    """conv_depthwise.cu's vec_in: VEC_X where the input tile is copied 16 bytes at a time (one input channel
    an output channel, C % 8 == 0, X 16-byte aligned), VEC_W where W is 16-byte aligned (the slice's weights
    read as 16-byte chunks)."""
    return (VEC_X if vec_x else 0) | (VEC_W if vec_w else 0)


def _depthwise_launch(variant: DepthwiseVariant):
    def launch_of(layer: Any, plan: DepthwisePlan, elem: str, X: DeviceTensor, Wt: DeviceTensor,
                  Y: DeviceTensor) -> tuple[KernelSource, int, bool]:
        kw, sw = fast_width(layer.attrs, Wt.shape)
        vec_x = plan.M == plan.C and plan.C % 8 == 0 and X.ptr % 16 == 0
        vec_out = plan.M % 8 == 0 and Y.rows_apart(plan.M) % 8 == 0 and Y.ptr % 16 == 0
        return kernel_source(layer, elem, variant, kw, sw), vec_flags(vec_x, Wt.ptr % 16 == 0), vec_out

    return launch_of


def compile_variants() -> list[KernelSource]:
    """Every compile-time width and stride and the run-time variant, for each tactic, in half
    storage; float and bfloat16 on the 7-wide stride-1 and the run-time variants (the storage
    type changes only the loads and stores)."""
    out = []
    for variant in VARIANTS:
        shapes = [(kw, sw) for kw in FAST_WIDTHS for sw in FAST_STRIDES] + [(0, 1)]
        out += [kernel_source(None, "half_t", variant, kw, sw) for kw, sw in shapes]
        out += [kernel_source(None, e, variant, kw, sw) for e in ("float", "bf16_t") for kw, sw in ((7, 1), (0, 1))]
    return out + _epilogue_variants()


def epilogue_layers(group: int, x: tuple[int, ...], w: tuple[int, ...],
                    body: list[dict[str, Any]] | None = None) -> tuple[Any, Any]:
    """Two ConvNHWC layers with a residual + Relu epilogue, or `body` (reading "raw" and "skip",
    writing "y"), (group `group`, X `x`, W `w`, the residual of the output's shape, 'same' 3 x 3
    window): one with its shapes (the epilogue read with 16-byte loads, EPI_VEC 1), one without
    (through strided offsets, EPI_VEC 0)."""
    from polykit.compiler.plan.records import LayerDesc

    body = body or [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
                    {"op": "Relu", "inputs": ["s"], "outputs": ["y"], "attrs": {}}]
    attrs = {"group": group, "kernel_shape": [3, 3], "epilogue": {"input": "raw", "body": body}}
    y = x[:3] + (w[0],)
    shaped = LayerDesc("epi", "ConvNHWC", ("x", "w", "b", "skip"), ("y",), attrs, domain="ai.polykit",
                       in_shapes=(x, w, (w[0],), y), out_shapes=(y,))
    return shaped, LayerDesc("epi", "ConvNHWC", ("x", "w", "b", "skip"), ("y",), attrs, domain="ai.polykit")


def _epilogue_variants() -> list[KernelSource]:
    """The epilogue layers (epilogue_layers) in half (16-byte loads) and float (strided)."""
    shaped, unshaped = epilogue_layers(8, (1, 8, 8, 8), (8, 3, 3, 1))
    return [kernel_source(shaped, "half_t", VARIANTS[0], 3, 1), kernel_source(unshaped, "float", VARIANTS[0], 0, 1)]


def register(variants: Sequence[TileVariant], kernels: Callable, supports: Callable, estimate: Callable,
             enqueue: Callable, places: Callable | None = None) -> None:
    """Declare each variant a ConvNHWC tactic of priority 20 (kernels(variant) etc. its hooks;
    `places`: Tactic.places_fn)."""
    for variant in variants:
        cuda_tactic("ConvNHWC", variant.name, kernels=kernels(variant), supports=supports(variant), priority=20,
                    estimate=estimate(variant), places=places,
                    params={"p": variant.p, "threads": variant.threads, "min_blocks": variant.min_blocks,
                            "smem_limit": SMEM_LIMIT})(enqueue(variant))


def _plan_of(variant: DepthwiseVariant):
    return lambda attrs, x, w, y, storage: plan_depthwise(attrs, x, w, y, ELEMS[storage][1], variant)


register(VARIANTS, _kernels, tile_supports(depthwise_window, _smallest_smem),
         lambda v: tile_estimate(lambda layer, storage: _plan_of(v)(layer.attrs, layer.in_shapes[0], layer.in_shapes[1],
                                                                    layer.out_shapes[0], storage), _depthwise_fmas, 4),
         lambda v: tile_enqueue("depthwise", _plan_of(v), _depthwise_launch(v), row_stride=True), places_last_axis)
