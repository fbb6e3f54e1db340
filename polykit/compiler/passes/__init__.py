"""Graph optimization passes and the pass manager.

A pass is a plain function `pass_fn(graph) -> bool` that edits the graph in place and
says whether it changed anything (passes that must spare marked tensors take a `keep=`
keyword; bind it with functools.partial). `run_passes` runs passes in order and keeps the
graph sorted and shape-inferred between them; `optimize` is the builder's default pipeline.
Fused node formats: docs/FUSION.md.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Iterable, Mapping, Sequence

from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import Graph, subgraphs
from polykit.compiler.passes.absorb_concat import absorb_concat
from polykit.compiler.passes.absorb_views import absorb_views
from polykit.compiler.passes.cancel_transposes import cancel_transposes
from polykit.compiler.passes.channel_movement import (compose_concat_gathers, compose_gathers, compose_reformats,
                                                       pad_into_producers)
from polykit.compiler.passes.absorb_quantized_casts import absorb_quantized_casts
from polykit.compiler.passes.channels_last import DEFAULT_CONV_CLASSES, INT8_CHANNEL_ALIGN, to_channels_last
from polykit.compiler.passes.fold_depth_to_space import fold_depth_to_space
from polykit.compiler.passes.eliminate_dead_code import eliminate_dead_code
from polykit.compiler.passes.fold_axis_permutations import fold_axis_permutations
from polykit.compiler.passes.fold_constants import fold_constants
from polykit.compiler.passes.fold_index_ranges import fold_index_ranges
from polykit.compiler.passes.fold_attention_layouts import fold_attention_layouts
from polykit.compiler.passes.fold_conv_batchnorm import fold_conv_batchnorm
from polykit.compiler.passes.fold_qdq import fold_qdq
from polykit.compiler.passes.fold_weight_only import fold_weight_only
from polykit.compiler.passes.fuse_bias_activation import fuse_bias_activation
from polykit.compiler.passes.fuse_movement import fuse_movement
from polykit.compiler.passes.fuse_output_quantize import fuse_output_quantize
from polykit.compiler.passes.fuse_pointwise import fuse_pointwise
from polykit.compiler.passes.fuse_quantize_nhwc import fuse_quantize_nhwc
from polykit.compiler.passes.fuse_squeeze_excite import fuse_squeeze_excite
from polykit.compiler.passes.hoist_activations import hoist_activations
from polykit.compiler.passes.plan_layouts import plan_layouts
from polykit.compiler.passes.control.inline_if import inline_constant_if
from polykit.compiler.passes.insert_qdq import insert_qdq
from polykit.compiler.passes.merge_duplicates import merge_duplicates
from polykit.compiler.passes.norm_row_maps import fold_norm_row_maps
from polykit.compiler.passes.pack_gemms import pack_gemms
from polykit.compiler.passes.pack_quantized_gemms import pack_quantized_gemms
from polykit.compiler.passes.io_formats import IoFormat, apply_io_formats, cancel_round_trip_casts
from polykit.compiler.passes.quantize_pools import quantize_pools
from polykit.compiler.passes.precision import BF16, F16, convert_precision, convert_to_fp16
from polykit.compiler.passes.recognize_attention import recognize_attention
from polykit.compiler.passes.mark_causal_masks import mark_causal_masks
from polykit.compiler.passes.recognize_gelu import recognize_gelu
from polykit.compiler.passes.recognize_groupnorm import recognize_groupnorm
from polykit.compiler.passes.recognize_layernorm import recognize_layernorm
from polykit.compiler.passes.remove_identity import remove_identity
from polykit.compiler.passes.row_transposes import move_row_transposes
from polykit.compiler.passes.space_to_depth_stems import space_to_depth_stems
from polykit.compiler.passes.control.unroll_loops import unroll_loops
from polykit.errors import GraphError, PolykitError

__all__ = [
    "Pass", "run_passes", "optimize", "fold_constants", "eliminate_dead_code", "remove_identity",
    "fold_conv_batchnorm", "fuse_bias_activation", "fuse_pointwise", "recognize_gelu", "recognize_layernorm",
    "recognize_groupnorm", "mark_causal_masks",
    "recognize_attention", "cancel_transposes", "hoist_activations", "convert_to_fp16", "convert_precision",
    "fold_attention_layouts", "to_channels_last", "plan_layouts", "fold_axis_permutations", "fuse_quantize_nhwc",
    "fold_qdq", "absorb_quantized_casts", "fold_weight_only", "insert_qdq", "quantize_pools", "inline_constant_if", "unroll_loops", "fuse_movement",
    "merge_duplicates", "fold_index_ranges", "move_row_transposes", "absorb_concat", "absorb_views", "fold_norm_row_maps",
    "compose_gathers", "pad_into_producers", "compose_reformats", "compose_concat_gathers", "fuse_squeeze_excite",
    "pack_gemms", "pack_quantized_gemms", "fuse_output_quantize", "fold_depth_to_space",
]

log = logging.getLogger("polykit.passes")

Pass = Callable[[Graph], bool]

#: how often `run_passes(fixed_point=True)` repeats the list before giving up
MAX_ROUNDS = 8


def pass_name(fn: Pass) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", repr(fn))


def run_passes(graph: Graph, passes: Sequence[Pass], check: bool = True, *, fixed_point: bool = False) -> bool:
    """Run `passes` in order on `graph` (in place); True if any changed it.

    After a pass that changed the graph, nodes are re-sorted topologically and shapes
    re-inferred, so the next pass sees fresh metadata. With `check`, the graph is also
    validated, and a pass that leaves it malformed is named in the GraphError. With
    `fixed_point`, the whole list repeats until a round changes nothing.
    """
    if not graph.values or any(out and out not in graph.values for n in graph.nodes for out in n.outputs):
        infer_shapes(graph, strict=False)
    changed_any = False
    for _ in range(MAX_ROUNDS if fixed_point else 1):
        changed_round = False
        for fn in passes:
            changed = bool(fn(graph))
            log.debug("pass %s: %s", pass_name(fn), "changed" if changed else "no change")
            if changed:
                changed_round = True
                _refresh(graph, pass_name(fn), check)
        changed_any |= changed_round
        if not changed_round:
            break
    for node in graph.nodes:  # If/Loop/Scan bodies: the same passes, inside (their outputs are their roots)
        for _, body in subgraphs(node):
            changed_any |= run_passes(body, passes, check, fixed_point=fixed_point)
    return changed_any


def _refresh(graph: Graph, name: str, check: bool) -> None:
    try:
        graph.toposort()
        if check:
            graph.validate()
        infer_shapes(graph, strict=False)
    except PolykitError as exc:
        raise GraphError(f"pass {name} left an invalid graph: {exc.what}", where=exc.where or f"graph {graph.name!r}",
                         hint="this is a polykit bug; run without optimization (or report the model)") from exc


def optimize(graph: Graph, *, fold: bool = True, fuse: bool = True, keep: Iterable[str] = frozenset(),
             check: bool = True, fp16: bool = False, bf16: bool = False, fp32_layers: Iterable[str] = (),
             channels_last: bool = False, channels_last_convs: Iterable[str] = DEFAULT_CONV_CLASSES,
             int8: bool = False, int8_scales: Mapping[str, float] | None = None,
             int8_unfolded: Iterable[str] = (), weight_only: bool = False, fp8: bool = False,
             unquantized: Iterable[str] = (), io_formats: Mapping[str, IoFormat] | None = None) -> Graph:
    """The default pipeline; returns an optimized copy of `graph` (the input is left as is).

    `keep` names tensors that must survive under their names (marked outputs); graph
    outputs always do. `fold=False` skips constant folding, `fuse=False` the fusions
    (recognizers of Gelu/LayerNorm/Attention still run: they give plain ONNX ops or a unit).
    With `fuse`, GEMMs reading one tensor with constant weights of one K become one GEMM + Split
    (pack_gemms, after fold_conv_batchnorm, before the recognizers, after Q/DQ and weight-only
    folding: only float weights pack; not in builds that calibrate INT8 / FP8, whose scales are
    keyed by the GEMMs' tensors); FP8 layers sharing their e4m3 input pack the same way
    (pack_quantized_gemms, after each fold_qdq).
    `fp16=True` (or `bf16=True`) converts the graph to float16 (bfloat16) before fusion
    (convert_precision; layers named in `fp32_layers` stay float32), so the I/O Casts fuse
    with their neighbours.
    `channels_last=True` runs 2-D (and 1-D) convolutions and 2-D pools in NHWC (to_channels_last, first in the
    layout group; fold_axis_permutations turns channel shuffles into Gathers, plan_layouts runs
    the regions of layout-free ops between them NHWC where that moves fewer bytes, and
    cancel_transposes removes the Transposes left between them; move_row_transposes then carries
    the rest through row-wise ops and views to a partner Transpose or Attention); of
    the convolutions, those of the classes `channels_last_convs` names ("dense", "depthwise",
    "grouped"); with "dense" among them, an implicitly quantized build's strided stems over few channels
    become stride-1 convs over their input's space-to-depth blocks first (space_to_depth_stems, before
    quantization).
    `int8=True` folds Q/DQ around Conv/Gemm/MatMul into INT8 layers (fold_qdq; the model's own
    Q/DQ first, before folding dequantizes their weights, with `fuse`); `int8_scales` (tensor ->
    scale, from calibration) quantizes the float graph after batch norms are folded (insert_qdq;
    to float8_e4m3fn with `fp8`: FP8 layers); nodes named in `fp32_layers` or `unquantized` (those
    a per-layer precision asks to run in a float type, fp16 included) are not quantized.
    `int8_unfolded` names ops that stay quantized but are not folded (no INT8 tactic of the target
    runs them): their Q/DQ run as layers and the op in float32, as the INT8 layer would compute.
    `weight_only=True` (with `fuse`) keeps weight-only quantized MatMul/Gemm weights packed
    (fold_weight_only, before constant folding would dequantize them); `int8_unfolded` names
    those that stay as written too.
    `io_formats`: graph input/output -> the dtype and layout the engine gives it (apply_io_formats,
    first); the conversions at the edges cancel against the build's own where they match.
    """
    g = graph.copy()
    kept = frozenset(keep)
    if io_formats:
        run_passes(g, [functools.partial(apply_io_formats, formats=dict(io_formats))], check)
    bind = functools.partial
    cleanup: list[Pass] = [bind(remove_identity, keep=kept), bind(fold_index_ranges, keep=kept),
                           bind(merge_duplicates, keep=kept), bind(eliminate_dead_code, keep=kept)]
    if fold:
        cleanup[:0] = [bind(fold_constants, keep=kept), inline_constant_if, unroll_loops]
    unfolded = tuple(int8_unfolded)
    fold_int8 = bind(fold_qdq, keep=kept, fp32_layers=tuple(fp32_layers) + unfolded)
    int8_pools = bind(quantize_pools, keep=kept)
    if int8 and fuse:
        run_passes(g, [int8_pools, fold_int8], check)
    if weight_only and fuse:
        run_passes(g, [bind(fold_weight_only, keep=kept, fp32_layers=tuple(fp32_layers) + unfolded)], check)
    run_passes(g, cleanup, check, fixed_point=True)
    recognize: list[Pass] = [bind(fold_conv_batchnorm, keep=kept), bind(recognize_gelu, keep=kept),
                             bind(recognize_layernorm, keep=kept), bind(recognize_groupnorm, keep=kept),
                             bind(recognize_attention, keep=kept)]
    pack_fp8 = bind(pack_quantized_gemms, keep=kept, skip=unfolded)
    if fuse and not (int8 and int8_scales):  # GEMMs sharing an input: one GEMM + Split (float weights only)
        recognize.insert(1, bind(pack_gemms, keep=kept, skip=tuple(fp32_layers) + unfolded))
    if fuse and int8:  # and FP8 layers sharing their e4m3 input (an explicit model's, folded above)
        recognize.insert(1, pack_fp8)
    if run_passes(g, recognize, check):
        run_passes(g, cleanup, check, fixed_point=True)
    if channels_last and int8 and int8_scales and "dense" in frozenset(channels_last_convs):
        # strided stems over few channels as stride-1 convs over space-to-depth blocks, in implicitly quantized
        # builds (their INT8 / FP8 convs pad channels to 16: ResNet's stem 784 -> 256 products an output); the
        # convs a float precision is asked for stay; the scales gain the stems' new inputs. (16-bit builds pad
        # to 8: 392 -> 256 on ResNet's stem, 2.67x on ViT / Swin / ConvNeXt patchify stems: CHANNEL_ALIGN, to be
        # timed on the zoo before they take it.)
        int8_scales = dict(int8_scales)
        run_passes(g, [bind(space_to_depth_stems, keep=kept, align=INT8_CHANNEL_ALIGN, scales=int8_scales,
                            skip=(*fp32_layers, *unquantized))], check)
    if int8 and int8_scales:
        quantize = bind(insert_qdq, scales=int8_scales, keep=kept, fp32_layers=(*fp32_layers, *unquantized), fp8=fp8)
        if run_passes(g, [quantize, int8_pools, fold_int8] + ([pack_fp8] if fuse else []), check):
            run_passes(g, cleanup, check, fixed_point=True)
    layout: list[Pass] = [bind(cancel_transposes, keep=kept), bind(move_row_transposes, keep=kept, attention=fuse)]
    if channels_last:
        layout[:0] = [bind(to_channels_last, keep=kept, conv_classes=frozenset(channels_last_convs)),
                      bind(fold_axis_permutations, keep=kept), bind(plan_layouts, keep=kept)]
    if fuse:
        layout += [bind(hoist_activations, keep=kept), bind(fold_attention_layouts, keep=kept),
                   bind(eliminate_dead_code, keep=kept), bind(move_row_transposes, keep=kept),
                   bind(fuse_movement, keep=kept), bind(compose_gathers, keep=kept), bind(fuse_quantize_nhwc, keep=kept)]
    if run_passes(g, layout, check):
        run_passes(g, cleanup, check, fixed_point=True)
    if fp16 or bf16:
        keep_fp32 = frozenset(fp32_layers) | set(unfolded)
        run_passes(g, [bind(convert_precision, half=F16 if fp16 else BF16, keep_fp32=keep_fp32, keep=kept),
                       bind(eliminate_dead_code, keep=kept)], check)
    if io_formats:  # the edges' conversions against the build's own: exact round trips and identities go
        run_passes(g, [bind(cancel_round_trip_casts, keep=kept), bind(remove_identity, keep=kept),
                       bind(eliminate_dead_code, keep=kept)], check, fixed_point=True)
    if fuse:  # mark_causal_masks first: it reads the mask's Where / And before fuse_pointwise merges them
        run_passes(g, [bind(mark_causal_masks, keep=kept), bind(compose_reformats, keep=kept),
                       bind(absorb_quantized_casts, keep=kept), bind(fuse_output_quantize, keep=kept, skip=unfolded),
                       bind(fuse_bias_activation, keep=kept),
                       bind(fuse_squeeze_excite, keep=kept), bind(fuse_pointwise, keep=kept),
                       bind(fold_depth_to_space, keep=kept), bind(pad_into_producers, keep=kept),
                       bind(compose_concat_gathers, keep=kept), bind(absorb_concat, keep=kept),
                       bind(fold_norm_row_maps, keep=kept), bind(absorb_views, keep=kept), bind(eliminate_dead_code, keep=kept)], check)
    return g
