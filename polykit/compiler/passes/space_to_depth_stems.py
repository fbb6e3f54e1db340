"""space_to_depth_stems: a strided convolution over few input channels (an image stem) as a stride-1
convolution over its input's space-to-depth blocks, so the channel padding of a channels-last build
stops multiplying zeros.

A channels-last build pads a dense conv's input channels to its kernels' load width (CHANNEL_ALIGN: 8
for 16-bit convs, INT8_CHANNEL_ALIGN: 16 for INT8 / FP8 ones): ResNet's 7x7 / 2 stem over 3 channels
runs K = 49 x 16 = 784 products an output in an INT8 / FP8 build where 147 are real (H100, 2026-12-07:
the FP8 stem 182 us of ResNet-50 bs32's 1.7 ms, slower than its fp16 one). With stride s the same
sums are a stride-1 conv over SpaceToDepth(s) of the input (padded), whose s * s * C channels fill
the width (12 of 16), and a kernel of ceil(k / s) taps a side: K = 4 x 4 x 16 = 256 (3.06x fewer);
a patchify conv (kernel = stride: ViT's 16 x 16 / 16, ConvNeXt's and Swin's 4 x 4 / 4) becomes a 1x1
conv, a GEMM over the patches with K = s * s * C.

    Y[m, oy, ox] = sum_{c, a, b} W[m, c, a, b] X'[c, oy s + a, ox s + b]          (X' = X padded)
                 = sum_{c, i, j, dy, dx} W~[m, c, i s + dy, j s + dx] X'[c, (oy + i) s + dy, (ox + j) s + dx]

with W~ the kernel zero-padded to ceil(k / s) * s a side: SpaceToDepth's channel (dy * s + dx) * C + c
at block (oy + i, ox + j) holds that X' element, so W'[m, (dy * s + dx) * C + c, i, j] = W~[m, c, i s + dy,
j s + dx] and Y = Conv(SpaceToDepth(Pad(X)), W', stride 1, no pads): the same products, summed in
another order. The pad makes X' exactly (OH + k' - 1) * s rows (and columns) long: the rows the conv
reads, rounded to whole blocks (its bottom / right pad; a conv whose windows skip the last rows would
need a crop instead and is left as it is).

Taken where it pays: a group-1, undilated conv with equal strides s >= 2, constant weights, an input of
known height and width, at least MIN_OUTPUT_CHANNELS outputs (the products, not the bytes, cost most),
and the build's padded K at least MIN_SHRINK times smaller. An implicitly quantized channels-last build
(--int8 / --fp8 with calibration) runs it before quantization (passes.optimize), so the new conv is the one
quantized; `scales` (calibrated scales by tensor) then gains the Pad's and SpaceToDepth's outputs with the
input's scale (zeros and a permutation keep its range). Untimed (written without a GPU, 2026-12-07): the
FP8 stem's 3.06x fewer products against the image's extra Pad and SpaceToDepth (and, in an --fp16 build, the
Casts around them: ~10 MB each at batch 32); 16-bit builds (alignment 8: 1.53x on ResNet's stem, 2.67x on
ViT / Swin / ConvNeXt patchify stems) do not run it until the zoo has timed it.
"""

from __future__ import annotations

from typing import Iterable, MutableMapping

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.channels_last import aligned, explicit_pads
from polykit.compiler.passes.rewrite import protected

#: the fewest output channels of a conv this pass rewrites (fewer: its output's bytes, not its products, cost most)
MIN_OUTPUT_CHANNELS = 64
#: the least shrink of the padded K (kernel taps x channels padded to the build's alignment) it rewrites for
MIN_SHRINK = 2.0


def space_to_depth_stems(graph: Graph, *, keep: frozenset[str] = frozenset(), align: int = 8,
                         scales: MutableMapping[str, float] | None = None, skip: Iterable[str] = ()) -> bool:
    """Rewrite every eligible conv (module docstring) but those `skip` names as Pad -> SpaceToDepth -> stride-1
    Conv; True if any. `align`: the channel multiple the build pads a dense conv's input to."""
    fixed = protected(graph, keep)
    skipped = frozenset(skip)
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        new = None if node.name in skipped else _rewrite(graph, node, align, fixed, scales)
        nodes.extend(new if new is not None else [node])
        changed = changed or new is not None
    graph.nodes = nodes
    return changed


def _rewrite(graph: Graph, node: Node, align: int, fixed: set[str],
             scales: MutableMapping[str, float] | None) -> list[Node] | None:
    if node.op_type != "Conv" or node.domain != "" or node.outputs[0] in fixed:
        return None
    x, w = node.input(0), node.input(1)
    weight = graph.initializers.get(w)
    xv = graph.value(x)
    if weight is None or weight.ndim != 4 or xv.shape is None or len(xv.shape) != 4:
        return None
    if not all(isinstance(d, int) for d in xv.shape[1:]) or weight.dtype != xv.dtype:
        return None
    if weight.dtype not in (np.dtype(np.float16), np.dtype(np.float32)):
        return None
    m, c, kh, kw = (int(d) for d in weight.shape)
    strides = [int(s) for s in node.attrs.get("strides") or [1, 1]]
    if int(node.attrs.get("group", 1)) != 1 or any(int(d) != 1 for d in node.attrs.get("dilations") or [1, 1]):
        return None
    if len(strides) != 2 or strides[0] != strides[1] or strides[0] < 2 or m < MIN_OUTPUT_CHANNELS:
        return None
    s = strides[0]
    kh2, kw2 = -(-kh // s), -(-kw // s)
    before, after = kh * kw * aligned(c, align), kh2 * kw2 * aligned(c * s * s, align)
    if before < MIN_SHRINK * after:
        return None
    pads = explicit_pads(graph, node, [kh, kw])
    if pads is None:
        return None
    top, left, bottom, right = pads
    _, _, h, wd = xv.shape
    oh, ow = (h + top + bottom - kh) // s + 1, (wd + left + right - kw) // s + 1
    # X' holds the rows the conv reads, in whole blocks: (oh + kh2 - 1) * s of them
    bottom2, right2 = (oh + kh2 - 1) * s - h - top, (ow + kw2 - 1) * s - wd - left
    if bottom2 < 0 or right2 < 0 or oh < 1 or ow < 1:
        return None  # (its windows skip the last rows: a crop, not a pad)
    wpad = np.zeros((m, c, kh2 * s, kw2 * s), weight.dtype)
    wpad[:, :, :kh, :kw] = weight
    # W'[m, (dy * s + dx) * C + c, i, j] = W~[m, c, i s + dy, j s + dx] (SpaceToDepth's channel order)
    w2 = wpad.reshape(m, c, kh2, s, kw2, s).transpose(0, 3, 5, 1, 2, 4).reshape(m, s * s * c, kh2, kw2)
    out: list[Node] = []
    xp = x
    if any((top, left, bottom2, right2)):
        xp = graph.fresh_name(f"{x}_s2d_pad")
        amounts = graph.add_initializer(np.array([0, 0, top, left, 0, 0, bottom2, right2], np.int64),
                                        f"{node.name}_s2d_pads")
        out.append(Node("Pad", [x, amounts], [xp], {"mode": "constant"}, name=graph.fresh_name(f"{node.name}_s2d_pad")))
    xs = graph.fresh_name(f"{x}_s2d")
    out.append(Node("SpaceToDepth", [xp], [xs], {"blocksize": s}, name=graph.fresh_name(f"{node.name}_s2d")))
    attrs = {k: v for k, v in node.attrs.items() if k not in ("auto_pad", "pads", "strides", "kernel_shape",
                                                                 "dilations")}
    attrs.update(kernel_shape=[kh2, kw2], strides=[1, 1], pads=[0, 0, 0, 0])
    inputs = [xs, graph.add_initializer(np.ascontiguousarray(w2), f"{w}_s2d")] + node.inputs[2:3]
    out.append(Node("Conv", inputs, list(node.outputs), attrs, name=node.name))
    if scales is not None and x in scales:
        scales[xp] = scales[xs] = scales[x]
    return out
