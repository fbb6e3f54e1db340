"""fold_depth_to_space: a ConvNHWC followed by a depth-to-space rearrangement stores its output
rearranged (ConvNHWC's `depth_to_space` attribute, ops/nn/channels_last.py; docs/FUSION.md,
"Depth-to-space stores"), so the rearranging copies disappear.

Two forms, keyed on op types, attributes and static shapes only:
- ConvNHWC (Y [N, OH, OW, M]) -> Reshape [N, OH, OW, bH, bW, C] -> Transpose (0, 1, 3, 2, 4, 5) ->
  Reshape [N, OH * bH, OW * bW, C] (M = bH * bW * C): to_channels_last's lowering of a ConvTranspose
  whose kernel equals its strides (UNet's 2x2/2 up-convolution) -> ConvNHWC(depth_to_space [bH, bW])
  writing the last Reshape's output.
- ConvNHWC -> Transpose (0, 3, 1, 2) -> ONNX DepthToSpace (blocksize b; a PixelShuffle export) ->
  ConvNHWC(depth_to_space [b, b]) -> Transpose (0, 3, 1, 2) writing DepthToSpace's output, or, when
  DepthToSpace's only reader is a Transpose (0, 2, 3, 1) (a channels-last consumer), the conv writing
  that Transpose's output. DCR mode
  is the attribute's order; CRD (channel c * b * b + dy * b + dx) permutes the conv's output channels
  (weight rows and bias, new initializers) to DCR's (dy * b + dx) * C + c.
Each intermediate tensor must have its chain's next node as its only reader and be no kept tensor; the
conv must not store depth-to-space already nor have epilogue inputs besides X, W, B (an epilogue
reading a tensor at the output index: the kernels index it densely). A CRD fold also needs a conv
without epilogue and constant W and B. The pass runs after the epilogue fusions and before concat
absorption, so the conv's output can still be placed into a channels-last Concat's slice.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.nn.channels_last import DEPTH_TO_SPACE, TO_NCHW, TO_NHWC
from polykit.compiler.ops.nn.fused import EPILOGUE_ARITY
from polykit.compiler.passes.rewrite import protected

#: the Transpose of the 6-D block view [N, H, W, bH, bW, C] that interleaves the blocks with the pixels
SHUFFLE_PERM = [0, 1, 3, 2, 4, 5]


def fold_depth_to_space(graph: Graph, keep: Iterable[str] = ()) -> bool:
    """Fold the depth-to-space chains after ConvNHWC nodes into the conv (module docstring)."""
    kept = protected(graph, keep)
    consumers = graph.consumers()
    changed = False
    for conv in list(graph.nodes):
        if conv.op_type != "ConvNHWC" or conv.domain != POLYKIT_DOMAIN or not _plain_output(graph, conv):
            continue
        chain = _only_reader_chain(conv.outputs[0], consumers, kept, 3)
        done = _fold_reshapes(graph, conv, chain) or _fold_onnx(graph, conv, chain)
        if done:
            graph.remove_nodes(done)
            changed = True
            consumers = graph.consumers()
    return changed


def _plain_output(graph: Graph, conv: Node) -> bool:
    """A conv that stores its output dense, of a static shape, with no epilogue input but X, W, B."""
    shape = graph.value(conv.outputs[0]).shape
    return (DEPTH_TO_SPACE not in conv.attrs and len(conv.outputs) == 1
            and len([i for i in conv.inputs[EPILOGUE_ARITY["ConvNHWC"]:] if i]) == 0
            and shape is not None and len(shape) == 4 and all(isinstance(d, int) and d > 0 for d in shape))


def _only_reader_chain(name: str, consumers: dict[str, list[Node]], kept: set[str], depth: int) -> list[Node]:
    """Up to `depth` nodes, each the only reader of the one before's first output (the first: of
    `name`), none of whose inputs along the chain is kept."""
    chain: list[Node] = []
    while len(chain) < depth and name not in kept:
        readers = consumers.get(name, [])
        if len(readers) != 1 or readers[0].inputs.count(name) != 1 or not readers[0].outputs:
            break
        chain.append(readers[0])
        name = readers[0].outputs[0]
    return chain


def _fold_reshapes(graph: Graph, conv: Node, chain: list[Node]) -> list[Node]:
    """The Reshape -> Transpose -> Reshape form; the nodes it removes (empty when it does not match)."""
    if len(chain) != 3 or [n.op_type for n in chain] != ["Reshape", "Transpose", "Reshape"]:
        return []
    if any(n.domain not in ("", "ai.onnx") for n in chain) or chain[0].inputs[0] != conv.outputs[0] \
            or [int(p) for p in chain[1].attrs.get("perm", [])] != SHUFFLE_PERM:
        return []
    n, oh, ow, m = graph.value(conv.outputs[0]).shape
    blocks, final = graph.value(chain[0].outputs[0]).shape, graph.value(chain[2].outputs[0]).shape
    if blocks is None or len(blocks) != 6 or tuple(blocks[:3]) != (n, oh, ow) or not all(isinstance(d, int) for d in blocks):
        return []
    bh, bw, c = blocks[3:]
    if bh * bw * c != m or final != (n, oh * bh, ow * bw, c):
        return []
    _store_depth_to_space(conv, bh, bw, chain[2].outputs[0])
    return chain


def _fold_onnx(graph: Graph, conv: Node, chain: list[Node]) -> list[Node]:
    """The Transpose (to NCHW) -> DepthToSpace form; the nodes it removes (empty when it does not match)."""
    if len(chain) < 2 or [n.op_type for n in chain[:2]] != ["Transpose", "DepthToSpace"] \
            or any(n.domain not in ("", "ai.onnx") for n in chain[:2]) \
            or tuple(int(p) for p in chain[0].attrs.get("perm", [])) != tuple(TO_NCHW):
        return []
    to_nchw, d2s = chain[:2]
    b, mode = int(d2s.attrs.get("blocksize", 0)), str(d2s.attrs.get("mode", "DCR") or "DCR")
    n, oh, ow, m = graph.value(conv.outputs[0]).shape
    if b < 1 or m % (b * b) or mode not in ("DCR", "CRD"):
        return []
    if mode == "CRD" and not _to_dcr(graph, conv, b, m // (b * b)):
        return []
    after = chain[2] if len(chain) > 2 else None
    if after is not None and after.op_type == "Transpose" and after.domain in ("", "ai.onnx") \
            and tuple(int(p) for p in after.attrs.get("perm", [])) == tuple(TO_NHWC):
        _store_depth_to_space(conv, b, b, after.outputs[0])  # an NHWC reader (a channels-last Concat): no Transposes
        return [to_nchw, d2s, after]
    nhwc = graph.fresh_name(f"{d2s.outputs[0]}_nhwc")
    _store_depth_to_space(conv, b, b, nhwc)
    to_nchw.inputs[0], to_nchw.outputs[0] = nhwc, d2s.outputs[0]
    to_nchw.name = graph.fresh_name(f"{d2s.name or conv.name}_to_nchw")
    return [d2s]


def _to_dcr(graph: Graph, conv: Node, b: int, c: int) -> bool:
    """Permute a conv's output channels from CRD's order (c, dy, dx) to DCR's (dy, dx, c): its
    weight rows and bias become new initializers. False (nothing changed) when it cannot."""
    init = graph.initializers
    w, bias = conv.input(1), conv.input(2)
    if conv.attrs.get("epilogue") or w not in init or (bias and bias not in init):
        return False
    order = np.arange(c * b * b).reshape(c, b, b).transpose(1, 2, 0).reshape(-1)  # new j -> old channel
    conv.inputs[1] = graph.add_initializer(np.ascontiguousarray(init[w][order]), f"{w}_dcr")
    if bias:
        conv.inputs[2] = graph.add_initializer(np.ascontiguousarray(init[bias][order]), f"{bias}_dcr")
    return True


def _store_depth_to_space(conv: Node, bh: int, bw: int, output: str) -> None:
    conv.attrs[DEPTH_TO_SPACE] = [int(bh), int(bw)]
    conv.outputs[0] = output
