"""fuse_squeeze_excite: a squeeze-excitation gate as one ai.polykit SqueezeExcite node.

    p = ReduceMean(x, spatial axes, keepdims)        (or GlobalAveragePool, NCHW)
    h = Conv1x1(p, W1, b1) + act epilogue            (ConvNHWC in NHWC, Conv in NCHW)
    s = Conv1x1(h, W2, b2) + gate epilogue
    y = Mul(x, s)                                    (either order; optional)
 -> y = SqueezeExcite(x, W1, b1, W2, b2, extras..., scale=1)  (ops/nn/squeeze_excite.py)
    (s = SqueezeExcite(...) without the Mul)

It runs after fuse_bias_activation, which has put each conv's bias, activation or gate into its
epilogue. Keyed on op types and shapes only: x is rank 4 with known dims and static channels (a
profile build's batch and image size may be dynamic: the kernels read them at run time; shapes
are compared by their dims' expressions, and the node's limits below are checked at the opt
shape: a profile whose max is beyond them gets no cuda tactic for the node); the mean is over H
and W exactly (axes (1, 2) of NHWC, (2, 3) of NCHW) with keepdims; each conv is 2-D, 1x1, group 1,
stride 1, no padding, with constant weights (and bias, or none: a zero bias is made) and an
epilogue whose extra inputs are one-element constants; p and h are read only by the next node of
the chain and are neither graph outputs nor kept; s is read by anything. The bodies move into
the node's `act` and `gate` holders unchanged, so any fusable activation and gate works. The node
absorbs the scaling Mul (attribute `scale`) when s is read by that Mul alone, is neither a graph
output nor kept, and the Mul's other operand is x itself, giving x's shape and dtype: the gate is
then never stored (the cuda kernel scales x as it computes it). Otherwise s is the node's output
and its readers stay. At 1x1 pixels the Mul has already joined the second conv's epilogue
(fuse_bias_activation runs first), so no chain is found there.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ir.symbolic import SymInt, same_dims
from polykit.compiler.ops.nn.squeeze_excite import MAX_BATCH, MAX_ELEMENTS, MAX_EXTRAS, MAX_HIDDEN, SQUEEZE_EXCITE
from polykit.compiler.passes.rewrite import const, json_safe, protected, replace_nodes, sole_reader

#: the conv op of each layout, and the spatial axes of its rank-4 tensors
CONV_OF = {"nhwc": "ConvNHWC", "nchw": "Conv"}
SPATIAL = {"nhwc": (1, 2), "nchw": (2, 3)}


def fuse_squeeze_excite(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace each squeeze-excitation chain by a SqueezeExcite node; True if any was."""
    fixed = protected(graph, keep)
    readers = graph.consumers()
    replacements: dict[int, Node] = {}
    dead: list[Node] = []
    for pool in graph.nodes:
        layout = _pool_layout(graph, pool)
        if layout is None or pool.outputs[0] in fixed:
            continue
        conv1 = sole_reader(graph, pool.outputs[0], readers, fixed)
        pad1 = conv1 if conv1 is not None and _channel_pad(graph, conv1, layout) else None
        if pad1 is not None:
            conv1 = sole_reader(graph, pad1.outputs[0], readers, fixed)
        if conv1 is None or not _is_fc(graph, conv1, layout, (pad1 or pool).outputs[0]):
            continue
        conv2 = sole_reader(graph, conv1.outputs[0], readers, fixed)
        pad = conv2 if conv2 is not None and _channel_pad(graph, conv2, layout) else None
        if pad is not None:  # to_channels_last's zero channels for conv2's aligned input: they add nothing
            conv2 = sole_reader(graph, pad.outputs[0], readers, fixed)
        if conv2 is None or not _is_fc(graph, conv2, layout, (pad or conv1).outputs[0]):
            continue
        x, hidden, out = (graph.value(n) for n in (pool.inputs[0], conv1.outputs[0], conv2.outputs[0]))
        c = x.shape[3 if layout == "nhwc" else 1]
        if out.shape is None or hidden.shape is None or not same_dims(out.shape, graph.value(pool.outputs[0]).shape) \
                or not same_dims(hidden.shape[:1], x.shape[:1]) or out.dtype != x.dtype or hidden.dtype != x.dtype \
                or out.shape[3 if layout == "nhwc" else 1] != c:
            continue
        if len(set(conv1.inputs[3:]) | set(conv2.inputs[3:])) > MAX_EXTRAS or not _fits(graph, x, hidden, conv1, conv2):
            continue
        try:
            node = _squeeze_excite(graph, pool, conv1, conv2, layout, (c, hidden.shape[3 if layout == "nhwc" else 1]))
        except TypeError:  # an attribute plans cannot store as JSON
            continue
        mul = _scaling_mul(graph, node, readers, fixed)
        if mul is not None:
            node.outputs = [mul.outputs[0]]
            node.attrs["scale"] = 1
            node.attrs["fused_from"].append(mul.name)
            dead.append(mul)
        replacements[id(conv2)] = node
        dead.extend([pool, conv1, *(p for p in (pad1, pad) if p is not None)])
    return replace_nodes(graph, replacements, dead)


def _scaling_mul(graph: Graph, se: Node, readers: dict[str, list[Node]], fixed: set[str]) -> Node | None:
    """The Mul(x, s) (either order) that reads the gate s of `se` as its only reader, giving x's shape
    and dtype, or None."""
    x, s = se.inputs[0], se.outputs[0]
    mul = sole_reader(graph, s, readers, fixed)
    if mul is None or mul.op_type != "Mul" or mul.domain != "" or len(mul.outputs) != 1 \
            or sorted(mul.inputs) != sorted([x, s]) or x == s:
        return None
    y, xv = graph.value(mul.outputs[0]), graph.value(x)
    return mul if y.shape is not None and same_dims(y.shape, xv.shape) and y.dtype == xv.dtype else None


def _fits(graph: Graph, x, hidden, conv1: Node, conv2: Node) -> bool:
    """Within the node's limits (ops/nn/squeeze_excite.py; dynamic dims at their opt values), and every
    weight, bias and extra of x's dtype (as the kernels read them)."""
    cr = hidden.shape[3] if len(hidden.shape) == 4 and conv1.op_type == "ConvNHWC" else hidden.shape[1]
    if cr > MAX_HIDDEN or x.shape[0] > MAX_BATCH or int(np.prod(x.shape)) > MAX_ELEMENTS:
        return False
    consts = [const(graph, name) for conv in (conv1, conv2) for name in conv.inputs[1:] if name]
    return all(arr is not None and arr.dtype == x.dtype for arr in consts)


def _pool_layout(graph: Graph, node: Node) -> str | None:
    """"nhwc" / "nchw" when `node` averages a rank-4 tensor of known dims (static channels) over its
    spatial axes, keeping dims."""
    if node.domain != "" or len(node.outputs) != 1 or not node.inputs:
        return None
    x = graph.value(node.inputs[0])
    if x.shape is None or len(x.shape) != 4 or not all(isinstance(d, int) for d in x.shape) or x.dtype is None \
            or np.dtype(x.dtype).kind != "f":
        return None
    layout = "nchw" if node.op_type == "GlobalAveragePool" else _mean_layout(graph, node)
    return layout if layout is not None and not isinstance(x.shape[3 if layout == "nhwc" else 1], SymInt) else None


def _mean_layout(graph: Graph, node: Node) -> str | None:
    """The layout whose spatial axes a ReduceMean keeping dims averages, or None."""
    if node.op_type != "ReduceMean" or int(node.attrs.get("keepdims", 1)) != 1:
        return None
    if len(node.inputs) > 1 and node.inputs[1]:
        axes = const(graph, node.inputs[1])
        if axes is None:
            return None
        axes = [int(a) for a in axes.reshape(-1)]
    else:
        axes = [int(a) for a in node.attrs.get("axes", ())]
    found = tuple(sorted(a % 4 for a in axes))
    return next((layout for layout, want in SPATIAL.items() if found == want), None)


def _channel_pad(graph: Graph, node: Node, layout: str) -> bool:
    """Whether `node` is a constant zero Pad of the channel axis's end only (to_channels_last aligns a
    dense conv's input channels so)."""
    if node.op_type != "Pad" or node.domain != "" or node.attrs.get("mode", "constant") != "constant":
        return False
    pads = const(graph, node.input(1))
    value = const(graph, node.input(2)) if node.input(2) else np.zeros(1)
    if pads is None or pads.size != 8 or value is None or value.size != 1 or float(value.reshape(-1)[0]) != 0:
        return False
    if len(node.inputs) > 3 and node.input(3):
        return False
    axis = 3 if layout == "nhwc" else 1
    return all(int(p) == 0 for k, p in enumerate(pads.reshape(-1)) if k != 4 + axis)


def _is_fc(graph: Graph, conv: Node, layout: str, src: str) -> bool:
    """Whether `conv` is a 1x1 dense convolution of `src` (its first input only) with constant
    weights and bias, and an epilogue (if any) reading only one-element constants besides."""
    if conv.op_type != CONV_OF[layout] or len(conv.outputs) != 1 or not conv.inputs or conv.input(0) != src:
        return False
    if conv.domain == "" and layout == "nhwc" or conv.domain not in ("", POLYKIT_DOMAIN):
        return False
    if conv.domain == POLYKIT_DOMAIN and conv.op_type == "Conv" and not conv.attrs.get("epilogue"):
        return False
    w = const(graph, conv.input(1))
    bias = const(graph, conv.input(2)) if conv.input(2) else np.zeros(0)
    if w is None or w.ndim != 4 or bias is None or (conv.input(2) and bias.size != w.shape[0]):
        return False
    kernel = w.shape[1:3] if layout == "nhwc" else w.shape[2:]
    attrs = conv.attrs
    if tuple(kernel) != (1, 1) or int(attrs.get("group", 1)) != 1 or src in conv.inputs[1:]:
        return False
    if any(int(s) != 1 for s in attrs.get("strides", ())) or any(int(p) != 0 for p in attrs.get("pads", ())):
        return False
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID"):
        return False
    extras = conv.inputs[3:]
    return all(n and const(graph, n) is not None and const(graph, n).size == 1 for n in extras)


def _holder(conv: Node) -> dict:
    epi = conv.attrs.get("epilogue")
    if not epi:
        return {"input": conv.outputs[0], "body": [], "output": conv.outputs[0]}
    return {"input": epi["input"], "body": json_safe(epi["body"]), "output": conv.outputs[0]}


def _squeeze_excite(graph: Graph, pool: Node, conv1: Node, conv2: Node, layout: str, widths: tuple[int, int]) -> Node:
    """The node; `widths` (C, Cr): the input channels of conv1 and conv2 without alignment padding."""
    inputs = [pool.inputs[0]]
    for conv, k in zip((conv1, conv2), widths):
        w = const(graph, conv.input(1))
        bias = conv.input(2) or graph.add_initializer(np.zeros(w.shape[0], w.dtype), f"{conv.name}_zero_bias")
        weight = conv.input(1)
        if w.shape[3 if layout == "nhwc" else 1] != k:  # the padded channels' columns go (they met zeros)
            cut = np.ascontiguousarray(w[..., :k] if layout == "nhwc" else w[:, :k])
            weight = graph.add_initializer(cut, f"{weight}_se")
        inputs += [weight, bias]
    for name in [*conv1.inputs[3:], *conv2.inputs[3:]]:
        if name not in inputs[5:]:
            inputs.append(name)
    attrs = {"layout": layout, "act": _holder(conv1), "gate": _holder(conv2),
             "fused_from": [pool.name, *(conv1.attrs.get("fused_from") or [conv1.name]),
                            *(conv2.attrs.get("fused_from") or [conv2.name])]}
    return Node(SQUEEZE_EXCITE, inputs, [conv2.outputs[0]], attrs, name=conv2.name, domain=POLYKIT_DOMAIN)
